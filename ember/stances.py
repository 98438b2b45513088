"""Stances: what a compiled function does when a call needs a new compiled version.

Takes torch.compiler.set_stance's stance (read through torch_internals), ember's own
(`ember.set_stance`: a function, a context manager or a decorator, with torch's names) and
torch._dynamo.config.error_on_recompile; gives CompiledFunction its answer per call (run
eagerly, capture, or raise RecompileError with the recompile's reason). It must not import
torch._dynamo: until something else has, torch's stance is "default".
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

from ember import logs, torch_internals

STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile",
           "eager_then_compile")
# torch's stances that ember runs as another of its own (and says so, once)
_TORCH_ONLY = {"aot_eager_then_compile": "eager_then_compile"}


class RecompileError(RuntimeError):
    """A call needed a new compiled version while the stance (fail_on_recompile) or
    torch._dynamo.config.error_on_recompile forbids compiling; the message says why."""


# ember.set_stance's stance; "default" defers to torch.compiler.set_stance's
_own = ["default"]
_lock = threading.Lock()
_said: set[str] = set()


class set_stance:  # noqa: N801  (named as torch.compiler.set_stance, which it mirrors)
    """ember.set_stance("force_eager") — as torch.compiler.set_stance, for ember's compiled
    functions: called alone it sets the stance; as a context manager (`with
    ember.set_stance(...)`) it restores the one before on leaving; as a decorator the stance
    holds while the decorated function runs.

    default: compile as usual. force_eager: every call runs eagerly (compiled versions kept).
    eager_on_recompile: a call that no compiled version accepts runs eagerly instead of
    compiling. fail_on_recompile: such a call raises RecompileError with the reason.
    eager_then_compile: a function's first call runs eagerly, later calls compile.
    ember's stance, when not "default", takes precedence over torch.compiler.set_stance's."""

    def __init__(self, stance: str = "default", *, skip_guard_eval_unsafe: bool = False,
                 force_backend: Any = None):
        if stance not in STANCES:
            hint = f" (ember runs torch's {stance!r} as {_TORCH_ONLY[stance]!r}; use that)" \
                if stance in _TORCH_ONLY else ""
            raise ValueError(f"ember.set_stance: unknown stance {stance!r}; the stances are "
                             f"{', '.join(STANCES)}{hint}")
        if skip_guard_eval_unsafe:
            raise ValueError("ember.set_stance: skip_guard_eval_unsafe is not supported: ember "
                             "checks every guard of a compiled version (they are one flat "
                             "function, a few microseconds per call)")
        if force_backend is not None:
            raise ValueError("ember.set_stance: force_backend is not supported; give "
                             "ember.compile(..., backend=...) the backend instead")
        self.stance = stance
        with _lock:
            self.before = _own[0]
            _own[0] = stance
        _chain_reset()

    def __enter__(self) -> set_stance:
        _own[0] = self.stance
        return self

    def __exit__(self, *exception: Any) -> None:
        _own[0] = self.before

    def __call__(self, function: Callable) -> Callable:
        _own[0] = self.before  # (decorating sets nothing: the stance holds per call)

        @functools.wraps(function)
        def with_stance(*args: Any, **kwargs: Any) -> Any:
            with set_stance(self.stance):
                return function(*args, **kwargs)

        return with_stance


def current() -> str:
    """The stance in force: ember's own unless it is "default", else torch's. (Read on every
    compiled call: two lookups while neither is set.)"""
    own = _own[0]
    if own != "default":
        return own
    if torch_internals.dynamo_stance_is_default():
        return "default"
    return _from_torch()


def _from_torch() -> str:
    name, skip_guards, force_backend = torch_internals.dynamo_stance()
    if skip_guards:
        _say_once("skip_guard_eval_unsafe", "torch.compiler.set_stance(skip_guard_eval_unsafe="
                  "True) does not apply to ember's compiled functions: ember checks every "
                  "guard")
    if force_backend is not None:
        _say_once("force_backend", f"torch.compiler.set_stance(force_backend="
                  f"{force_backend!r}) does not apply to ember's compiled functions: they keep "
                  f"the backend ember.compile was given")
    if name in _TORCH_ONLY:
        _say_once(name, f"torch.compiler.set_stance({name!r}): ember's compiled functions "
                  f"run it as {_TORCH_ONLY[name]!r} (ember has no AOT-eager first call)")
        return _TORCH_ONLY[name]
    if name not in STANCES:
        _say_once(name, f"torch.compiler.set_stance({name!r}) is a stance ember does not know; "
                  f"ember's compiled functions compile as under 'default'")
        return "default"
    return name


def _say_once(key: str, message: str) -> None:
    if key not in _said:
        _said.add(key)
        warnings.warn(message, stacklevel=4)


def on_miss(compiled: Any, arguments: dict[str, Any]) -> bool:
    """A call of `compiled` that none of its versions accepts: True to capture it, False to
    run it eagerly; raises RecompileError where compiling is forbidden."""
    _chain_reset()
    stance = current()
    recompiling = bool(compiled.entries)
    if stance == "default":
        if recompiling and torch_internals.dynamo_error_on_recompile():
            raise RecompileError(f"Recompiling {compiled.where}: "
                                 f"{compiled.why_missed(compiled.entries[0], arguments)} "
                                 f"(torch._dynamo.config.error_on_recompile is set)")
        return True
    if stance == "fail_on_recompile":
        why = f": {compiled.why_missed(compiled.entries[0], arguments)}" if recompiling else \
            " (its first call: it has no compiled version yet)"
        raise RecompileError(f"{compiled.where} would {'re' if recompiling else ''}compile "
                             f"under the stance 'fail_on_recompile'{why}")
    if stance == "eager_then_compile":
        if compiled.entries or compiled.first_call_ran:
            return True
        compiled.first_call_ran = True
        logs.channel("recompiles").info("%s: its first call runs eagerly (stance "
                                        "'eager_then_compile'); later calls compile",
                                        compiled.where)
        return False
    # eager_on_recompile (force_eager never misses: its calls do not look for a version)
    logs.channel("recompiles").info("%s runs this call eagerly instead of %s (stance "
                                    "'eager_on_recompile')", compiled.where,
                                    "recompiling" if recompiling else "compiling")
    return False


_reset_chained = [False, False]  # (torch.compiler.reset, torch._dynamo.reset) wrapped


def _chain_reset() -> None:
    """torch.compiler.reset() and torch._dynamo.reset() reset ember too (ember.reset)."""
    if _reset_chained[1]:
        return
    dynamo = torch_internals.dynamo_imported()
    if _reset_chained[0] and not dynamo:
        return
    from ember.api import reset

    torch_internals.chain_compiler_reset(reset)
    _reset_chained[0] = True
    _reset_chained[1] = dynamo


def _stance_in_capture(session: Any, *args: Any, **kwargs: Any) -> Any:
    from ember.capture.errors import Unsupported

    raise Unsupported("the compiler's stance is set inside the compiled function",
                      "set it outside the compiled function, around the call: "
                      "with ember.set_stance(...): f(x)")


def register_capture_rules(call_rules: dict) -> None:
    """Capture meets set_stance as a graph break that says what to do (not as the lock
    inside it, nor as an object it cannot keep): called by ember/capture/calls.py, which
    holds the rules (a warm start imports no capture)."""
    import torch.compiler

    call_rules[set_stance] = _stance_in_capture
    call_rules[torch.compiler.set_stance] = _stance_in_capture
