"""Python semantics under capture: each case runs compiled (fullgraph, one graph) and eager
over several calls with different inputs, comparing results and effects on arguments."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator
import types
import typing

import pytest
import torch
import torch.nn.functional as F
from checks import check_calls, same
from model_outputs import LMOutputs, ModelOutputs

import ember

CASES = []


def case(*inputs):
    """Register fn with a list of (args, kwargs) calls."""

    def register(fn):
        CASES.append(pytest.param(fn, list(inputs), id=fn.__name__))
        return fn

    return register


def t(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, device="cpu").to(torch.get_default_device())


def calls(*args_list, **kwargs):
    return [(args if isinstance(args, tuple) else (args,), kwargs) for args in args_list]


# -- arithmetic and operators --------------------------------------------------------------
@case(*calls(t(4, seed=1), t(4, seed=2)))
def tensor_arithmetic(x):
    return (x + 1) * 2 - x / 3 + x ** 2 - (-x) % 1.5 + x // 2


@case(*calls((t(3, 4), t(4, 5)), (t(3, 4, seed=3), t(4, 5, seed=4))))
def matmul_operator(a, b):
    return a @ b, b.T @ a.T


@case(*calls((t(4), 3), (t(4, seed=5), 7)))
def python_int_arithmetic(x, n):
    k = n * 2 + 1
    k //= 3
    k **= 2
    return x * k + n % 4 - abs(-n) + divmod(n, 3)[0]


@case(*calls((t(4), 2.5), (t(4), -1.5)))
def python_float_math(x, s):
    return x * math.sqrt(abs(s)) + math.floor(s) + math.pi * round(s, 1)


@case(*calls(t(5), t(5, seed=9)))
def comparisons_and_where(x):
    return torch.where(x > 0, x, -x), (x >= 0) & (x < 1), x == x, ~(x > 0)


@case(*calls((t(4), 1, 2), (t(4), 3, 3)))
def chained_comparisons(x, a, b):
    if 0 < a <= b < 10:
        return x * a
    return x - b


@case(*calls(torch.arange(6), torch.arange(6) * 3))
def integer_bit_ops(x):
    return x & 3, x | 8, x ^ 5, x << 2, x >> 1


@case(*calls((t(3), True), (t(3), False)))
def boolean_ops(x, flag):
    a = flag and x.shape[0] == 3
    b = flag or x.ndim > 5
    return x * (1 if a else 2) + (3 if b else 4), not flag


@case(*calls(t(4), t(4, seed=3)))
def augmented_assignment(x):
    y = x.clone()
    y += 1
    y *= 2
    y -= x
    z = 0
    z += 5
    return y, z


@case(*calls(t(3), t(3, seed=4)))
def unary_ops(x):
    return -x, +x, abs(x), x.neg().abs()


# -- control flow on Python values ---------------------------------------------------------
@case(*calls((t(3), "a"), (t(3), "b"), (t(3), "c")))
def if_elif_else(x, mode):
    if mode == "a":
        return x + 1
    elif mode == "b":
        return x * 2
    else:
        return x - 3


@case(*calls((t(3), 0), (t(3), 4)))
def while_loop(x, n):
    i = 0
    while i < n:
        x = x * 1.5
        i += 1
    return x, i


@case(*calls((t(3), 5), (t(3), 2)))
def for_break_continue(x, n):
    total = x
    for i in range(10):
        if i % 2 == 0:
            continue
        if i > n:
            break
        total = total + i
    return total


@case(*calls((t(2), 3), (t(2), 1)))
def nested_loops(x, n):
    out = x
    for i in range(n):
        for j in range(i):
            out = out + i * j
    return out


@case(*calls(t(3), t(3, seed=2)))
def for_else(x):
    for i in range(3):
        if i == 5:
            break
    else:
        x = x + 100
    return x


@case(*calls((t(4), None), (t(4), t(4, seed=7))))
def optional_argument(x, bias):
    if bias is not None:
        x = x + bias
    return x


@case(*calls((t(3), 3), (t(3), 8)))
def ternary_expression(x, n):
    return x * (2 if n > 5 else 3), ("big" if n > 5 else "small")


@case(*calls(t(3), t(3, seed=6)))
def walrus(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x


@case(*calls((t(4, 3), 0), (t(4, 3), 1)))
def branch_on_shape(x, dim):
    if x.shape[dim] > 3:
        return x.sum(dim)
    return x.mean(dim)


@case(*calls((t(2), [1, 2, 3]), (t(2), [4])))
def loop_over_argument_list(x, values):
    for v in values:
        x = x + v
    return x


# -- functions -----------------------------------------------------------------------------
def helper_scale(x, factor=2.0):
    return x * factor


@case(*calls(t(3), t(3, seed=8)))
def call_global_function(x):
    return helper_scale(x) + helper_scale(x, factor=0.5)


@case(*calls(t(3), t(3, seed=8)))
def closure_over_local(x):
    k = 3

    def inner(y):
        return y * k

    return inner(x) + inner(1)


@case(*calls(t(3), t(3, seed=8)))
def lambda_function(x):
    square = lambda v: v * v  # noqa: E731
    return square(x) + square(2)


@case(*calls((t(3), t(3, seed=1)), (t(3, seed=2), t(3, seed=3))))
def star_args(x, y):
    def add_all(*values, scale=1):
        total = values[0]
        for v in values[1:]:
            total = total + v
        return total * scale

    return add_all(x, y, x, scale=2), add_all(*[x, y])


@case(*calls(t(3), t(3, seed=4)))
def kwargs_dict(x):
    def configure(a, **options):
        return a * options.get("scale", 1) + options.get("shift", 0)

    return configure(x, scale=3, shift=1), configure(x, **{"shift": 2})


@case(((t(3),), {}), ((t(3),), {"bias": 1.0}))
def keyword_only(x, *, bias=0.0):
    return x + bias


@case(*calls(t(3), t(3, seed=5)))
def nonlocal_counter(x):
    count = 0

    def bump():
        nonlocal count
        count += 1

    bump()
    bump()
    return x * count


def decorate(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1

    return wrapper


@decorate
def decorated_helper(x):
    return x * 2


@case(*calls(t(3), t(3, seed=6)))
def call_decorated(x):
    return decorated_helper(x)


@case(*calls(t(3), t(3, seed=7)))
def functools_partial_free(x):
    def add(a, b):
        return a + b

    return add(x, b=2), add(b=x, a=1)


@case(*calls(t(4), t(4, seed=8)))
def default_argument_values(x, scale=2, offset=(1, 2)):
    return x * scale + offset[0] - offset[1]


# -- containers ----------------------------------------------------------------------------
@case(*calls(t(3), t(3, seed=9)))
def list_operations(x):
    items = [x, x * 2]
    items.append(x * 3)
    items.extend([x * 4])
    items.insert(0, x * 0)
    last = items.pop()
    items.reverse()
    return items, last, len(items), items[1:3], items[-1]


@case(*calls(t(3), t(3, seed=9)))
def tuple_operations(x):
    pair = (x, 1)
    triple = pair + (2,)
    return triple * 2, triple[1:], len(triple), pair[0] * pair[1]


@case(*calls(t(3), t(3, seed=9)))
def dict_operations(x):
    d = {"a": x, "b": 2}
    d["c"] = x + 1
    d.update(e=3)
    value = d.pop("b")
    keys = list(d.keys())
    return d, value, keys, [k for k, v in d.items()], d.get("z", 7), "a" in d


@case(*calls(t(3), t(3, seed=9)))
def set_operations(x):
    s = {1, 2, 3}
    s.add(4)
    return x * len(s | {5}), 3 in s, sorted(s - {1})


@case(*calls([t(3), t(3, seed=1)], [t(3, seed=2), t(3, seed=3), t(3, seed=4)]))
def list_comprehension(xs):
    return [x * 2 for x in xs if x.shape[0] == 3]


@case(*calls([t(3), t(3, seed=1)]))
def dict_and_set_comprehensions(xs):
    return {i: x.sum() for i, x in enumerate(xs)}, {len(xs), 2}


@case(*calls([t(3), t(3, seed=1), t(3, seed=2)]))
def generator_expression_in_sum(xs):
    return sum(x * 2 for x in xs), tuple(x + 1 for x in xs)


@case(*calls((t(2, 3),), (t(4, 3),)))
def nested_containers(x):
    data = {"layers": [{"w": x, "b": 1}, {"w": x * 2, "b": 2}]}
    return sum(layer["w"] * layer["b"] for layer in data["layers"])


@case(*calls(([t(2), t(2)],), ([t(2)],)))
def list_argument_read(xs):
    return torch.stack(xs).sum(0) if len(xs) > 1 else xs[0]


@case(*calls(({"a": t(2), "b": t(2, seed=2)},)))
def dict_argument_read(inputs):
    return inputs["a"] * inputs["b"], sorted(inputs)


# -- unpacking and slicing -----------------------------------------------------------------
@case(*calls(t(4, 2), t(4, 2, seed=3)))
def star_unpacking(x):
    first, *middle, last = x.unbind(0)
    return first + last, len(middle)


@case(*calls(t(4), t(4, seed=3)))
def nested_unpacking(x):
    (a, b), c = (x, x * 2), x * 3
    return a + b + c


@case(*calls(t(6, 4), t(6, 4, seed=3)))
def tensor_slicing(x):
    return x[1:4], x[::2, 1:], x[-1], x[..., 0], x[:, None, 2], x[[0, 2]]


@case(*calls(t(5), t(5, seed=3)))
def list_slicing(x):
    items = [x * i for i in range(5)]
    return items[1:3], items[::-2], items[-2:]


@case(*calls(t(3, 4), t(3, 4, seed=3)))
def swap_variables(x):
    a, b = x[0], x[1]
    a, b = b, a
    return a - b


# -- tensor attributes and methods ---------------------------------------------------------
@case(*calls(t(2, 3, 4), t(5, 1, 2)))
def tensor_metadata(x):
    return (x.shape, x.size(), x.size(1), x.dim(), x.ndim, x.numel(), x.dtype, x.device,
            x.requires_grad, x.is_floating_point(), x.is_contiguous(), x.stride())


@case(*calls(t(2, 3), t(4, 3)))
def shape_arithmetic(x):
    batch, width = x.shape
    return x.reshape(batch * width).view(-1, 1).expand(-1, 2), x.new_zeros(batch, 2)


@case(*calls(t(2, 3), t(2, 3, seed=1)))
def tensor_methods(x):
    return (x.sum(dim=1, keepdim=True), x.mean(), x.max(dim=0).values, x.t(), x.permute(1, 0),
            x.unsqueeze(0).squeeze(0), x.transpose(0, 1).contiguous(), x.flatten(), x.float())


@case(*calls(t(3, 3), t(3, 3, seed=1)))
def tensor_properties(x):
    return x.T, x.mT, x.data * 1


@case(*calls(t(4), t(4, seed=2)))
def dtype_conversions(x):
    return x.to(torch.float64), x.double().float(), x.int(), x.to(dtype=torch.float16), x.bool()


@case(*calls(t(4), t(4, seed=2)))
def torch_constants(x):
    return x.to(torch.float32) * torch.finfo(torch.float32).eps, torch.float16.itemsize


@case(*calls(t(2, 4), t(2, 4, seed=2)))
def tensor_iteration(x):
    return [row * 2 for row in x]


@case(*calls(t(3), t(3, seed=2)))
def torch_factories(x):
    return (torch.zeros(3) + x, torch.ones_like(x), torch.arange(3) * x, torch.full((3,), 2.0),
            torch.tensor([1.0, 2.0, 3.0]) * x, torch.empty(3).fill_(1) + x)


@case(*calls(t(3, 4), t(3, 4, seed=2)))
def functional_ops(x):
    return F.relu(x), F.gelu(x), F.softmax(x, dim=-1), F.layer_norm(x, (4,)), F.silu(x)


@case(*calls(t(3), t(3, seed=2)))
def in_place_on_local(x):
    y = x.clone()
    y.add_(1).mul_(2)
    y[0] = 5
    return y


@case(*calls(t(3), t(3, seed=2)))
def in_place_on_argument(x):
    x.add_(1)
    x[1:] *= 2
    return x.sum()


@case(*calls(t(4), t(4, seed=2)))
def operator_module(x):
    return operator.add(x, 1), operator.mul(2, x), operator.getitem([1, 2], 0)


# -- builtins ------------------------------------------------------------------------------
@case(*calls(t(3), t(5)))
def builtin_len_range(x):
    return [x * i for i in range(len(x))], len([1, 2]), len("abc"), len({"a": 1})


@case(*calls([t(2), t(2, seed=1), t(2, seed=2)]))
def builtin_enumerate_zip(xs):
    weights = [1.0, 2.0, 3.0]
    return [x * w * i for i, (x, w) in enumerate(zip(xs, weights), start=1)]


@case(*calls((t(2), 3), (t(2), 1.5), (t(2), "s")))
def builtin_isinstance(x, value):
    if isinstance(value, int):
        return x * value
    if isinstance(value, (float, complex)):
        return x + value
    return x, isinstance(x, torch.Tensor), isinstance(value, str)


class Config:
    def __init__(self):
        self.width = 3
        self.name = "cfg"


CONFIG = Config()


@case(*calls(t(3), t(3, seed=1)))
def builtin_getattr_hasattr(x):
    return (x * getattr(CONFIG, "width"), getattr(CONFIG, "missing", 7), hasattr(CONFIG, "name"),
            hasattr(CONFIG, "nope"))


@case(*calls((t(2), 3, 7), (t(2), 9, 2)))
def builtin_min_max_abs(x, a, b):
    return x * min(a, b) + max(a, b, 5) - abs(a - b), min([a, b]), max((a, b))


@case(*calls((t(2), 2.7), (t(2), -1.2)))
def builtin_conversions(x, v):
    return x * int(v) + float(int(v)), bool(v), str(int(v)), round(v)


@case(*calls([3, 1, 2], [5, 4]))
def builtin_sorted_reversed_sum(values):
    return sorted(values), list(reversed(values)), sum(values), any(v > 4 for v in values), \
        all(v > 0 for v in values)


@case(*calls(t(3), t(3, seed=1)))
def builtin_map_filter(x):
    return list(map(lambda v: v * 2, [x, x])), list(filter(lambda v: v > 1, [0, 1, 2, 3]))


@case(*calls(t(3), t(3, seed=1)))
def builtin_type(x):
    return type(x) is torch.Tensor, type(3) is int, type([]).__name__


@case(*calls(t(3), t(3, seed=1)))
def builtin_iter_next(x):
    it = iter([x, x * 2, x * 3])
    first = next(it)
    return first + next(it), next(iter([]), "default")


# -- strings and asserts -------------------------------------------------------------------
@case(*calls((t(2), "layer", 3), (t(2), "block", 10)))
def fstrings(x, name, n):
    key = f"{name}_{n:03d}_{x.shape[0]}"
    return {key: x * n}, f"{n!r}" + name.upper(), "{}-{}".format(name, n)


@case(*calls((t(3), 2), (t(3), 5)))
def assert_on_python_values(x, n):
    assert n > 0, "n must be positive"
    assert x.ndim == 1
    return x * n


@case(*calls(t(2), t(2, seed=1)))
def string_methods(x):
    name = "Linear_Layer"
    return x * len(name.split("_")), name.lower().startswith("linear"), ",".join(["a", "b"])


# -- grad mode -----------------------------------------------------------------------------
@case(*calls(t(3), t(3, seed=1)))
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + 1, torch.is_grad_enabled()


@case(*calls(t(3), t(3, seed=1)))
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            inner = torch.is_grad_enabled()
        outer = torch.is_grad_enabled()
    return x * 2, inner, outer


@case(*calls(t(3), t(3, seed=1)))
def set_grad_enabled_block(x):
    with torch.set_grad_enabled(False):
        y = x + 1
    return y, torch.is_grad_enabled()


# -- globals, math, misc -------------------------------------------------------------------
SCALE = 1.5
TABLE = {"a": 2, "b": 3}


@case(*calls(t(3), t(3, seed=1)))
def read_globals(x):
    return x * SCALE + TABLE["a"] - len(TABLE)


@case(*calls(t(3), t(3, seed=1)))
def none_and_identity(x):
    y = None
    z = x
    return y is None, z is x, x is not None, (y or 3)


@case(*calls((t(3), [1, 2]), (t(3), [5])))
def membership(x, values):
    return x * (2 if 1 in values else 3), 3 not in values, "a" in "abc"


@case(*calls(t(3), t(3, seed=1)))
def early_return_in_loop(x):
    for i in range(5):
        if i == 2:
            return x * i
    return x


@case(*calls(t(2, 2), t(2, 2, seed=1)))
def returns_nested_structure(x):
    return {"out": (x, [x * 2, {"deep": x * 3}]), "n": 2, "none": None}


@case(*calls(t(3), t(3, seed=1)))
def returns_python_only(x):
    return x.shape[0] * 2, "done"


@case(*calls(t(3), t(3, seed=1)))
def math_functions(x):
    return x * math.exp(1) + math.log(2) + math.cos(0) + math.ceil(1.2) + math.inf * 0 + 1


# -- objects of the user's own classes, made inside -----------------------------------------
@dataclasses.dataclass
class _Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None
    extras: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.scaled = self.logits * 2

    @property
    def total(self):
        return self.scaled.sum() + (0 if self.loss is None else self.loss)

    def with_bias(self, bias):
        return self.logits + bias


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: torch.Tensor
    b: float = 1.5


class _Record:
    kind = "record"

    def __init__(self, x, *, label="r"):
        super().__init__()
        self.x = x
        self.label = label

    @classmethod
    def of(cls, x):
        return cls(x + 1, label="made")

    @staticmethod
    def twice(v):
        return v * 2


@case(*calls(t(2, 3), t(2, 3, seed=1)))
def dataclass_made_and_returned(x):
    out = _Output(x.tanh(), loss=x.sum())
    out.extras.append(out.total)
    return out, out.with_bias(1.0), isinstance(out, _Output)


@case(*calls(t(3), t(3, seed=2)))
def one_new_object_twice_stays_one(x):
    record = _Record(x)
    record.x = record.x * 3  # changed after it was made
    return [record, record], record.kind, _Record.twice(record.x)


@case(*calls(t(3), t(3, seed=3)))
def frozen_dataclass_and_classmethod(x):
    frozen = _Frozen(x * 2)
    made = _Record.of(frozen.a)
    return frozen, made.label, made.x + frozen.b


_Pair = collections.namedtuple("_Pair", ["a", "b"])


class _Heads(typing.NamedTuple):
    logits: torch.Tensor
    loss: torch.Tensor | None = None


@case(*calls(t(3), t(3, seed=9)))
def named_tuples_made_with_tensors(x):
    pair = _Pair(x + 1, b=x * 2)
    heads = _Heads(x.sin())
    made = _Pair._make([x, pair.b])
    return (pair, pair.a + pair[1], heads, heads.loss is None, heads._replace(loss=x.sum()),
            made, made._asdict())


@case(*calls(t(3), t(3, seed=8)))
def number_accumulators_take_tensors(x):
    total, scale, parts = 0, 1.0, 0.0
    total += x                # (a number has no in-place operator: Python takes the plain one)
    scale *= x.sum()
    for v in (x, x * 2):
        parts -= v.mean()
    return total, scale, parts


@case(*calls(t(3), t(3, seed=4)))
def new_object_used_and_dropped(x):
    helper = _Record(x.relu(), label="tmp")
    return helper.x * 2 + len(helper.label)


class _Bag(dict):
    def total(self):
        return sum(self.values())


@case(*calls(t(2, 3), t(2, 3, seed=6)))
def dict_subclass_outputs_made_read_and_returned(x):
    out = LMOutputs(logits=x.tanh(), hidden=(x, x * 2))
    first, rest = out[0], out[1:]
    out.logits = out.logits + 1          # an attribute written: its item follows
    out["extra"] = first * 3             # an item written: its attribute follows
    return (out, out["logits"], out.extra, rest, out.to_tuple(), len(out), "loss" in out,
            list(out), [k for k in out.keys()], bool(out))


@case(*calls(t(3), t(3, seed=7)))
def dict_subclasses_made_with_items(x):
    bag = _Bag(a=x, b=x * 2)
    bag["c"] = x.sin()
    ordered = ModelOutputs(first=x + 1)
    return bag, bag.total(), ordered, ordered["first"], len(bag), sorted(bag)


@case(*calls(t(2, 3), t(2, 3, seed=5)))
def partial_made_inside(x):
    soft = functools.partial(torch.softmax, dim=-1)
    scaled = functools.partial(torch.mul, 2.0)
    return soft(x) + scaled(x), [scaled(v) for v in x.unbind(0)]


@pytest.mark.parametrize("fn, inputs", CASES)
def test_python_semantics(fn, inputs):
    check_calls(fn, inputs)


def test_there_are_enough_cases():
    assert len(CASES) >= 80


class _Walker(torch.nn.Module):
    """Reads its own tree the ways models do (fast-path checks, weight norms, devices)."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        hooked = any(len(m._forward_hooks) for m in self.modules())
        norm = sum(p.pow(2).sum() for p in self.parameters())
        names = [name for name, _ in self.named_children()]
        dtype = next(self.parameters()).dtype
        out = self.inner(self.first(x)) * self.scale + norm * 1e-3
        for _, buffer in self.named_buffers():
            out = out + buffer
        return out.to(dtype) + (0.0 if hooked else 1.0) + len(names)


def test_a_modules_own_tree_walks_are_captured_and_guarded():
    import ember

    model = _Walker()
    compiled = ember.compile(model)
    x = t(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        report = ember.explain(model)(x)
        assert report.graph_break_count == 0 and report.graph_count == 1
        model.inner.append(torch.nn.Sigmoid())  # the tree changes: captured again
        torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled._compiled_forward.records) == 2


def test_a_new_object_is_one_object_wherever_it_goes_and_survives_a_break():
    import ember

    kept = []

    def fn(x):
        record = _Record(x * 2)
        kept.append(record)  # (a side effect on a list from outside)
        if record.x.sum() > 0:  # a break with the object alive
            record.x = record.x + 1
        return record, record

    x = t(3)
    explained = ember.explain(fn)(x)
    assert explained.graph_break_count == 1
    kept.clear()
    compiled = ember.compile(fn)
    for sign in (1.0, -1.0):
        first, second = compiled(x.abs() * sign)
        assert first is second and kept[-1] is first and type(first) is _Record
        want = x.abs() * sign * 2
        torch.testing.assert_close(first.x, want + 1 if sign > 0 else want)


def test_super_reaches_the_base_class_method():
    import ember

    class Doubled(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    torch.manual_seed(0)
    model = Doubled(3, 2)
    x = t(4, 3)
    explained = ember.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(model)(x), model(x))


def test_objects_of_classes_with_hooks_are_made_eagerly():
    import ember

    class Output(list):  # (its __new__ is list's: a break, right answers)
        pass

    def fn(x):
        return Output([x + 1])

    x = t(3)
    explained = ember.explain(fn)(x)
    assert explained.graph_break_count == 1
    assert "own __new__ or a built-in base" in str(explained.break_reasons[0])
    torch.testing.assert_close(ember.compile(fn)(x)[0], x + 1)


def test_a_dict_subclass_object_made_inside_survives_a_break_and_stays_one_object():
    import ember

    def fn(x):
        out = LMOutputs(logits=x * 2)
        if out.logits.sum() > 0:  # a break with the object alive
            out["loss"] = out.logits.sum()
        return out, out

    x = t(3)
    explained = ember.explain(fn)(x)
    assert (explained.graph_count, explained.graph_break_count) == (2, 1)
    compiled = ember.compile(fn)
    for sign in (1.0, -1.0):
        first, second = compiled(x.abs() * sign)
        (want, _) = fn(x.abs() * sign)
        assert first is second
        same(first, want)


class _Counted:
    made = []  # a class attribute the constructor changes

    def __init__(self, x):
        self.x = x
        _Counted.made.append(len(_Counted.made))
        self.made.append(-1)


def test_a_new_objects_class_attributes_are_the_class_s():
    import ember

    def fn(x):
        return _Counted(x * 2).x + len(_Counted.made)

    x = t(3)
    _Counted.made.clear()
    want = fn(x)
    eager_made = list(_Counted.made)
    _Counted.made.clear()
    got = ember.compile(fn, fullgraph=True)(x)
    torch.testing.assert_close(got, want)
    assert _Counted.made == eager_made == [0, -1]


def test_activation_checkpointing_is_inlined_with_eagers_gradients():
    import copy

    import torch.utils.checkpoint as checkpoint

    import ember

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner_layer = torch.nn.Linear(8, 8)
            self.outer_layer = torch.nn.Linear(8, 8)

        def inner(self, x):
            return F.gelu(self.inner_layer(x))

        def forward(self, x):
            return self.outer_layer(checkpoint.checkpoint(self.inner, x, use_reentrant=False)) + x

    torch.manual_seed(0)
    model = Block()
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    x = t(4, 8)
    explained = ember.explain(twin)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    model(x).pow(2).sum().backward()
    compiled(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5)


def test_functions_wrapped_by_decorators_bind_their_own_arguments():
    # (functools.wraps gives the wrapper the wrapped function's signature: ember bound the
    # wrapper's *args by the names `t` and `scale`, and its resumed code raised
    # UnboundLocalError; torch.no_grad() as a decorator is such a wrapper)
    import ember

    def twice(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            print("calling", function.__name__)  # (a break inside the wrapper)
            return function(*args, **kwargs) * 2
        return wrapper

    @twice
    def scaled(t, scale=3.0):
        return t * scale

    @torch.no_grad()
    def halved(t):
        return t / 2

    def fn(x):
        return scaled(x, scale=2.0) + halved(x) + scaled(x)

    x = t(3)
    torch.testing.assert_close(ember.compile(scaled)(x), scaled(x))
    torch.testing.assert_close(ember.compile(halved)(x), halved(x))
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))

    def uses_no_grad_helper(x):  # (torch's decorator is inlined: one graph)
        return halved(x) + x

    explained = ember.explain(uses_no_grad_helper)(x.requires_grad_())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    got = ember.compile(uses_no_grad_helper)(x)
    torch.testing.assert_close(got, uses_no_grad_helper(x))
    got.sum().backward()  # (only x's own term has a gradient, as in eager)
    torch.testing.assert_close(x.grad, torch.ones(3))


def test_a_class_made_inside_breaks_and_the_rest_is_captured():
    import ember

    def fn(x):
        made = type("Made", (), {"scale": 2.0})
        return x * made.scale

    x = t(3)
    explained = ember.explain(fn)(x)
    assert explained.graph_break_count == 1
    assert "makes a class" in str(explained.break_reasons[0])
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))


def test_an_internal_error_in_capture_is_said_and_the_code_runs_natively(monkeypatch, caplog):
    import logging

    import ember
    from ember.capture.calls import call_rules

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setitem(call_rules, abs, broken)

    def fn(x):
        return x * abs(-2) + 1

    x = t(3)
    with caplog.at_level(logging.WARNING, logger="ember"):
        torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    assert any("internal error in ember's capture (KeyError" in r.getMessage()
               and "please report it" in r.getMessage() for r in caplog.records)


def test_the_slice_builtin_indexes_as_a_subscript_does():
    # (Swin's shifted-window mask: `for h in (slice(0, -w), slice(-w, -s), slice(-s, None))`)
    def mask(x):
        image = torch.zeros(1, 8, 8, 1)
        count = 0
        for h in (slice(0, -4), slice(-4, -2), slice(-2, None)):
            for w in (slice(0, -4), slice(-4, -2), slice(-2, None)):
                image[:, h, w, :] = count
                count += 1
        return image + x[:, slice(1, None)].sum() + x[slice(2)].sum() + x[:, slice(1, 7, 2)].sum()

    x = torch.randn(3, 8)
    assert ember.explain(mask)(x).graph_break_count == 0
    torch.testing.assert_close(ember.compile(mask)(x), mask(x))


@dataclasses.dataclass
class _Activation:
    name: str
    scale: float = 1.0


def test_match_statements_are_captured():
    # (mapping, sequence, class and value patterns sent the whole function to eager)
    def act(x, config):
        match config:
            case {"act": "relu"}:
                return x.relu()
            case (a, b):
                return x * a + b
            case _Activation(name="gelu", scale=s):
                return F.gelu(x) * s
            case _Activation("tanh"):
                return x.tanh()
            case str() as s if s == "neg":
                return -x
            case int(n):
                return x + n
            case _:
                return x

    x = torch.randn(3)
    for config in ({"act": "relu"}, (2.0, 1.0), _Activation("gelu", 0.5), _Activation("tanh"),
                   "neg", 7, _Activation("sin")):
        report = ember.explain(act)(x, config)
        assert (report.graph_count, report.graph_break_count) == (1, 0), config
        torch.testing.assert_close(ember.compile(act)(x, config), act(x, config))


class _Instantiating(collections.OrderedDict):
    """transformers' ACT2FN: super().__getitem__ reads the class (and its arguments) that
    the subclass's own __getitem__ makes an object of."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


ACTIVATIONS = _Instantiating({"gelu": torch.nn.GELU, "tanh": (torch.nn.GELU,
                                                               {"approximate": "tanh"})})


def _doubled_length(self):
    return self.length * 2


class _Cache:
    def __init__(self, length=3):
        self.length = length

    def get_length(self):
        return 0


def test_dict_functions_called_through_the_class_typing_subscripts_and_function_get():
    # (each was a break in Mamba's cache, transformers' activations, CrossViT and
    # RecurrentGemma's cache)
    def fn(x, cache):
        states = dict.fromkeys(range(3))
        states[1] = x
        found = torch.jit.annotate(typing.List[torch.Tensor], [])  # noqa: UP006 (timm's)
        found.append(ACTIVATIONS["tanh"](states[1]))
        found.append(ACTIVATIONS["gelu"](x) * dict.get(ACTIVATIONS, "relu", 2.0))
        length = _doubled_length.__get__(cache)
        made = _Cache(4)
        made.get_length = types.MethodType(_doubled_length, made)
        return found[0] + found[1] * length() + made.get_length(), states[0]

    def bind(x, cache):
        cache.get_length = _doubled_length.__get__(cache)  # (RecurrentGemma's cache)
        return x * cache.get_length()

    check_calls(fn, [((torch.randn(4), _Cache()), {})], fullgraph=True)
    for function in (fn, bind):
        report = ember.explain(function)(torch.randn(4), _Cache())
        assert (report.graph_count, report.graph_break_count) == (1, 0)
    cache, x = _Cache(), torch.randn(4)
    torch.testing.assert_close(ember.compile(bind, fullgraph=True)(x, cache), x * 6)
    assert cache.get_length() == 6 and cache.get_length.__self__ is cache


def test_functools_reduce_and_numpy_ufuncs_of_numbers_are_run_in_the_capture():
    # (Reformer's reduce(mul, axial_pos_shape) and np.lcm of its chunk lengths were breaks;
    # the np.bool_ of a comparison with np.lcm's answer a third)
    np = pytest.importorskip("numpy")
    shape = (3, 4)

    def fn(x):
        count = functools.reduce(operator.mul, shape)
        total = functools.reduce(lambda a, b: a + b, [x, x * 2], x)
        if x.shape[-1] % np.lcm(4, 6) != 0:
            total = total + 1
        return total * count

    check_calls(fn, [((torch.randn(12),), {}), ((torch.randn(24),), {})], fullgraph=True)
    report = ember.explain(fn)(torch.randn(12))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


_Attended = collections.namedtuple("_Attended", ["first", "second"])


def test_hasattr_and_getattr_see_what_a_container_lacks():
    # (every name of a tuple, list or dict read as a method: Reformer's
    # `hasattr(outputs, "buckets")` on a named tuple without that field answered True)
    def fn(x):
        pair = _Attended(x, x + 1)
        found = [hasattr(pair, "buckets"), hasattr(pair, "second"), hasattr([x], "append"),
                 hasattr({"a": x}, "shape"), hasattr((x,), "count")]
        extra = getattr(pair, "buckets", None)
        return pair.first * sum(found) + (0 if extra is None else 100)

    check_calls(fn, [((torch.randn(3),), {})])
    assert ember.explain(fn)(torch.randn(3)).graph_break_count == 0
