"""scaled_dot_product_attention as eager runs it, on CUDA and on the CPU.

Eager's attention is a composite: on each call it picks a kernel (flash, memory-efficient,
cuDNN, or its math composite) by the inputs' shapes, strides and dtypes and the GPU, turns a
boolean mask into an additive one, pads what the kernel wants padded, and calls the kernel.
The kernels differ from the math composite (all a meta tensor decomposes into) in rounding and
in the layout of their results, so ember asks once per geometry: the composite runs on stand-in
tensors of the graph's device under a dispatch mode that records the aten calls it makes.

- Where eager runs the math composite, its ops are traced as a meta tensor runs them and fuse
  with their neighbours.
- In an inference graph the recorded calls are replayed: the mask's conversion and padding
  become ember's ops (every layer converts the same mask: common subexpressions, one kernel
  a graph) and the kernel is one library call. The per-call choice, checks and conversions of
  the composite (a dozen host-side ops a layer) are gone, and every value is eager's to the
  bit, since eager runs these very calls.
- A training graph asks eager with the operands that require grad requiring grad (eager's
  choice depends on it). Where that is the CPU's flash kernel or CUDA's memory-efficient one
  (asked on CUDA with those operands requiring grad, so that it computes the log-sum-exp its
  backward reads), the recorded calls are replayed with the kernel's every result kept, and
  the backward graph calls its backward kernel on them (autodiff/library_rules.py).
  Elsewhere (CUDA's flash and cuDNN kernels, a graph whose example values do not say what
  requires grad) the composite is called whole, a library call whose backward is eager's
  autograd, kept on the step's tape.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_internals
from ember.lower.registry import Unsupported
from ember.torch_internals import tree_flatten, tree_map

if TYPE_CHECKING:
    from ember.lower.tracer import Tracer

# Devices where eager's attention picks fused kernels. On the CPU too: eager's flash kernel for
# the CPU takes 0.83 ms where ember's kernels for the composite (two bmm and a softmax) took
# 3.6 (2×4×128×64, causal, one thread; 2026-12-02), and with a mask in a training graph its
# backward differs from the composite's where a row's every key is masked by a large finite
# number (Hugging Face's left padding, `(1 - mask) * finfo.min`): eager's op and its backward
# are what the user gets.
FUSED_ATTENTION_DEVICES = {"cuda", "cpu"}
ATTENTIONS = {torch.nn.functional.scaled_dot_product_attention,
              torch.ops.aten.scaled_dot_product_attention.default}
ARGUMENT_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
              "enable_gqa")
_OPERANDS = ARGUMENT_NAMES[:4]


@dataclasses.dataclass(frozen=True)
class _Operand:
    name: str            # one of _OPERANDS


@dataclasses.dataclass(frozen=True)
class _Result:
    call: int            # which recorded call
    item: int | None     # which of its results (None: its only one)


@dataclasses.dataclass(frozen=True)
class _Call:
    func: Any
    args: tuple          # tensors as _Operand/_Result references
    kwargs: dict
    kernel: bool         # the attention kernel itself: a library call of its first result
    layout: tuple        # (shape, strides, dtype) of the kernel's first result
    layouts: tuple = ()  # the same of each of the kernel's tensor results


@dataclasses.dataclass(frozen=True)
class _Eager:
    """What eager's attention does for one geometry: its result's layout and, where the
    recording could be read, the calls it makes (None: call the composite whole)."""

    layout: tuple
    calls: tuple[_Call, ...] | None
    result: _Result | None


def kernel_result(kernel: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The attention kernel's output, the first of the tuple it returns (its log-sum-exp and
    the rest are for its backward)."""
    return kernel(*args, **kwargs)[0]


def fused_attention(tracer: Tracer, device: torch.device, args, kwargs,
                    wants_grad: frozenset[str] | None = frozenset()) -> Any:
    """The meta result of eager's attention for this call, bound in `tracer`, or None where
    the math composite is to be traced instead. `wants_grad`: the operands that require grad
    in eager (a training graph's): eager's choice of kernel depends on it (its CPU flash
    kernel takes no mask that requires grad: T5's position bias runs the math composite);
    None where not known: a training graph then calls eager's attention whole, which
    chooses at run time (and its backward is eager's autograd)."""
    bound = dict(zip(ARGUMENT_NAMES, args), **kwargs)
    if set(bound) - set(ARGUMENT_NAMES) or bound.get("dropout_p", 0.0) != 0.0:
        return None  # (dropout draws: a training graph's backward could not run it again)
    tensors = {name: bound.get(name) for name in _OPERANDS}
    if tensors["attn_mask"] is None:
        del tensors["attn_mask"]
    if not all(isinstance(t, torch.Tensor) and t.device.type == "meta"
               for t in tensors.values()):
        return None
    options = {name: bound[name] for name in ARGUMENT_NAMES[3:] if name in bound}
    known = wants_grad is not None
    wants_grad = frozenset(wants_grad or ()) & set(tensors)
    if any(torch_internals.is_symbolic(t) for t in tensors.values()):
        return _symbolic_attention(tracer, device, bound, tensors, options, wants_grad)
    key = (str(device), tuple(sorted((name, repr(v)) for name, v in options.items()
                                     if not isinstance(v, torch.Tensor))),
           tuple((name, tuple(t.shape), t.stride(), t.dtype) for name, t in tensors.items()),
           _switches(), tuple(sorted(wants_grad)))
    if key not in _eager_by_geometry:  # (a model's layers ask the same: one run each)
        _eager_by_geometry[key] = _ask_eager(device, tensors, options, wants_grad)
    eager = _eager_by_geometry[key]
    if eager is None:
        # eager runs the composite (a dozen ops, each a kernel and a host round): its ops
        # are traced instead, as a meta tensor runs them, and fuse with their neighbours
        return None
    if eager.calls is not None and (not tracer.stops or known and
                                    _differentiated_by_ember(eager, wants_grad)):
        try:
            return _replay(tracer, eager, tensors)
        except Unsupported:
            pass  # (what the replay added is dead code now: the whole call stands)
    shape, strides, dtype = eager.layout
    out = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    attention = torch.ops.aten.scaled_dot_product_attention.default
    tracer.call_library(attention, (bound["query"], bound["key"], bound["value"]), options, out)
    return out


_eager_by_geometry: dict[tuple, _Eager | None] = {}

# Attention kernels whose backward ember calls itself in a training graph, from the results
# the forward kept (autodiff/library_rules.py), rather than through eager's autograd: the CPU's
# flash kernel (its mask, when it has one, never requires grad: eager takes the math
# composite then).
# The CUDA memory-efficient kernel too, where its forward computed the log-sum-exp (asked with
# its operands requiring grad) and draws no dropout: its backward reads the forward's result,
# log-sum-exp and (unused without dropout) random state — eager's backward, without the
# tape's autograd record, whose gradients came back copied out of the kernel's own layout.
# By kernel: how many tensor results the forward returns.
DIFFERENTIATED_KERNELS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: 2,
                          torch.ops.aten._scaled_dot_product_efficient_attention.default: 4}
EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention.default


def _differentiated_by_ember(eager: _Eager, wants_grad: frozenset[str]) -> bool:
    return all(DIFFERENTIATED_KERNELS.get(call.func) == len(call.layouts) and
               (call.func is not EFFICIENT or _efficient_backward_ready(call, wants_grad))
               for call in eager.calls if call.kernel)


def _efficient_backward_ready(call: _Call, wants_grad: frozenset[str]) -> bool:
    """Did the memory-efficient kernel's recorded call keep what its backward reads (a
    log-sum-exp, no dropout), with a mask that needs no gradient (its backward's rule gives
    the mask none)?"""
    from ember import config

    bound = torch_internals.arguments_by_name(call.func, call.args, call.kwargs)
    return config.settings.attention_backward and "attn_mask" not in wants_grad and \
        bool(bound.get("compute_log_sumexp")) and not bound.get("dropout_p")


def _symbolic_attention(tracer: Tracer, device: torch.device, bound: dict,
                        tensors: dict[str, torch.Tensor], options: dict,
                        wants_grad: frozenset[str]) -> Any:
    """Attention over symbolic sizes (a decoding step's growing cache): eager is asked at the
    sizes of the call being compiled; where it runs a kernel, the graph calls eager's
    attention whole (its sizes come from the tensors at run time), its result laid out as
    eager's was here (`attention_laid_out`); where it runs the math composite, that is traced.
    The recorded calls are not replayed: they hold this call's sizes."""
    hinted = {name: torch.empty_strided(
        [torch_internals.size_hint(n) for n in t.shape],
        [torch_internals.size_hint(n) for n in t.stride()], dtype=t.dtype, device="meta")
        for name, t in tensors.items()}
    key = (str(device), tuple(sorted((name, repr(v)) for name, v in options.items()
                                     if not isinstance(v, torch.Tensor))),
           tuple((name, tuple(t.shape), t.stride(), t.dtype) for name, t in hinted.items()),
           _switches(), tuple(sorted(wants_grad)))
    if key not in _eager_by_geometry:
        _eager_by_geometry[key] = _ask_eager(device, hinted, options, wants_grad)
    eager = _eager_by_geometry[key]
    if eager is None:
        return None
    shape, strides, dtype = eager.layout
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    query, value = bound["query"], bound["value"]
    symbolic_shape = (*query.shape[:-1], value.shape[-1])
    out = torch.empty_permuted(symbolic_shape, order, dtype=dtype, device="meta")
    if tuple(strides) != torch.empty_permuted(shape, order, device="meta").stride():
        return None  # (not a dense layout: the composite is traced instead)
    tracer.call_library(attention_laid_out, (order, query, bound["key"], value), options, out)
    return out


def attention_laid_out(order: tuple[int, ...], query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, **options: Any) -> torch.Tensor:
    """Eager's attention, its result in the dense layout `order` (outermost dim first) that
    eager gave at the sizes the graph was compiled at: at other sizes eager may choose another
    kernel, laid out otherwise, and the graph's kernels read the result by the planned
    strides. The values are eager's either way."""
    result = torch.ops.aten.scaled_dot_product_attention.default(query, key, value, **options)
    wanted = torch.empty_permuted(result.shape, order, device="meta").stride()
    if all(n <= 1 or s == w for n, s, w in zip(result.shape, result.stride(), wanted)):
        return result
    return torch.empty_permuted(result.shape, order, dtype=result.dtype,
                                device=result.device).copy_(result)


def _switches() -> tuple[bool, ...]:
    """What eager's choice of attention kernel depends on besides the tensors."""
    backends = torch.backends.cuda
    return (backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(),
            backends.math_sdp_enabled(), backends.cudnn_sdp_enabled(),
            torch.are_deterministic_algorithms_enabled())


class _Recorder(torch_internals.TorchDispatchMode):
    """Records the aten calls made under it (the composite's, not the kernels' own)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, out))
        return out


def _ask_eager(device: torch.device, tensors: dict[str, torch.Tensor],
               options: dict[str, Any], wants_grad: frozenset[str] = frozenset()
               ) -> _Eager | None:
    """Eager's attention on stand-ins of these tensors on `device`, recorded; None where eager
    would run the math composite (asked with the operands in `wants_grad` requiring grad)."""
    attention = torch.ops.aten.scaled_dot_product_attention.default
    with torch_internals.outside_dispatch_modes(), torch.no_grad():
        stand_ins = {name: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                               device=device) for name, t in tensors.items()}
        if "attn_mask" in stand_ins and stand_ins["attn_mask"].dtype == torch.bool:
            stand_ins["attn_mask"].fill_(True)  # (a bool's memory holds 0 or 1 only)
        asked = {name: t.detach().requires_grad_(name in wants_grad and t.is_floating_point())
                 for name, t in stand_ins.items()}
        with torch.enable_grad() if wants_grad else contextlib.nullcontext():
            if torch_internals.attention_uses_math(
                    asked["query"], asked["key"], asked["value"], asked.get("attn_mask"),
                    options):
                return None
        # (on CUDA, asked as a training graph's operands are: the memory-efficient kernel
        # computes the log-sum-exp its backward reads only for operands that require grad)
        if device.type == "cuda" and wants_grad:
            stand_ins = asked
        recorder = _Recorder()
        with recorder, torch.enable_grad() if stand_ins is asked else \
                contextlib.nullcontext():
            real = attention(stand_ins["query"], stand_ins["key"], stand_ins["value"],
                             **dict(options, **{n: stand_ins[n] for n in ("attn_mask",)
                                                if n in stand_ins}))
    layout = (tuple(real.shape), real.stride(), real.dtype)
    calls, result = _program(recorder.calls, stand_ins, real)
    return _Eager(layout, calls, result)


def _program(recorded: list, stand_ins: dict[str, torch.Tensor], real: torch.Tensor
             ) -> tuple[tuple[_Call, ...] | None, _Result | None]:
    """The recorded calls with their tensors as references to the operands and to earlier
    results; (None, None) where they cannot be replayed (a tensor from elsewhere, not one
    kernel, or a later call reading a kernel's result other than its first)."""
    names: dict[int, Any] = {id(t): _Operand(name) for name, t in stand_ins.items()}
    calls: list[_Call] = []
    kernels = 0
    for position, (func, args, kwargs, out) in enumerate(recorded):
        if not any(isinstance(v, torch.Tensor) for v in tree_flatten(out)[0]):
            continue  # (the kernel's choice, and such: later calls hold what it said)
        try:
            args, kwargs = tree_map(lambda v: _reference(v, names), (tuple(args), dict(kwargs)))
        except LookupError:
            return None, None
        kernel = "attention" in func.__name__
        kernels += kernel
        first = out[0] if kernel and isinstance(out, (tuple, list)) else out
        if kernel:
            if not isinstance(first, torch.Tensor):
                return None, None
            names[id(first)] = _Result(position, None)
            layout = (tuple(first.shape), first.stride(), first.dtype)
            layouts = tuple((tuple(t.shape), t.stride(), t.dtype) for t in tree_flatten(out)[0]
                            if isinstance(t, torch.Tensor))
        else:
            flat, _ = tree_flatten(out)
            single = isinstance(out, torch.Tensor)
            for item, value in enumerate(flat):
                if isinstance(value, torch.Tensor):
                    names[id(value)] = _Result(position, None if single else item)
            layout = layouts = ()
        calls.append(_Call(func, args, kwargs, kernel, layout, layouts))
    result = names.get(id(real))
    if kernels != 1 or not isinstance(result, _Result):
        return None, None
    return tuple(calls), result


def _reference(value: Any, names: dict[int, Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return names[id(value)]  # (LookupError: a tensor the recording cannot name)
    return value


def _replay(tracer: Tracer, eager: _Eager, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Eager's calls, again, on the graph's meta tensors under the tracer: the kernel a library
    call, the rest lowered as any op is. In a training graph the kernel is called whole, all
    its results kept (its backward reads them: autodiff/vjp's rule for it)."""
    values: dict[Any, torch.Tensor] = {_Operand(name): t for name, t in tensors.items()}

    def fill(value: Any) -> Any:
        if isinstance(value, (_Operand, _Result)):
            if value not in values:
                raise Unsupported("a recorded attention call reads a value not replayed")
            return values[value]
        return value

    for position, call in enumerate(eager.calls):
        args, kwargs = tree_map(fill, (call.args, call.kwargs))
        if call.kernel and tracer.stops:
            outs = tuple(torch.empty_strided(shape, strides, dtype=dtype, device="meta")
                         for shape, strides, dtype in call.layouts)
            tracer.call_library(call.func, args, kwargs, outs)
            values[_Result(position, None)] = outs[0]
            continue
        if call.kernel:
            shape, strides, dtype = call.layout
            out = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
            tracer.call_library(kernel_result, (call.func, *args), kwargs, out)
            values[_Result(position, None)] = out
            continue
        out = call.func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            values[_Result(position, None)] = out
        else:
            for item, value in enumerate(tree_flatten(out)[0]):
                if isinstance(value, torch.Tensor):
                    values[_Result(position, item)] = value
    result = values[eager.result]
    if (tuple(result.shape), result.stride(), result.dtype) != eager.layout:
        raise Unsupported("the replayed attention's result lies otherwise than eager's")
    return result
