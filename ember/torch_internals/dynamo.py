"""torch._dynamo without importing it (1-3 s, and it wraps torch functions): the stand-in
package fake tensors run with while nothing has imported it, torch's disabled functions made
on first need, ember's backend registered by an import hook, and Dynamo's markers, config and
stance read only once the user's code has imported torch._dynamo. Nothing here imports it on
ember's own path to a first result.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib.util
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import torch


def dynamo_imported() -> bool:
    """Has anything imported torch._dynamo in this process? Importing it costs 1-3 s and
    wraps torch functions (manual_seed, ...): ember never imports it on its own path to a
    first result; user code can only reach torch._dynamo's functions after importing it."""
    module = sys.modules.get("torch._dynamo")
    return module is not None and not (_stand_in and module is _stand_in[0])


# -- the stand-in for torch._dynamo while fake tensors work --------------------------------
_stand_in: list[types.ModuleType] = []
_stand_in_lock = threading.Lock()
_stand_in_depth = [0]  # (changed only by the import lock's holder)
_STAND_IN = "ember's stand-in for torch._dynamo"


class _PlainSource(torch._guards.Source):
    """A source that only carries a name (torch._dynamo.source.ConstantSource)."""

    def __init__(self, source_name: str):
        self.source_name = source_name

    def __eq__(self, other: object) -> bool:  # (by name, as torch's: not the dataclass's)
        return type(other) is type(self) and self.source_name == other.source_name

    def __hash__(self) -> int:
        return hash((type(self), self.source_name))

    @property
    def guard_source(self) -> Any:
        return torch._guards.GuardSource.CONSTANT

    @property
    def _name_template(self) -> str:
        return self.source_name


class _RandomValueSource(_PlainSource):
    pass


class _AttrSource(torch._guards.ChainedSource):
    """`base.member` (torch._dynamo.source.AttrSource: a view's base, a tensor's grad)."""

    def __init__(self, base: Any, member: str):
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "member", member)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and \
            (self.base, self.member) == (other.base, other.member)

    def __hash__(self) -> int:
        return hash((self.base, self.member))

    @property
    def _name_template(self) -> str:
        return "{0}." + self.member


class _TensorProperty(enum.Enum):
    """torch._dynamo.source.TensorProperty: which of a tensor's sizes a symbol is."""
    SIZE = 0
    STRIDE = 1
    STORAGE_OFFSET = 2

    def method_name(self) -> str:
        return self.name.lower()


class _TensorPropertySource(torch._guards.ChainedSource):
    """`base.size()[idx]`, `base.stride()[idx]` or `base.storage_offset()`
    (torch._dynamo.source.TensorPropertySource: the source of a symbolic fake's size)."""

    def __init__(self, base: Any, prop: _TensorProperty, idx: int | None = None):
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "prop", prop)
        object.__setattr__(self, "idx", idx)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and \
            (self.base, self.prop, self.idx) == (other.base, other.prop, other.idx)

    def __hash__(self) -> int:
        return hash((self.base, self.prop, self.idx))

    @property
    def _name_template(self) -> str:
        call = "{0}." + self.prop.method_name() + "()"
        return call if self.idx is None else f"{call}[{self.idx}]"


class _CallMethodItemSource(torch._guards.ChainedSource):
    """`base.item()` (torch._dynamo.source.CallMethodItemSource: a symbol for the value of a
    0-dim integer or double tensor a fake is made from with a source, a BatchNorm's
    num_batches_tracked under symbolic sizes)."""

    def __init__(self, base: Any):
        object.__setattr__(self, "base", base)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.base == other.base

    def __hash__(self) -> int:
        return hash((type(self), self.base))

    @property
    def _name_template(self) -> str:
        return "{0}.item()"


class _FloatTensorSource(torch._guards.ChainedSource):
    """torch._dynamo.source.FloatTensorSource: a Python float Dynamo made a tensor of; ember
    makes none (fake tensors only ask whether a source is one)."""


@functools.cache
def _names_as_torch_does() -> bool:
    """Do the stand-in sources name themselves as torch's do (Source.name from the class's
    _name_template, torch 2.13's form)? Where not, a symbolic fake imports torch._dynamo."""
    try:
        size = _TensorPropertySource(_PlainSource("x"), _TensorProperty.SIZE, 1)
        offset = _TensorPropertySource(_PlainSource("x"), _TensorProperty.STORAGE_OFFSET)
        return size.name == "x.size()[1]" and offset.name == "x.storage_offset()"
    except Exception:  # noqa: BLE001 (another torch's Source)
        return False


@contextlib.contextmanager
def _dynamo_stand_in() -> Any:
    """Fake tensors' code imports from torch._dynamo while it works: two settings of
    torch._dynamo.config (FakeTensorMode's cache switches) and source classes of
    torch._dynamo.source; importing either imports the whole package (1-3 s, and it wraps
    torch functions). While torch._dynamo is not imported, a stand-in package stands for it
    during the call: its config module loaded alone from torch's file (the defaults), the
    sources as plain names (and a symbolic fake's sizes, where they name themselves as
    torch's do: symbolic_stand_in). Afterwards nothing of it stays in sys.modules.
    NOTE: the import lock is held meanwhile, so another thread's `import torch._dynamo`
    waits and gets the real package."""
    if dynamo_imported():
        yield
        return
    import _imp

    with _stand_in_lock:
        if not _stand_in:
            _stand_in.append(_make_stand_in())
    package = _stand_in[0]
    names = {"torch._dynamo": package, "torch._dynamo.config": package.config,
             "torch._dynamo.source": package.source}
    _imp.acquire_lock()
    try:
        _stand_in_depth[0] += 1
        if _stand_in_depth[0] == 1:
            sys.modules.update(names)
        yield
    finally:
        _stand_in_depth[0] -= 1
        if _stand_in_depth[0] == 0:
            for name, module in names.items():
                if sys.modules.get(name) is module:
                    del sys.modules[name]
            if torch.__dict__.get("_dynamo") is package:
                del torch._dynamo
        _imp.release_lock()


# (whether the stand-in serves a symbolic fake mode on this torch: a trial's answer, once)
_serves_symbolic: list[bool] = []


def stand_in_serves_symbolic(trial: Callable[[], Any]) -> bool:
    """Does the stand-in serve a symbolic fake mode's work on this torch? Its sources must
    name themselves as torch's do, and `trial` (a ShapeEnv made, a fake with a symbolic
    size, an op and a guard on it) must run under it, once: where either fails, what needs
    torch._dynamo imports it, as before the stand-in served symbolic work."""
    if not _serves_symbolic:
        serves = _names_as_torch_does()
        if serves and not dynamo_imported():
            try:
                with _dynamo_stand_in(), _validator_stand_in():
                    trial()
            except Exception:  # noqa: BLE001 (another torch needs more of torch._dynamo)
                serves = False
        _serves_symbolic.append(serves)
    return _serves_symbolic[0]


def _serving_symbolic() -> bool:
    """Did the trial find the stand-in serves symbolic work (False before it ran)?"""
    return bool(_serves_symbolic) and _serves_symbolic[0]


@contextlib.contextmanager
def symbolic_stand_in() -> Any:
    """_dynamo_stand_in for a symbolic fake mode's work (its ShapeEnv made, its fakes made),
    where the stand-in serves it (stand_in_serves_symbolic); else nothing."""
    if not _serving_symbolic():
        yield
        return
    with _dynamo_stand_in(), _validator_stand_in():
        yield


def plain_source(name: str) -> Any:
    """A source that only carries `name` (torch._dynamo.source.ConstantSource, or its
    stand-in while torch._dynamo is not imported and the stand-in serves symbolic work)."""
    if not dynamo_imported() and _serving_symbolic():
        return _PlainSource(name)
    from torch._dynamo.source import ConstantSource

    return ConstantSource(name)


_VALIDATOR = "torch.fx.experimental.validator"


@contextlib.contextmanager
def _validator_stand_in() -> Any:
    """A ShapeEnv made asks torch.fx.experimental.validator whether translation validation
    (torch's fx config, off by default; it needs z3) is on, and that module imports
    torch._dynamo for its exceptions and timers: 0.85 s of the first symbolic capture of a
    process. While neither is imported and it is off, a stand-in answers during the call;
    afterwards nothing of it stays in sys.modules (the import lock is held meanwhile, as
    for _dynamo_stand_in)."""
    fx_config = sys.modules.get("torch.fx.experimental._config")
    if _VALIDATOR in sys.modules or dynamo_imported() or fx_config is None or \
            getattr(fx_config, "translation_validation", True):
        yield
        return
    import _imp

    stand_in = types.ModuleType(_VALIDATOR)
    stand_in.translation_validation_enabled = lambda: False
    _imp.acquire_lock()
    try:
        sys.modules[_VALIDATOR] = stand_in
        yield
    finally:
        if sys.modules.get(_VALIDATOR) is stand_in:
            del sys.modules[_VALIDATOR]
        _imp.release_lock()


def _make_stand_in() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "torch._dynamo.config", f"{torch.__path__[0]}/_dynamo/config.py")
    config = importlib.util.module_from_spec(spec)
    sys.modules["torch._dynamo.config"] = config  # (install_config_module looks it up)
    try:
        spec.loader.exec_module(config)
    finally:
        del sys.modules["torch._dynamo.config"]
    source = types.ModuleType("torch._dynamo.source")
    source.ConstantSource = _PlainSource
    source.RandomValueSource = _RandomValueSource
    source.AttrSource = _AttrSource
    if _names_as_torch_does():  # (a symbolic fake's sizes)
        source.TensorProperty = _TensorProperty
        source.TensorPropertySource = _TensorPropertySource
        source.CallMethodItemSource = _CallMethodItemSource
        source.FloatTensorSource = _FloatTensorSource
    package = types.ModuleType("torch._dynamo")
    package.config, package.source = config, source

    def missing(name: str) -> Any:
        raise AttributeError(f"{_STAND_IN} has no {name}")

    package.__getattr__ = missing
    source.__getattr__ = missing
    package.disable = _DeferredDisable
    return package


# -- functions torch wrapped with torch._disable_dynamo ------------------------------------
def defer_dynamo_disable(wrapper: Any, stand_in: bool = True) -> None:
    """A function torch wrapped with torch._disable_dynamo imports torch._dynamo on its first
    call (to build the disabled version it then calls): FakeTensorMode's dispatch is one.
    Its disabled version is made a _DeferredDisable instead."""
    code = getattr(wrapper, "__code__", None)
    if code is None or not {"fn", "recursive"} <= set(code.co_freevars):
        return
    cells = dict(zip(code.co_freevars, wrapper.__closure__))
    function = cells["fn"].cell_contents
    if getattr(function, "__dynamo_disable", None) is None:
        function.__dynamo_disable = _DeferredDisable(function, cells["recursive"].cell_contents)
        function.__dynamo_disable.stand_in = stand_in


class _DeferredDisable:
    """torch._dynamo.disable(function) made when torch._dynamo is first imported. Until then
    no frame can be compiling, so the plain function is what the disabled one would run; it
    runs with the stand-in package in place (fake dispatch reads torch._dynamo.config)."""

    def __init__(self, function: Any, recursive: bool = True, **options: Any):
        self.function = function
        self.recursive = recursive
        self.options = options
        self.disabled: Any = None
        self.stand_in = True  # (ember's own modes: not needed, and their calls not retried)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.disabled is None and not dynamo_imported():
            if not self.stand_in:
                return self.function(*args, **kwargs)
            try:
                with _dynamo_stand_in():
                    return self.function(*args, **kwargs)
            except (ImportError, AttributeError) as error:
                if _STAND_IN not in str(error):
                    raise
        if self.disabled is None:  # (a path the stand-in lacks: the real package)
            import torch._dynamo

            self.disabled = torch._dynamo.disable(self.function, self.recursive,
                                                  **self.options)
        return self.disabled(*args, **kwargs)


# -- torch.compile's backends by name ------------------------------------------------------
def register_dynamo_backend(name: str, fn: Any) -> None:
    """Make `torch.compile(backend=name)` find `fn` even when the package is not installed
    with its entry point (a source checkout on sys.path). When the entry point exists, torch
    registers it itself on first lookup (registering here too would be a duplicate). Without
    it, the registration waits for torch._dynamo's backend registry to be imported (by
    torch.compile's first call): importing it here would cost `import ember` seconds."""
    from importlib.metadata import entry_points

    if name in entry_points(group="torch_dynamo_backends").names:
        return
    if _BACKEND_REGISTRY in sys.modules:
        _register_backend(sys.modules[_BACKEND_REGISTRY], name, fn)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _RegisterOnImport):
            finder.backends[name] = fn
            return
    sys.meta_path.insert(0, _RegisterOnImport({name: fn}))


_BACKEND_REGISTRY = "torch._dynamo.backends.registry"


def _register_backend(registry: types.ModuleType, name: str, fn: Any) -> None:
    if name not in registry._COMPILER_FNS:
        registry.register_backend(fn, name=name)


class _RegisterOnImport:
    """An import hook (first on sys.meta_path) that registers `backends` with torch._dynamo's
    backend registry as soon as that module has run, then leaves sys.meta_path."""

    def __init__(self, backends: dict[str, Any]):
        self.backends = backends

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _BACKEND_REGISTRY:
            return None
        sys.meta_path.remove(self)  # (finds the module's spec as if this hook were not here)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenRegister(spec.loader, self.backends)
        return spec


class _ThenRegister:
    """A module's loader that registers `backends` once the module has run; everything else
    is the loader's own."""

    def __init__(self, loader: Any, backends: dict[str, Any]):
        self.loader = loader
        self.backends = backends

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        for name, fn in self.backends.items():
            _register_backend(module, name, fn)

    def __getattr__(self, name: str) -> Any:  # (get_source, get_filename, ...)
        return getattr(self.loader, name)


def lookup_dynamo_backend(name: str) -> Any:
    """A torch.compile backend by name ("inductor", "aot_eager", ...)."""
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend(name)


# -- torch._dynamo's own functions (these import it) ---------------------------------------
def reset_dynamo() -> None:
    torch._dynamo.reset()


def dynamo_compiling_tests() -> list[Any]:
    """The older, private spellings of torch.compiler.is_compiling() model code still calls
    (torch._dynamo.is_compiling, torch._utils.is_compiling), those this torch has."""
    import torch._dynamo
    import torch._utils

    found = [getattr(torch._dynamo, "is_compiling", None),
             getattr(torch._utils, "is_compiling", None)]
    return [f for f in found if callable(f)]


# -- torch's markers for compilers (ember/capture/markers.py reads them) --------------------
def dynamo_marker(name: str) -> Any:
    """torch._dynamo's own spelling of a marker (disable, graph_break, mark_static_address,
    allow_in_graph), or None where this torch lacks it."""
    import torch._dynamo

    return getattr(torch._dynamo, name, None)


def disabled_reason(value: Any) -> str | None:
    """Why torch.compiler.disable (torch._dynamo.disable) marked `value` — a function, a
    method, or a module — to run without a compiler: its `reason=`, "" when none was given;
    None when it is not marked. (recursive=False marks the same way.)"""
    function = getattr(value, "__func__", value)  # (a bound method: its function's mark)
    if isinstance(function, types.FunctionType):
        if function.__dict__.get("_torchdynamo_disable") is True:
            return function.__dict__.get("_torchdynamo_disable_msg") or ""
        return None
    if isinstance(value, torch.nn.Module) and dynamo_imported():  # (its mark imports it)
        from torch._dynamo.eval_frame import DisableContext, OptimizedModule

        if isinstance(value, OptimizedModule) and isinstance(value.dynamo_ctx, DisableContext):
            return getattr(value.dynamo_ctx, "msg", None) or ""
    return None


def torch_compiled_original(value: Any) -> Any:
    """What a torch.compile'd function or module stands for when compiled code calls it —
    the function Dynamo itself would inline, the module it wraps — or None for anything
    else (a torch.compiler.disable'd one included: that mark is disabled_reason's)."""
    function = getattr(value, "__func__", value)
    if isinstance(function, types.FunctionType):
        marks = function.__dict__
        inline = marks.get("_torchdynamo_inline")
        if inline is None or marks.get("_torchdynamo_disable"):
            return None
        if function is not value:  # (a compiled method: bound again to its object)
            return types.MethodType(inline, value.__self__)
        return inline
    if isinstance(value, torch.nn.Module) and dynamo_imported():
        from torch._dynamo.eval_frame import DisableContext, OptimizedModule

        if isinstance(value, OptimizedModule) and \
                not isinstance(value.dynamo_ctx, DisableContext):
            return value._orig_mod
    return None


def allowed_in_graph(function: Any) -> bool:
    """Did the user mark `function` with torch.compiler.allow_in_graph (a call of it is one
    node of the graph, not traced into)? torch's own callables are torch's business."""
    module = getattr(function, "__module__", None) or ""
    if module.split(".")[0] == "torch" or not callable(function) or not dynamo_imported():
        return False  # (allow_in_graph imports torch._dynamo to mark)
    from torch._dynamo import trace_rules

    return bool(trace_rules.is_callable_allowed(function))


def is_compiler_config_patch(value: Any) -> bool:
    """Is `value` a patch of one of torch's configuration modules (torch._dynamo.config.patch,
    torch._inductor.config.patch, or Dynamo's proxy of one), entered as a context manager?"""
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    return (module == "torch.utils._config_module" and cls.__name__ == "ConfigPatch") or \
        (module == "torch._dynamo.decorators" and cls.__name__ == "DynamoConfigPatchProxy")


# -- torch.compiler's stance and reset (ember/stances.py) ----------------------------------
# NOTE: torch.compiler.set_stance imports torch._dynamo; until something has, the stance is
# "default" and error_on_recompile False, so nothing here imports it (ember's calls read the
# stance on every call: a dictionary lookup while torch._dynamo is not imported).
def dynamo_stance_is_default() -> bool:
    """Is torch.compiler.set_stance's stance the default one, with no force_backend and no
    skip_guard_eval_unsafe (always, while torch._dynamo is not imported)? Read on every
    compiled call: a lookup and a few attribute reads."""
    module = sys.modules.get("torch._dynamo.eval_frame")
    if module is None:
        return True
    stance = module._stance
    return stance.stance == "default" and getattr(stance, "backend", None) is None and \
        not getattr(stance, "skip_guard_eval_unsafe", False)


def dynamo_stance() -> tuple[str, bool, Any]:
    """torch.compiler.set_stance's current stance: (name, skip_guard_eval_unsafe,
    force_backend); ("default", False, None) while torch._dynamo is not imported."""
    module = sys.modules.get("torch._dynamo.eval_frame")
    if module is None:
        return "default", False, None
    stance = module._stance  # (backend and skip_guard_eval_unsafe: not in every torch)
    return stance.stance, getattr(stance, "skip_guard_eval_unsafe", False), \
        getattr(stance, "backend", None)


def dynamo_error_on_recompile() -> bool:
    """torch._dynamo.config.error_on_recompile (False while torch._dynamo is not imported:
    ember's stand-in config, which holds the defaults, may be in sys.modules for a moment)."""
    if not dynamo_imported():
        return False
    return bool(sys.modules["torch._dynamo.config"].error_on_recompile)


def dynamo_recompile_limit() -> int | None:
    """torch._dynamo.config.recompile_limit where the user changed it (None: its default, or
    torch._dynamo not imported)."""
    if not dynamo_imported():
        return None
    dynamo_config = sys.modules["torch._dynamo.config"]
    if dynamo_config._is_default("recompile_limit"):
        return None
    # (a config patch that ended leaves the entry marked as set, at its default value)
    entry = getattr(dynamo_config, "_config", {}).get("recompile_limit")
    if entry is not None and dynamo_config.recompile_limit == entry.default:
        return None
    return int(dynamo_config.recompile_limit)


def chain_compiler_reset(reset: Any) -> None:
    """Make torch.compiler.reset() and torch._dynamo.reset() call `reset` first (ember's
    compiled functions are forgotten with Dynamo's). torch.compiler.reset is wrapped now;
    torch._dynamo.reset once torch._dynamo is imported (call this again then: it wraps each
    once)."""
    import torch.compiler

    _chain(torch.compiler, "reset", reset)
    if dynamo_imported():
        _chain(sys.modules["torch._dynamo"], "reset", reset)


def _chain(module: types.ModuleType, name: str, first: Any) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "_ember_chained", False):
        return

    def chained(*args: Any, **kwargs: Any) -> Any:
        first()
        return original(*args, **kwargs)

    chained.__name__, chained.__qualname__ = original.__name__, original.__qualname__
    chained.__doc__, chained.__wrapped__ = original.__doc__, original
    chained._ember_chained = True
    setattr(module, name, chained)
