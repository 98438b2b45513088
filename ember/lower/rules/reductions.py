"""Reductions and the normalisations built on them: sum, mean, var, softmax, norms, ..."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ember.ir import dtypes
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.lower.builder import Builder, normalize_dim, normalize_dims
from ember.lower.registry import Decline, aten, lowering


def _count(x: Node, dims: Sequence[int] | None) -> int:
    return math.prod(x.shape[d] for d in normalize_dims(dims, x.ndim)) if x.ndim else 1


def _accumulate_dtype(x: Node, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.int64 if dtypes.is_integral(x.dtype, include_bool=True) else x.dtype


@lowering(aten.sum.default)
def _sum_all(b: Builder, x: Node, *, dtype=None) -> Node:
    return b.reduce(Op.SUM, b.cast(x, _accumulate_dtype(x, dtype)), None)


@lowering(aten.sum.dim_IntList)
def _sum(b: Builder, x: Node, dim=None, keepdim: bool = False, *, dtype=None) -> Node:
    return b.reduce(Op.SUM, b.cast(x, _accumulate_dtype(x, dtype)), dim, keepdim)


@lowering(aten.prod.default)
def _prod_all(b: Builder, x: Node, *, dtype=None) -> Node:
    return b.reduce(Op.PROD, b.cast(x, _accumulate_dtype(x, dtype)), None)


@lowering(aten.prod.dim_int)
def _prod(b: Builder, x: Node, dim: int, keepdim: bool = False, *, dtype=None) -> Node:
    return b.reduce(Op.PROD, b.cast(x, _accumulate_dtype(x, dtype)), [dim], keepdim)


@lowering(aten.nansum)
def _nansum(b: Builder, x: Node, dim=None, keepdim: bool = False, *, dtype=None) -> Node:
    if dtypes.is_float(x.dtype):
        x = b.where(b.unary(Op.ISNAN, x), b.full(0, x.dtype), x)
    return b.reduce(Op.SUM, b.cast(x, _accumulate_dtype(x, dtype)), dim, keepdim)


@lowering(aten.trace)
def _trace(b: Builder, x: Node) -> Node:
    rows, cols = x.shape
    count = min(rows, cols)
    flat = b.reshape(x, (rows * cols,))
    diagonal = b.slice(flat, 0, 0, (count - 1) * (cols + 1) + 1 if count else 0, cols + 1)
    return b.reduce(Op.SUM, b.cast(diagonal, _accumulate_dtype(x, None)), None)


def _wide(b: Builder, x: Node) -> Node:
    """float16/bfloat16 statistics are computed in float32 (as eager's CPU kernels do): a
    float16 sum or element count overflows at 65504."""
    return b.cast(x, torch.float32) if x.dtype in dtypes.REDUCED_FLOAT else x


def mean(b: Builder, x: Node, dim=None, keepdim: bool = False) -> Node:
    total = b.reduce(Op.SUM, _wide(b, x), dim, keepdim)
    result = b.div(total, _count(x, dim))
    return b.cast(result, x.dtype) if x.dtype in dtypes.REDUCED_FLOAT else result


@lowering(aten.mean.default)
def _mean_all(b: Builder, x: Node, *, dtype=None) -> Node:
    return mean(b, b.cast(x, dtype) if dtype else x)


@lowering(aten.mean.dim)
def _mean(b: Builder, x: Node, dim=None, keepdim: bool = False, *, dtype=None) -> Node:
    return mean(b, b.cast(x, dtype) if dtype else x, dim, keepdim)


def _extreme(b: Builder, op: Op, x: Node, dim, keepdim: bool) -> Node:
    if x.numel == 0 and _count(x, dim) == 0:
        raise Decline("max/min of an empty dim raises in eager")
    return b.reduce(op, x, dim, keepdim)


@lowering(aten.amax)
def _amax(b: Builder, x: Node, dim=(), keepdim: bool = False) -> Node:
    return _extreme(b, Op.MAX, x, dim, keepdim)


@lowering(aten.amin)
def _amin(b: Builder, x: Node, dim=(), keepdim: bool = False) -> Node:
    return _extreme(b, Op.MIN, x, dim, keepdim)


@lowering(aten.max.default)
def _max_all(b: Builder, x: Node) -> Node:
    return _extreme(b, Op.MAX, x, None, False)


@lowering(aten.min.default)
def _min_all(b: Builder, x: Node) -> Node:
    return _extreme(b, Op.MIN, x, None, False)


@lowering(aten.max.other)
def _max_other(b: Builder, x: Node, other: Node) -> Node:
    return b.elementwise(Op.MAXIMUM, x, other)


@lowering(aten.min.other)
def _min_other(b: Builder, x: Node, other: Node) -> Node:
    return b.elementwise(Op.MINIMUM, x, other)


@lowering(aten.max.dim)
def _max_dim(b: Builder, x: Node, dim: int, keepdim: bool = False) -> tuple[Node, Node]:
    return _selected(b, Op.MAX, Op.ARGMAX, x, dim, keepdim)


@lowering(aten.min.dim)
def _min_dim(b: Builder, x: Node, dim: int, keepdim: bool = False) -> tuple[Node, Node]:
    return _selected(b, Op.MIN, Op.ARGMIN, x, dim, keepdim)


def _selected(b: Builder, op: Op, arg: Op, x: Node, dim: int, keepdim: bool
              ) -> tuple[Node, Node]:
    """max(dim)/min(dim): the values are x at the indices (eager's backward gives a tie's
    whole gradient to the index returned; amax's splits it among the ties)."""
    if x.ndim == 0 or x.dtype is torch.bool:
        return _extreme(b, op, x, [dim], keepdim), _arg(b, arg, x, dim, keepdim)
    _extreme(b, op, x, [dim], keepdim)  # (an empty dim declines, as eager raises)
    indices = _arg(b, arg, x, dim, True)
    values = b.gather(x, indices, normalize_dim(dim, x.ndim))
    if keepdim:
        return values, indices
    axis = [normalize_dim(dim, x.ndim)]
    return b.squeeze(values, axis), b.squeeze(indices, axis)


@lowering(aten.aminmax)
def _aminmax(b: Builder, x: Node, *, dim=None, keepdim: bool = False) -> tuple[Node, Node]:
    dims = None if dim is None else [dim]
    if dim is None and keepdim:
        dims = list(range(x.ndim))
    return _extreme(b, Op.MIN, x, dims, keepdim), _extreme(b, Op.MAX, x, dims, keepdim)


def _arg(b: Builder, op: Op, x: Node, dim, keepdim: bool) -> Node:
    if x.dtype is torch.bool:
        x = b.cast(x, torch.uint8)
    if dim is None:
        flat = b.reshape(x, (x.numel,))
        result = b.reduce(op, flat, [0], True)
        return b.reshape(result, (1,) * x.ndim) if keepdim else b.reshape(result, ())
    if x.ndim == 0:
        return b.full(0, torch.int64, ())
    if x.shape[normalize_dim(dim, x.ndim)] == 0:
        raise Decline("argmax/argmin of an empty dim raises in eager")
    return b.reduce(op, x, [dim], keepdim)


@lowering(aten.argmax)
def _argmax(b: Builder, x: Node, dim=None, keepdim: bool = False) -> Node:
    return _arg(b, Op.ARGMAX, x, dim, keepdim)


@lowering(aten.argmin)
def _argmin(b: Builder, x: Node, dim=None, keepdim: bool = False) -> Node:
    return _arg(b, Op.ARGMIN, x, dim, keepdim)


def _truth(b: Builder, x: Node) -> Node:
    return x if x.dtype is torch.bool else b.compare(Op.NE, x, 0)


def _any_all(op: Op):
    def rule(b: Builder, x: Node, dim=None, keepdim: bool = False) -> Node:
        result = b.reduce(op, _truth(b, x), dim, keepdim)
        return result if x.dtype is not torch.uint8 else b.cast(result, torch.uint8)

    return rule


lowering(aten.any.default, aten.any.dim, aten.any.dims)(_any_all(Op.ANY))
lowering(aten.all.default, aten.all.dim, aten.all.dims)(_any_all(Op.ALL))


@lowering(aten.count_nonzero.dim_IntList, aten.count_nonzero.default)
def _count_nonzero(b: Builder, x: Node, dim=None) -> Node:
    if isinstance(dim, int):
        dim = [dim]
    return b.reduce(Op.SUM, b.cast(_truth(b, x), torch.int64), dim, False)


def variance(b: Builder, x: Node, dim, correction, keepdim: bool) -> tuple[Node, Node]:
    """(var, mean) by two passes: mean first, then the mean squared deviation; in float32 for
    float16/bfloat16 (the callers cast back)."""
    if not dtypes.is_float(x.dtype):
        raise Decline("variance of integers")
    x = _wide(b, x)
    center = b.div(b.reduce(Op.SUM, x, dim, True), _count(x, dim))
    deviation = b.sub(x, center)
    squares = b.reduce(Op.SUM, b.mul(deviation, deviation), dim, keepdim)
    correction = 1 if correction is None else correction
    divisor = max(_count(x, dim) - correction, 0)
    var = b.div(squares, divisor)
    return var, center if keepdim else b.squeeze(center, normalize_dims(dim, x.ndim))


@lowering(aten.var.correction)
def _var(b: Builder, x: Node, dim=None, *, correction=None, keepdim: bool = False) -> Node:
    return b.cast(variance(b, x, dim, correction, keepdim)[0], x.dtype)


@lowering(aten.std.correction)
def _std(b: Builder, x: Node, dim=None, *, correction=None, keepdim: bool = False) -> Node:
    return b.cast(b.unary(Op.SQRT, variance(b, x, dim, correction, keepdim)[0]), x.dtype)


@lowering(aten.var_mean.correction)
def _var_mean(b: Builder, x: Node, dim=None, *, correction=None, keepdim=False):
    var, center = variance(b, x, dim, correction, keepdim)
    return b.cast(var, x.dtype), b.cast(center, x.dtype)


@lowering(aten.std_mean.correction)
def _std_mean(b: Builder, x: Node, dim=None, *, correction=None, keepdim=False):
    var, center = variance(b, x, dim, correction, keepdim)
    return b.cast(b.unary(Op.SQRT, var), x.dtype), b.cast(center, x.dtype)


@lowering(aten.logsumexp)
def _logsumexp(b: Builder, x: Node, dim, keepdim: bool = False) -> Node:
    if not dtypes.is_float(x.dtype):
        x = b.cast(x, torch.get_default_dtype())
    if _count(x, dim) == 0:  # the log of an empty sum
        shape = b.reduce(Op.SUM, x, dim, keepdim).shape
        return b.full(-math.inf, x.dtype, shape)
    peak = b.reduce(Op.MAX, x, dim, True)
    peak = b.where(b.unary(Op.ISINF, peak), b.full(0.0, x.dtype), peak)
    total = b.reduce(Op.SUM, b.unary(Op.EXP, b.sub(x, peak)), dim, True)
    result = b.add(b.unary(Op.LOG, total), peak)
    return result if keepdim else b.squeeze(result, normalize_dims(dim, x.ndim))


@lowering(aten.linalg_vector_norm)
def _vector_norm(b: Builder, x: Node, ord=2, dim=None, keepdim: bool = False, *,
                 dtype=None) -> Node:
    if dtype is not None:
        x = b.cast(x, dtype)
    if not dtypes.is_float(x.dtype):
        raise Decline("norm of integers")
    magnitude = b.unary(Op.ABS, x)
    if ord == math.inf:
        return _extreme(b, Op.MAX, magnitude, dim, keepdim)
    if ord == -math.inf:
        return _extreme(b, Op.MIN, magnitude, dim, keepdim)
    if ord == 0:
        return b.reduce(Op.SUM, b.cast(b.compare(Op.NE, x, 0.0), x.dtype), dim, keepdim)
    if ord == 1:
        return b.reduce(Op.SUM, magnitude, dim, keepdim)
    if ord == 2:
        return _root_of(b, b.reduce(Op.SUM, b.mul(x, x), dim, keepdim),
                        lambda total: b.unary(Op.SQRT, total))
    powered = b.elementwise(Op.POW, magnitude, float(ord))
    if ord > 0:
        # (0 ** ord is 0; its derivative there, infinite for ord < 1, times the zero below it
        # is NaN: eager's norm backward gives a zero subgradient at zero elements)
        zero = b.compare(Op.EQ, x, 0.0)
        safe = b.where(zero, b.full(1.0, x.dtype, ()), magnitude)
        powered = b.where(zero, b.full(0.0, x.dtype, ()), b.elementwise(Op.POW, safe, float(ord)))
    return _root_of(b, b.reduce(Op.SUM, powered, dim, keepdim),
                    lambda total: b.elementwise(Op.POW, total, 1.0 / ord))


def _root_of(b: Builder, total: Node, root) -> Node:
    """root(total), whose gradient is 0 where the total is 0, as eager's norm backward masks
    it (the root's own derivative there is infinite: times the zero below it, NaN)."""
    zero = b.compare(Op.EQ, total, 0.0)
    safe = b.where(zero, b.full(1.0, total.dtype, ()), total)
    return b.where(zero, b.full(0.0, total.dtype, ()), root(safe))


def softmax(b: Builder, x: Node, dim: int, log: bool = False) -> Node:
    if x.ndim == 0:
        return b.full(0.0 if log else 1.0, x.dtype) if x.numel else x
    dim = normalize_dim(dim, x.ndim)
    if x.shape[dim] == 0:
        return x
    # NOTE: the peak only keeps exp in range; softmax does not depend on it, so no gradient
    # flows through it (its true gradient is 1 - sum(softmax) = 0: differentiated, a max's
    # backward cost two more passes over the row — a count of the maxima and a sum)
    peak = b.unary(Op.STOP_GRADIENT, b.reduce(Op.MAX, x, dim, True))
    shifted = b.sub(x, peak)
    exponent = b.unary(Op.EXP, shifted)
    total = b.reduce(Op.SUM, exponent, dim, True)
    if log:
        return b.sub(shifted, b.unary(Op.LOG, total))
    return b.div(exponent, total)


@lowering(aten._softmax)
def _softmax(b: Builder, x: Node, dim: int, half_to_float: bool) -> Node:
    if half_to_float:
        x = b.cast(x, torch.float32)
    return softmax(b, x, dim)


@lowering(aten._log_softmax)
def _log_softmax(b: Builder, x: Node, dim: int, half_to_float: bool) -> Node:
    if half_to_float:
        x = b.cast(x, torch.float32)
    return softmax(b, x, dim, log=True)


@lowering(aten._safe_softmax)
def _safe_softmax(b: Builder, x: Node, dim: int, dtype=None) -> Node:
    if dtype is not None:
        x = b.cast(x, dtype)
    dim = normalize_dim(dim, x.ndim)
    all_masked = b.broadcast_to(
        b.reduce(Op.ALL, b.compare(Op.EQ, x, -math.inf), dim, True), x.shape)
    # (a row of -inf alone would make NaN inside softmax — -inf minus its -inf peak — whose
    # derivative, times the zero gradient the row gets, is NaN: such rows are zeros first)
    result = softmax(b, b.where(all_masked, b.full(0.0, x.dtype), x), dim)
    return b.where(all_masked, b.full(0.0, x.dtype), result)
