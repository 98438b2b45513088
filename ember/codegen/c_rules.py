"""C for each primitive (`c_rules`), the C types of dtypes, and the file's prelude.

Values are computed in a *compute type*: float for float16/bfloat16/float32 (so a fused chain
of half ops rounds once, when stored), double for float64, the integer type itself for
integers and `bool` for bools. Memory holds the *storage type*.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy
import torch

from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.ir.sizes import Size

STORAGE_TYPES = {
    torch.float16: "_Float16", torch.bfloat16: "uint16_t", torch.float32: "float",
    torch.float64: "double", torch.bool: "uint8_t", torch.uint8: "uint8_t",
    torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t", torch.int64: "int64_t",
}
COMPUTE_TYPES = {**STORAGE_TYPES, torch.float16: "float", torch.bfloat16: "float",
                 torch.bool: "bool"}
_BITS = {torch.uint8: 8, torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
_UNSIGNED = {torch.uint8: "uint8_t", torch.int8: "uint8_t", torch.int16: "uint16_t",
             torch.int32: "uint32_t", torch.int64: "uint64_t"}

# Math functions that glibc's libmvec has SIMD versions of (x86-64, glibc >= 2.35).
VECTOR_MATH = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
               "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
               "erf", "erfc", "pow", "atan2", "hypot")

INCLUDES = """
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
"""

# (after vector_math_declarations in the file: a helper that calls expf, as ember_erff does,
# must see its SIMD declaration, or a loop that calls the helper is not vectorized)
PRELUDE = r"""
/* c ? a : b as bit masks: gcc (12) turns a plain select whose arm calls a vector function
   (expf) into a branch around the call, and a loop with a branch does not vectorize. */
#define EMBER_PICK(NAME, T, BITS) \
static inline T NAME(int c, T a, T b) { \
    BITS ua, ub, mask = -(BITS)(c != 0), r; \
    T f; \
    memcpy(&ua, &a, sizeof(T)); \
    memcpy(&ub, &b, sizeof(T)); \
    r = (ua & mask) | (ub & ~mask); \
    memcpy(&f, &r, sizeof(T)); \
    return f; \
}
EMBER_PICK(ember_pickf, float, uint32_t)
EMBER_PICK(ember_pick, double, uint64_t)
/* NaN-propagating; a tie keeps `a`, as eager's clamp, relu and hardtanh keep x: max(-0.0, 0)
   is -0.0. (Eager's maximum of zeros of both signs keeps `a` in its scalar loop but `b` in its
   SIMD body, so there the sign depends on the element's position; ember keeps `a`.) Selected
   by bit masks with `|`, not `||`: gcc left a relu's backward loop, which holds a relu,
   scalar for the short-circuit's branch (a batch norm's backward kernel: 6.4 ms -> 0.23). */
static inline float ember_maximumf(float a, float b) {
    return ember_pickf((a != a) | (a >= b), a, b);
}
static inline float ember_minimumf(float a, float b) {
    return ember_pickf((a != a) | (a <= b), a, b);
}
static inline double ember_maximum(double a, double b) {
    return ember_pick((a != a) | (a >= b), a, b);
}
static inline double ember_minimum(double a, double b) {
    return ember_pick((a != a) | (a <= b), a, b);
}
/* sign as eager's: 0 for NaN and for either zero */
static inline float ember_signf(float a) { return (float)((a > 0) - (a < 0)); }
static inline double ember_sign(double a) { return (double)((a > 0) - (a < 0)); }
/* Python-style remainder and floor division, as torch computes them for floats */
static inline float ember_remainderf(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
static inline double ember_remainder(double a, double b) {
    double m = fmod(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
static inline float ember_floordivf(float a, float b) {
    if (b == 0) return a / b;
    float m = fmodf(a, b);
    float d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1.0f;
    if (d != 0) { float f = floorf(d); if (d - f > 0.5f) f += 1.0f; return f; }
    return copysignf(0.0f, a / b);
}
static inline double ember_floordiv(double a, double b) {
    if (b == 0) return a / b;
    double m = fmod(a, b);
    double d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1.0;
    if (d != 0) { double f = floor(d); if (d - f > 0.5) f += 1.0; return f; }
    return copysign(0.0, a / b);
}
/* the same for integers (the divisor is never 0, nor -1 for signed types) */
static inline int64_t ember_remainder_int(int64_t a, int64_t b) {
    int64_t m = a % b;
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
static inline int64_t ember_floordiv_int(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline float ember_bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
static inline uint16_t ember_float_to_bf16(float f) {
    union { uint32_t u; float f; } v; v.f = f;
    if (f != f) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7FFF + ((v.u >> 16) & 1)) >> 16);
}
static inline float ember_round_bf16(float f) {
    return ember_bf16_to_float(ember_float_to_bf16(f));
}
static inline float ember_round_f16(float f) { return (float)(_Float16)f; }
/* erf in float, branch-free so that it vectorizes: an odd Taylor polynomial near zero (exact
   to float rounding for |x| < 0.5) and Abramowitz & Stegun 7.1.26 beyond (error < 1.5e-7). */
static inline float ember_erff(float x) {
    float a = fabsf(x);
    float s = x * x;
    float near = x * (1.1283791671f + s * (-0.3761263890f + s * (0.1128379167f + s * (
        -0.0268661706f + s * (0.0052239776f + s * (-0.0008548327f + s * 0.0001205491f))))));
    float t = 1.0f / (0.3275911f * a + 1.0f);
    float r = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t
              + 0.254829592f;
    /* exp(-s) clamped at s = 80 (1.8e-35: 1 - r*t*e rounds to 1 either way), so libmvec's
       expf never takes its slow path for underflowing lanes (a GELU kernel over values of
       magnitude 10 and more: 8x slower); a plain select gcc would distribute over expf */
    float far = copysignf(1.0f - r * t * expf(-ember_pickf(s < 80.0f, s, 80.0f)), x);
    return ember_pickf(a < 0.5f, near, far);
}
static inline int64_t ember_clamp_index(int64_t i, int64_t n) {
    return i < 0 ? 0 : (i >= n ? n - 1 : i);
}
/* The identity on every index a kernel loads at (under a pad's test, a negative one is read
   at 0 and its value dropped), that gcc cannot take for affine: see CKernelWriter.offset */
static inline int64_t ember_gathered(int64_t i) {
    return i < 0 ? 0 : i;
}
"""


def vector_math_declarations() -> str:
    lines = []
    for name in VECTOR_MATH:
        arity = 2 if name in ("pow", "atan2", "hypot") else 1
        for ctype, suffix in (("float", "f"), ("double", "")):
            params = ", ".join([ctype] * arity)
            lines.append("#pragma omp declare simd notinbranch")
            lines.append(f"{ctype} {name}{suffix}({params});")
    return "\n".join(lines)


def compute_type(dtype: torch.dtype) -> str:
    return COMPUTE_TYPES[dtype]


def select(condition: str, a: str, b: str, dtype: torch.dtype) -> str:
    """`condition ? a : b` for values of `dtype`. Floats select by bit masks (ember_pickf):
    gcc (12) turns a plain select of a load and a constant (a padded max pool's
    `inside ? x[...] : -INFINITY`) into a branch around the load, and the loop stays scalar
    (8x slower); it also branches around an arm that calls a vector function (expf)."""
    kind = COMPUTE_TYPES.get(dtype)
    if kind == "float":
        return f"ember_pickf({condition}, {a}, {b})"
    if kind == "double":
        return f"ember_pick({condition}, {a}, {b})"
    return f"({condition} ? {a} : {b})"


def literal(value, dtype: torch.dtype) -> str:
    """A C literal for `value` as a value of `dtype` (rounded to dtype first, as eager does);
    a symbolic size as its C expression over the kernel's size parameters."""
    if isinstance(value, Size):
        return f"(({compute_type(dtype)}){value.render_c()})"
    if dtype is torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = torch.tensor(value, dtype=dtype).item()
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "-INFINITY"
        if compute_type(dtype) == "float":
            return str(numpy.float32(value)) + "f"  # numpy: the shortest exact float32 text
        return repr(float(value))
    value = int(value)
    if dtype is torch.int64:
        return f"INT64_C({value})" if value != -(2 ** 63) else "INT64_MIN"
    return str(value)


def load(dtype: torch.dtype, pointer_expression: str) -> str:
    if dtype is torch.float16:
        return f"(float){pointer_expression}"
    if dtype is torch.bfloat16:
        return f"ember_bf16_to_float({pointer_expression})"
    if dtype is torch.bool:
        return f"({pointer_expression} != 0)"
    return pointer_expression


def store(dtype: torch.dtype, value: str) -> str:
    if dtype is torch.float16:
        return f"(_Float16)({value})"
    if dtype is torch.bfloat16:
        return f"ember_float_to_bf16({value})"
    if dtype is torch.bool:
        return f"(uint8_t)({value})"
    return value


def _math(name: str) -> Callable[[Node, list[str]], str]:
    def rule(node: Node, args: list[str]) -> str:
        suffix = "f" if compute_type(node.inputs[0].dtype) == "float" else ""
        return f"{name}{suffix}({', '.join(args)})"

    return rule


def _float_or(node: Node, float_name: str, double_name: str) -> str:
    return float_name if compute_type(node.inputs[0].dtype) == "float" else double_name


def _one(node: Node) -> str:
    return "1.0f" if compute_type(node.dtype) == "float" else "1.0"


c_rules: dict[Op, Callable[[Node, list[str]], str]] = {}
for _op, _name in {
    Op.EXP: "exp", Op.EXP2: "exp2", Op.EXPM1: "expm1", Op.LOG: "log", Op.LOG2: "log2",
    Op.LOG10: "log10", Op.LOG1P: "log1p", Op.SQRT: "sqrt", Op.SIN: "sin", Op.COS: "cos",
    Op.TAN: "tan", Op.ASIN: "asin", Op.ACOS: "acos", Op.ATAN: "atan", Op.SINH: "sinh",
    Op.COSH: "cosh", Op.TANH: "tanh", Op.ASINH: "asinh", Op.ACOSH: "acosh", Op.ATANH: "atanh",
    Op.ERFC: "erfc", Op.FLOOR: "floor", Op.CEIL: "ceil", Op.ROUND: "rint",
    Op.TRUNC: "trunc", Op.POW: "pow", Op.ATAN2: "atan2", Op.HYPOT: "hypot",
    Op.COPYSIGN: "copysign",
}.items():
    c_rules[_op] = _math(_name)


def _abs(node: Node, args: list[str]) -> str:
    (a,) = args
    if node.dtype.is_floating_point:
        return f"{_float_or(node, 'fabsf', 'fabs')}({a})"
    return f"({a} < 0 ? -{a} : {a})"


def _arith(symbol: str, bool_symbol: str | None = None):
    def rule(node: Node, args: list[str]) -> str:
        a, b = args
        if node.dtype is torch.bool and bool_symbol:
            return f"({a} {bool_symbol} {b})"
        if node.dtype.is_floating_point or node.dtype is torch.int64:
            return f"({a} {symbol} {b})"
        # narrow integers: C promotes to int; wrap back to the dtype as eager does
        return f"({compute_type(node.dtype)})({a} {symbol} {b})"

    return rule


def _division(which: str):
    """floordiv and remainder with the divisor's sign, as Python and torch round."""

    def rule(node: Node, args: list[str]) -> str:
        a, b = args
        if node.dtype.is_floating_point:
            return f"{_float_or(node, f'ember_{which}f', f'ember_{which}')}({a}, {b})"
        return f"({compute_type(node.dtype)})ember_{which}_int({a}, {b})"

    return rule


def _fmod(node: Node, args: list[str]) -> str:
    a, b = args
    if node.dtype.is_floating_point:
        return _math("fmod")(node, args)
    return f"({compute_type(node.dtype)})({a} % {b})"  # C's % truncates, as fmod does


def _extremum(which: str):
    def rule(node: Node, args: list[str]) -> str:
        a, b = args
        if node.dtype.is_floating_point:
            suffix = "f" if compute_type(node.dtype) == "float" else ""
            return f"ember_{which}{suffix}({a}, {b})"
        if node.dtype is torch.bool:
            return f"({a} {'|' if which == 'maximum' else '&'} {b})"
        return f"({a} {'>' if which == 'maximum' else '<'} {b} ? {a} : {b})"

    return rule


def _shift(left: bool):
    def rule(node: Node, args: list[str]) -> str:
        a, b = args
        bits = _BITS.get(node.dtype, 8)
        ctype = compute_type(node.dtype)
        if left:
            shifted = f"({ctype})(({_UNSIGNED.get(node.dtype, 'uint8_t')}){a} << {b})"
            return f"(({b}) < 0 || ({b}) >= {bits} ? ({ctype})0 : {shifted})"
        fill = f"({a} < 0 ? ({ctype})-1 : ({ctype})0)"
        return f"(({b}) < 0 || ({b}) >= {bits} ? {fill} : ({ctype})({a} >> {b}))"

    return rule


def _cast(node: Node, args: list[str]) -> str:
    (a,) = args
    # A half value is carried in float between fused ops; leaving the half type, it must
    # first become the half value eager would hold.
    if node.inputs[0].dtype is torch.float16:
        a = f"ember_round_f16({a})"
    elif node.inputs[0].dtype is torch.bfloat16:
        a = f"ember_round_bf16({a})"
    return cast_exact(node, [a])


def cast_exact(node: Node, args: list[str]) -> str:
    """A cast of a value that is exactly of its source type already (a half value loaded
    from memory, or one _cast has rounded)."""
    (a,) = args
    source, target = node.inputs[0].dtype, node.dtype
    if target is torch.bool:
        return f"({a} != 0)"
    if target is torch.float16:
        return f"ember_round_f16((float)({a}))"
    if target is torch.bfloat16:
        return f"ember_round_bf16((float)({a}))"
    if source.is_floating_point and target is torch.uint8:
        return f"(uint8_t)(int64_t)({a})"
    return f"({compute_type(target)})({a})"


def _neg(node: Node, args: list[str]) -> str:
    if node.dtype.is_floating_point or node.dtype is torch.int64:
        return f"(-{args[0]})"
    return f"({compute_type(node.dtype)})(-{args[0]})"


c_rules.update({
    Op.NEG: _neg,
    Op.STOP_GRADIENT: lambda node, a: a[0],
    Op.ERF: lambda node, a: (f"ember_erff({a[0]})" if compute_type(node.dtype) == "float"
                             else f"erf({a[0]})"),
    Op.ABS: _abs,
    Op.RSQRT: lambda node, a: f"({_one(node)} / {_float_or(node, 'sqrtf', 'sqrt')}({a[0]}))",
    Op.SIGMOID: lambda node, a: (f"({_one(node)} / ({_one(node)} + "
                                 f"{_float_or(node, 'expf', 'exp')}(-{a[0]})))"),
    Op.RECIPROCAL: lambda node, a: f"({_one(node)} / {a[0]})",
    Op.SIGN: lambda node, a: (f"{_float_or(node, 'ember_signf', 'ember_sign')}({a[0]})"
                              if node.dtype.is_floating_point
                              else f"({compute_type(node.dtype)})(({a[0]} > 0) - ({a[0]} < 0))"),
    Op.BITWISE_NOT: lambda node, a: (f"(!{a[0]})" if node.dtype is torch.bool  # ~true is -2
                                     else f"({compute_type(node.dtype)})(~{a[0]})"),
    Op.LOGICAL_NOT: lambda node, a: f"(!{a[0]})",
    Op.ISNAN: lambda node, a: f"({a[0]} != {a[0]})",
    Op.ISINF: lambda node, a: f"({_float_or(node, 'fabsf', 'fabs')}({a[0]}) == INFINITY)",
    Op.ADD: _arith("+", "|"),
    Op.SUB: _arith("-"),
    Op.MUL: _arith("*", "&"),
    Op.DIV: _arith("/"),
    Op.FMOD: _fmod,
    Op.FLOORDIV: _division("floordiv"),
    Op.REMAINDER: _division("remainder"),
    Op.MAXIMUM: _extremum("maximum"),
    Op.MINIMUM: _extremum("minimum"),
    Op.BITWISE_AND: lambda node, a: f"({compute_type(node.dtype)})({a[0]} & {a[1]})",
    Op.BITWISE_OR: lambda node, a: f"({compute_type(node.dtype)})({a[0]} | {a[1]})",
    Op.BITWISE_XOR: lambda node, a: f"({compute_type(node.dtype)})({a[0]} ^ {a[1]})",
    Op.SHIFT_LEFT: _shift(True),
    Op.SHIFT_RIGHT: _shift(False),
    Op.EQ: lambda node, a: f"({a[0]} == {a[1]})",
    Op.NE: lambda node, a: f"({a[0]} != {a[1]})",
    Op.LT: lambda node, a: f"({a[0]} < {a[1]})",
    Op.LE: lambda node, a: f"({a[0]} <= {a[1]})",
    Op.GT: lambda node, a: f"({a[0]} > {a[1]})",
    Op.GE: lambda node, a: f"({a[0]} >= {a[1]})",
    Op.WHERE: lambda node, a: select(a[0], a[1], a[2], node.dtype),
    Op.CAST: _cast,
})
