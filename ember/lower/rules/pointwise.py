"""Pointwise aten ops: math functions, arithmetic, comparisons, selection, casts."""

from __future__ import annotations

import math

import torch

from ember.ir import dtypes
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.lower.builder import Builder, wrap_integer
from ember.lower.devices import same_device
from ember.lower.registry import Decline, aten, lowering

# aten ops that are one float-valued IR op (integer inputs compute in the default float dtype).
_FLOAT_UNARY = {
    aten.exp: Op.EXP, aten.exp2: Op.EXP2, aten.expm1: Op.EXPM1, aten.log: Op.LOG,
    aten.log2: Op.LOG2, aten.log10: Op.LOG10, aten.log1p: Op.LOG1P, aten.sqrt: Op.SQRT,
    aten.rsqrt: Op.RSQRT, aten.sin: Op.SIN, aten.cos: Op.COS, aten.tan: Op.TAN,
    aten.asin: Op.ASIN, aten.acos: Op.ACOS, aten.atan: Op.ATAN, aten.sinh: Op.SINH,
    aten.cosh: Op.COSH, aten.tanh: Op.TANH, aten.asinh: Op.ASINH, aten.acosh: Op.ACOSH,
    aten.atanh: Op.ATANH, aten.erf: Op.ERF, aten.erfc: Op.ERFC, aten.sigmoid: Op.SIGMOID,
    aten.reciprocal: Op.RECIPROCAL,
}


def _float_unary(op: Op):
    return lambda b, x: b.elementwise(op, x)


for _target, _op in _FLOAT_UNARY.items():
    lowering(_target)(_float_unary(_op))


def _integral_identity(op: Op):
    """floor/ceil/round/trunc: identities on integers, the op on floats."""

    def rule(b: Builder, x: Node) -> Node:
        return x if not dtypes.is_float(x.dtype) else b.unary(op, x)

    return rule


for _target, _op in {aten.floor: Op.FLOOR, aten.ceil: Op.CEIL, aten.trunc: Op.TRUNC,
                     aten.fix: Op.TRUNC}.items():
    lowering(_target)(_integral_identity(_op))


@lowering(aten.round.default)
def _round(b: Builder, x: Node) -> Node:
    return _integral_identity(Op.ROUND)(b, x)


@lowering(aten.round.decimals)
def _round_decimals(b: Builder, x: Node, *, decimals: int = 0) -> Node:
    if not dtypes.is_float(x.dtype):
        raise Decline("round(decimals) of integers")
    if decimals == 0:
        return b.unary(Op.ROUND, x)
    scale = 10.0 ** abs(decimals)
    if decimals > 0:
        return b.div(b.unary(Op.ROUND, b.mul(x, scale)), scale)
    return b.mul(b.unary(Op.ROUND, b.div(x, scale)), scale)


@lowering(aten.abs)
def _abs(b: Builder, x: Node) -> Node:
    return x if x.dtype is torch.bool else b.unary(Op.ABS, x)


@lowering(aten.neg)
def _neg(b: Builder, x: Node) -> Node:
    return b.unary(Op.NEG, x)


@lowering(aten.sign, aten.sgn)
def _sign(b: Builder, x: Node) -> Node:
    return x if x.dtype is torch.bool else b.unary(Op.SIGN, x)


@lowering(aten.square)
def _square(b: Builder, x: Node) -> Node:
    if x.dtype is torch.bool:
        x = b.cast(x, torch.int64)
    return b.mul(x, x)


@lowering(aten.frac)
def _frac(b: Builder, x: Node) -> Node:
    return b.sub(x, b.unary(Op.TRUNC, x))


@lowering(aten.bitwise_not)
def _bitwise_not(b: Builder, x: Node) -> Node:
    return b.unary(Op.LOGICAL_NOT if x.dtype is torch.bool else Op.BITWISE_NOT, x)


@lowering(aten.logical_not)
def _logical_not(b: Builder, x: Node) -> Node:
    return b.unary(Op.LOGICAL_NOT, b.cast(x, torch.bool))


@lowering(aten.isnan)
def _isnan(b: Builder, x: Node) -> Node:
    if not dtypes.is_float(x.dtype):
        return b.full(False, torch.bool, x.shape)
    return b.unary(Op.ISNAN, x)


@lowering(aten.isinf)
def _isinf(b: Builder, x: Node) -> Node:
    if not dtypes.is_float(x.dtype):
        return b.full(False, torch.bool, x.shape)
    return b.unary(Op.ISINF, x)


@lowering(aten.isfinite)
def _isfinite(b: Builder, x: Node) -> Node:
    if not dtypes.is_float(x.dtype):
        return b.full(True, torch.bool, x.shape)
    bad = b.binary(Op.BITWISE_OR, b.unary(Op.ISNAN, x), b.unary(Op.ISINF, x))
    return b.unary(Op.LOGICAL_NOT, bad)


@lowering(aten.isposinf)
def _isposinf(b: Builder, x: Node) -> Node:
    return b.compare(Op.EQ, x, math.inf) if dtypes.is_float(x.dtype) \
        else b.full(False, torch.bool, x.shape)


@lowering(aten.isneginf)
def _isneginf(b: Builder, x: Node) -> Node:
    return b.compare(Op.EQ, x, -math.inf) if dtypes.is_float(x.dtype) \
        else b.full(False, torch.bool, x.shape)


@lowering(aten.signbit)
def _signbit(b: Builder, x: Node) -> Node:
    if not dtypes.is_float(x.dtype):
        return b.compare(Op.LT, x, 0)
    # copysign(1, x) < 0 sees the sign of -0.0 and of NaNs, as signbit does
    return b.compare(Op.LT, b.binary(Op.COPYSIGN, b.full(1.0, x.dtype, x.shape), x), 0.0)


# -- arithmetic ---------------------------------------------------------------------------
def _scaled(b: Builder, other, alpha):
    if alpha is None or alpha == 1:
        return other
    return b.mul(other, alpha) if isinstance(other, Node) else other * alpha


# NOTE: alpha is positional in the Scalar overloads (add.Scalar(self, other, alpha=1)), keyword
# only in the Tensor ones: the rules take it either way.
@lowering(aten.add.Tensor, aten.add.Scalar)
def _add(b: Builder, x, other, alpha=1) -> Node:
    if isinstance(x, Node) and isinstance(other, Node) and alpha != 1:
        dtype = b.compute_dtype(x, other)
        return b.add(b.cast(x, dtype), b.mul(b.cast(other, dtype), alpha))
    return b.add(x, _scaled(b, other, alpha))


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def _sub(b: Builder, x, other, alpha=1) -> Node:
    if isinstance(other, Node) and alpha != 1:
        dtype = b.compute_dtype(x, other)
        return b.sub(b.cast(x, dtype), b.mul(b.cast(other, dtype), alpha))
    return b.sub(x, _scaled(b, other, alpha))


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(b: Builder, x, other, alpha=1) -> Node:
    return _sub(b, other, x, alpha=alpha) if isinstance(other, Node) \
        else b.sub(other, _scaled(b, x, alpha))


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def _mul(b: Builder, x, other) -> Node:
    return b.mul(x, other)


def _integer_divisor(b: Builder, x, other) -> torch.dtype | None:
    """The integer dtype of an integer division whose divisor is a safe constant, or None for a
    float division. Declines a tensor divisor (it may hold a zero, which must raise as in eager)
    and 0 or -1 (the minimum integer divided by -1 overflows in C)."""
    dtype = b.compute_dtype(x, other)
    if dtypes.is_float(dtype):
        return None
    if isinstance(other, Node):
        raise Decline("integer division by a tensor (a zero in it must raise as in eager)")
    divisor = wrap_integer(int(other), dtype)
    if divisor == 0 or (divisor == -1 and dtype.is_signed):
        raise Decline(f"integer division by {divisor}")
    return dtype


def _integer_division(b: Builder, op: Op, x, other, dtype: torch.dtype) -> Node:
    return b.binary(op, b.operand(x, dtype), b.full(other, dtype))


@lowering(aten.div.Tensor, aten.div.Scalar)
def _div(b: Builder, x, other) -> Node:
    return b.div(x, other)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(b: Builder, x, other, *, rounding_mode=None) -> Node:
    if rounding_mode is None:
        return b.div(x, other)
    dtype = _integer_divisor(b, x, other)
    if rounding_mode == "trunc":
        if dtype is not None:  # Op.DIV truncates integers
            return _integer_division(b, Op.DIV, x, other, dtype)
        return b.unary(Op.TRUNC, b.div(x, other))
    return _floor_divide(b, x, other)


@lowering(aten.floor_divide)
def _floor_divide(b: Builder, x, other) -> Node:
    dtype = _integer_divisor(b, x, other)
    if dtype is not None:
        return _integer_division(b, Op.FLOORDIV, x, other, dtype)
    return b.elementwise(Op.FLOORDIV, x, other)


@lowering(aten.remainder.Tensor, aten.remainder.Scalar)
def _remainder(b: Builder, x, other) -> Node:
    dtype = _integer_divisor(b, x, other)
    if dtype is not None:
        return _integer_division(b, Op.REMAINDER, x, other, dtype)
    return b.elementwise(Op.REMAINDER, x, other)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(b: Builder, x, other) -> Node:
    dtype = _integer_divisor(b, x, other)
    if dtype is not None:
        return _integer_division(b, Op.FMOD, x, other, dtype)
    return b.elementwise(Op.FMOD, x, other)


def _integer_power(b: Builder, x: Node, exponent: int) -> Node:
    """x ** exponent by repeated squaring: exact, and wrapping on overflow as eager's does."""
    result = b.full(1, x.dtype, x.shape)
    square = x
    while exponent:
        if exponent & 1:
            result = square if result.op is Op.FULL else b.mul(result, square)
        exponent >>= 1
        if exponent:
            square = b.mul(square, square)
    return result


@lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(b: Builder, x: Node, exponent) -> Node:
    dtype = b.compute_dtype(x, exponent)
    if not dtypes.is_float(dtype):
        if isinstance(exponent, bool) or not isinstance(exponent, int) or exponent < 0:
            raise Decline("integer power with a negative exponent (eager raises)")
        return _integer_power(b, b.cast(x, dtype), exponent)
    x = b.cast(x, dtype)
    if exponent == 1:
        return x
    if exponent == 2:
        return b.mul(x, x)
    if exponent == 3:
        return b.mul(b.mul(x, x), x)
    # NOTE: eager on the CPU computes float16 powers with pow() itself, which differs from
    # sqrt at -inf; on CUDA every float type takes sqrt
    roots = dtype is not torch.float16 or b.graph.device.type == "cuda"
    if exponent == 0.5 and roots:
        return b.unary(Op.SQRT, x)
    if exponent == -0.5 and roots:
        return b.unary(Op.RSQRT, x)
    if exponent == -1:
        return b.unary(Op.RECIPROCAL, x)
    if exponent == -2:
        return b.unary(Op.RECIPROCAL, b.mul(x, x))
    return b.elementwise(Op.POW, x, exponent)


@lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(b: Builder, x, exponent) -> Node:
    if not dtypes.is_float(b.compute_dtype(x, exponent)):
        raise Decline("integer power")
    return b.elementwise(Op.POW, x, exponent)


for _target, _op in {aten.maximum: Op.MAXIMUM, aten.minimum: Op.MINIMUM, aten.atan2: Op.ATAN2,
                     aten.hypot: Op.HYPOT, aten.copysign: Op.COPYSIGN}.items():
    lowering(_target)(lambda b, x, other, _op=_op: b.elementwise(_op, x, other))


@lowering(aten.fmax)
def _fmax(b: Builder, x: Node, other: Node) -> Node:
    return _nan_ignoring(b, Op.MAXIMUM, x, other)


@lowering(aten.fmin)
def _fmin(b: Builder, x: Node, other: Node) -> Node:
    return _nan_ignoring(b, Op.MINIMUM, x, other)


def _nan_ignoring(b: Builder, op: Op, x: Node, other: Node) -> Node:
    result = b.elementwise(op, x, other)
    if not dtypes.is_float(result.dtype):
        return result
    x, other = b.cast(x, result.dtype), b.cast(other, result.dtype)
    result = b.where(b.unary(Op.ISNAN, b.broadcast_to(x, result.shape)), other, result)
    return b.where(b.unary(Op.ISNAN, b.broadcast_to(other, result.shape)), x, result)


for _target, _op in {aten.bitwise_and: Op.BITWISE_AND, aten.bitwise_or: Op.BITWISE_OR,
                     aten.bitwise_xor: Op.BITWISE_XOR,
                     aten.bitwise_left_shift: Op.SHIFT_LEFT, aten.__lshift__: Op.SHIFT_LEFT,
                     aten.bitwise_right_shift: Op.SHIFT_RIGHT,
                     aten.__rshift__: Op.SHIFT_RIGHT}.items():
    lowering(_target)(lambda b, x, other, _op=_op: b.elementwise(_op, x, other))


def _logical(op: Op):
    def rule(b: Builder, x, other) -> Node:
        x = b.cast(x, torch.bool) if isinstance(x, Node) else b.full(bool(x), torch.bool)
        other = b.cast(other, torch.bool) if isinstance(other, Node) \
            else b.full(bool(other), torch.bool)
        return b.binary(op, x, other)

    return rule


lowering(aten.logical_and)(_logical(Op.BITWISE_AND))
lowering(aten.logical_or)(_logical(Op.BITWISE_OR))
lowering(aten.logical_xor)(_logical(Op.BITWISE_XOR))

for _target, _op in {aten.eq: Op.EQ, aten.ne: Op.NE, aten.lt: Op.LT, aten.le: Op.LE,
                     aten.gt: Op.GT, aten.ge: Op.GE}.items():
    lowering(_target)(lambda b, x, other, _op=_op: b.compare(_op, x, other))


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(b: Builder, condition: Node, x, other) -> Node:
    dtype = b.compute_dtype(x, other)
    return b.where(condition, b.operand(x, dtype), b.operand(other, dtype))


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(b: Builder, x: Node, mask: Node, value) -> Node:
    if isinstance(value, Node):
        value = b.reshape(b.cast(value, x.dtype), ())
    return b.where(mask, b.operand(value, x.dtype), x)


def _scalar_nan_bound_applies() -> bool:
    """Does this torch's clamp(x, min=nan) give NaN (2.13) or leave x alone (2.11)? Ask it."""
    return bool(torch.isnan(torch.clamp(torch.tensor([1.0]), min=math.nan))[0])


SCALAR_NAN_BOUND_APPLIES = _scalar_nan_bound_applies()


def clamp(b: Builder, x: Node, low, high, gradient: str = "clamp") -> Node:
    """min(max(x, low), high) in the promoted dtype, NaN-propagating; a bound may be None.
    `gradient` marks the nodes for autodiff: "clamp" passes the gradient inside the closed
    interval (eager's clamp), "hardtanh" strictly inside it — not maximum's half-and-half at
    a tie."""
    if not SCALAR_NAN_BOUND_APPLIES:
        low = None if isinstance(low, float) and math.isnan(low) else low
        high = None if isinstance(high, float) and math.isnan(high) else high
    dtype = b.compute_dtype(*(v for v in (x, low, high) if v is not None))
    result = b.cast(x, dtype)
    if low is not None:
        result = b.elementwise(Op.MAXIMUM, result, b.operand(low, dtype))
        result.attrs["gradient"] = gradient
    if high is not None:
        result = b.elementwise(Op.MINIMUM, result, b.operand(high, dtype))
        result.attrs["gradient"] = gradient
    return result


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp_rule(b: Builder, x: Node, min=None, max=None) -> Node:  # noqa: A002
    return clamp(b, x, min, max)


@lowering(aten.clamp_min)
def _clamp_min(b: Builder, x: Node, low) -> Node:
    return clamp(b, x, low, None)


@lowering(aten.clamp_max)
def _clamp_max(b: Builder, x: Node, high) -> Node:
    return clamp(b, x, None, high)


@lowering(aten.nan_to_num)
def _nan_to_num(b: Builder, x: Node, nan=None, posinf=None, neginf=None) -> Node:
    if not dtypes.is_float(x.dtype):
        return x
    info = torch.finfo(x.dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    result = b.where(b.unary(Op.ISNAN, x), b.full(nan, x.dtype), x)
    result = b.where(b.compare(Op.EQ, x, math.inf), b.full(posinf, x.dtype), result)
    return b.where(b.compare(Op.EQ, x, -math.inf), b.full(neginf, x.dtype), result)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(b: Builder, start: Node, end: Node, weight) -> Node:
    dtype = b.compute_dtype(start, end, weight)
    start, end = b.cast(start, dtype), b.cast(end, dtype)
    # (a scalar weight is read in float32, as eager's kernels read it)
    weight = b.operand(weight, dtype) if isinstance(weight, Node) else \
        b.full(weight, dtype, wide=True)
    difference = b.sub(end, start)
    low = b.add(start, b.mul(weight, difference))
    high = b.sub(end, b.mul(difference, b.sub(1, weight)))
    return b.where(b.compare(Op.LT, b.unary(Op.ABS, weight), 0.5), low, high)


@lowering(aten.addcmul)
def _addcmul(b: Builder, x: Node, tensor1: Node, tensor2: Node, *, value=1) -> Node:
    dtype = b.compute_dtype(x, tensor1, tensor2)
    t1, t2 = b.cast(tensor1, dtype), b.cast(tensor2, dtype)
    if value == 1:
        product = b.mul(t1, t2)
    elif b.graph.device.type == "cuda":  # eager's order there: x + value * (t1 * t2)
        product = b.mul(value, b.mul(t1, t2))
    else:  # and on the CPU: x + value * t1 * t2
        product = b.mul(b.mul(value, t1), t2)
    return b.add(b.cast(x, dtype), product)


@lowering(aten.addcdiv)
def _addcdiv(b: Builder, x: Node, tensor1: Node, tensor2: Node, *, value=1) -> Node:
    dtype = b.compute_dtype(x, tensor1, tensor2)
    if not dtypes.is_float(dtype):
        raise Decline("integer addcdiv")
    t1, t2 = b.cast(tensor1, dtype), b.cast(tensor2, dtype)
    if value == 1:
        quotient = b.div(t1, t2)
    elif b.graph.device.type == "cuda":  # eager's order there: x + value * (t1 / t2)
        quotient = b.mul(value, b.div(t1, t2))
    else:  # and on the CPU: x + value * t1 / t2
        quotient = b.div(b.mul(value, t1), t2)
    return b.add(b.cast(x, dtype), quotient)


# -- other functions ----------------------------------------------------------------------
@lowering(aten.logit)
def _logit(b: Builder, x: Node, eps=None) -> Node:
    if not dtypes.is_float(x.dtype):
        x = b.cast(x, torch.get_default_dtype())
    if eps is not None:
        x = clamp(b, x, eps, 1.0 - eps)
    return b.unary(Op.LOG, b.div(x, b.sub(1.0, x)))


@lowering(aten.xlogy.Tensor)
def _xlogy(b: Builder, x: Node, y: Node) -> Node:
    dtype = b.compute_dtype(x, y)
    if not dtypes.is_float(dtype):
        dtype = torch.get_default_dtype()
    x, y = b.cast(x, dtype), b.cast(y, dtype)
    product = b.mul(x, b.unary(Op.LOG, y))
    product = b.where(b.compare(Op.EQ, x, 0.0), b.full(0.0, dtype), product)
    return b.where(b.unary(Op.ISNAN, b.broadcast_to(y, product.shape)), y, product)


@lowering(aten.logaddexp)
def _logaddexp(b: Builder, x: Node, other: Node) -> Node:
    return _log_add_exp(b, x, other, Op.EXP, 1.0)


@lowering(aten.logaddexp2)
def _logaddexp2(b: Builder, x: Node, other: Node) -> Node:
    return _log_add_exp(b, x, other, Op.EXP2, 1.0 / math.log(2.0))


def _log_add_exp(b: Builder, x: Node, other: Node, exp: Op, scale: float) -> Node:
    """max + log1p(exp(-|x - other|)) * scale, and x itself where both are the same infinity
    (where the difference would be NaN), as eager's kernel computes it."""
    dtype = b.compute_dtype(x, other)
    if not dtypes.is_float(dtype):
        raise Decline("logaddexp of integers (eager refuses)")
    x, other = b.broadcast(b.cast(x, dtype), b.cast(other, dtype))
    tail = b.unary(Op.LOG1P, b.unary(exp, b.unary(Op.NEG, b.unary(Op.ABS, b.sub(x, other)))))
    if scale != 1.0:
        tail = b.mul(tail, scale)
    result = b.add(b.maximum(x, other), tail)
    same_infinity = b.binary(Op.BITWISE_AND, b.compare(Op.EQ, x, other), b.unary(Op.ISINF, x))
    return b.where(same_infinity, x, result)


@lowering(aten.heaviside)
def _heaviside(b: Builder, x: Node, values: Node) -> Node:
    positive = b.cast(b.compare(Op.GT, x, 0), x.dtype)
    return b.where(b.compare(Op.EQ, x, 0), b.cast(values, x.dtype), positive)


@lowering(aten.deg2rad)
def _deg2rad(b: Builder, x: Node) -> Node:
    return b.mul(_as_float(b, x), math.pi / 180.0)


@lowering(aten.rad2deg)
def _rad2deg(b: Builder, x: Node) -> Node:
    return b.mul(_as_float(b, x), 180.0 / math.pi)


@lowering(aten.sinc)
def _sinc(b: Builder, x: Node) -> Node:
    x = _as_float(b, x)
    zero = b.compare(Op.EQ, x, 0)
    # (the unused branch divides by 1 at 0: 0/0 there made the gradient NaN through where)
    product = b.where(zero, b.full(1.0, x.dtype), b.mul(x, math.pi))
    return b.where(zero, b.full(1.0, x.dtype), b.div(b.unary(Op.SIN, product), product))


def _as_float(b: Builder, x: Node) -> Node:
    return x if dtypes.is_float(x.dtype) else b.cast(x, torch.get_default_dtype())


# -- casts and copies ---------------------------------------------------------------------
@lowering(aten._to_copy)
def _to_copy(b: Builder, x: Node, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None) -> Node:
    if device is not None and not same_device(device, b.graph.device):
        raise Decline("a copy to another device")
    return b.cast(x, dtype) if dtype is not None else x


@lowering(aten.clone, aten.lift_fresh_copy, aten.lift_fresh, aten.positive,
          aten.contiguous)
def _clone(b: Builder, x: Node, *, memory_format=None) -> Node:
    return x


@lowering(aten.copy.default)
def _copy(b: Builder, destination: Node, source, non_blocking: bool = False) -> Node:
    # source may be a Python number: x.copy_(2.5) reaches aten.copy_ with the scalar as is
    return b.broadcast_to(b.operand(source, destination.dtype), destination.shape)


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def _fill(b: Builder, x: Node, value) -> Node:
    if isinstance(value, Node):
        return b.broadcast_to(b.cast(b.reshape(value, ()), x.dtype), x.shape)
    return b.full(value, x.dtype, x.shape)


@lowering(aten.zero)
def _zero(b: Builder, x: Node) -> Node:
    return b.full(0, x.dtype, x.shape)
