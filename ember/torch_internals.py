"""The one place ember touches private torch APIs.

Everything here has a test on the installed torch version (tests/test_torch_internals.py), so a
torch upgrade that moves one of these breaks one obvious test instead of ember at large.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import logging
import operator
import sys
import threading
import types
import weakref
from typing import Any

import torch
from torch.nn.modules import module as _module_module
from torch.utils._contextlib import _DecoratorContextManager
from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode
from torch.utils._pytree import (  # noqa: F401  (re-exported)
    TreeSpec,
    tree_flatten,
    tree_map,
    tree_unflatten,
    treespec_dumps,
    treespec_loads,
)
from torch.utils.hooks import RemovableHandle

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def is_op_overload(value: Any) -> bool:
    return isinstance(value, OpOverload)


def is_script_function(value: Any) -> bool:
    return isinstance(value, torch.jit.ScriptFunction)


def scripted_python(value: Any) -> Any:
    """The Python function a torch.jit.script'd function was made from (torch keeps it for
    Dynamo to inline), or None for anything else."""
    if not isinstance(value, torch.jit.ScriptFunction):
        return None
    original = getattr(value, "_torchdynamo_inline", None)
    return original if isinstance(original, types.FunctionType) else None


def schema_of(func: OpOverload) -> Any:
    return func._schema


def overload_name(func: OpOverload) -> str:
    return func._overloadname


def decomposition_of(func: OpOverload) -> Any:
    """torch's Python decomposition of `func` (torch._decomp's table), or None."""
    from torch._decomp import decomposition_table

    return decomposition_table.get(func)


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool, or a tensor whose shape or strides are symbolic."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride()))
    return False


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


def dynamo_imported() -> bool:
    """Has anything imported torch._dynamo in this process? Importing it costs 1-3 s and
    wraps torch functions (manual_seed, ...): ember never imports it on its own path to a
    first result; user code can only reach torch._dynamo's functions after importing it."""
    module = sys.modules.get("torch._dynamo")
    return module is not None and not (_stand_in and module is _stand_in[0])


class TorchDispatchMode(_TorchDispatchMode):
    """torch's TorchDispatchMode, for ember's modes: their dispatch does not import
    torch._dynamo on its first call (defer_dynamo_disable)."""

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        defer_dynamo_disable(cls.__dict__.get("__torch_dispatch__"), stand_in=False)


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


def make_fake_mode() -> Any:
    """A FakeTensorMode: tensors with real metadata (device included) and no data."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    defer_dynamo_disable(FakeTensorMode.__torch_dispatch__)
    with _dynamo_stand_in():
        return FakeTensorMode(allow_non_fake_inputs=True)


def fake_of(mode: Any, tensor: torch.Tensor) -> torch.Tensor:
    """`mode`'s fake of a real tensor, named by a plain source, without a structured trace
    (it extracts a Python traceback per storage, and symbolizing it imports torch._dynamo)."""
    with _dynamo_stand_in():
        return mode.from_tensor(tensor, source=_PlainSource(f"__ember_fake{next(_fakes)}"),
                                trace=False)


_fakes = itertools.count()


class _PlainSource(torch._guards.Source):
    """A source that only carries a name (torch._dynamo.source.ConstantSource)."""

    def __init__(self, source_name: str):
        self.source_name = source_name

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

    def __hash__(self) -> int:
        return hash((self.base, self.member))

    @property
    def _name_template(self) -> str:
        return "{0}." + self.member


_stand_in: list[types.ModuleType] = []
_stand_in_lock = threading.Lock()
_stand_in_depth = [0]  # (changed only by the import lock's holder)
_STAND_IN = "ember's stand-in for torch._dynamo"


@contextlib.contextmanager
def _dynamo_stand_in() -> Any:
    """Fake tensors' code imports from torch._dynamo while it works: two settings of
    torch._dynamo.config (FakeTensorMode's cache switches) and three source classes of
    torch._dynamo.source; importing either imports the whole package (1-3 s, and it wraps
    torch functions). While torch._dynamo is not imported, a stand-in package stands for it
    during the call: its config module loaded alone from torch's file (the defaults), the
    three sources as plain names. Afterwards nothing of it stays in sys.modules.
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
    package = types.ModuleType("torch._dynamo")
    package.config, package.source = config, source

    def missing(name: str) -> Any:
        raise AttributeError(f"{_STAND_IN} has no {name}")

    package.__getattr__ = missing
    source.__getattr__ = missing
    package.disable = _DeferredDisable
    return package


def data_dependent_errors() -> tuple[type, ...]:
    """Exceptions fake tensors raise when a result depends on tensor data."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    errors: list[type] = [DataDependentOutputException, DynamicOutputShapeException]
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
        errors.append(GuardOnDataDependentSymNode)
    except ImportError:
        pass
    return tuple(errors)


def reset_dynamo() -> None:
    torch._dynamo.reset()


# Sets grad mode (torch's own context managers call it): a graph's grad-mode switches are
# nodes calling it.
set_grad_enabled = torch._C._set_grad_enabled


def autocast_region_functions() -> tuple[Any, Any]:
    """torch.autocast's own enter and exit functions (what Dynamo's graphs call for an
    autocast region): a captured region's graph nodes call them, and capture enters the
    real region with them while it traces inside."""
    from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

    return _enter_autocast, _exit_autocast


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


def custom_op_overload(value: Any) -> OpOverload | None:
    """The op a torch.library.custom_op function calls (a CustomOpDef: torch.ops.ns.name's
    default overload), or None for anything else."""
    from torch._library.custom_ops import CustomOpDef

    return value._opoverload if isinstance(value, CustomOpDef) else None


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


def allowed_in_graph(function: Any) -> bool:
    """Did the user mark `function` with torch.compiler.allow_in_graph (a call of it is one
    node of the graph, not traced into)? torch's own callables are torch's business."""
    module = getattr(function, "__module__", None) or ""
    if module.split(".")[0] == "torch" or not callable(function) or not dynamo_imported():
        return False  # (allow_in_graph imports torch._dynamo to mark)
    from torch._dynamo import trace_rules

    return bool(trace_rules.is_callable_allowed(function))


def module_has_hooks(module: torch.nn.Module) -> bool:
    """Hooks on the module, or global module hooks, that calling forward would skip: forward
    hooks and pre-hooks, and backward hooks (nn.Module's call wraps the forward's inputs and
    outputs for them). (Every call of a compiled module asks: plain attribute reads.)"""
    return bool(module._forward_hooks or module._forward_pre_hooks or
                module._backward_hooks or module._backward_pre_hooks or
                _module_module._global_forward_hooks or
                _module_module._global_forward_pre_hooks or
                _module_module._global_backward_hooks or
                _module_module._global_backward_pre_hooks)


# The hook tables of a module, and the global ones, that decide what calling it runs: a
# capture that inlines a hooked module's call guards their keys (hook_tables_unchanged).
_MODULE_HOOK_TABLES = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                       "_forward_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_TABLES = ("_global_forward_pre_hooks", "_global_forward_hooks",
                       "_global_forward_hooks_with_kwargs", "_global_backward_hooks",
                       "_global_backward_pre_hooks")


def hooks_run_apart(module: torch.nn.Module) -> str | None:
    """Why a capture cannot inline this module's call as nn.Module's call runs it, with its
    hooks (None: it can, or there are none). Backward hooks wrap the forward's inputs and
    outputs in autograd functions of torch's; torch's own forward hooks (FSDP's all-gather
    and reshard, DDP's) talk to other processes. Both run as eager runs them, around the
    forward compiled on its own."""
    if module._backward_hooks or module._backward_pre_hooks or \
            _module_module._global_backward_hooks or _module_module._global_backward_pre_hooks:
        return "backward hooks"
    for hook in (*_module_module._global_forward_pre_hooks.values(),
                 *module._forward_pre_hooks.values(),
                 *_module_module._global_forward_hooks.values(),
                 *module._forward_hooks.values()):
        owner = getattr(hook, "__module__", None) or \
            getattr(getattr(hook, "__func__", None), "__module__", None) or ""
        if owner.split(".")[0] == "torch":
            return f"torch's own forward hooks ({getattr(hook, '__qualname__', hook)})"
    return None


def forward_hooks(module: torch.nn.Module) -> tuple[list, list]:
    """What nn.Module's call runs around the forward, in its order: the pre-hooks and the
    hooks, each as (table, hook id, hook, takes kwargs), globals first. (As _call_impl asks:
    a pre-hook takes kwargs by the module's table, even a global one.)"""
    pre = [(table, key, hook, key in module._forward_pre_hooks_with_kwargs)
           for table in (_module_module._global_forward_pre_hooks, module._forward_pre_hooks)
           for key, hook in table.items()]
    post = [(table, key, hook, key in module._forward_hooks_with_kwargs or
             key in _module_module._global_forward_hooks_with_kwargs)
            for table in (_module_module._global_forward_hooks, module._forward_hooks)
            for key, hook in table.items()]
    return pre, post


def hook_tables(module: torch.nn.Module | None) -> list[dict]:
    """The module's hook tables (None: the global ones)."""
    if module is None:
        return [getattr(_module_module, name) for name in _GLOBAL_HOOK_TABLES]
    return [getattr(module, name) for name in _MODULE_HOOK_TABLES]


def hook_tables_unchanged(handles_made: int, tables: list[dict], lengths: list[int],
                          keys: list[tuple]) -> bool:
    """Do the hook tables of the modules a capture inlined with their hooks still hold the
    hooks they held then? A guard: it runs on every call. Removing a hook shortens a table;
    registering one numbers a new handle, and only then are the keys compared.
    NOTE: a hook put into a table by hand, over an existing key, is not seen (as torch's
    own hooks API never does that)."""
    if list(map(len, tables)) != lengths:
        return False
    return RemovableHandle.next_id == handles_made or list(map(tuple, tables)) == keys


def is_thread_lock(value: Any) -> bool:
    """A threading.Lock or threading.RLock (C's or Python's)."""
    return isinstance(value, (_LOCK_TYPE, _RLOCK_TYPE, threading._PyRLock))


_LOCK_TYPE = type(threading.Lock())
_RLOCK_TYPE = type(threading.RLock())


def instance_forward(module: torch.nn.Module) -> Any:
    """A `forward` set on the module instance (it shadows the class's: accelerate's and
    PEFT's wrappers, a user's monkeypatch), or None."""
    return module.__dict__.get("forward")


def lookup_dynamo_backend(name: str) -> Any:
    """A torch.compile backend by name ("inductor", "aot_eager", ...)."""
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend(name)


def current_raw_stream(device_index: int) -> int:
    """The handle of the current CUDA stream of a device (what kernel launchers take)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


def cuda_spin(cycles: int) -> None:
    """Keep the current CUDA stream busy for about `cycles` GPU clock cycles (a kernel that
    spins), so that launches queued behind it run back to back, without the gaps of their
    launching."""
    torch.cuda._sleep(cycles)


def plain_view() -> Any:
    """A function (tensor, size, stride, offset) -> a tensor over `tensor`'s memory with that
    geometry, `offset` elements past `tensor`'s own storage offset, made in C++ without the
    dispatcher: no autograd view record, its own version counter. For a compiled graph's
    wrapper, which builds no autograd graph and hands such tensors to its kernels and library
    calls only (torch.compile's wrappers make their views with it). ~40% of as_strided's
    host time; where this torch lacks it, as_strided."""
    fast = getattr(torch._C._dynamo.guards, "_reinterpret_tensor", None)
    if fast is not None:
        return fast
    return lambda tensor, size, stride, offset: tensor.as_strided(
        size, stride, tensor.storage_offset() + offset)


def plain_empty(device: torch.device) -> Any:
    """A function (size, stride, dtype) -> an uninitialized tensor on `device` made without
    the dispatcher (what torch.compile's wrappers allocate with; on CUDA it allocates on the
    current device: the caller checks that it is `device`), or None where this torch lacks
    it."""
    name = {"cpu": "_empty_strided_cpu", "cuda": "_empty_strided_cuda"}.get(device.type)
    return getattr(torch._C._dynamo.guards, name, None) if name else None


def current_cuda_device() -> int:
    """The index of the current CUDA device."""
    return torch._C._cuda_getDevice()


def tensor_checker(examples: list[torch.Tensor]) -> Any:
    """One C++ check of many tensors' metadata: check(*tensors) is True when each tensor has
    the type, dispatch keys (device, requires_grad), dtype, shape and strides of its example.
    It keeps no reference to the examples. None where this torch lacks it (then ember's guards
    check in Python)."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        checker = TensorGuards(*examples,
                               tensor_check_names=[f"t{i}" for i in range(len(examples))],
                               dynamic_dims_sizes=[list(t.shape) for t in examples],
                               dynamic_dims_strides=[list(t.stride()) for t in examples])
        if not checker.check(*examples):
            return None
        return checker.check
    except Exception:  # the API moved: the Python checks stay correct, only slower
        return None


def data_attribute_getters() -> set:
    """How Dynamo's graphs spell `tensor.data` (a detached alias)."""
    getter = getattr(getattr(torch._C, "_autograd", None), "_get_data_attr", None)
    return {getter} if getter is not None else set()


def is_context_decorator(value: Any) -> bool:
    """An instance of torch's context managers that also decorate (torch.no_grad(),
    torch.enable_grad(), ...): callable objects of torch's, not graph operations."""
    return isinstance(value, _DecoratorContextManager)


# Is a torch.autocast region active, for any device type? (A C function: the per-call guard
# of every compiled function calls it directly.)
any_autocast = torch._C._is_any_autocast_enabled


def autocast_state() -> tuple | None:
    """What torch.autocast does now: None when no region is active (the common case), else
    (enabled, dtype) for the CPU and for CUDA."""
    if not any_autocast():
        return None
    return tuple((torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                 for device in ("cpu", "cuda"))


def trace_under_autocast(module: torch.fx.GraphModule, example_inputs: list[Any]
                         ) -> torch.fx.GraphModule:
    """`module` traced again into aten ops on fake tensors, under the autocast now active: its
    casts become _to_copy nodes of the graph (a meta-tensor lowering would not see them:
    autocast acts on tensors of its own device type only)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(module, tracing_mode="fake", _allow_non_fake_inputs=True)(*example_inputs)


def outside_dispatch_modes() -> Any:
    """A context in which no TorchDispatchMode is active (the tracer's own mode included):
    real tensors made in it are real, and ops on them run as eager runs them."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def attention_uses_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attn_mask: torch.Tensor | None, options: dict[str, Any]) -> bool:
    """Would eager's scaled_dot_product_attention on these tensors (real ones, on their
    device) run its math composite rather than a fused kernel (flash, memory-efficient,
    cuDNN)? torch decides by the inputs' shapes, strides, dtypes and the GPU."""
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice(
        query, key, value, attn_mask, options.get("dropout_p", 0.0),
        options.get("is_causal", False), scale=options.get("scale"),
        enable_gqa=options.get("enable_gqa", False))
    return choice == int(SDPBackend.MATH.value)


def storage_use_count(tensor: torch.Tensor) -> int:
    """How many tensors (TensorImpls: views, detached aliases, autograd's saved copies) hold
    `tensor`'s storage now. CUDA-graph replays hand out pool memory uncopied only while the
    previous replay's outputs are no longer held."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def storage_identity(tensor: torch.Tensor) -> int:
    """Equal for tensors that share one storage, fake tensors too (whose data pointers are all
    0): eager islands must see the aliases eager makes."""
    return tensor.untyped_storage()._cdata


def data_pointers_checker(pointers: list[int | None]) -> Any:
    """A function (tensors, positions) -> whether tensors[i].data_ptr() == pointers[i] for
    every i in positions. CUDA builds of torch do it in one C++ call (what a CUDA-graph
    replay checks of its parameters on every call); elsewhere, a loop in Python."""
    native = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
    if native is not None:
        # (its arguments are Python lists, not any sequence)
        return lambda tensors, positions: native(list(tensors), pointers, positions)
    data_ptr = torch.Tensor.data_ptr
    return lambda tensors, positions: all(data_ptr(tensors[i]) == pointers[i]
                                          for i in positions)


def call_with_forward(module: torch.nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
    """module(*args, **kwargs) with its hooks as they are (FSDP's all-gather before, its
    reshard after, a user's hooks) and `forward` run in place of the module's forward: the
    hooks read `module.forward`, so it is set on the instance for the call."""
    had = module.__dict__.get("forward")
    module.__dict__["forward"] = forward
    try:  # (_call_impl: not a call routed elsewhere by route_calls, which would come back)
        return module._call_impl(*args, **kwargs)
    finally:
        if had is None:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = had


def call_as_eager(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """module(*args, **kwargs) as eager runs it: hooks, the instance's forward — and not a
    call routed elsewhere by route_calls (which would come back here)."""
    return module._call_impl(*args, **kwargs)


def route_calls(module: torch.nn.Module, call: Any) -> None:
    """Calls of `module` (module(*args)) go to `call` (what nn.Module.compile() sets up)."""
    module.__dict__["_compiled_call_impl"] = call  # (a function: never a submodule)


def calls_routed(module: torch.nn.Module) -> bool:
    return module.__dict__.get("_compiled_call_impl") is not None


def is_distributed_data_parallel(module: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(module, DistributedDataParallel)


def scheduler_wrapped_optimizer(function: Any) -> torch.optim.Optimizer | None:
    """The optimizer whose `step` an LR scheduler replaced with `function`, else None.

    torch's LRScheduler wraps `optimizer.step` (an instance attribute, tagged
    `_wrapped_by_lr_sched`) to note that it ran; the optimizer is a weak reference in the
    wrapper's closure."""
    if not getattr(function, "_wrapped_by_lr_sched", False):
        return None
    for cell in getattr(function, "__closure__", None) or ():
        referent = cell.cell_contents
        if isinstance(referent, weakref.ref) and \
                isinstance(referent(), torch.optim.Optimizer):
            return referent()
    return None


def hooks_made() -> int:
    """How many hook handles torch has numbered so far (every register_*_hook makes one)."""
    return RemovableHandle.next_id


def modules_still_plain(handles_made: int, modules: list[torch.nn.Module],
                        instance_dicts: list[dict]) -> bool:
    """Are `modules` still called plainly — no hooks, no forward set on the instance — as
    when a capture inlined them? Torch numbers each hook's handle: while no hook was
    registered anywhere since, one comparison answers for hooks; else each module is looked
    at. (`instance_dicts`: the modules' __dict__s, looked up for "forward" in C.) A guard:
    it runs on every call."""
    if any(map(operator.contains, instance_dicts, itertools.repeat("forward"))):
        return False
    if RemovableHandle.next_id == handles_made:
        return True
    return not any(module_has_hooks(module) for module in modules)


# -- symbolic sizes (ember/capture/symbols.py) ---------------------------------------------
# NOTE: only captures that asked for a symbol come here: creating a ShapeEnv, and running
# fake tensors on it, costs many times the static path (see notes/2026-12-dynamic-shapes-*).
def make_symbolic_fake_mode() -> tuple[Any, Any]:
    """A FakeTensorMode over a fresh ShapeEnv (symbols, their ranges and the guards that
    branching on them records), and the ShapeEnv. Sizes are static unless symbolic_fake
    asks (a tensor the fake mode meets on its own stays static), and a data-dependent size
    (nonzero, a boolean mask) raises as without a ShapeEnv: a graph break, not an unbacked
    symbol."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv(assume_static_by_default=True, allow_scalar_outputs=False,
                         allow_dynamic_output_shape_ops=False)
    return _symbolic_fake_mode_class()(shape_env=shape_env, allow_non_fake_inputs=True), \
        shape_env


def refuses_symbolic_sizes(error: BaseException) -> bool:
    """Is `error` a C++ kernel's refusal of symbolic sizes ("SymIntArrayRef expected to
    contain only concrete integers": a kernel that takes plain ints only)?"""
    return "SymIntArrayRef expected to contain only concrete integers" in str(error)


# ops whose fake dispatch met that refusal: they run with torch's Python kernels from then on
_PYTHON_KERNELS: set[Any] = set()
_quiet = threading.local()


class _QuietRefusals(logging.Filter):
    """Drops fake_tensor's logged traceback of a meta kernel's failure while ember tries an
    op it may retry (the retry answers; the log would be a false alarm on the user's
    stderr)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_quiet, "depth", 0)


@functools.cache
def _symbolic_fake_mode_class() -> type:
    """FakeTensorMode that retries an op with torch's Python dispatcher on, as Dynamo traces,
    where the op's C++ kernel refuses symbolic sizes ("SymIntArrayRef expected to contain
    only concrete integers": `constant_pad_nd`, i.e. F.pad by an amount computed from a
    symbolic size, on torch 2.11 to 2.13). A fake dispatch skips such an op's Python meta
    kernel (in torch's meta table, not registered with the dispatcher); the Python
    dispatcher runs it. Only there: with the Python dispatcher on throughout, other ops'
    fake results change (a training step's views), so it stays off elsewhere."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode

    logging.getLogger(FakeTensorMode.__module__).addFilter(_QuietRefusals())

    class SymbolicFakeTensorMode(FakeTensorMode):
        def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func not in _PYTHON_KERNELS:
                _quiet.depth = getattr(_quiet, "depth", 0) + 1
                try:
                    return super().dispatch(func, types, args, kwargs)
                except RuntimeError as error:
                    if not refuses_symbolic_sizes(error):
                        raise
                    _PYTHON_KERNELS.add(func)
                finally:
                    _quiet.depth -= 1
            with enable_python_dispatcher():
                return super().dispatch(func, types, args, kwargs)

    return SymbolicFakeTensorMode


def _named(name: str) -> Any:
    """A torch source that only carries a name (ember's source expression): the ShapeEnv
    needs one per symbol, and names the symbol's origin by it (symbol_origins reads it)."""
    from torch._dynamo.source import ConstantSource

    return ConstantSource(name)


def symbolic_fake(fake_mode: Any, tensor: torch.Tensor, name: str,
                  ranges: list[tuple[int, int | None] | None]) -> torch.Tensor:
    """A fake of `tensor` whose dims with a range (min, max or None) are symbols, the others
    static."""
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        StatelessSymbolicContext,
        StrictMinMaxConstraint,
    )
    from torch.utils._sympy.value_ranges import ValueRanges

    dynamic = [DimDynamic.STATIC if r is None else DimDynamic.DYNAMIC for r in ranges]
    constraints = [None if r is None else StrictMinMaxConstraint(
        vr=ValueRanges(r[0], _unbounded() if r[1] is None else r[1]), warn_only=False)
        for r in ranges]
    context = StatelessSymbolicContext(dynamic_sizes=dynamic, constraint_sizes=constraints)
    return fake_mode.from_tensor(tensor, source=_named(name), symbolic_context=context)


def _unbounded() -> Any:
    from torch.utils._sympy.numbers import int_oo

    return int_oo


def symbolic_int(shape_env: Any, value: int, name: str) -> torch.SymInt:
    """A symbolic int whose hint is `value` (a Python int from the call, used as a size)."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    source = _named(name)
    symbol = shape_env.create_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
    return shape_env.create_symintnode(symbol, hint=value, source=source)


def expression_of(value: Any) -> Any:
    """The sympy expression a SymInt/SymFloat/SymBool stands for."""
    return value.node.expr


def symbol_origins(shape_env: Any) -> dict[Any, tuple[str, str | None, int | None]]:
    """Each symbol's first origin: (the name symbolic_fake/symbolic_int was given, "size" /
    "stride" / "storage_offset" or None for an int, the dim or None)."""
    origins = {}
    for symbol, sources in shape_env.var_to_sources.items():
        source = sources[0]
        base = getattr(source, "base", None)
        if base is None:
            origins[symbol] = (source.name, None, None)
        else:
            kind = source.prop.name.lower()
            origins[symbol] = (base.name, kind, source.idx)
    return origins


def symbol_range(shape_env: Any, symbol: Any) -> tuple[int, int | None]:
    """The range a symbol is known to lie in (after the guards): (lower, upper or None)."""
    import sympy

    bounds = shape_env.var_to_range[symbol]
    upper = bounds.upper
    return int(bounds.lower), (None if upper in (_unbounded(), sympy.oo) else int(upper))


def shape_guards(shape_env: Any) -> list[Any]:
    """The relations the ShapeEnv recorded while fake tensors branched on symbols (sympy
    booleans), in the order they were met."""
    return [guard.expr for guard in shape_env.guards]


def render_python(expression: Any, names: dict[Any, str]) -> str:
    """A sympy expression over symbols as Python source, symbols renamed by `names`."""
    import sympy
    from torch.utils._sympy.printers import PythonPrinter

    renamed = expression.xreplace({s: sympy.Symbol(n, integer=True) for s, n in names.items()})
    return PythonPrinter().doprint(renamed)


def dynamo_dim_marks(tensor: torch.Tensor) -> tuple[dict[int, tuple[int | None, int | None]],
                                                    set[int]]:
    """torch._dynamo.mark_dynamic / maybe_mark_dynamic / mark_static marks on a tensor:
    ({dim: (min, max)} to make symbolic, {dims} to keep static)."""
    dynamic: dict[int, tuple[int | None, int | None]] = {}
    marked = getattr(tensor, "__dict__", {})
    for dim in (*marked.get("_dynamo_dynamic_indices", ()),
                *marked.get("_dynamo_weak_dynamic_indices", ())):
        dynamic[dim] = (None, None)
    for bounds in marked.get("_dynamo_dynamic_range", ()):
        dynamic[bounds.dim] = (bounds.min, bounds.max)
    return dynamic, set(marked.get("_dynamo_static_indices", ()))


def opinfo_database() -> list[Any]:
    """PyTorch's OpInfo database (op_db: each op with its sample inputs and supported dtypes),
    for tests/opinfo. Imported only when asked: it loads torch's test machinery."""
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def opinfo_tolerance_overrides(op: Any, dtype: torch.dtype, device_type: str
                               ) -> list[tuple[float, float]]:
    """(atol, rtol) of each tolerance or precision override an OpInfo declares for `dtype` on
    `device_type` (its decorators, whichever test they serve)."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride

    found = []
    for decorate in op.decorators:
        if getattr(decorate, "device_type", None) not in (None, device_type):
            continue
        for decorator in getattr(decorate, "decorators", [decorate]):
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                found.append((decorator.d[dtype].atol, decorator.d[dtype].rtol))
            elif isinstance(decorator, precisionOverride) and dtype in decorator.d:
                found.append((decorator.d[dtype], 0.0))
    return found


def is_compiler_config_patch(value: Any) -> bool:
    """Is `value` a patch of one of torch's configuration modules (torch._dynamo.config.patch,
    torch._inductor.config.patch, or Dynamo's proxy of one), entered as a context manager?"""
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    return (module == "torch.utils._config_module" and cls.__name__ == "ConfigPatch") or \
        (module == "torch._dynamo.decorators" and cls.__name__ == "DynamoConfigPatchProxy")


# -- symbolic sizes below the lowering (ember/lower/symbolic.py) -----------------------------
def fake_mode_of(value: Any) -> Any:
    """The FakeTensorMode a fake tensor (or a SymInt's ShapeEnv's tensors) belongs to, or
    None for a real tensor."""
    return getattr(value, "fake_mode", None)


def shape_env_of(value: Any) -> Any:
    """The ShapeEnv behind a SymInt."""
    return value.node.shape_env


def symbolic_expression(value: Any) -> Any:
    """A SymInt's sympy expression, with the ShapeEnv's replacements applied (s1 -> s0 once
    a guard made them equal), or the int itself."""
    if not isinstance(value, torch.SymInt):
        return value
    node = value.node
    constant = node.maybe_as_int()
    if constant is not None:
        return int(constant)
    return node.shape_env.replace(node.expr)


def polynomial_terms(expression: Any) -> list[tuple[list[Any], int]] | None:
    """A sympy expression as (symbols, coefficient) terms of a polynomial with int
    coefficients, or None when it is not one (a FloorDiv, a Mod, a Max)."""
    import sympy

    if isinstance(expression, int):
        return [([], expression)]
    if expression.is_Integer:
        return [([], int(expression))]
    if expression.is_Symbol:
        return [([expression], 1)]
    if isinstance(expression, sympy.Add):
        terms = []
        for argument in expression.args:
            part = polynomial_terms(argument)
            if part is None:
                return None
            terms += part
        return terms
    if isinstance(expression, sympy.Mul):
        terms = [([], 1)]
        for argument in expression.args:
            part = polynomial_terms(argument)
            if part is None:
                return None
            terms = [(a + b, x * y) for a, x in terms for b, y in part]
        return terms
    if isinstance(expression, sympy.Pow) and expression.exp.is_Integer and expression.exp > 0:
        base = polynomial_terms(expression.base)
        if base is None:
            return None
        terms = [([], 1)]
        for _ in range(int(expression.exp)):
            terms = [(a + b, x * y) for a, x in terms for b, y in base]
        return terms
    return None


def min_max_arguments(expression: Any) -> tuple[str, tuple] | None:
    """("max" or "min", its arguments) of a sympy Max/Min (`x[:, :-1]` sizes as
    Max(1, s - 1)), else None."""
    import sympy
    from torch.utils._sympy import functions

    if isinstance(expression, (sympy.Max, getattr(functions, "Max", sympy.Max))):
        return "max", tuple(expression.args)
    if isinstance(expression, (sympy.Min, getattr(functions, "Min", sympy.Min))):
        return "min", tuple(expression.args)
    return None


def known_equal(a: Any, b: Any) -> bool:
    """Are two sizes (or shapes) equal for every value of their symbols? Never guards: `==`
    of SymInts read as a bool would pin a symbol to the value it has now (a sequence length
    of 4 compared with a batch of 4)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if isinstance(a, (tuple, list, torch.Size)):
        return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b))
    if not isinstance(a, torch.SymInt) and not isinstance(b, torch.SymInt):
        return a == b
    return statically_known_true(a == b)


def size_hint(value: Any) -> int:
    """A symbolic size's value in the call being compiled (an int as it is): for choices
    that only a run can make (eager's attention kernel), never for correctness."""
    if not isinstance(value, torch.SymInt):
        return int(value)
    constant = value.node.maybe_as_int()
    return int(constant) if constant is not None else int(value.node.hint)


def symbol_bounds(value: Any, symbol: Any) -> tuple[int, int | None]:
    """A torch symbol's range in the ShapeEnv of `value` (a SymInt)."""
    return symbol_range(value.node.shape_env, symbol)


def is_symbol(expression: Any) -> bool:
    return getattr(expression, "is_Symbol", False)


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


def convolution_uses_onednn(x: torch.Tensor, weight: torch.Tensor, stride: list[int],
                            padding: list[int], dilation: list[int], groups: int) -> bool:
    """Would eager's convolution of these tensors call oneDNN (which reorders the weight on
    every call)? torch decides by the tensors' geometry and the thread count of this moment."""
    backend = torch._C._select_conv_backend(x, weight, None, stride, padding, dilation, False,
                                            [0] * len(stride), groups, None)
    return backend == torch._C._ConvBackend.Mkldnn


def suggest_memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """The memory format torch's kernels read `tensor`'s strides as (C++'s
    suggest_memory_format: channels-last or contiguous), for real or meta tensors."""
    from torch._prims_common import suggest_memory_format as suggest

    return suggest(tensor)
