"""The one place ember touches private torch APIs: no other module of ember imports them.

Everything here has a test on the installed torch version (tests/test_torch_internals.py), so a
torch upgrade that moves one of these breaks one obvious test instead of ember at large.

This module holds ops and their schemas, fake tensors and dispatch modes, pytree, grad mode and
autocast, CUDA and storage helpers, eager's kernel choices (attention, convolution) and the
OpInfo database. Its submodules hold the rest, and every name of theirs that ember uses is
re-exported here, so that callers spell each one `torch_internals.NAME`:

- dynamo.py: torch._dynamo without importing it (the stand-in fake tensors run with, deferred
  disable), backend registration, Dynamo's markers, config and stance;
- symbolic.py: the symbolic fake mode, ShapeEnv and sympy helpers;
- modules.py: nn.Module's call (hooks, forward routing), DDP and LR-scheduler detection;
- fakes.py: a plain tensor's fake made directly; FakeTensorMode's log of failed ops kept quiet.

NOTE: a test's monkeypatch of `torch_internals.NAME` reaches the callers outside this package
(they look NAME up here at call time), not a call from inside the submodule that defines NAME
(modules_still_plain's module_has_hooks): patch the submodule for that.
"""

from __future__ import annotations

import itertools
import threading
import types
from typing import Any

import torch
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

from ember.torch_internals.dynamo import (  # noqa: F401  (re-exported)
    _dynamo_stand_in,
    _PlainSource,
    allowed_in_graph,
    chain_compiler_reset,
    defer_dynamo_disable,
    disabled_reason,
    dynamo_compiling_tests,
    dynamo_error_on_recompile,
    dynamo_imported,
    dynamo_marker,
    dynamo_recompile_limit,
    dynamo_stance,
    dynamo_stance_is_default,
    is_compiler_config_patch,
    lookup_dynamo_backend,
    register_dynamo_backend,
    reset_dynamo,
    torch_compiled_original,
)
from ember.torch_internals.modules import (  # noqa: F401  (re-exported)
    call_as_eager,
    call_with_forward,
    calls_routed,
    forward_hooks,
    hook_tables,
    hook_tables_unchanged,
    hooks_made,
    hooks_run_apart,
    instance_forward,
    is_distributed_data_parallel,
    module_has_hooks,
    modules_still_plain,
    route_calls,
    scheduler_wrapped_optimizer,
)
from ember.torch_internals.symbolic import (  # noqa: F401  (re-exported)
    LOWEST,
    ConcreteSizesAsked,
    calling_composites,
    dynamo_dim_marks,
    expression_of,
    fake_mode_of,
    is_symbol,
    is_symbolic,
    known_equal,
    known_true,
    make_symbolic_fake_mode,
    min_max_arguments,
    polynomial_terms,
    ranged_symbol,
    refuses_symbolic_sizes,
    render_python,
    shape_env_of,
    shape_guards,
    size_hint,
    symbol_bounds,
    symbol_hint,
    symbol_origins,
    symbol_range,
    symbolic_expression,
    symbolic_fake,
    symbolic_int,
)

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def is_op_overload(value: Any) -> bool:
    return isinstance(value, OpOverload)


def op_namespace_name(value: Any) -> str | None:
    """The name of an op namespace (`torch.ops.aten` -> "aten"), None for anything else."""
    if isinstance(value, torch._ops._OpNamespace) and \
            getattr(torch.ops, value.name, None) is value:
        return value.name
    return None


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


def arguments_by_name(func: OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by the names of `func`'s schema (defaults not filled in)."""
    names = [argument.name for argument in schema_of(func).arguments]
    return dict(zip(names, args), **kwargs)


def overload_name(func: OpOverload) -> str:
    return func._overloadname


def decomposition_of(func: OpOverload) -> Any:
    """torch's Python decomposition of `func` (torch._decomp's table), or None."""
    from torch._decomp import decomposition_table

    return decomposition_table.get(func)


class TorchDispatchMode(_TorchDispatchMode):
    """torch's TorchDispatchMode, for ember's modes: their dispatch does not import
    torch._dynamo on its first call (defer_dynamo_disable)."""

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        defer_dynamo_disable(cls.__dict__.get("__torch_dispatch__"), stand_in=False)


def make_fake_mode() -> Any:
    """A FakeTensorMode: tensors with real metadata (device included) and no data."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    defer_dynamo_disable(FakeTensorMode.__torch_dispatch__)
    with _dynamo_stand_in():
        return FakeTensorMode(allow_non_fake_inputs=True)


def fake_of(mode: Any, tensor: torch.Tensor) -> torch.Tensor:
    """`mode`'s fake of a real tensor, named by a plain source, without a structured trace
    (it extracts a Python traceback per storage, and symbolizing it imports torch._dynamo).
    A plain leaf's is made directly (fakes.quick_fake)."""
    from ember.torch_internals.fakes import quick_fake

    quick = quick_fake(mode, tensor)
    if quick is not None:
        return quick
    with _dynamo_stand_in():
        return mode.from_tensor(tensor, source=_PlainSource(f"__ember_fake{next(_fakes)}"),
                                trace=False)


_fakes = itertools.count()


def quiet_failed_meta_runs() -> Any:
    """A context: FakeTensorMode's log of an op failing on fakes dropped in this thread
    (fakes.py says why)."""
    from ember.torch_internals.fakes import quiet_failed_meta_runs as quiet

    return quiet()


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


# Sets grad mode (torch's own context managers call it): a graph's grad-mode switches are
# nodes calling it.
set_grad_enabled = torch._C._set_grad_enabled


def autocast_region_functions() -> tuple[Any, Any]:
    """torch.autocast's own enter and exit functions (what Dynamo's graphs call for an
    autocast region): a captured region's graph nodes call them, and capture enters the
    real region with them while it traces inside."""
    from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

    return _enter_autocast, _exit_autocast


def autocast_arguments(region: torch.autocast) -> tuple:
    """A torch.autocast object's settings, as torch.autocast(...) takes them: (device_type,
    dtype, enabled, cache_enabled)."""
    return region.device, region.fast_dtype, region._enabled, region._cache_enabled


def custom_op_overload(value: Any) -> OpOverload | None:
    """The op a torch.library.custom_op function calls (a CustomOpDef: torch.ops.ns.name's
    default overload), or None for anything else."""
    from torch._library.custom_ops import CustomOpDef

    return value._opoverload if isinstance(value, CustomOpDef) else None


def is_thread_lock(value: Any) -> bool:
    """A threading.Lock or threading.RLock (C's or Python's)."""
    return isinstance(value, (_LOCK_TYPE, _RLOCK_TYPE, threading._PyRLock))


_LOCK_TYPE = type(threading.Lock())
_RLOCK_TYPE = type(threading.RLock())


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


def parse_to(*args: Any, **kwargs: Any) -> tuple:
    """What nn.Module.to and Tensor.to make of their arguments: (device, dtype, non_blocking,
    memory_format), each None where not given."""
    return torch._C._nn._parse_to(*args, **kwargs)


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


def dispatch_mode_stack_function() -> Any:
    """torch's query of the TorchDispatchModes active now (a list: torch.nn.MultiheadAttention
    asks it whether make_fx traces it)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return _get_current_dispatch_mode_stack


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
    0): eager islands must see the aliases eager makes. A sparse or other non-strided tensor
    has no storage of its own to share: its own identity."""
    if tensor.layout is not torch.strided:
        return id(tensor)
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


def convolution_uses_onednn(x: torch.Tensor, weight: torch.Tensor, stride: list[int],
                            padding: list[int], dilation: list[int], groups: int) -> bool:
    """Would eager's convolution of these tensors call oneDNN (which reorders the weight on
    every call)? torch decides by the tensors' geometry and the thread count of this moment."""
    return _backend(x, weight, None, None, stride, padding, dilation, False, [0] * len(stride),
                    groups) == torch._C._ConvBackend.Mkldnn


def convolution_backend(x: torch.Tensor, weight: torch.Tensor, stride: list[int],
                        padding: list[int], dilation: list[int], groups: int) -> str:
    """The kernel family eager's convolution of these tensors (no bias, not transposed) would
    call: `Cudnn`, `CudaDepthwise2d`, `Mkldnn`, `Slow2d`, ... (torch decides by the tensors'
    geometry, dtype and device, and by switches such as torch.backends.cudnn.enabled)."""
    return _backend(x, weight, None, None, stride, padding, dilation, False, [0] * len(stride),
                    groups).name


def convolution_memory_format(x: torch.Tensor, weight: torch.Tensor, bias: Any,
                              bias_sizes: Any, stride: list[int], padding: list[int],
                              dilation: list[int], transposed: bool,
                              output_padding: list[int], groups: int) -> torch.memory_format:
    """The memory format eager's convolution of operands of this geometry (or its backward,
    given `bias_sizes`) lays its results out in: torch's choice of kernel family for them,
    then that family's format — the question torch's fake tensors ask. `x` and `weight` are
    tensors of the operands' geometry on their device (uninitialized will do: no data is
    read)."""
    backend = _backend(x, weight, bias, bias_sizes, stride, padding, dilation, transposed,
                       output_padding, groups)
    if weight.ndim == 3:  # (a 1-d convolution runs as a 2-d one of height 1)
        x = torch.empty(x.shape, dtype=x.dtype, device=x.device).unsqueeze(2)
        weight = weight.unsqueeze(2)
    return torch._C._conv_determine_backend_memory_format(x, weight, backend)


def _backend(x: torch.Tensor, weight: torch.Tensor, bias: Any, bias_sizes: Any,
             stride: list[int], padding: list[int], dilation: list[int], transposed: bool,
             output_padding: list[int], groups: int) -> Any:
    """torch's choice of convolution kernel family (a torch._C._ConvBackend)."""
    return torch._C._select_conv_backend(x, weight, bias, stride, padding, dilation,
                                         transposed, output_padding, groups, bias_sizes)


_cudnn_enabled = torch._C._get_cudnn_enabled
_cudnn_benchmark = torch._C._get_cudnn_benchmark
_cudnn_deterministic = torch._C._get_cudnn_deterministic
_deterministic_algorithms = torch._C._get_deterministic_algorithms
if hasattr(torch._C, "_get_fp32_precision_getter"):
    _fp32_precision = torch._C._get_fp32_precision_getter

    def _cudnn_allow_tf32() -> bool:
        """Eager's convolution asks for the convolutions' own float32 precision."""
        return _fp32_precision("cuda", "conv") == "tf32"
else:  # (torch before the per-op precision switches)
    _cudnn_allow_tf32 = torch._C._get_cudnn_allow_tf32
_cudnn_call = torch.cudnn_convolution
_aten_convolution = torch.ops.aten.convolution.default


def cudnn_convolution(x: torch.Tensor, weight: torch.Tensor, stride: list[int],
                      padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """aten.convolution (no bias, not transposed) of operands that eager hands to cuDNN
    (convolution_backend says `Cudnn`), called as eager's dispatch calls it — cuDNN's entry
    point with the switches of this moment, which lays out the operands and the result as
    aten.convolution does — without that dispatch's own host time (argument checks, the
    backend's choice: 5-10 us a call). With cuDNN switched off since, aten.convolution."""
    if not _cudnn_enabled():
        return _aten_convolution(x, weight, None, stride, padding, dilation, False,
                                 [0] * len(stride), groups)
    return _cudnn_call(x, weight, padding, stride, dilation, groups, _cudnn_benchmark(),
                       _cudnn_deterministic() or _deterministic_algorithms(),
                       _cudnn_allow_tf32())


def suggest_memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """The memory format torch's kernels read `tensor`'s strides as (C++'s
    suggest_memory_format: channels-last or contiguous), for real or meta tensors."""
    from torch._prims_common import suggest_memory_format as suggest

    return suggest(tensor)


def associative_scan_function() -> Any:
    """torch._higher_order_ops.associative_scan.associative_scan, or None where this torch has
    none (capture runs it in its generic mode: capture/vmap_rules.py)."""
    try:
        from torch._higher_order_ops.associative_scan import associative_scan
    except ImportError:
        return None
    return associative_scan


def pytree_leaves_function() -> Any:
    """torch.utils._pytree.tree_leaves (a generator's `yield from` inside: capture answers it
    by a rule, capture/vmap_rules.py)."""
    from torch.utils import _pytree

    return _pytree.tree_leaves

