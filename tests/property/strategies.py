"""Every hypothesis strategy of the property tests: shapes, layouts, tensors and programs.

A *program* is a short straight-line Python function of torch calls (pointwise ops with
broadcasting and type promotion, comparisons and where, casts, reductions) over inputs of random
shapes, strides and dtypes. It is generated as source text, so a failing example prints as the
function that fails. Each value carries what is known about it (bound, exactness) so that ops
whose result jumps on a tiny difference (comparisons, rounding, argmax, casts to integers) are
only applied to values that ember and eager compute bit for bit alike: otherwise a last-ulp
difference between two libm's would flip a comparison and the test would fail for no bug.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from hypothesis import assume, settings
from hypothesis import strategies as st


def examples(count: int) -> settings:
    """A test's settings: `count` examples under the CI profile (whose default is 100); another
    profile scales it by its own max_examples / 100 (explore: 5x). A test's own max_examples
    overrides any profile's, so a bare settings(max_examples=count) would draw `count` under
    explore too. Read when the test module is imported: after the profile is loaded."""
    return settings(max_examples=max(1, count * settings.default.max_examples // 100))


FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTEGERS = (torch.int32, torch.int64)
DTYPES = FLOATS + INTEGERS + (torch.bool,)
_MANTISSA = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}
_INT_BOUND = {torch.int32: 2.0 ** 31, torch.int64: 2.0 ** 63}

# -- shapes and layouts -------------------------------------------------------------------
# Small sizes keep each example to a few hundred elements; 0 and 1 are the interesting edges;
# 9, 17 and 33 leave remainders after SIMD-width loops. (sampled_from, not integers: it draws
# evenly, where hypothesis's integers lean to the small end.)
sizes = st.sampled_from([1, 2, 3, 4, 5, 7, 9, 17, 33, 1, 2, 3, 0])
MAX_NUMEL = 3000


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 4) -> tuple[int, ...]:
    rank = draw(st.sampled_from(range(min_rank, max_rank + 1)))
    shape = [draw(sizes) for _ in range(rank)]
    while math.prod(shape) > MAX_NUMEL:
        shape[shape.index(max(shape))] = 3
    return tuple(shape)


@st.composite
def broadcast_shape(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `shape`: leading dims dropped, some dims set to 1."""
    drop = draw(st.integers(0, len(shape)))
    kept = shape[drop:]
    ones = draw(st.lists(st.booleans(), min_size=len(kept), max_size=len(kept)))
    return tuple(1 if one else n for n, one in zip(kept, ones))


@dataclasses.dataclass(frozen=True)
class Layout:
    """How an input's memory is laid out: a permuted base, sliced with steps and offsets,
    with some size-1 dims expanded (stride 0)."""

    perm: tuple[int, ...]
    steps: tuple[int, ...]
    offsets: tuple[int, ...]
    expanded: tuple[int, ...]

    def describe(self) -> str:
        parts = []
        if self.perm != tuple(range(len(self.perm))):
            parts.append(f"permuted {self.perm}")
        if any(s != 1 for s in self.steps) or any(self.offsets):
            parts.append(f"sliced steps {self.steps} offsets {self.offsets}")
        if self.expanded:
            parts.append(f"expanded dims {self.expanded}")
        return ", ".join(parts) or "contiguous"


@st.composite
def layouts(draw, shape: tuple[int, ...]) -> Layout:
    rank = len(shape)
    kind = draw(st.sampled_from(["contiguous", "contiguous", "permuted", "sliced", "expanded",
                                 "mixed"]))
    perm, steps, offsets, expanded = tuple(range(rank)), (1,) * rank, (0,) * rank, ()
    if kind in ("permuted", "mixed"):
        perm = tuple(draw(st.permutations(range(rank))))
    if kind in ("sliced", "mixed"):
        steps = tuple(draw(st.lists(st.sampled_from([1, 2, 3]), min_size=rank, max_size=rank)))
        offsets = tuple(draw(st.lists(st.sampled_from([0, 1]), min_size=rank, max_size=rank)))
    if kind in ("expanded", "mixed"):
        candidates = [d for d, n in enumerate(shape) if n != 1]
        expanded = tuple(sorted(draw(st.sets(st.sampled_from(candidates))) if candidates
                                else ()))
    return Layout(perm, steps, offsets, expanded)


def grid_values(shape: tuple[int, ...], dtype: torch.dtype, seed: int,
                specials: bool) -> torch.Tensor:
    """Values on a grid every dtype holds exactly: multiples of 1/4 in [-2, 2] for floats
    (ties and exact zeros are common, as they are in real programs), small integers, bools;
    with `specials`, some NaN, inf, -inf and -0.0 among the floats."""
    # (drawn on the CPU, whose generator this is, then moved to the default device: the
    # whole suite runs on a GPU with EMBER_TEST_DEVICE=cuda)
    generator = torch.Generator().manual_seed(seed)
    device = torch.get_default_device()
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator, device="cpu").bool().to(device)
    if dtype in INTEGERS:
        return torch.randint(-6, 7, shape, generator=generator, device="cpu").to(device, dtype)
    values = torch.randint(-8, 9, shape, generator=generator, device="cpu").double() / 4
    if specials and values.numel():
        mask = torch.rand(shape, generator=generator, device="cpu") < 0.15
        choice = torch.randint(0, 4, shape, generator=generator, device="cpu")
        table = torch.tensor([math.nan, math.inf, -math.inf, -0.0], dtype=torch.float64,
                             device="cpu")
        values = torch.where(mask, table[choice], values)
    return values.to(device, dtype)


def materialize(shape: tuple[int, ...], dtype: torch.dtype, layout: Layout, seed: int,
                specials: bool) -> torch.Tensor:
    """A tensor of `shape` whose strides and storage offset follow `layout`."""
    base_shape = [1 if d in layout.expanded else n for d, n in enumerate(shape)]
    # allocate in permuted order so that permuting back gives non-row-major strides
    permuted = [base_shape[p] for p in layout.perm]
    steps = [layout.steps[p] for p in layout.perm]
    offsets = [layout.offsets[p] for p in layout.perm]
    storage_shape = [n * s + o for n, s, o in zip(permuted, steps, offsets)]
    storage = grid_values(tuple(storage_shape), dtype, seed, specials)
    sliced = storage[tuple(slice(o, o + n * s, s) for n, s, o in zip(permuted, steps, offsets))]
    inverse = [0] * len(layout.perm)
    for position, axis in enumerate(layout.perm):
        inverse[axis] = position
    result = sliced.permute(inverse) if sliced.ndim else sliced
    assert tuple(result.shape) == tuple(base_shape), (result.shape, base_shape)
    return result.expand(shape) if layout.expanded else result


# -- values that programs compute -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Value:
    """A value of a program: its name, an example tensor (shape, dtype) and what is known of it.

    exact: every element is the exact real result (or a NaN/inf reached the same way), so
    ember and eager hold the same bits and a comparison, rounding or argmax of it is fair.
    bound, frac: finite elements satisfy |v| <= bound and are multiples of 2**-frac.
    root: the value whose memory it views (itself when it is no view); writes to any value of
    a root change them all. writable: an in-place write to it is legal (not an expanded view).
    minmax_nan: a NaN in it may have come out of amax/amin/maximum/minimum, whose vectorized
    eager kernels give a NaN of their own bits (all ones; ember's keeps the operand's): its
    bits are no contract, so it is never bitcast (.view(int)).
    reduced_nan: a NaN in it may be the result of amax/amin. Eager's gradient of such a result
    is NaN under any cotangent, a zero one included (its backward divides the cotangent by the
    count of maxima, 0, then multiplies by the all-false mask); ember gives a zero cotangent
    as 0. So no zero-gradient op (floor, ceil, round, trunc, sign) is applied to it in
    programs that are differentiated.
    """

    name: str
    example: torch.Tensor  # zeros of its shape and dtype
    exact: bool
    bound: float
    frac: int
    finite: bool
    root: str = ""
    writable: bool = True
    minmax_nan: bool = False
    reduced_nan: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return self.example.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.example.shape)


def representable(dtype: torch.dtype, bound: float, frac: int) -> bool:
    """Whether every multiple of 2**-frac up to `bound` is held exactly by `dtype`."""
    if dtype is torch.bool:
        return True
    if dtype in _INT_BOUND:
        return frac == 0 and bound < _INT_BOUND[dtype]
    return bound * 2.0 ** frac < 2.0 ** _MANTISSA[dtype] and bound < 6e4


def _bits(value: Value) -> tuple[float, int]:
    if value.dtype is torch.bool:
        return 1.0, 0
    return value.bound, value.frac


# -- program steps ----------------------------------------------------------------------------
# Unary ops as (name, source template, accepts): `accepts(value)` says when the op is fair.
def _any(v: Value) -> bool:
    return True


def _numeric(v: Value) -> bool:
    return v.dtype is not torch.bool


def _exact_numeric(v: Value) -> bool:
    return v.exact and v.dtype is not torch.bool


def _exact_float(v: Value) -> bool:
    return v.exact and v.dtype in FLOATS


def _integral(v: Value) -> bool:
    return v.dtype in INTEGERS or v.dtype is torch.bool


# Continuous everywhere: fair on any value (results differ by ulps at most).
SMOOTH_UNARY = [
    ("neg", "torch.neg({})", _numeric),
    ("abs", "torch.abs({})", _any),
    ("sin", "torch.sin({})", _any),
    ("cos", "torch.cos({})", _any),
    ("tanh", "torch.tanh({})", _any),
    ("sigmoid", "torch.sigmoid({})", _any),
    ("atan", "torch.atan({})", _any),
    ("erf", "torch.erf({})", _any),
    ("exp_tanh", "torch.exp(torch.tanh({}))", _any),
    ("log1p_abs", "torch.log1p(torch.abs({}))", _numeric),
    ("sqrt_abs", "torch.sqrt(torch.abs({}))", _numeric),
    ("square", "torch.square({})", _numeric),
    ("relu", "torch.relu({})", _numeric),
    ("silu", "torch.nn.functional.silu({})", _any),
    # eager's float32 gelu gives NaN at +inf (its float64 gives inf): not a contract to test
    ("gelu", "torch.nn.functional.gelu({})", lambda v: v.dtype in FLOATS and v.finite),
]
# Fair only on exact values: they jump, or are undefined near points an ulp could cross.
EXACT_UNARY = [
    ("floor", "torch.floor({})", _exact_numeric),
    ("ceil", "torch.ceil({})", _exact_numeric),
    ("round", "torch.round({})", _exact_numeric),
    ("trunc", "torch.trunc({})", _exact_numeric),
    ("sign", "torch.sign({})", _exact_numeric),
    ("log", "torch.log({})", lambda v: v.exact),
    ("sqrt", "torch.sqrt({})", lambda v: v.exact),
    ("rsqrt", "torch.rsqrt({})", lambda v: v.exact),
    ("reciprocal", "torch.reciprocal({})", lambda v: v.exact),
    ("exp", "torch.exp({})", lambda v: v.exact),
    ("isnan", "torch.isnan({})", lambda v: v.exact),
    ("isinf", "torch.isinf({})", lambda v: v.exact),
    ("logical_not", "torch.logical_not({})", lambda v: v.exact),
    ("bitwise_not", "torch.bitwise_not({})", _integral),
]
# Binary ops as (name, template, kind): kind "arith" (exact on exact inputs while the result
# is representable), "smooth" (continuous), "divide" (fair when the divisor is exact),
# "compare" (fair on exact inputs), "bitwise" (integers and bools).
BINARY = [
    ("add", "torch.add({}, {})", "arith"),
    ("sub", "torch.sub({}, {})", "arith"),
    ("mul", "torch.mul({}, {})", "arith"),
    ("maximum", "torch.maximum({}, {})", "arith"),
    ("minimum", "torch.minimum({}, {})", "arith"),
    ("atan2", "torch.atan2({}, {})", "smooth"),
    ("hypot_like", "torch.sqrt(torch.add(torch.square({}), torch.square({})))", "smooth"),
    ("div", "torch.div({}, {})", "divide"),
    ("eq", "torch.eq({}, {})", "compare"),
    ("ne", "torch.ne({}, {})", "compare"),
    ("lt", "torch.lt({}, {})", "compare"),
    ("le", "torch.le({}, {})", "compare"),
    ("gt", "torch.gt({}, {})", "compare"),
    ("ge", "torch.ge({}, {})", "compare"),
    ("bitwise_and", "torch.bitwise_and({}, {})", "bitwise"),
    ("bitwise_or", "torch.bitwise_or({}, {})", "bitwise"),
    ("bitwise_xor", "torch.bitwise_xor({}, {})", "bitwise"),
]
REDUCTIONS = ("sum", "mean", "amax", "amin", "prod", "argmax", "any")
_BITCAST = {torch.float32: torch.int32, torch.int32: torch.float32, torch.float64: torch.int64,
            torch.int64: torch.float64, torch.float16: torch.bfloat16,
            torch.bfloat16: torch.float16}


@dataclasses.dataclass
class Program:
    """A straight-line function of torch calls; `source` is its Python text."""

    inputs: list[torch.Tensor]
    layouts: list[Layout]
    lines: list[str]
    outputs: list[str]
    values: list[Value]

    @property
    def source(self) -> str:
        names = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        body = [f"    {line}" for line in self.lines]
        result = ", ".join(self.outputs)
        return "\n".join([f"def program({names}):", *body, f"    return {result}"]) + "\n"

    def function(self):
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.source, "<program>", "exec"), namespace)  # noqa: S102
        return namespace["program"]

    def _repr_pretty_(self, printer, cycle) -> None:  # how hypothesis prints an example
        printer.text(repr(self))

    def __repr__(self) -> str:
        inputs = "\n".join(f"# x{i}: {x.dtype} {tuple(x.shape)} strides {x.stride()} "
                           f"offset {x.storage_offset()} ({layout.describe()})"
                           + (f"\n#     = {x.tolist()}" if x.numel() <= 32 else "")
                           for i, (x, layout) in enumerate(zip(self.inputs, self.layouts)))
        return f"\n{inputs}\n{self.source}"


class _Builder:
    """Grows a program one step at a time, tracking each value with an example tensor."""

    def __init__(self, draw, mutations: bool = False, gradients: bool = False):
        self.draw = draw
        self.mutations = mutations
        self.gradients = gradients  # the program is differentiated (training property test)
        self.values: list[Value] = []
        self.lines: list[str] = []
        self.used: set[str] = set()
        self.count = 0

    def add_input(self, tensor: torch.Tensor, specials: bool, writable: bool) -> Value:
        name = f"x{len(self.values)}"
        value = Value(name, torch.zeros(tensor.shape, dtype=tensor.dtype), exact=True, bound=2.0,
                      frac=2 if tensor.dtype in FLOATS else 0,
                      finite=not (specials and tensor.dtype in FLOATS), root=name,
                      writable=writable)
        if tensor.dtype in INTEGERS:
            value = dataclasses.replace(value, bound=6.0)
        self.values.append(value)
        return value

    def emit(self, expression: str, operands: list[Value], exact: bool, bound: float,
             frac: int, finite: bool, root: str | None = None,
             writable: bool = True, minmax_nan: bool = False,
             reduced_nan: bool = False) -> Value | None:
        # Zeros on the CPU, not meta tensors: only CPU kernels say which dtypes eager accepts.
        namespace = {"torch": torch, **{v.name: torch.zeros(v.shape, dtype=v.dtype)
                                        for v in operands}}
        try:
            example = eval(expression, namespace)  # noqa: S307  (our own generated text)
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
            return None  # e.g. an integer op eager refuses: not a program worth testing
        name = f"v{self.count}"
        self.count += 1
        if example.dtype in FLOATS:
            exact = exact and representable(example.dtype, bound, frac)
        elif example.dtype in INTEGERS:
            exact = exact and representable(example.dtype, bound, 0)
            finite = True
        else:
            bound, frac, finite = 1.0, 0, True
        # a NaN's origin carries through whatever computes from it (conservatively); only
        # float values hold a NaN
        floating = example.dtype in FLOATS
        minmax_nan = floating and (minmax_nan or any(v.minmax_nan for v in operands))
        reduced_nan = floating and (reduced_nan or any(v.reduced_nan for v in operands))
        value = Value(name, example, exact, bound if exact else math.inf, frac, finite,
                      root or name, writable, minmax_nan, reduced_nan)
        self.used.update(v.name for v in operands)
        self.lines.append(f"{name} = {expression}")
        self.values.append(value)
        return value

    def pick(self, accepts=_any) -> Value | None:
        candidates = [v for v in self.values if accepts(v)]
        if not candidates:
            return None
        # prefer recent values so that chains grow long rather than wide
        weights = list(range(1, len(candidates) + 1))
        index = self.draw(st.integers(0, sum(weights) - 1))
        for candidate, weight in zip(candidates, weights):
            if index < weight:
                return candidate
            index -= weight
        return candidates[-1]

    # -- step kinds -------------------------------------------------------------------------
    def unary(self) -> Value | None:
        name, template, accepts = self.draw(st.sampled_from(SMOOTH_UNARY + EXACT_UNARY))
        x = self.pick(accepts)
        if x is None:
            return None
        if self.gradients and x.reduced_nan and name in ("floor", "ceil", "round", "trunc",
                                                         "sign"):
            return None  # (eager's NaN gradient through amax's 0/0: see Value.reduced_nan)
        exact = x.exact and name in ("neg", "abs", "floor", "ceil", "round", "trunc", "sign",
                                     "isnan", "isinf", "logical_not", "bitwise_not", "relu")
        bound, frac = _bits(x)
        if name in ("floor", "ceil", "round", "trunc"):
            bound, frac = bound + 1, 0
        if name == "sign":
            bound, frac = 1.0, 0
        return self.emit(template.format(x.name), [x], exact, bound, frac,
                         x.finite and name in ("neg", "abs", "floor", "ceil", "round", "trunc",
                                               "sign", "relu", "bitwise_not"))

    def binary(self) -> Value | None:
        name, template, kind = self.draw(st.sampled_from(BINARY))
        if kind == "bitwise":
            a, b = self.pick(_integral), self.pick(_integral)
        elif kind == "compare":
            a, b = self.pick(lambda v: v.exact), self.pick(lambda v: v.exact)
        elif kind == "divide":
            a, b = self.pick(), self.pick(lambda v: v.exact and v.dtype in FLOATS)
        else:
            a, b = self.pick(_numeric), self.pick(_numeric)
        if a is None or b is None:
            return None
        b = self.maybe_scalar(b, kind)
        if name == "atan2" and self.gradients and any(
                v.dtype in INTEGERS and v.bound ** 2 >= _INT_BOUND[v.dtype] for v in (a, b)):
            # eager's atan2 backward computes a*a + b*b in an integer operand's own dtype,
            # which overflows (a bitcast's huge integers): its gradient is then wrong
            return None
        (ba, fa), (bb, fb) = _bits(a), _bits(b)
        if name in ("add", "sub"):
            bound, frac = ba + bb, max(fa, fb)
        elif name == "mul":
            bound, frac = ba * bb, fa + fb
        else:
            bound, frac = max(ba, bb), max(fa, fb)
        exact = a.exact and b.exact and kind in ("arith", "compare", "bitwise")
        return self.emit(template.format(a.name, b.name), [a, b], exact, bound, frac,
                         a.finite and b.finite and kind in ("arith", "bitwise"),
                         minmax_nan=name in ("maximum", "minimum")
                         and not (a.finite and b.finite))

    def maybe_scalar(self, value: Value, kind: str) -> Value:
        """Sometimes a Python scalar instead of a tensor (promotion treats them apart)."""
        if kind == "bitwise" or not self.draw(st.integers(0, 4)) == 0:
            return value
        scalar = self.draw(st.sampled_from([2, -1, 0.5, 1.25, -3.0]))
        if kind == "divide" and scalar == 0:
            scalar = 2
        return Value(repr(scalar), torch.zeros(()), exact=True,
                     bound=abs(float(scalar)), frac=2 if isinstance(scalar, float) else 0,
                     finite=True)

    def where(self) -> Value | None:
        condition = self.pick(lambda v: v.exact)
        a, b = self.pick(), self.pick()
        if condition is None:
            return None
        b = self.maybe_scalar(b, "arith")
        test = condition.name if condition.dtype is torch.bool else f"{condition.name} > 0"
        (ba, fa), (bb, fb) = _bits(a), _bits(b)
        return self.emit(f"torch.where({test}, {a.name}, {b.name})", [condition, a, b],
                         a.exact and b.exact, max(ba, bb), max(fa, fb), a.finite and b.finite)

    def cast(self) -> Value | None:
        dtype = self.draw(st.sampled_from(DTYPES))
        # float -> integer is fair only for exact, finite, representable values (C leaves the
        # rest undefined; eager's answer there is not a contract)
        if dtype in INTEGERS:
            x = self.pick(lambda v: v.exact and (v.finite or v.dtype not in FLOATS)
                          and v.bound < 2 ** 31)
        elif dtype is torch.bool:
            x = self.pick(lambda v: v.exact)
        else:
            x = self.pick()
        if x is None:
            return None
        bound, frac = _bits(x)
        if dtype in INTEGERS:
            bound, frac = bound + 1, 0
        # (to() of the same dtype returns the tensor itself: an alias of x's memory)
        same = dtype == x.dtype
        return self.emit(f"{x.name}.to({dtype})", [x], x.exact, bound, frac, x.finite,
                         root=x.root if same else None, writable=x.writable if same else True)

    def view(self) -> Value | None:
        """A view of a value (permute, strided slice, reshape, unsqueeze+expand) or a flip:
        index maps inside kernels, and outputs that alias inputs or other outputs."""
        x = self.pick()
        rank = len(x.shape)
        kind = self.draw(st.sampled_from(["permute", "slice", "reshape", "expand", "flip"]))
        if kind == "permute" and rank >= 2:
            text = f"{x.name}.permute{tuple(self.draw(st.permutations(range(rank))))}"
        elif kind == "slice" and rank >= 1:
            dim = self.draw(st.sampled_from(range(rank)))
            start = self.draw(st.sampled_from([0, 1]))
            step = self.draw(st.sampled_from([1, 2, 3]))
            text = f"{x.name}[{':, ' * dim}{start}::{step}]"
        elif kind == "reshape":
            text = f"{x.name}.reshape(-1)" if rank != 1 else f"{x.name}.reshape(1, -1, 1)"
        elif kind == "expand":
            dim = self.draw(st.sampled_from(range(rank + 1)))
            size = self.draw(st.sampled_from([1, 3]))
            shape = x.shape[:dim] + (size,) + x.shape[dim:]
            text = f"{x.name}.unsqueeze({dim}).expand{shape}"
        elif kind == "flip" and rank >= 1:
            text = f"torch.flip({x.name}, ({self.draw(st.sampled_from(range(rank)))},))"
        else:
            return None
        bound, frac = _bits(x)
        # a flip is a copy; a reshape may be one too, but writes are tracked conservatively
        return self.emit(text, [x], x.exact, bound, frac, x.finite,
                         root=None if kind == "flip" else x.root,
                         writable=x.writable and kind != "expand")

    def data(self) -> Value | None:
        """Data movement: cat, constant pad, roll, indexing with a constant index tensor
        (negative indices included), gather."""
        x = self.pick()
        rank, shape = len(x.shape), x.shape
        kinds = ["cat", "pad", "roll", "index", "gather"]
        if not self.mutations:
            # library calls returning views of their operand's memory (no rule rederives
            # them after a write, so the tracer refuses writes to what they view)
            kinds += ["as_strided", "bitcast"]
        kind = self.draw(st.sampled_from(kinds))
        if rank == 0:
            return None
        dim = self.draw(st.sampled_from(range(rank)))
        size = shape[dim]
        operands = [x]
        if kind == "cat":
            other = self.pick(lambda v: v.shape == shape) or x
            operands.append(other)
            text = f"torch.cat([{x.name}, {other.name}], {dim - rank})"
        elif kind == "pad":
            low, high = self.draw(st.sampled_from([0, 1, 2])), self.draw(st.sampled_from([0, 3]))
            value = 1 if x.dtype is not torch.bool else True
            text = f"torch.nn.functional.pad({x.name}, ({low}, {high}), value={value})"
        elif kind == "roll":
            text = f"torch.roll({x.name}, {self.draw(st.integers(-3, 3))}, {dim})"
        elif kind == "index" and size > 0:
            count = self.draw(st.sampled_from([1, 2, 4]))
            picks = [self.draw(st.integers(-size, size - 1)) for _ in range(count)]
            text = f"{x.name}[{':, ' * dim}torch.tensor({picks}, dtype=torch.int64)]"
        elif kind == "gather" and size > 0 and x.example.numel() > 0:  # tolist() keeps shape
            index_shape = list(shape)
            index_shape[dim] = self.draw(st.sampled_from([1, 2, 3]))
            generator = torch.Generator().manual_seed(self.draw(st.integers(0, 2 ** 16)))
            index = torch.randint(0, size, index_shape, generator=generator,
                                  device="cpu").to(torch.get_default_device())
            text = (f"torch.gather({x.name}, {dim}, "
                    f"torch.tensor({index.tolist()}, dtype=torch.int64))")
        elif kind == "as_strided" and x.example.numel() > 0:
            rows = self.draw(st.integers(1, 3))
            row_stride = self.draw(st.integers(0, 3))
            columns = self.draw(st.integers(1, 3))
            numel = x.example.numel()
            if not x.writable or (rows - 1) * row_stride + columns - 1 >= numel:
                return None  # (an expanded view's storage holds fewer elements than it shows)
            text = f"torch.as_strided({x.name}, ({rows}, {columns}), ({row_stride}, 1))"
        elif kind == "bitcast" and x.dtype in _BITCAST:
            if x.minmax_nan:
                return None  # a NaN's bits after eager's min/max: see Value.minmax_nan
            text = f"{x.name}.view({_BITCAST[x.dtype]})"
            return self.emit(text, operands, False, math.inf, 0, False, root=x.root,
                             writable=False)
        else:
            return None
        bounds = [_bits(v) for v in operands]
        return self.emit(text, operands, all(v.exact for v in operands),
                         max(max(b for b, _ in bounds), 1.0), max(f for _, f in bounds),
                         all(v.finite for v in operands))

    def mutate(self) -> Value | None:
        """An in-place op on a value or a view of it (slice, select, transpose): the tracer
        makes it functional, writes inputs back, and every alias sees the new value."""
        target = self.pick(lambda v: v.writable)
        if target is None:
            return None
        rank = len(target.shape)
        view = self.draw(st.sampled_from(["", "slice", "select", "transpose"]))
        if view == "slice" and rank:
            dim = self.draw(st.sampled_from(range(rank)))
            view = f"[{':, ' * dim}{self.draw(st.sampled_from([0, 1]))}::" \
                   f"{self.draw(st.sampled_from([1, 2]))}]"
        elif view == "select" and rank and target.shape[0] > 0:
            view = f"[{self.draw(st.integers(-target.shape[0], target.shape[0] - 1))}]"
        elif view == "transpose" and rank >= 2:
            view = f".transpose(0, {rank - 1})"
        else:
            view = ""
        op = self.draw(st.sampled_from(["add_", "mul_", "copy_", "fill_", "zero_"]))
        bound, frac = _bits(target)
        operands, exact, finite = [target], target.exact, target.finite
        if op in ("add_", "mul_", "copy_"):
            value = self.pick(lambda v: v.exact and v.root != target.root)  # no overlap
            if value is None:
                return None
            value = self.maybe_scalar(value, "arith")
            operands.append(value)
            (value_bound, value_frac) = _bits(value)
            exact, finite = exact and value.exact, finite and value.finite
            if op == "add_":
                bound, frac = bound + value_bound, max(frac, value_frac)
            elif op == "mul_":
                bound, frac = bound * value_bound, frac + value_frac
            else:
                bound, frac, exact, finite = value_bound, value_frac, value.exact, value.finite
            text = f"{target.name}{view}.{op}({value.name})"
        elif op == "fill_":
            text = f"{target.name}{view}.fill_({self.draw(st.sampled_from([2, -1, 0.5]))})"
            bound = max(bound, 2.0)
        else:
            text = f"{target.name}{view}.zero_()"
        result = self.emit(text, operands, exact, bound, frac, finite, root=target.root)
        if result is not None:
            # every value of that memory now holds what was written (conservatively merged)
            self.values = [dataclasses.replace(
                v, exact=v.exact and result.exact, bound=max(v.bound, result.bound),
                frac=max(v.frac, result.frac), finite=v.finite and result.finite,
                minmax_nan=v.minmax_nan or result.minmax_nan,
                reduced_nan=v.reduced_nan or result.reduced_nan)
                if v.root == target.root and v is not result else v for v in self.values]
        return result

    def reduction(self) -> Value | None:
        op = self.draw(st.sampled_from(REDUCTIONS))
        if op in ("amax", "amin", "argmax", "any", "prod"):
            x = self.pick(lambda v: v.exact)
        elif op == "mean":
            x = self.pick(lambda v: v.dtype in FLOATS)
        else:
            x = self.pick()
        if x is None:
            return None
        rank = len(x.shape)
        keepdim = self.draw(st.booleans())
        if op == "argmax":
            dims = self.draw(st.one_of(st.none(), st.integers(-rank, rank - 1) if rank
                                       else st.none()))
        else:
            dims = self.draw(st.one_of(
                st.none(), st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank,
                                    unique=True) if rank else st.none()))
            if dims is not None and self.draw(st.booleans()):
                dims = [d - rank for d in dims]  # negative dims too
        reduced = range(rank) if dims is None else \
            ([dims % rank] if isinstance(dims, int) else [d % rank for d in dims])
        count = math.prod(x.shape[d] for d in reduced)
        if op in ("amax", "amin", "argmax") and count == 0:
            return None  # eager raises on an empty reduction without identity
        if op == "argmax" and dims is None and x.shape and math.prod(x.shape) == 0:
            return None
        bound, frac = _bits(x)
        if op == "prod" and x.dtype is torch.float16 and \
                count * math.log(max(bound, 1)) > math.log(6e4):  # (bound ** count overflows)
            # eager multiplies float16 in float16 (its bfloat16 and sums use float), so its
            # partial products overflow to inf in an order of its own: not a contract to test
            return None
        exact = x.exact
        if op == "sum":
            bound *= max(count, 1)
        elif op == "prod":
            exact = exact and count <= 6
            bound = bound ** max(count, 1) if exact else math.inf
            frac = frac * max(count, 1)
        elif op == "mean":
            exact = False
        elif op in ("argmax", "any"):
            bound, frac = float(max(x.shape, default=1)), 0
        if op == "argmax":
            arguments = "" if dims is None else f", dim={dims}, keepdim={keepdim}"
        elif dims is None:
            arguments = ""
        else:
            arguments = f", dim={tuple(dims)}, keepdim={keepdim}"
        extremum = op in ("amax", "amin") and not x.finite
        return self.emit(f"torch.{op}({x.name}{arguments})", [x], exact, bound, frac,
                         x.finite and op not in ("sum", "prod", "mean"),
                         minmax_nan=extremum, reduced_nan=extremum)


@st.composite
def input_tensors(draw, shape: tuple[int, ...], dtype: torch.dtype | None = None,
                  specials: bool | None = None) -> tuple[torch.Tensor, Layout, bool]:
    dtype = dtype if dtype is not None else draw(st.sampled_from(DTYPES))
    layout = draw(layouts(shape))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    specials = specials if specials is not None else draw(st.integers(0, 3)) == 0
    return materialize(shape, dtype, layout, seed, specials), layout, specials


@st.composite
def programs(draw, reductions: bool = False, mutations: bool = False, min_steps: int = 1,
             max_steps: int = 6, dtypes: tuple[torch.dtype, ...] = DTYPES,
             gradients: bool = False) -> Program:
    """A random program over 1-3 inputs that broadcast together (`gradients`: one whose
    gradients are compared with eager's; a few of eager's backward artifacts are not drawn)."""
    shape = draw(shapes())
    builder = _Builder(draw, mutations, gradients)
    count = draw(st.sampled_from([1, 2, 2, 3]))
    inputs, input_layouts = [], []
    for position in range(count):
        input_shape = shape if position == 0 else draw(broadcast_shape(shape))
        tensor, layout, specials = draw(input_tensors(input_shape,
                                                      draw(st.sampled_from(dtypes))))
        inputs.append(tensor)
        input_layouts.append(layout)
        builder.add_input(tensor, specials, writable=not layout.expanded)
    kinds = ["unary", "binary", "binary", "where", "cast", "view", "data"]
    if mutations:
        kinds += ["mutate", "mutate"]
    if reductions:
        kinds += ["reduction", "reduction"]
    steps = draw(st.sampled_from(range(min_steps, max_steps + 1)))
    made_reduction = False
    attempts = 0
    while len(builder.lines) < steps and attempts < 4 * steps:
        attempts += 1
        kind = draw(st.sampled_from(kinds))
        if reductions and not made_reduction and len(builder.lines) == steps - 1:
            kind = "reduction"
        value = getattr(builder, kind)()
        if value is not None and kind == "reduction":
            made_reduction = True
    if not builder.lines or (reductions and not made_reduction):
        value = builder.reduction() if reductions else builder.unary()
        if value is None:
            builder.emit(f"torch.abs({builder.values[0].name})", [builder.values[0]],
                         False, math.inf, 0, False)
    # every value no later step reads is an output: no dead code, and kernels with several
    # stores of different shapes and dtypes
    outputs = [v.name for v in builder.values
               if v.name.startswith("v") and v.name not in builder.used]
    return Program(inputs, input_layouts, builder.lines, outputs, builder.values)


def tolerance(program: Program) -> dict[str, float]:
    """Tolerances for comparing a program's outputs with eager's: those of the least precise
    float dtype any inexact value went through (a float32 result cast to float64 carries
    float32's error). Eager rounds a float16/bfloat16 value after every op; ember computes a
    fused chain in float and rounds once when it stores (c_rules.py), so each reduced-float
    step adds up to half an ulp of difference."""
    steps = max(len(program.lines), 1)
    # eager's float16/bfloat16 prod rounds after every element it multiplies in (ember
    # multiplies in float and rounds once)
    largest = max((x.numel() for x in program.inputs), default=1)
    steps += sum(largest for line in program.lines if "torch.prod(" in line)
    inexact = {v.dtype for v in program.values if not v.exact and v.dtype in FLOATS}
    if torch.bfloat16 in inexact:
        return dict(rtol=8e-3 * steps, atol=8e-3 * steps)
    if torch.float16 in inexact:
        return dict(rtol=1e-3 * steps, atol=1e-3 * steps)
    if torch.float32 in inexact:
        return dict(rtol=2e-5, atol=2e-5)
    return {}


# -- index expressions (schedule/expr.py) -----------------------------------------------------
def index_variables(count: int = 3) -> st.SearchStrategy:
    """Loop variables with small extents (every point can be enumerated)."""
    from ember.schedule.expr import Var

    return st.lists(st.sampled_from([1, 2, 3, 4, 5, 6, 8]), min_size=1, max_size=count).map(
        lambda extents: [Var(f"i{n}", e) for n, e in enumerate(extents)])


@st.composite
def index_expressions(draw, variables, depth: int = 3):
    """(Expr, the same expression as a Python function of the variables' values): sums,
    products by constants, floor divisions and modulos by positive constants, nested."""
    from ember.schedule.expr import Expr

    kind = draw(st.sampled_from(["var", "const"] + (["add", "mul", "div", "mod"] * 2
                                                    if depth > 0 else [])))
    if kind == "var":
        var = draw(st.sampled_from(variables))
        return Expr.of(var), lambda values, name=var.name: values[name]
    if kind == "const":
        value = draw(st.integers(-6, 12))
        return Expr.of(value), lambda values, value=value: value
    left, left_fn = draw(index_expressions(variables, depth - 1))
    if kind == "add":
        right, right_fn = draw(index_expressions(variables, depth - 1))
        return left + right, lambda values: left_fn(values) + right_fn(values)
    number = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12] if kind != "mul" else [-2, -1, 2, 3, 4]))
    if kind == "mul":
        return left * number, lambda values: left_fn(values) * number
    if kind == "div":
        return left // number, lambda values: left_fn(values) // number
    return left % number, lambda values: left_fn(values) % number


# -- reshapes (schedule/layout.py) --------------------------------------------------------------
@st.composite
def reshape_targets(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape with as many elements: adjacent dims merged, dims split into factors, size-1
    dims inserted or dropped."""
    dims = list(shape)
    result: list[int] = []
    position = 0
    while position < len(dims):
        take = draw(st.sampled_from([1, 1, 2, 3]))
        group = dims[position:position + take]
        position += take
        size = math.prod(group)
        divisors = [d for d in range(2, size) if size % d == 0]
        if divisors and draw(st.booleans()):
            factor = draw(st.sampled_from(divisors))
            result += [factor, size // factor]
        else:
            result.append(size)
    result = [n for n in result if n != 1 or draw(st.booleans())]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        result.insert(draw(st.integers(0, len(result))), 1)
    if math.prod(result) != math.prod(shape):  # only when shape holds a 0 and 1s were dropped
        result.append(0)
    return tuple(result)


# -- large reductions (column mode, OpenMP reductions, double accumulation) ------------------
@st.composite
def large_reductions(draw) -> Program:
    """One reduction over a tensor of up to ~70k elements (blocks of column mode, parallel
    regions, long float sums) followed by an epilogue that broadcasts it back."""
    rank = draw(st.sampled_from([2, 3]))
    shape = tuple(draw(st.sampled_from([1, 3, 7, 64, 255, 257, 300, 600])) for _ in range(rank))
    while math.prod(shape) > 70_000:
        shape = tuple(n if n != max(shape) else 7 for n in shape)
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                  torch.int32, torch.bool]))
    tensor, layout, specials = draw(input_tensors(shape, dtype))
    builder = _Builder(draw)
    x = builder.add_input(tensor, specials, writable=False)
    op = draw(st.sampled_from(["sum", "amax", "amin", "argmax", "mean", "any"]))
    if op == "mean" and dtype not in FLOATS:
        op = "sum"
    dims = draw(st.lists(st.sampled_from(range(rank)), min_size=1, max_size=rank, unique=True))
    if op == "argmax":
        dims = dims[:1]
    keep = "keepdim=True"
    text = f"torch.{op}({x.name}, dim={dims[0] if op == 'argmax' else tuple(dims)}, {keep})"
    exact = op in ("amax", "amin", "argmax", "any") or dtype not in FLOATS
    reduced = builder.emit(text, [x], exact, 1e9, 2, False)
    assume(reduced is not None)  # e.g. argmax of bools, which eager refuses
    epilogue = draw(st.sampled_from(["sub", "mul", "none"]))
    if epilogue != "none" and reduced.dtype is not torch.bool and dtype is not torch.bool:
        builder.emit(f"torch.{epilogue}({x.name}, {reduced.name})", [x, reduced], False,
                     math.inf, 0, False)
    outputs = [v.name for v in builder.values[1:] if v.name not in builder.used]
    return Program([tensor], [layout], builder.lines, outputs, builder.values)


# -- pointwise chains over a symbolic batch (issue 18, stage 2) --------------------------------
_CHAIN_UNARY = ("torch.tanh({})", "torch.sigmoid({})", "({}).abs()", "({}) * 0.5",
                "({}) + 1.25", "torch.relu({})", "torch.sin({})", "torch.exp(-({}).abs())")
_CHAIN_BINARY = ("({}) * ({})", "({}) + ({})", "({}) - ({})", "torch.maximum({}, {})")


@st.composite
def pointwise_chains(draw, max_steps: int = 6) -> tuple[str, int]:
    """(source of `f(x, w)`, row length): a chain of pointwise float ops over x [batch, n]
    and a row w [n] broadcast against it; every step reads the values made before it."""
    width = draw(st.sampled_from((3, 8, 17, 64)))
    values = ["x", "w"]
    lines = []
    for step in range(draw(st.integers(1, max_steps))):
        if draw(st.booleans()):
            text = draw(st.sampled_from(_CHAIN_UNARY)).format(draw(st.sampled_from(values)))
        else:
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            text = draw(st.sampled_from(_CHAIN_BINARY)).format(a, b)
        lines.append(f"    v{step} = {text}")
        values.append(f"v{step}")
    lines.append(f"    return {values[-1]} + x")
    return "def f(x, w):\n" + "\n".join(lines) + "\n", width
