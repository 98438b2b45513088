"""The layouts eager gives library calls' results, where the meta kernels say otherwise.

Meta kernels usually agree with eager, but not always (size-1 dims, Python decompositions that
reorder operands, CPU kernels' own rules), and the result's layout is observable. For pointwise
ops ember reproduces TensorIterator's choice, step by step as aten/src/ATen/TensorIterator.cpp
makes it; `eager_layout` applies that and the op-by-op corrections (a run on stand-ins where
only the real op knows). Nothing here lowers an op.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from ember import torch_internals
from ember.ir.graph import row_major, suggested_layout
from ember.torch_internals import tree_flatten, tree_map


def non_overlapping_and_dense(tensor: torch.Tensor) -> bool:
    dims = sorted((d for d in range(tensor.ndim) if tensor.shape[d] != 1),
                  key=lambda d: tensor.stride(d))
    step = 1
    for d in dims:
        if tensor.stride(d) != step:
            return False
        step *= tensor.shape[d]
    return True


def like_strides(tensor: torch.Tensor) -> tuple[int, ...]:
    """Strides of empty_like(tensor): its own when it is non-overlapping and dense."""
    if non_overlapping_and_dense(tensor):
        return tuple(tensor.stride())
    return elementwise_strides([tensor], tuple(tensor.shape), wrapped_scalars=True)


def elementwise_strides(tensors: Sequence[torch.Tensor], shape: Sequence[int],
                        wrapped_scalars: bool = False) -> tuple[int, ...]:
    """Strides of the result of a TensorIterator op over `tensors` (in argument order) broadcast
    to `shape`; `wrapped_scalars`: Python numbers are operands too (`x * 2`)."""
    shape = tuple(shape)
    ndim = len(shape)
    # fast set-up: operands of the result's shape that all share one layout
    if tensors and not wrapped_scalars and \
            all(torch_internals.known_equal(tuple(t.shape), shape) for t in tensors):
        if all(t.is_contiguous() for t in tensors):
            return row_major(shape)
        if ndim == 4 and all(t.is_contiguous(memory_format=torch.channels_last)
                             for t in tensors):
            return tuple(torch.empty(shape, device="meta")
                         .to(memory_format=torch.channels_last).stride())
        if all(non_overlapping_and_dense(t) and t.stride() == tensors[0].stride()
               for t in tensors):
            return tuple(tensors[0].stride())
    if ndim <= 1:
        return row_major(shape)
    # reorder_dimensions: broadcast dims (stride 0) never decide; equal strides put the
    # smaller dim first; ambiguous pairs keep their order
    operand_strides = []
    for tensor in tensors:
        lead = ndim - tensor.ndim
        operand_strides.append([0] * lead + [
            0 if tensor.shape[d] == 1 and shape[lead + d] != 1 else tensor.stride(d)
            for d in range(tensor.ndim)])

    def should_swap(dim0: int, dim1: int) -> int:
        for strides in operand_strides:
            stride0, stride1 = strides[dim0], strides[dim1]
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 != stride1:
                return -1 if stride0 < stride1 else 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))  # perm[0] is the fastest-moving dim
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    strides, step = [0] * ndim, 1
    for d in perm:
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def _batch_norm_statistics(training_argument: int | None):
    """CPU's batch norm allocates its result as `empty_like(input,
    input.suggest_memory_format())`: row-major unless the input is channels-last, where the
    meta kernel keeps any dense input's strides (PatchTST normalizes a transposed (batch,
    channels, length) view). In eval it returns empty statistics; the meta kernel,
    per-channel ones."""

    def fix(args, out):
        result, mean, invstd = out
        if result.ndim >= 2:
            result = torch.empty_strided(result.shape, suggested_layout(result.shape, args[0]),
                                         dtype=result.dtype, device="meta")
        if training_argument is not None and args[training_argument]:
            return result, mean, invstd
        return (result, torch.empty((0,), dtype=mean.dtype, device="meta"),
                torch.empty((0,), dtype=invstd.dtype, device="meta"))

    return fix


def run_on_stand_ins(func, args, kwargs, out, device_type: str,
                      row_major_as_meta: bool = True) -> Any:
    """`out` with the layouts the real op gives, from one run on stand-in tensors (zeros) of
    the arguments' geometry on the device. For convolutions of symbolic sizes whose input or
    weight is not row-major (convolution_layouts answers the others without a run): oneDNN's,
    the slow path's and cuDNN's rules for channels-last results are not the meta kernel's; for SVD,
    LAPACK's column-major factors against the meta kernel's guess; for the attention kernels'
    backward kernels (autodiff/library_rules.py). (Row-major inputs keep the meta kernel's
    answer where `row_major_as_meta`: no run at compile time.)"""
    leaves, spec = tree_flatten((args, kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if row_major_as_meta and all(t.is_contiguous() for t in tensors):
        return out
    key = _geometry(func, device_type, leaves, spec)
    ran = _ran_by_geometry.get(key) if key is not None else None
    if ran is None:
        with torch_internals.outside_dispatch_modes(), torch.no_grad():
            def stand_in(value: Any) -> Any:
                if isinstance(value, torch.Tensor):  # (zeros: a factorization must converge)
                    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                               device=device_type).zero_()
                return value

            ran = fresh_meta(func(*tree_map(stand_in, args), **tree_map(stand_in, kwargs)))
        if key is not None:
            _ran_by_geometry[key] = ran
    return fresh_meta(ran)


CONVOLUTIONS = frozenset({torch.ops.aten.convolution.default,
                          torch.ops.aten.convolution_backward.default})


def convolution_layouts(func, args, kwargs, out, device_type: str) -> Any:
    """`out` (a convolution's or its backward's meta results) laid out as eager's kernel lays
    them out: in the memory format of the kernel family torch picks for operands of this
    geometry (torch_internals.convolution_memory_format; asked of uninitialized tensors on
    the device, once per geometry), the bias's gradient as it is; where an image's format is
    ambiguous and a result's is not, a run on stand-ins. None where a size is symbolic. Runs
    of every convolution cost more: MobileNetV3's cold first call on an H100 4.66 s with
    them, 1.91 without (its 46 channels-last convolutions planned and loaded by cuDNN at
    compile time, beside Triton's start)."""
    named = torch_internals.arguments_by_name(func, args, kwargs)
    x, weight = named["input"], named["weight"]
    images = [x] + ([named["grad_output"]] if "grad_output" in named else [])
    if not all(type(n) is int for t in (*images, weight) for n in (*t.shape, *t.stride())):
        return None
    results = [out] if isinstance(out, torch.Tensor) else [t for t in out if t is not None]
    if any(_both_formats(t) for t in images) and \
            not all(_both_formats(t) for t in results):
        return run_on_stand_ins(func, args, kwargs, out, device_type, row_major_as_meta=False)
    bias = named.get("bias")
    options = (tuple(named["stride"]), tuple(named["padding"]), tuple(named["dilation"]),
               bool(named["transposed"]), tuple(named["output_padding"]), int(named["groups"]))
    bias_sizes = named.get("bias_sizes")
    memory_format = _convolution_format(
        _geometry_of(x), _geometry_of(weight), None if bias is None else _geometry_of(bias),
        None if bias_sizes is None else tuple(bias_sizes), options, device_type,
        *_kernel_switches())

    def laid_out(result: Any) -> Any:
        if not isinstance(result, torch.Tensor):
            return result
        shape = tuple(result.shape)
        if len(shape) == 3 and memory_format == torch.channels_last:
            strides = torch.empty((shape[0], shape[1], 1, shape[2]), device="meta",
                                  memory_format=memory_format).squeeze(2).stride()
        elif memory_format == torch.contiguous_format and result.is_contiguous():
            return result
        else:
            strides = torch.empty(shape, device="meta", memory_format=memory_format).stride()
        return torch.empty_strided(shape, strides, dtype=result.dtype, device="meta")

    if func is torch.ops.aten.convolution.default:
        return laid_out(out)
    grad_input, grad_weight, grad_bias = out
    return laid_out(grad_input), laid_out(grad_weight), grad_bias


def _both_formats(tensor: torch.Tensor) -> bool:
    """Is the tensor both row-major and channels-last (size-1 dims: a squeeze-excite's 1x1
    image, a 1x1 convolution's weight)? Its results' layouts then matter only where they are
    not so too: on an H100 the weight gradient (3x3) of a backward over a 1x1 image came out
    row-major where the format said channels-last."""
    if tensor.ndim not in (4, 5):
        return False
    channels_last = torch.channels_last if tensor.ndim == 4 else torch.channels_last_3d
    return tensor.is_contiguous() and tensor.is_contiguous(memory_format=channels_last)


def _geometry_of(tensor: torch.Tensor) -> tuple:
    return tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype


@functools.cache
def _convolution_format(x: tuple, weight: tuple, bias: tuple | None, bias_sizes: tuple | None,
                        options: tuple, device_type: str, *_switches: Any
                        ) -> torch.memory_format:
    """(`_switches`: eager's choice of kernel family depends on them too)"""
    def stand_in(geometry: tuple) -> torch.Tensor:
        shape, strides, dtype = geometry
        return torch.empty_strided(shape, strides, dtype=dtype, device=device_type)

    stride, padding, dilation, transposed, output_padding, groups = options
    with torch_internals.outside_dispatch_modes():
        return torch_internals.convolution_memory_format(
            stand_in(x), stand_in(weight), None if bias is None else stand_in(bias),
            None if bias_sizes is None else list(bias_sizes), list(stride), list(padding),
            list(dilation), transposed, list(output_padding), groups)


def _kernel_switches() -> tuple:
    """The switches that steer eager's choice of a kernel (and so of its results' layout):
    the thread count among them (a CPU convolution's family depends on it)."""
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    return (torch.get_num_threads(), cudnn.enabled, cudnn.benchmark, cudnn.deterministic,
            torch.backends.mkldnn.enabled, torch.are_deterministic_algorithms_enabled(),
            cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled(), cuda.cudnn_sdp_enabled())


def fresh_meta(value: Any) -> Any:
    """`value` with each tensor replaced by a new meta tensor of its geometry (a kept answer
    handed out again: the copies share no storage with it or with each other)."""
    return tree_map(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                  device="meta")
                    if isinstance(t, torch.Tensor) else t, value)


# run_on_stand_ins' answers by the call's geometry: a model's repeated layers ask the same
# question (GPT-2's twelve attention backwards: 0.25 s of a first call on the CPU)
_ran_by_geometry: dict[tuple, Any] = {}


def _geometry(func: Any, device_type: str, leaves: list, spec: Any) -> tuple | None:
    """What a run on stand-ins depends on: the op, the device, every tensor's shape, strides
    and dtype, the other arguments, and the switches that steer eager's choice of kernel;
    None where some argument is not a plain value (a symbolic size: no memo)."""
    parts: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append((tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype))
        elif leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype,
                                               torch.device, torch.memory_format)):
            parts.append((type(leaf), leaf))
        else:
            return None
    if not all(type(n) is int for part in parts if isinstance(part[0], tuple)
               for n in (*part[0], *part[1])):
        return None
    return (func, device_type, str(spec), tuple(parts), _kernel_switches())


# op -> whether row-major operands may keep the meta kernel's layout (no run then)
LAYOUTS_FROM_A_RUN = {torch.ops.aten.convolution.default: True,
                      torch.ops.aten.convolution_backward.default: True,
                      torch.ops.aten._linalg_svd.default: False,
                      # LAPACK's column-major eigenvectors, where the meta kernel says
                      # row-major
                      torch.ops.aten.linalg_eig.default: False,
                      # pocketfft's and cuFFT's results are row-major over the transformed
                      # dims, where the meta kernels permute them
                      torch.ops.aten._fft_r2c.default: False,
                      torch.ops.aten._fft_c2c.default: False,
                      torch.ops.aten._fft_c2r.default: False}

# Results of CPU kernels that differ in shape from the meta kernels' (by op).
CPU_RESULTS = {
    torch.ops.aten.native_batch_norm.default: _batch_norm_statistics(5),
    torch.ops.aten._native_batch_norm_legit_no_training.default: _batch_norm_statistics(None),
}

# Ops whose CPU kernels allocate their result with empty_like(input), where the meta kernels
# (or TensorIterator, for pointwise ones) may choose other strides for size-1 dims.
INPUT_LAYOUT_RESULTS = frozenset({
    torch.ops.aten.hardtanh.default, torch.ops.aten.relu6.default,
    torch.ops.aten.nan_to_num.default, torch.ops.aten.deg2rad.default,
    torch.ops.aten.rad2deg.default, torch.ops.aten.flip.default,
})

# Ops whose CPU kernels allocate their result in the input's suggested memory format
# (channels-last when the input is, else row-major), where the meta kernels say row-major:
# padding and shuffling, whose layouts on other devices come from a run on stand-ins; and
# roll, whose CPU kernel is a cat of two narrowed pieces (CUDA's: row-major, as meta says).
PADS_AND_SHUFFLES = frozenset({
    torch.ops.aten.reflection_pad2d.default, torch.ops.aten.reflection_pad3d.default,
    torch.ops.aten.replication_pad2d.default, torch.ops.aten.replication_pad3d.default,
    torch.ops.aten.channel_shuffle.default, torch.ops.aten.native_channel_shuffle.default})
CPU_SUGGESTED_LAYOUT_RESULTS = PADS_AND_SHUFFLES | {torch.ops.aten.roll.default}


# Ops whose kernels return row-major results whatever their inputs' layout, where the meta
# kernels follow the input's layout (log_sigmoid's only on the CPU; `2 ** x`: pow.Scalar's
# structured kernel allocates its result with no strides asked).
ROW_MAJOR_RESULTS = frozenset({torch.ops.aten.log_sigmoid_forward.default,
                               torch.ops.aten.rrelu_with_noise.default,
                               torch.ops.aten.pow.Scalar, torch.ops.aten.float_power.Scalar})
ROW_MAJOR_ON_CPU_ONLY = frozenset({torch.ops.aten.log_sigmoid_forward.default})


def eager_layout(func, args, kwargs, out, device_type: str = "cpu") -> Any:
    """`out`, with the strides eager's CPU kernel gives it where the meta kernel differs.

    NOTE: some pointwise ops (copysign, xlogy, logical_and, ...) get their meta kernel from
    a Python decomposition whose operand order differs from the aten op's, so their meta
    strides are not eager's; TensorIterator's rule over the op's own operands is.
    The special cases are CPU kernels' layouts (CUDA's follow the meta kernels there).
    """
    if func in CPU_RESULTS and device_type == "cpu":
        return CPU_RESULTS[func](args, out)
    if func in CONVOLUTIONS:
        laid = convolution_layouts(func, args, kwargs, out, device_type)
        if laid is not None:
            return laid
    if func in LAYOUTS_FROM_A_RUN:
        return run_on_stand_ins(func, args, kwargs, out, device_type,
                                 LAYOUTS_FROM_A_RUN[func])
    if func in ROW_MAJOR_RESULTS and (device_type == "cpu"
                                      or func not in ROW_MAJOR_ON_CPU_ONLY):
        return tree_map(lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")
                        if isinstance(t, torch.Tensor) else t, out)
    if not isinstance(out, torch.Tensor) or out.numel() == 0 or out.ndim < 2:
        return out
    if func in CPU_SUGGESTED_LAYOUT_RESULTS and device_type == "cpu":
        strides = suggested_layout(tuple(out.shape), args[0])
    elif func in PADS_AND_SHUFFLES:
        return run_on_stand_ins(func, args, kwargs, out, device_type)
    elif func in INPUT_LAYOUT_RESULTS:
        strides = like_strides(args[0])
    elif torch.Tag.pointwise not in func.tags or any(
            a.name == "memory_format" for a in torch_internals.schema_of(func).arguments):
        return out  # (clone: the layout is asked for, not TensorIterator's)
    else:
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        # a Python number as `self` or `other` is an operand of TensorIterator too
        arguments = torch_internals.schema_of(func).arguments
        wrapped = any(isinstance(value, (int, float, bool))
                      and argument.name in ("self", "other")
                      for argument, value in zip(arguments, args))
        if device_type == "cpu" and not wrapped and len(tensors) == 2 and \
                tensors[0].dtype != tensors[1].dtype:
            # eager's CPU TensorIterator casts an operand of another dtype first (a copy
            # that keeps a dense layout; an expanded one's copy is laid out anew) and takes
            # the copy's strides into the result's layout
            common = torch.result_type(*tensors)
            tensors = [t.to(common) if t.dtype != common and not non_overlapping_and_dense(t)
                       else t for t in tensors]
        try:
            strides = elementwise_strides(tensors, tuple(out.shape), wrapped)
        except (RuntimeError, IndexError):  # operands that do not broadcast: keep meta's
            return out
    if strides == tuple(out.stride()):
        return out
    return torch.empty_strided(tuple(out.shape), strides, dtype=out.dtype, device="meta")
