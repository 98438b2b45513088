"""Small idioms of library Python captured without a break: functools.lru_cache'd helpers,
objects of the user's classes made inside and then called, dataclasses.replace of them,
sorted() and list.sort() with a key over items that hold tensors. Each compares with eager
and counts graphs and breaks; a cached helper with effects runs natively (its cache runs
them once, as eager's does)."""

from __future__ import annotations

import dataclasses
import functools

import torch
from checks import same

import ember


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def counts(fn, *args, **kwargs):
    report = ember.explain(fn)(*args, **kwargs)
    return report.graph_count, report.graph_break_count


CALLS: list = []


@functools.cache
def offsets(count):
    CALLS.append(count)  # (eager's cache runs this once per count)
    return tuple(range(count))


@functools.lru_cache(maxsize=8)
def scaled(x, factor):
    return x * factor


@functools.lru_cache(maxsize=8)
def noted(x):
    CALLS.append("noted")
    return x + 1


def test_an_lru_cached_helper_of_constants_answers_as_a_constant_and_fills_the_cache_once():
    offsets.cache_clear()
    CALLS.clear()

    def fn(x):
        return x * len(offsets(5)) + offsets(3)[-1]

    x = t(3)
    compiled = ember.compile(fn)
    same(compiled(x), fn(x))
    same(compiled(x), fn(x))
    assert CALLS == [5, 3]
    assert counts(fn, x) == (1, 0)


def test_an_lru_cached_function_of_tensors_is_inlined_and_one_with_effects_runs_natively():
    def pure(x):
        return scaled(x, 2.0).relu()

    def effectful(x):
        return noted(x) * 2

    x = t(4)
    same(ember.compile(pure)(x), pure(x))
    assert counts(pure, x) == (1, 0)
    noted.cache_clear()
    CALLS.clear()
    compiled = ember.compile(effectful)
    same(compiled(x), (x + 1) * 2)
    same(compiled(x), (x + 1) * 2)
    assert CALLS == ["noted"]  # (the compiled calls consulted the cache as eager's do)


class Scale:
    def __init__(self, factor):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor + self.bias()

    def bias(self):
        return 1.0


def test_an_object_made_inside_and_called_runs_its_class_s_call():
    def fn(x):
        return Scale(3.0)(x).sin()

    x = t(2, 3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


@dataclasses.dataclass
class Output:
    hidden: torch.Tensor
    extra: torch.Tensor | None = None


def test_dataclasses_replace_and_asdict_of_an_object_made_inside():
    def fn(x):
        first = Output(x * 2)
        second = dataclasses.replace(first, extra=x + 1)
        return second, dataclasses.asdict(second)["extra"] * 3, len(dataclasses.fields(second))

    x = t(3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


def test_sorted_and_list_sort_order_items_holding_tensors_by_their_keys():
    def fn(x):
        pairs = [(3, x), (1, x * 2), (2, x + 1), (1, x - 1)]
        ascending = sorted(pairs, key=lambda pair: pair[0])
        descending = list(pairs)
        descending.sort(key=lambda pair: pair[0], reverse=True)
        names = sorted(["b", "a", "c"], reverse=True)
        return [p[1] for p in ascending], [p[1] for p in descending], names

    x = t(3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


@torch.autocast("cpu", dtype=torch.bfloat16)
def projected(x, weight):
    return x @ weight


class Projection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(t(8, 8, seed=1))

    @torch.autocast("cpu", enabled=False)
    def exact(self, x):
        return x.float() @ self.weight

    def forward(self, x):
        return projected(x, self.weight).float() + self.exact(x)


def test_torch_autocast_as_a_decorator_is_its_region_in_the_graph():
    model = Projection()
    x = t(4, 8)
    expected = model(x)
    assert projected(x, model.weight).dtype == torch.bfloat16
    same(ember.compile(model)(x), expected)
    assert counts(model, x) == (1, 0)
