"""Small idioms of library Python captured without a break: functools.lru_cache'd helpers,
objects of the user's classes made inside and then called, dataclasses.replace of them,
sorted() and list.sort() with a key over items that hold tensors, defaultdicts and Counters
(a missing key is their factory's item or 0, not a KeyError), a set's own changes,
torch.autocast as a decorator, `__class__` of tensors and containers, operator's getters,
str.join of a generator, set operators of dict views, a passed object's setters (a
property's, a descriptor's, its class's own __setattr__); and a dict subclass's method at a
break changing the object itself. Each compares with eager and counts graphs and breaks; a
cached helper with effects runs natively (its cache runs them once, as eager's does); a
gradient taken inside breaks the graph there."""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import operator

import torch
from checks import counts, same

import ember


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


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


def test_sorted_list_sort_min_and_max_order_items_holding_tensors_by_their_keys():
    def fn(x):
        pairs = [(3, x), (1, x * 2), (2, x + 1), (1, x - 1)]
        ascending = sorted(pairs, key=lambda pair: pair[0])
        descending = list(pairs)
        descending.sort(key=lambda pair: pair[0], reverse=True)
        names = sorted(["b", "a", "c"], reverse=True)
        least, most = min(pairs, key=lambda pair: pair[0]), max(pairs, key=lambda p: p[0])
        return ([p[1] for p in ascending], [p[1] for p in descending], names, least[1],
                most[1], max([], key=len, default=x))

    x = t(3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


_DEVICE = torch.get_default_device().type  # (the suite's: tests/conftest.py sets it)


@torch.autocast(_DEVICE, dtype=torch.bfloat16)
def projected(x, weight):
    return x @ weight


class Projection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(t(8, 8, seed=1))

    @torch.autocast(_DEVICE, enabled=False)
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


def test_a_defaultdict_made_inside_gives_its_factory_s_items_and_leaves_as_a_defaultdict():
    def fn(x):
        groups = collections.defaultdict(list)
        for i in range(3):
            groups[i % 2].append(x * i)
        return sum(groups[0]) + sum(groups[1]), groups

    x = t(3)
    (total, groups), (expected_total, expected) = ember.compile(fn)(x), fn(x)
    same(total, expected_total)
    assert type(groups) is collections.defaultdict and groups.default_factory is list
    same(dict(groups), dict(expected))
    assert counts(fn, x) == (1, 0)


def test_a_missing_key_of_a_passed_defaultdict_or_counter_is_no_key_error():
    # (a KeyError that eager does not raise would be caught by the handler: another answer)
    def fn(x, table, seen):
        try:
            value = table["a"]
        except KeyError:
            value = 100
        return x + value + seen["never"] + seen["once"]

    x = t(2)
    ours = collections.defaultdict(int), collections.Counter(once=2)
    theirs = collections.defaultdict(int), collections.Counter(once=2)
    same(ember.compile(fn)(x, *ours), fn(x, *theirs))
    assert [dict(m) for m in ours] == [dict(m) for m in theirs] == [{"a": 0}, {"once": 2}]
    assert counts(fn, x, collections.defaultdict(int), collections.Counter(once=2)) == (1, 0)


def test_a_defaultdict_without_a_factory_raises_key_error_as_eager_does():
    def fn(x):
        table = collections.defaultdict(None, {"a": 1})
        try:
            return x + table["b"]
        except KeyError:
            return x - table["a"]

    x = t(3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


def test_counters_made_inside_or_passed_in_and_changed_are_eager_s():
    def fn(x, seen, words=("a", "b", "a")):
        seen["calls"] += 1
        counted = collections.Counter(words)
        counted["c"] += 2
        return x * counted["a"] + counted["missing"], counted, collections.Counter({"z": 2}, y=1)

    x = t(2)
    ours, theirs = collections.Counter(calls=1), collections.Counter(calls=1)
    same(ember.compile(fn)(x, ours), fn(x, theirs))
    assert ours == theirs == collections.Counter(calls=2)
    assert counts(fn, x, collections.Counter()) == (1, 0)


def test_a_set_s_own_changes_change_the_set():
    # (discard and remove ran on the known set's Python copy: the set kept the item)
    def fn(x):
        kept = {3, 1, 2}
        kept.discard(1)
        kept.update([7, 3])
        kept.remove(2)
        kept |= {5}
        return x * sum(kept), sorted(kept)

    x = t(3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


def test_a_dict_subclass_s_own_method_at_a_break_changes_the_object_itself():
    # (move_to_end breaks the graph: it ran on a copy of the OrderedDict's items, and the
    # resumed code read the object without the change)
    def fn(x):
        order = collections.OrderedDict(b=1, a=2)
        order.move_to_end("b")
        return x * order["a"], list(order)

    x = t(3)
    same(ember.compile(fn)(x), fn(x))


def test_a_dict_view_taken_before_a_change_sees_the_change():
    # (the views were lists made when taken: the change was missed, another answer)
    def fn(x):
        table = {"a": x}
        keys, values = table.keys(), table.values()
        table["b"] = x * 2
        return x * len(keys), sum(values)

    x = t(2)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


def test_the_class_of_a_tensor_or_a_container_is_eager_s():
    # (tensor.__class__ was the tensor's method of that name: `is torch.Tensor` said False)
    weight = torch.nn.Parameter(t(2))

    def fn(x, w):
        kinds = (x.__class__ is torch.Tensor, w.__class__.__name__, [1].__class__ is list,
                 {}.__class__, x.shape.__class__, (3).__class__)
        return x * w, kinds

    x = t(2)
    same(ember.compile(fn)(x, weight), fn(x, weight))
    assert counts(fn, x, weight) == (1, 0)


def test_a_gradient_taken_inside_breaks_the_graph_and_gives_eager_s_gradients():
    # (torch.autograd.grad was put in the graph, whose forward runs inside its own autograd
    # node: an internal error, then the whole function ran eagerly)
    def penalty(x):
        y = x.detach().requires_grad_()
        g, = torch.autograd.grad((y * 2).sin().sum(), y, create_graph=True)
        return (x * g).sum()

    results = []
    for run in (penalty, ember.compile(penalty)):
        x = t(4).requires_grad_()
        value = run(x)
        value.backward()
        results.append((value.detach(), x.grad))
    same(results[1], results[0])
    assert counts(penalty, t(4).requires_grad_()) == (2, 1)


BY_SECOND = operator.itemgetter(1)


def test_operator_getters_made_inside_or_passed_in_read_as_they_do():
    # (an itemgetter, attrgetter or methodcaller made inside broke the graph twice)
    def fn(x, pairs):
        first_and_third = operator.itemgetter(0, 2)([x, x * 2, x * 3])
        rows = operator.attrgetter("shape")(x)[0]
        total = operator.methodcaller("sum", dim=0)(x)
        ranked = sorted(pairs, key=BY_SECOND)
        return first_and_third, rows * total, [name for name, _ in ranked]

    x, pairs = t(3, 2), [("a", 3), ("b", 1), ("c", 2)]
    same(ember.compile(fn)(x, pairs), fn(x, pairs))
    assert counts(fn, x, pairs) == (1, 0)


def test_str_join_of_a_generator_and_set_operators_of_dict_views_are_eager_s():
    # (join took only known lists; a keys() or items() view was a list, so `&` raised where
    # eager's view answers a set, and the whole function ran eagerly)
    def fn(x):
        label = ", ".join(str(d) for d in x.shape) + "".join(map(str, [1, 2]))
        table = {"a": 1, "b": 2}
        common = table.keys() & {"a", "c"}
        rest = sorted(table.keys() - ["a"]) + sorted(table.items() | {("c", 3)})
        return x * len(label), sorted(common), rest

    x = t(2, 3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


class _Scaled:
    """A descriptor in Python: what is written is kept, what is read is ten times it."""

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, obj, kind=None):
        return getattr(obj, self.slot, 1) * 10

    def __set__(self, obj, value):
        setattr(obj, self.slot, value)


class _Settings:
    scale = _Scaled()
    aliases = {"width": "hidden"}

    def __init__(self):
        self._shift = 1
        self.hidden = 4

    def __setattr__(self, key, value):  # (a transformers config's attribute_map in small)
        super().__setattr__(self.aliases.get(key, key), value)

    @property
    def shift(self):
        return self._shift * 10

    @shift.setter
    def shift(self, value):
        self._shift = value + 1


def test_a_passed_object_s_setters_run_as_eager_runs_them():
    # (the write was recorded as a plain attribute and read back: a property's setter, a
    # descriptor's __set__ and the class's own __setattr__ never ran — 3 where eager
    # reads 40, 10 where it reads 30, 4 where a config's mapped name reads 64)
    def fn(x, settings):
        settings.shift = 3
        settings.scale = 3
        settings.width = 64
        return x * settings.shift + settings.scale + settings.hidden

    x = t(2)
    ours, theirs = _Settings(), _Settings()
    same(ember.compile(fn)(x, ours), fn(x, theirs))
    assert vars(ours) == vars(theirs)
    assert counts(fn, x, _Settings()) == (1, 0)


class _Tempered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._temperature = 1.0

    @property
    def temperature(self):
        return self._temperature * 10

    @temperature.setter
    def temperature(self, value):
        self._temperature = value + 1

    def forward(self, x):
        self.temperature = 2
        return x * self.temperature


def test_a_module_s_property_setter_runs_as_eager_runs_it():
    x = t(2)
    ours, theirs = _Tempered(), _Tempered()
    same(ember.compile(ours)(x), theirs(x))
    assert ours._temperature == theirs._temperature == 3
    assert counts(_Tempered(), x) == (1, 0)


class _Plain:
    def __init__(self):
        self.a, self.b = 1, 2


def test_a_passed_object_s_dict_and_its_attributes_are_one_store():
    # (the __dict__ was a copy of the object's dict at capture, apart from the attributes
    # written: o.__dict__["a"] = 7 then o.a read 1, setattr(o, "z", 3) then
    # o.__dict__.get("z", 0) read 0)
    def fn(x, o):
        o.__dict__["a"] = 7
        setattr(o, "z", 3)
        stored = o.__dict__
        o.q = 5
        return x * o.a + stored.get("z", 0) + stored["q"] + len(stored)

    x = t(2)
    for _ in range(2):
        ours, theirs = _Plain(), _Plain()
        same(ember.compile(fn)(x, ours), fn(x, theirs))
        assert vars(ours) == vars(theirs)
    assert counts(fn, x, _Plain()) == (1, 0)


class _Router(torch.nn.Module):
    """Switch Transformers' router: its classifier cast to the router's dtype in forward."""

    def __init__(self, dtype):
        super().__init__()
        self.classifier = torch.nn.Linear(8, 4)
        self.dtype = dtype

    def forward(self, x):
        self.classifier = self.classifier.to(self.dtype)
        return self.classifier(x.to(self.dtype)).softmax(-1)


def test_a_module_cast_to_the_dtype_it_has_in_forward_is_captured_whole():
    # (nn.Module.to in forward broke the graph: its argument parser's tuple, then each
    # parameter's .grad read in _apply; Switch Transformers: 41 graphs for a tiny model)
    for dtype in (torch.float32, torch.float64):
        ours, theirs = _Router(dtype), _Router(dtype)
        theirs.load_state_dict(ours.state_dict())
        x = t(2, 8)
        same(ember.compile(ours)(x), theirs(x))
        assert ours.classifier.weight.dtype == theirs.classifier.weight.dtype
    assert counts(_Router(torch.float32), x) == (1, 0)


class _Layers:
    """A KV cache in small: its truth and length are its layers'."""

    def __init__(self):
        self.layers = []

    def __len__(self):
        return len(self.layers)


class _Named:
    def __init__(self):
        self.scale = 2.0
        self.names = {"a", "b"}


def test_an_outside_object_s_own_len_and_a_set_in_a_deep_copy_are_code_and_guards():
    # (`if past_key_values and ...` broke the graph; so did deep-copying a config that holds
    # a set, as transformers' get_text_config does for a cache made in forward: Moonshine)
    def truth(x, cache):
        if cache:
            return x + len(cache)
        return x - 1

    def copied(x, config):
        made = copy.deepcopy(config)
        made.names.add("c")
        return x * made.scale * len(made.names) + ("b" in made.names)

    cache, config, x = _Layers(), _Named(), t(3)
    compiled_truth, compiled_copy = ember.compile(truth), ember.compile(copied)
    for step in range(3):
        same(compiled_truth(x, cache), truth(x, cache))
        same(compiled_copy(x, config), copied(x, config))
        assert config.names == ({"a", "b"} if step == 0 else {"a"})  # (the copy's change
        cache.layers.append(step)                                      # stays in the copy)
        config.names.discard("b")
    assert counts(truth, x, cache) == (1, 0) and counts(copied, x, config) == (1, 0)
