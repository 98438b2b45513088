"""Triton for each primitive (`triton_rules`), the Triton types of dtypes, and the module prelude.

As in C, values are computed in a *compute type*: float32 for float16/bfloat16/float32 (a fused
chain of half ops rounds once, when stored), float64 for float64, the integer type itself for
integers and int1 for bools. Memory holds the storage type.

Only `tl.*` and `tl.math.*` are used, so the Triton interpreter runs every generated kernel
(TRITON_INTERPRET=1) and the kernels are tested on machines without a GPU. Functions that
`tl.math` lacks are built here from what it has (tanh from a fitted odd polynomial near zero
and exp beyond; expm1 and log1p from series near zero; float32 erf as CUDA's erff, without its
branch), accurate to a few ulps; the few ops
that cannot be built accurately that way (`TRITON_LIBRARY_OPS`) run as library calls of the
aten op instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy
import torch

from ember.config import triton_interpreted as interpreting
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.ir.sizes import Size

STORAGE_TYPES = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.bool: "tl.int1", torch.uint8: "tl.uint8",
    torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64",
}
COMPUTE_TYPES = {**STORAGE_TYPES, torch.float16: "tl.float32", torch.bfloat16: "tl.float32"}
# Pointer types in Triton's signature notation (what `triton.compile` is told).
SIGNATURE_TYPES = {
    torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32",
    torch.float64: "*fp64", torch.bool: "*i1", torch.uint8: "*u8", torch.int8: "*i8",
    torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64",
}
_BITS = {torch.uint8: 8, torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}

# Ops `tl.math` cannot build to eager's accuracy: they run as library calls (ember/passes).
TRITON_LIBRARY_OPS = frozenset({Op.ASIN, Op.ACOS, Op.ATAN, Op.ATAN2, Op.ASINH, Op.ACOSH,
                                Op.ATANH, Op.ERFC, Op.HYPOT})

# tanh(x) = x + x^3 P(x^2) for |x| < TANH_SPLIT: a least-squares fit of (tanh(x) - x) / x^3
# on Chebyshev points, weighted to relative error (1.3 ulp in float32); beyond it
# 1 - 2 / (exp(2|x|) + 1), within 4 ulps.
TANH_SPLIT = 0.55
TANH_COEFFICIENTS = (-0.33333334, 0.13333312, -0.05396252, 0.021802662, -0.0084761195,
                     0.0024681936)

# erf(x) in float32 as CUDA's erff computes it (its coefficients, read from libdevice's
# __nv_erff in PTX): x + x P(x^2) below |x| = ERF_SPLIT, 1 - 2^(-|x| (1 + Q(|x|))) with x's
# sign above. libdevice picks one coefficient set per element by a branch, which ptxas turns
# into a register move per coefficient (and constants kept in registers); both polynomials
# with their coefficients as immediates and one select at the end take 22% fewer instructions
# per erf (S2's erf-gelu chain is bound by instruction issue on the H200), same results.
ERF_SPLIT = 1.002959966659546
ERF_NEAR = (8.483494457323104e-05, -0.0008213091641664505, 0.005213488824665546,
            -0.026868773624300957, 0.11284004896879196, -0.37612664699554443,
            0.12837915122509003)
ERF_FAR = (1.6425845387857407e-05, -0.0004680210549850017, 0.0052647641859948635,
           -0.034303076565265656, 0.1532936990261078, 0.9163130521774292, 0.6282998323440552)

PRELUDE = '''
import triton
import triton.language as tl


@triton.jit
def ember_max_nan(a, b):
    """maximum that propagates NaN, as eager's max does; a tie keeps a (max(-0.0, 0) is -0.0,
    as eager's clamp and relu give)"""
    return tl.where((a >= b) | (a != a), a, b)


@triton.jit
def ember_min_nan(a, b):
    return tl.where((a <= b) | (a != a), a, b)


@triton.jit
def ember_mul(a, b):
    return a * b


@triton.jit
def ember_welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    """Chan's combination of two groups' (mean, sum of squared deviations, count); an empty
    group leaves the other as it is"""
    n = n_a + n_b
    share = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    delta = mean_b - mean_a
    return mean_a + delta * share, m2_a + m2_b + delta * delta * n_a * share, n


@triton.jit
def ember_argmax_combine(av, ai, bv, bi):
    """(value, index) pairs: the larger value wins, NaN beats everything, ties go to the first"""
    a_nan = av != av
    b_nan = bv != bv
    tie = (bv == av) | (a_nan & b_nan)
    take = ((bv > av) & (av == av)) | (b_nan & (av == av)) | (tie & (bi < ai))
    return tl.where(take, bv, av), tl.where(take, bi, ai)


@triton.jit
def ember_argmin_combine(av, ai, bv, bi):
    a_nan = av != av
    b_nan = bv != bv
    tie = (bv == av) | (a_nan & b_nan)
    take = ((bv < av) & (av == av)) | (b_nan & (av == av)) | (tie & (bi < ai))
    return tl.where(take, bv, av), tl.where(take, bi, ai)


@triton.jit
def ember_floordiv(a, b):
    """Python's a // b for floats, as torch computes it"""
    m = a % b
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1.0, d)
    f = tl.floor(d)
    f = tl.where(d - f > 0.5, f + 1.0, f)
    zero = 0.0 * (a / b)
    return tl.where(b == 0, a / b, tl.where(d != 0, f, zero))


@triton.jit
def ember_remainder(a, b):
    """Python's a % b (the divisor's sign) for floats and integers"""
    m = a % b
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@triton.jit
def ember_floordiv_int(a, b):
    q = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def ember_round_half_even(x, big):
    """torch.round: halves go to the even neighbour; |x| >= big is already an integer"""
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0
    r = tl.where((r - x == 0.5) & odd, r - 1.0, r)
    r = tl.where(r == 0, x * 0.0, r)  # (a zero takes x's sign, as eager's: round(-0.3) = -0.0)
    return tl.where(tl.abs(x) >= big, x, r)


ROUND_BF16


@triton.jit
def ember_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def ember_tanh_f32(x):
    a = tl.abs(x)
    s = x * x
    p = TANH_P5
    p = p * s + TANH_P4
    p = p * s + TANH_P3
    p = p * s + TANH_P2
    p = p * s + TANH_P1
    p = p * s + TANH_P0
    near = x + x * s * p
    far = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    far = tl.where(x < 0, -far, far)
    # (x == 0 returns x: the polynomial's x + x*s*p is +0 for x = -0.0, eager's tanh is -0.0)
    return tl.where(a < TANH_SPLIT, tl.where(x == 0, x, near), far)


@triton.jit
def ember_erf_f32(x):
    t = tl.abs(x)
    s = x * x
    q = ERF_FAR0 * t + ERF_FAR1
    q = q * t + ERF_FAR2
    q = q * t + ERF_FAR3
    q = q * t + ERF_FAR4
    q = q * t + ERF_FAR5
    q = q * t + ERF_FAR6
    far = 1.0 - tl.math.exp2(q * -t - t)
    far = tl.where(x < 0, -far, far)
    p = ERF_NEAR0 * s + ERF_NEAR1
    p = p * s + ERF_NEAR2
    p = p * s + ERF_NEAR3
    p = p * s + ERF_NEAR4
    p = p * s + ERF_NEAR5
    p = p * s + ERF_NEAR6
    return tl.where(t >= ERF_SPLIT, far, p * x + x)


@triton.jit
def ember_expm1_f64(x):
    """exp(x) - 1 without cancellation: (u - 1) * x / log(u) with u = exp(x) (Kahan)"""
    u = tl.exp(x)
    um1 = u - 1.0
    r = um1 * x / tl.log(u)
    r = tl.where(u == float("inf"), u, r)
    r = tl.where(um1 == -1.0, -1.0, r)
    return tl.where(u == 1.0, x, r)


@triton.jit
def ember_expm1_f32(x):
    return ember_expm1_f64(x.to(tl.float64)).to(tl.float32)


@triton.jit
def ember_log1p_f64(x):
    """log(1 + x) without cancellation: log(u) * x / (u - 1) with u = 1 + x (Kahan)"""
    u = 1.0 + x
    r = tl.log(u) * x / (u - 1.0)
    r = tl.where(u == float("inf"), u, r)
    return tl.where(u == 1.0, x, r)


@triton.jit
def ember_log1p_f32(x):
    return ember_log1p_f64(x.to(tl.float64)).to(tl.float32)


@triton.jit
def ember_tanh_f64(x):
    a = tl.abs(x)
    e = ember_expm1_f64(-2.0 * a)
    t = -e / (e + 2.0)
    return tl.where(x == 0, x, tl.where(x < 0, -t, t))  # (tanh(-0.0) is -0.0)


@triton.jit
def ember_pow(a, b):
    """a ** b for floats (computed in float64): eager's special cases, negative bases with
    integer exponents"""
    a64 = a.to(tl.float64)
    b64 = b.to(tl.float64)
    magnitude = tl.exp2(b64 * tl.log2(tl.abs(a64)))
    integral = tl.floor(b64) == b64
    odd = integral & ((b64 - 2.0 * tl.floor(b64 * 0.5)) != 0)
    r = tl.where((a64 < 0) & odd, -magnitude, magnitude)
    finite_negative = (a64 < 0) & (a64 != float("-inf"))
    r = tl.where(finite_negative & (integral == 0) & (tl.abs(b64) != float("inf")),
                 float("nan"), r)
    r = tl.where((tl.abs(a64) == 1.0) & (tl.abs(b64) == float("inf")), 1.0, r)
    r = tl.where((b64 == 0) | (a64 == 1.0), 1.0, r)
    return r.to(a.dtype)
'''


# float32 -> the nearest bfloat16 value, still in float32. On a GPU the conversion rounds to
# nearest, ties to even (one cvt.rn); the interpreter's conversion truncates, so there the
# rounding is written out on the bits (six integer operations and a select).
ROUND_BF16_GPU = '''@triton.jit
def ember_round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even), still in float32"""
    return x.to(tl.bfloat16).to(tl.float32)
'''
ROUND_BF16_INTERPRETED = '''@triton.jit
def ember_round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even; NaN stays NaN), still in float32:
    written out because the interpreter's conversion truncates"""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))
'''


def prelude() -> str:
    """The prelude with the tanh and erf polynomials' coefficients written in, and the
    bfloat16 rounding for where the kernels run."""
    text = PRELUDE.replace("TANH_SPLIT", repr(TANH_SPLIT)).replace("ERF_SPLIT", repr(ERF_SPLIT))
    text = text.replace("ROUND_BF16\n", ROUND_BF16_INTERPRETED if interpreting() else
                        ROUND_BF16_GPU)
    for name, values in (("TANH_P", TANH_COEFFICIENTS), ("ERF_NEAR", ERF_NEAR),
                         ("ERF_FAR", ERF_FAR)):
        for index, value in enumerate(values):
            text = text.replace(f"{name}{index}", repr(value))
    return text.strip() + "\n"


def compute_type(dtype: torch.dtype) -> str:
    return COMPUTE_TYPES[dtype]


def is_double(dtype: torch.dtype) -> bool:
    return dtype is torch.float64


def _negative_zero(dtype: torch.dtype) -> str:
    if is_double(dtype):
        return "tl.full([], -9223372036854775808, tl.int64).to(tl.float64, bitcast=True)"
    return "tl.full([], -2147483648, tl.int32).to(tl.float32, bitcast=True)"


def literal(value, dtype: torch.dtype) -> str:
    """A Triton expression for `value` as a value of `dtype` (rounded to dtype first, as eager
    does). Python floats are float32 constants in Triton, so float64 values are made with
    tl.full, as are integers of types narrower or wider than Triton's int32 default. A
    symbolic size (mean's count) is its expression over the kernel's size arguments."""
    if isinstance(value, Size):
        return f"tl.full([], {value.render_python()}, {compute_type(dtype)})"
    if dtype is torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        value = torch.tensor(value, dtype=dtype).item()
        if math.isnan(value):
            text = 'float("nan")'
        elif value == 0 and math.copysign(1.0, value) < 0:
            # Triton makes every constant equal to zero +0.0: -0.0 is built from its bits
            return _negative_zero(dtype)
        elif math.isinf(value):
            text = 'float("inf")' if value > 0 else 'float("-inf")'
        elif compute_type(dtype) == "tl.float32":
            text = str(numpy.float32(value))  # numpy: the shortest exact float32 text
            if not any(c in text for c in ".en"):
                text += ".0"
        else:
            text = repr(float(value))
        if dtype is torch.float64:
            return f"tl.full([], {text}, tl.float64)"
        return text
    value = int(value)
    if dtype is torch.int32:
        return str(value)
    return f"tl.full([], {value}, {compute_type(dtype)})"


class Emitter(Protocol):
    def temp(self, dtype: torch.dtype, expression: str) -> str:
        """Bind `expression` (a value of `dtype`'s compute type) to a fresh name."""


Rule = Callable[[Node, list[str], Emitter], str]
triton_rules: dict[Op, Rule] = {}


def _rule(*ops: Op):
    def register(fn: Rule) -> Rule:
        for op in ops:
            triton_rules[op] = fn
        return fn

    return register


def _unary(template: str, template64: str | None = None) -> Rule:
    def rule(node: Node, args: list[str], w: Emitter) -> str:
        chosen = template64 if template64 and is_double(node.inputs[0].dtype) else template
        return chosen.format(*args)

    return rule


for _op, _templates in {
    Op.EXP: ("tl.exp({0})",), Op.EXP2: ("tl.exp2({0})",), Op.LOG: ("tl.log({0})",),
    Op.LOG2: ("tl.log2({0})",), Op.SIN: ("tl.sin({0})",), Op.COS: ("tl.cos({0})",),
    Op.ERF: ("ember_erf_f32({0})", "tl.math.erf({0})"),
    Op.FLOOR: ("tl.floor({0})",), Op.CEIL: ("tl.ceil({0})",),
    Op.TRUNC: ("ember_trunc({0})",), Op.RSQRT: ("tl.rsqrt({0})",),
    Op.SQRT: ("tl.sqrt_rn({0})", "tl.sqrt({0})"),
    Op.TAN: ("(tl.sin({0}) / tl.cos({0}))",),
    Op.EXPM1: ("ember_expm1_f32({0})", "ember_expm1_f64({0})"),
    Op.LOG1P: ("ember_log1p_f32({0})", "ember_log1p_f64({0})"),
    Op.TANH: ("ember_tanh_f32({0})", "ember_tanh_f64({0})"),
    Op.SIGMOID: ("(1.0 / (1.0 + tl.exp(-{0})))",),
    Op.ISNAN: ("({0} != {0})",),
    Op.LOGICAL_NOT: ("({0} == 0)",),
    Op.POW: ("ember_pow({0}, {1})",),
    Op.FMOD: ("({0} % {1})",),
    Op.EQ: ("({0} == {1})",), Op.NE: ("({0} != {1})",), Op.LT: ("({0} < {1})",),
    Op.LE: ("({0} <= {1})",), Op.GT: ("({0} > {1})",), Op.GE: ("({0} >= {1})",),
    Op.WHERE: ("tl.where({0}, {1}, {2})",),
    Op.BITWISE_AND: ("({0} & {1})",), Op.BITWISE_OR: ("({0} | {1})",),
    Op.BITWISE_XOR: ("({0} ^ {1})",),
}.items():
    triton_rules[_op] = _unary(*_templates)


@_rule(Op.LOG10)
def _log10(node, args, w):
    return f"(tl.log2({args[0]}) * {literal(math.log10(2.0), node.dtype)})"


@_rule(Op.SINH)
def _sinh(node, args, w):
    suffix = "f64" if is_double(node.dtype) else "f32"
    e = w.temp(node.dtype, f"ember_expm1_{suffix}(tl.abs({args[0]}))")
    half = w.temp(node.dtype, f"0.5 * ({e} + {e} / ({e} + 1.0))")
    magnitude = f'tl.where({e} == float("inf"), {e}, {half})'
    return f"tl.where({args[0]} < 0, -{magnitude}, {magnitude})"


@_rule(Op.COSH)
def _cosh(node, args, w):
    e = w.temp(node.dtype, f"tl.exp(tl.abs({args[0]}))")
    return f"(0.5 * ({e} + 1.0 / {e}))"


@_rule(Op.STOP_GRADIENT)
def _stop_gradient(node, args, w):
    return args[0]


@_rule(Op.ABS)
def _abs(node, args, w):
    if node.dtype is torch.uint8 or node.dtype is torch.bool:
        return args[0]
    return f"tl.abs({args[0]})"


@_rule(Op.NEG)
def _neg(node, args, w):
    if node.dtype.is_floating_point:
        # (Triton's unary minus is 0 - x, which makes -(0.0) +0.0; eager's is -0.0)
        return f"({args[0]} * -1.0)"
    return f"(-{args[0]})"


@_rule(Op.ROUND)
def _round(node, args, w):
    big = 2.0 ** 52 if is_double(node.dtype) else 2.0 ** 23
    return f"ember_round_half_even({args[0]}, {literal(big, node.dtype)})"


@_rule(Op.SIGN)
def _sign(node, args, w):
    (a,) = args
    ctype = compute_type(node.dtype)
    if node.dtype is torch.bool:
        return a
    return f"(({a} > 0).to({ctype}) - ({a} < 0).to({ctype}))"


@_rule(Op.RECIPROCAL)
def _reciprocal(node, args, w):
    return f"({literal(1.0, node.dtype)} / {args[0]})"


@_rule(Op.BITWISE_NOT)
def _bitwise_not(node, args, w):
    if node.dtype is torch.bool:
        return f"({args[0]} == 0)"
    if node.dtype is torch.uint8:  # (the interpreter cannot make ~'s all-ones of unsigned)
        return f"({args[0]} ^ {literal(255, node.dtype)})"
    return f"(~{args[0]})"


@_rule(Op.ISINF)
def _isinf(node, args, w):
    return f'(tl.abs({args[0]}) == float("inf"))'


def _arith(symbol: str, bool_symbol: str | None = None) -> Rule:
    def rule(node, args, w):
        if node.dtype is torch.bool and bool_symbol:
            return f"({args[0]} {bool_symbol} {args[1]})"
        return f"({args[0]} {symbol} {args[1]})"

    return rule


triton_rules[Op.ADD] = _arith("+", "|")
triton_rules[Op.SUB] = _arith("-")
triton_rules[Op.MUL] = _arith("*", "&")


@_rule(Op.DIV)
def _div(node, args, w):
    # integer division truncates: Triton's // on integers is C's division
    symbol = "/" if node.dtype.is_floating_point else "//"
    return f"({args[0]} {symbol} {args[1]})"


@_rule(Op.FLOORDIV)
def _floordiv(node, args, w):
    if node.dtype.is_floating_point:
        return f"ember_floordiv({args[0]}, {args[1]})"
    return f"ember_floordiv_int({args[0]}, {args[1]})"


@_rule(Op.REMAINDER)
def _remainder(node, args, w):
    return f"ember_remainder({args[0]}, {args[1]})"


def _extremum(which: str) -> Rule:
    def rule(node, args, w):
        a, b = args
        if node.dtype.is_floating_point:
            return f"ember_{'max' if which == 'maximum' else 'min'}_nan({a}, {b})"
        if node.dtype is torch.bool:
            return f"({a} {'|' if which == 'maximum' else '&'} {b})"
        return f"tl.{which}({a}, {b})"

    return rule


triton_rules[Op.MAXIMUM] = _extremum("maximum")
triton_rules[Op.MINIMUM] = _extremum("minimum")


@_rule(Op.COPYSIGN)
def _copysign(node, args, w):
    a, b = args
    if is_double(node.dtype):
        bits, sign = "tl.int64", "tl.full([], -9223372036854775808, tl.int64)"
    else:
        bits, sign = "tl.int32", "tl.full([], -2147483648, tl.int32)"
    ctype = compute_type(node.dtype)
    a_bits = f"{a}.to({bits}, bitcast=True)"
    b_bits = f"{b}.to({bits}, bitcast=True)"
    return f"(({a_bits} & ~{sign}) | ({b_bits} & {sign})).to({ctype}, bitcast=True)"


def _shift(left: bool) -> Rule:
    def rule(node, args, w):
        a, b = args
        bits = _BITS.get(node.dtype, 8)
        ctype = compute_type(node.dtype)
        out = f"(({b}) < 0) | (({b}) >= {bits})"
        safe = w.temp(node.dtype, f"tl.where({out}, 0, {b}).to({ctype})")
        if left:
            return f"tl.where({out}, {literal(0, node.dtype)}, {a} << {safe})"
        fill = literal(0, node.dtype) if not node.dtype.is_signed else \
            f"tl.where({a} < 0, {literal(-1, node.dtype)}, {literal(0, node.dtype)})"
        return f"tl.where({out}, {fill}, {a} >> {safe})"

    return rule


triton_rules[Op.SHIFT_LEFT] = _shift(True)
triton_rules[Op.SHIFT_RIGHT] = _shift(False)


@_rule(Op.CAST)
def _cast(node, args, w):
    (a,) = args
    source, target = node.inputs[0].dtype, node.dtype
    # A half value is carried in float32 between fused ops; leaving the half type, it must
    # first become the half value eager would hold (one loaded from memory already is).
    if source in (torch.float16, torch.bfloat16) and a not in w.exact_halves:
        a = _round_half(a, source)
    if target is torch.bool:
        return f"({a} != 0)"
    if target in (torch.float16, torch.bfloat16):
        if source is not torch.float32:
            # through float32, as eager converts (c10::Half and c10::BFloat16 are made from
            # floats); the interpreter cannot convert other types to half types directly
            a = f"{a}.to(tl.float32)"
        return _round_half(a, target)
    if source.is_floating_point and target is torch.uint8:
        return f"{a}.to(tl.int64).to(tl.uint8)"
    return f"{a}.to({compute_type(target)})"


def _round_half(value: str, dtype: torch.dtype) -> str:
    """A float32 value rounded to the half type `dtype`, kept in float32."""
    if dtype is torch.bfloat16:
        return f"ember_round_bf16({value})"
    return f"{value}.to(tl.float16).to(tl.float32)"


def load(dtype: torch.dtype, expression: str) -> str:
    """A loaded value in its compute type."""
    if dtype in (torch.float16, torch.bfloat16):
        return f"{expression}.to(tl.float32)"
    return expression


def store(dtype: torch.dtype, value: str) -> str:
    if dtype is torch.bfloat16:
        return f"ember_round_bf16({value}).to(tl.bfloat16)" if interpreting() else \
            f"{value}.to(tl.bfloat16)"
    if dtype is torch.float16:
        return f"{value}.to(tl.float16)"
    return value


def supported(op: Op) -> bool:
    return op in triton_rules or op not in TRITON_LIBRARY_OPS
