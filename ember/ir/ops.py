"""The primitive operations of ember's IR and their kinds.

Every aten op is lowered to these (ember/lower). Per-op behaviour lives in tables keyed by `Op`
(shape_rules, interpret_rules, index_rules, c_rules, ...), never in isinstance chains.

Kinds:
  LEAF       no tensor inputs: INPUT, FULL, IOTA
  POINTWISE  out[i] = f(in_0[i], ..., in_k[i]); all inputs share the output's shape
  REDUCTION  combine the input over `axes`; the output keeps reduced dims with size 1
  VIEW       out[i] = in[map(i)]: an index map, never a copy
  DATA       index maps that read data or pick among inputs: PAD, CAT, TAKE, GATHER
  LIBRARY    an aten op called at run time (matmul, conv, anything without a rule)
"""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    LEAF = "leaf"
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    VIEW = "view"
    DATA = "data"
    LIBRARY = "library"


class Op(enum.Enum):
    # leaves
    INPUT = "input"              # attrs: index
    FULL = "full"                # attrs: value
    IOTA = "iota"                # attrs: dim, start, step  (value = start + step * index[dim])
    # unary pointwise, same dtype in and out
    NEG = "neg"
    STOP_GRADIENT = "stop_gradient"  # x itself; no gradient flows back through it (detach,
    #                                  values made under torch.no_grad() in a training graph)
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    TANH = "tanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    ERF = "erf"
    ERFC = "erfc"
    SIGMOID = "sigmoid"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"              # half to even, like torch.round
    TRUNC = "trunc"
    SIGN = "sign"
    RECIPROCAL = "reciprocal"
    BITWISE_NOT = "bitwise_not"
    LOGICAL_NOT = "logical_not"  # bool -> bool
    ISNAN = "isnan"              # -> bool
    ISINF = "isinf"              # -> bool
    # binary pointwise (inputs share one dtype)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"                  # true division for floats, truncation for integers
    FLOORDIV = "floordiv"
    REMAINDER = "remainder"      # sign of the divisor, like Python's %
    FMOD = "fmod"                # sign of the dividend, like C's fmod
    POW = "pow"
    MAXIMUM = "maximum"          # NaN-propagating
    MINIMUM = "minimum"          # NaN-propagating
    ATAN2 = "atan2"
    HYPOT = "hypot"
    COPYSIGN = "copysign"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    SHIFT_LEFT = "shift_left"
    SHIFT_RIGHT = "shift_right"
    EQ = "eq"                    # comparisons -> bool
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    # ternary / conversion
    WHERE = "where"              # (bool cond, a, b)
    CAST = "cast"                # attrs: dtype
    # reductions: attrs: axes (sorted tuple); output keeps the reduced dims as size 1
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    ARGMAX = "argmax"            # one axis; int64
    ARGMIN = "argmin"
    ANY = "any"                  # bool -> bool
    ALL = "all"
    # views
    RESHAPE = "reshape"          # attrs: shape
    PERMUTE = "permute"          # attrs: perm
    EXPAND = "expand"            # attrs: shape (same rank; only size-1 dims grow)
    SLICE = "slice"              # attrs: dim, start, stop, step (step >= 1, normalised bounds)
    SQUEEZE = "squeeze"          # attrs: dims (each of size 1)
    UNSQUEEZE = "unsqueeze"      # attrs: dim
    FLIP = "flip"                # attrs: dims
    AS_STRIDED = "as_strided"    # attrs: shape, strides, offset over the input's row-major order
    # data movement
    PAD = "pad"                  # attrs: pads ((low, high, interior) per dim), value
    CAT = "cat"                  # attrs: dim
    TAKE = "take"                # (x, index) attrs: dim, wrap; out = x[..., index[...], ...]
    GATHER = "gather"            # (x, index) attrs: dim; torch.gather (no wrapping)
    # library
    LIBRARY = "library"          # attrs: target (an aten op), template (args with slots)
    ITEM = "item"                # attrs: index; one output of a multi-output LIBRARY node


UNARY = frozenset({
    Op.NEG, Op.STOP_GRADIENT, Op.ABS, Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10,
    Op.LOG1P, Op.SQRT,
    Op.RSQRT, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.TANH,
    Op.ASINH, Op.ACOSH, Op.ATANH, Op.ERF, Op.ERFC, Op.SIGMOID, Op.FLOOR, Op.CEIL, Op.ROUND,
    Op.TRUNC, Op.SIGN, Op.RECIPROCAL, Op.BITWISE_NOT, Op.LOGICAL_NOT, Op.ISNAN, Op.ISINF,
})
BINARY = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.REMAINDER, Op.FMOD, Op.POW, Op.MAXIMUM,
    Op.MINIMUM, Op.ATAN2, Op.HYPOT, Op.COPYSIGN, Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR,
    Op.SHIFT_LEFT, Op.SHIFT_RIGHT, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE,
})
COMPARISONS = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
BOOL_RESULT = COMPARISONS | {Op.LOGICAL_NOT, Op.ISNAN, Op.ISINF}
# Unary ops defined only on floating dtypes (lowering casts integer inputs first).
FLOAT_ONLY = frozenset({
    Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SQRT, Op.RSQRT, Op.SIN,
    Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.TANH, Op.ASINH, Op.ACOSH,
    Op.ATANH, Op.ERF, Op.ERFC, Op.SIGMOID, Op.ATAN2, Op.HYPOT, Op.COPYSIGN, Op.RECIPROCAL,
})
REDUCTIONS = frozenset({Op.SUM, Op.PROD, Op.MAX, Op.MIN, Op.ARGMAX, Op.ARGMIN, Op.ANY, Op.ALL})
VIEWS = frozenset({
    Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.SQUEEZE, Op.UNSQUEEZE, Op.FLIP, Op.AS_STRIDED,
})
DATA = frozenset({Op.PAD, Op.CAT, Op.TAKE, Op.GATHER})


def kind_of(op: Op) -> Kind:
    if op in (Op.INPUT, Op.FULL, Op.IOTA):
        return Kind.LEAF
    if op in UNARY or op in BINARY or op in (Op.WHERE, Op.CAST):
        return Kind.POINTWISE
    if op in REDUCTIONS:
        return Kind.REDUCTION
    if op in VIEWS:
        return Kind.VIEW
    if op in DATA:
        return Kind.DATA
    return Kind.LIBRARY


KIND: dict[Op, Kind] = {op: kind_of(op) for op in Op}
