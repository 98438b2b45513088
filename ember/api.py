"""ember.compile and ember.reset: the user-facing API of the capture frontend (ember.explain
reports through it: ember/explanation.py).

A CompiledFunction keeps cache entries, newest first; each is (guard, run), and the two as one
function (its guards, then the run; MISS where a guard fails). A call binds the arguments by
name, finds the first entry whose guards accept them and runs it; a miss captures
again (logging why on EMBER_LOGS=recompiles) until the recompile limit, after which the
function runs eagerly with one warning. Functions ember cannot capture run eagerly, and say so;
once their calls keep running eagerly, they are called directly (ember/giving_up.py). How an
entry is made — capture, the backend's compile, the runner and its guards — is
ember/entries.py's.
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import binding, config, logs, stances, torch_internals, warm_entries
from ember import options as compile_options
from ember.capture.errors import AssumptionFailed, GraphRaised, Unsupported
from ember.capture.guards import MISS, first_failure, same_tensor
from ember.capture.symbols import FrameSizes
from ember.entries import (  # noqa: F401  (CUDA_GRAPH_MODES, CaptureRecord: re-exported)
    CUDA_GRAPH_MODES,
    MODES,
    CacheEntry,
    CaptureRecord,
    Capturing,
)
from ember.giving_up import (  # noqa: F401  (EAGER_CALLS_BEFORE_DIRECT: re-exported)
    EAGER_CALLS_BEFORE_DIRECT,
    EagerTrial,
    GivingUp,
    counted_eager_call,
    dynamo_compiling,
    ending_the_streak,
    hooked_arguments,
)
from ember.giving_up import grad_enabled as _grad_enabled
from ember.resumes import Resume
from ember.runtime import collector, triton_launch

if TYPE_CHECKING:
    from ember.capture.captured import Resumption

# NOTE: the capture's interpreter, the compiler (ember.backends) and CUDA graphs are imported
# where a call first captures or compiles: a new process whose first call starts warm
# (ember/warm_entries.py) imports the runtime only.

_registry: weakref.WeakSet = weakref.WeakSet()



def resolve_backend(backend: str | Callable) -> Callable:
    """"ember", "eager", "inductor" (or any torch.compile backend name), or a callable."""
    if callable(backend):
        return backend
    if backend == "ember":
        from ember.backends import backend as ember_backend

        return ember_backend
    if backend == "eager":
        return _eager_backend
    return torch_internals.lookup_dynamo_backend(backend)


def _eager_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    return gm.forward


_eager_backend.serves_any_shape = True  # (a graph with symbolic sizes needs no per-shape copy)


class CompiledFunction(GivingUp, Capturing):
    def __init__(self, function: Callable, fullgraph: bool = False, dynamic: bool | None = None,
                 mode: str | None = None, backend: str | Callable = "ember", depth: int = 0,
                 collector: list | None = None, where: str | None = None,
                 origin: tuple[types.CodeType, int] | None = None,
                 resumes: dict[tuple, Resume] | None = None, settings: dict | None = None,
                 recompile_limit: int | None = None, name: str | None = None):
        if inspect.ismethod(function):
            self.bound_self = function.__self__
            function = function.__func__
        else:
            self.bound_self = None
        if not isinstance(function, types.FunctionType):
            raise TypeError(f"ember.compile needs a Python function or an nn.Module, got "
                            f"{type(function).__name__}")
        if function.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE |
                                         inspect.CO_ASYNC_GENERATOR):
            raise TypeError(f"ember.compile cannot compile {function.__qualname__}: it is a "
                            "generator or coroutine function; compile the code it calls")
        if dynamic not in (None, True, False):
            raise ValueError(f"ember.compile: dynamic must be None, True or False, got "
                             f"{dynamic!r}")
        if mode not in MODES:
            raise ValueError(f"ember.compile: unknown mode {mode!r}; use one of "
                             f"{', '.join(repr(m) for m in MODES)}")
        self.function = function
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.mode = mode
        self.settings = settings or {}        # ember settings while it compiles (options=)
        self.recompile_limit = recompile_limit  # (None: EMBER_RECOMPILE_LIMIT)
        # (ember's own is imported at the first compile: see `backend`)
        self._backend = None if backend == "ember" else resolve_backend(backend)
        self.backend_option = backend  # (as given: what modules compiled apart get)
        self.backend_name = backend if isinstance(backend, str) else getattr(
            backend, "__name__", "custom")
        self.binder = binding.binder(function)
        self.caller = binding.caller(function)
        self.entries: list[CacheEntry] = []
        # held while a missed call captures: re-entrant, for a capture that reaches this
        # function again (through a resume function, say) on its own thread
        self._compiling = threading.RLock()
        self.records: list[CaptureRecord] = []
        self.given_up = False
        self.frame_sizes = FrameSizes()  # (sizes its captures saw: automatic dynamic)
        self.symbolic_refused = False  # (a symbolic compile of ember's fell back per shape)
        # (see EAGER_CALLS_BEFORE_DIRECT) what __call__ calls at once, in the grad modes of
        # `direct_modes`; and how many calls in a row ran eagerly since the last capture
        self.direct: Callable | None = None
        self.direct_modes: frozenset[bool] = frozenset()
        self.eager_streak = 0
        self.trial: EagerTrial | None = None  # (a function whose graph breaks: on trial)
        self.first_call_ran = False  # (stance eager_then_compile: its first call ran eagerly)
        self.depth = depth              # 0, or how many breaks led to this resume function
        self.collector = collector      # shared with resume functions, for explain()
        # the code this function's own code runs (a resume function's: the original's, after
        # a prologue this many instructions long), and the resume functions made from it
        self.origin = origin or (function.__code__, 0)
        self.resumes: dict[tuple, Resume] = resumes if resumes is not None else {}
        self.callees: dict[Any, CompiledFunction] = {}
        # where the user's code called this function, when ember compiles it on its own at
        # a break in its caller (explain shows its breaks under those lines)
        self.called_from: list[Any] = []
        code = function.__code__
        self.where = where or f"{name or function.__qualname__} ({code.co_filename}:" \
                              f"{code.co_firstlineno})"
        # (torch's own code, nn.Sequential's forward: named after the user's line that
        # compiled or first called it, which logs, explain and EMBER_DUMP show)
        self.site = logs.user_site() if logs.in_torch(code.co_filename) else None
        if self.site is not None and where is None:
            self.where = f"{name or function.__qualname__} (torch's code, compiled at " \
                         f"{self.site[0]}:{self.site[1]})"
        _registry.add(self)
        self.__wrapped__ = function
        self.__name__ = getattr(function, "__name__", "compiled")
        self.__doc__ = function.__doc__

    @property
    def backend(self) -> Callable:
        """What compiles the captured graphs (resolve_backend)."""
        if self._backend is None:
            self._backend = resolve_backend(self.backend_option)
        return self._backend

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def reset(self) -> None:
        self.entries = []
        self.records.clear()
        self.given_up = False
        self.frame_sizes = FrameSizes()
        self.symbolic_refused = False
        self.direct = None
        self.direct_modes = frozenset()
        self.eager_streak = 0
        self.trial = None
        self.first_call_ran = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if dynamo_compiling():  # (torch.compile tracing: see giving_up.dynamo_compiling)
            return self._eager(args, kwargs)
        direct = self.direct
        if direct is not None and _grad_enabled() in self.direct_modes:
            return direct(*args, **kwargs)
        trial = self.trial
        if trial is not None and trial.takes_calls():  # (see giving_up.TRIAL_ROUNDS)
            return trial.call(self, args, kwargs)
        if config.settings.disable or stances.current() == "force_eager":
            return self._eager(args, kwargs)
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        try:
            arguments = self.binder(*args, **kwargs)
        except TypeError:
            return self.function(*args, **kwargs)  # eager raises the right TypeError
        rerun = False
        try:
            for entry in self.entries:
                result = entry.call(arguments)
                if result is not MISS:
                    return result
        except AssumptionFailed as failed:  # (a check the graph assumed passes does not, or
            self._eager_turn(failed)         # the graph raised: eager's turn)
            rerun = True
        if rerun:  # (outside the handler: eager's exception chains to nothing of ember's)
            return self.function(*args, **kwargs)
        if self.given_up:  # (no more versions: calls the kept ones do not take run eagerly)
            self.ran_eagerly()
            return self.function(*args, **kwargs)
        return self._miss(arguments, args, kwargs)

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        return self.function(*args, **kwargs)

    def _miss(self, arguments: dict[str, Any], args: tuple, kwargs: dict) -> Any:
        with collector.paused():  # (a capture and a compile: runtime/collector.py)
            entry = self._entry_for(arguments)
        if entry is None:
            return self.function(*args, **kwargs)
        try:
            return entry.run(arguments)
        except AssumptionFailed as failed:
            self._eager_turn(failed)
        return self.function(*args, **kwargs)

    def _eager_turn(self, failed: AssumptionFailed) -> None:
        """Says why the call runs eagerly from the function's start (the caller runs it
        outside its handler: eager's exception chains to nothing of ember's)."""
        if isinstance(failed, GraphRaised):
            logs.channel("fallbacks").info(
                "%s: its graph raised %s at run time; the call ran eagerly from the "
                "function's start", self.where, failed)

    def _entry_for(self, arguments: dict[str, Any]) -> CacheEntry | None:
        """The entry that serves these arguments, captured now if none does; None past the
        recompile limit. One thread at a time: threads that miss together on one input
        signature capture it once, and the limit counts versions, not racing threads."""
        with self._compiling:
            for entry in self.entries:  # (another thread may have captured it meanwhile)
                if entry.guard(arguments):
                    return entry
            if self.given_up or not stances.on_miss(self, arguments):
                return None
            if self.entries:
                if len(self.entries) >= self.limit():
                    logs.channel("recompiles").warning(
                        "%s has reached its recompile limit of %d compiled version%s, so from "
                        "now on a call that none of them accepts runs eagerly. The call%s "
                        "needed a new version because %s. To keep more versions, pass "
                        "ember.compile(..., recompile_limit=N) or set EMBER_RECOMPILE_LIMIT; "
                        "to compile one version for every size, mark the changing dimension "
                        "with ember.mark_dynamic.", self.where, len(self.entries),
                        "" if len(self.entries) == 1 else "s",
                        logs.from_site(), self.why_missed(self.entries[0], arguments))
                    self.given_up = True
                    self.eager_streak = 0
                    for entry in self.entries:  # (a call a kept version serves ends the streak)
                        entry.call = ending_the_streak(self, entry.call)
                    return None
                if logs.enabled("recompiles"):
                    logs.channel("recompiles").info(
                        "%s is compiled again: the call%s needed a new version because %s.",
                        self.where, logs.from_site(), self.why_missed(self.entries[0], arguments))
            entry = self._hooked_entry(arguments)
            keys = warm_entries.key_of(self, arguments) \
                if entry is None and warm_entries.wanted(self) else None
            entry = warm_entries.load(self, arguments, keys) if keys is not None else entry
            if entry is None:
                entry = self._capture(arguments)
                if keys is not None and entry.captured is not None:
                    warm_entries.keep(self, entry, keys)
            # (a new list, not an insertion: threads looping over the old one see it whole)
            self.entries = [entry, *self.entries]
            self.eager_streak = 0
            return entry

    def _hooked_entry(self, arguments: dict[str, Any]) -> CacheEntry | None:
        """An eager entry for arguments with a __torch_function__ of their own, made before
        anything reads them (giving_up.hooked_arguments)."""
        hooked = hooked_arguments(arguments)
        if hooked is None:
            return None
        refusal, guard = hooked
        logs.channel("graph_breaks").info("%s runs eagerly: %s", self.where, refusal)
        self.record(CaptureRecord(0, [], [refusal], "", 0.0))
        return CacheEntry(guard, self.caller, None, "", refusal,
                          call=counted_eager_call(self, guard))

    def why_missed(self, entry: CacheEntry, arguments: dict[str, Any]) -> str:
        if entry.captured is None:
            return "inputs differ from the eager entry's"
        scope = dict(entry.captured.scope, L=arguments,
                     C=self.function.__closure__ or ())
        why = first_failure(entry.captured.guards, scope) or same_tensor(arguments) or \
            "no guard failed (?)"
        return logs.user_names(why)

    def record(self, record: CaptureRecord) -> None:
        for reason in record.breaks:  # (the lines of the code that called this one first)
            if self.called_from and not getattr(reason, "called_from_added", False):
                reason.user_stack[:0] = self.called_from
                reason.called_from_added = True
        self.records.append(record)
        if self.collector is not None:
            self.collector.append(record)

    def callee(self, function: types.FunctionType, at: Unsupported | None = None
               ) -> CompiledFunction:
        """A function the code calls at a break (`at`), compiled on its own (its breaks
        resume in its own frame; explain shows them under the caller's line)."""
        if function not in self.callees:
            self.callees[function] = CompiledFunction(
                function, backend=self.backend, dynamic=self.dynamic, mode=self.mode,
                collector=self.collector, settings=self.settings,
                recompile_limit=self.recompile_limit)
            self.callees[function].called_from = \
                [*self.called_from, *(at.user_stack[:1] if at is not None else [])]
        return self.callees[function]

    def resume(self, spec: Resumption) -> Resume:
        """The resume function for a break at `spec` (one per place in the original code and
        layout of what it takes)."""
        start = spec.start - self.origin[1]
        lasti = None if spec.lasti is None else spec.lasti - self.origin[1]
        from ember.capture.values import NULL

        key = (start, tuple(value is NULL for value in spec.stack), tuple(spec.locals),
               tuple(spec.cells), lasti)
        found = self.resumes.get(key)
        if found is None:  # (setdefault: one Resume per place, for every thread)
            found = self.resumes.setdefault(key, Resume(self, spec, start, lasti))
        return found

    def limit(self) -> int:
        """How many versions this function keeps: ember.compile's recompile_limit, else
        torch._dynamo.config.recompile_limit where the user set it, else
        EMBER_RECOMPILE_LIMIT."""
        return self.recompile_limit or torch_internals.dynamo_recompile_limit() or \
            config.settings.recompile_limit

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Ahead of time: capture this function for these arguments, as one graph, without
        running it (ember/aot.py); `.compile()` on the result builds it."""
        from ember import aot

        return aot.lower(self, args, kwargs)


def compile(model: Callable | torch.nn.Module | None = None, *, fullgraph: bool = False,
            dynamic: bool | None = None, mode: str | None = None,
            backend: str | Callable = "ember", options: dict[str, Any] | None = None,
            disable: bool = False, recompile_limit: int | None = None,
            name: str | None = None) -> Any:
    """Compile a function or nn.Module (like torch.compile; usable as a decorator).
    torch.compile's arguments mean what they mean there (`options`: ember's settings for this
    function and the Inductor options ember has equivalents of, ember/options.py;
    `disable=True`: the model itself, uncompiled); ember's own: `recompile_limit` (this
    function's, instead of EMBER_RECOMPILE_LIMIT) and `name` (what logs and explain call it)."""
    if model is None:
        return lambda fn: compile(fn, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                                  backend=backend, options=options, disable=disable,
                                  recompile_limit=recompile_limit, name=name)
    if mode is not None and options:
        raise RuntimeError("ember.compile: either mode or options can be given, not both (as "
                           "torch.compile)")
    if disable:
        return model
    if recompile_limit is not None and (type(recompile_limit) is not int
                                        or recompile_limit < 1):
        raise ValueError(f"ember.compile: recompile_limit must be a positive int, got "
                         f"{recompile_limit!r}")
    resolved = compile_options.resolve(options)
    if resolved.cuda_graphs and mode is None:
        mode = "reduce-overhead"
    tuned = {"max_autotune": True} if mode in compile_options.TUNING_MODES else {}
    chosen = dict(fullgraph=fullgraph, dynamic=dynamic, mode=mode, backend=backend,
                  settings={**resolved.settings, **tuned}, recompile_limit=recompile_limit,
                  name=name)
    if isinstance(model, torch.export.ExportedProgram):
        # (a graph torch.export made: its module, parameters and buffers attached, called as
        # the exported function is — one graph, captured from its generated code)
        model = model.module()
    if isinstance(model, torch.nn.Module):
        from ember import compiled_module

        if triton_launch.on_gpu([model]):  # (Triton's one-time costs start now, beside the
            triton_launch.warm_up_for_cuda()  # user's program, before the first call)
        return compiled_module.CompiledModule(model, **chosen)
    if not callable(model):
        raise TypeError(f"ember.compile needs a function or an nn.Module, got "
                        f"{type(model).__name__}")
    if isinstance(model, functools.partial):  # (its function compiled, its arguments kept)
        return functools.partial(CompiledFunction(model.func, **chosen), *model.args,
                                 **model.keywords)
    if isinstance(model, (types.FunctionType, types.MethodType)):
        return CompiledFunction(model, **chosen)
    if isinstance(model, (torch_internals.OpOverload, torch_internals.OpOverloadPacket)):
        return CompiledFunction(_calling(model), **chosen)  # (an op: one call of it)
    from ember.capture.attributes import class_lookup

    call = class_lookup(type(model), "__call__")
    if isinstance(call, types.FunctionType):  # (an object with a Python __call__)
        return CompiledFunction(types.MethodType(call, model), **chosen)
    # a callable without Python code of its own (torch.relu, an aten op, a C type's
    # instance): compiled as the Python function that calls it
    return CompiledFunction(_calling(model), **chosen)


def _calling(function: Callable) -> types.FunctionType:
    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(function, "__name__", type(function).__name__)
    return call


def reset() -> None:
    """Forget every compiled version of every function (like torch._dynamo.reset), once the
    graphs being kept for a warm start are written."""
    from ember.runtime import warm_cache

    warm_cache.finish_keeps()
    for compiled in list(_registry):
        compiled.reset()


def graph_break() -> None:
    """Marks a place where capture must stop (like torch._dynamo.graph_break); eagerly, a
    no-op."""


def graph_break_rule(session: Any, *args: Any, **kwargs: Any) -> Any:
    """What a capture does at ember.graph_break() (registered by ember/capture/calls.py)."""
    raise Unsupported("ember.graph_break() was called", "this break was asked for")

