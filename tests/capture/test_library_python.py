"""The Python that model libraries are written in, captured by general mechanisms: graph breaks
inside try blocks (the handler runs when the native part raises), breaks deep in inlined
wrappers that undo what they changed, objects with __slots__ and Hugging Face's real
ModelOutput made inside, inspect.signature, a logger's lru_cache'd method. Each compares with
eager and counts graphs and breaks."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging

import pytest
import torch
from checks import counts, same

import ember

transformers = pytest.importorskip("transformers")


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def opaque(x):
    print("opaque", tuple(x.shape))  # (a break: print runs natively)
    return x * 3


# -- breaks inside try blocks ----------------------------------------------------------------
def break_in_try_finally(x, log):
    y = x + 1
    try:
        z = opaque(y)
        w = z * 2
    finally:
        log.append("finally")
    return w - 1


def test_break_inside_try_finally_resumes_inside_the_block(capsys):
    log_eager, log_ember = [], []
    x = t(4)
    expected = break_in_try_finally(x, log_eager)
    compiled = ember.compile(break_in_try_finally)
    for _ in range(2):
        same(compiled(x, log_ember), expected)
    assert log_ember == ["finally", "finally"] and log_eager == ["finally"]
    # the graph before the break, the opaque call's own two (before and after its print),
    # the rest of the try block and the finally
    assert counts(break_in_try_finally, x, []) == (4, 2)


def raises_in_try(x, fail):
    try:
        y = opaque(x)
        if fail:
            y = y.view(-1, 7)  # (6 elements: eager raises, its handler runs)
        out = y + 1
    except RuntimeError:
        out = x - 1
    return out * 2


@pytest.mark.parametrize("fail", [False, True])
def test_exception_of_the_native_part_goes_to_its_handler(fail, capsys):
    x = t(6)
    compiled = ember.compile(raises_in_try)
    for _ in range(2):
        same(compiled(x, fail), raises_in_try(x, fail))


def wrapper_with_try(fn):
    """A library's output-capturing wrapper: try/finally around the real forward."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        state = {"depth": 1}
        try:
            output = fn(*args, **kwargs)
        finally:
            state["depth"] -= 1
        return output

    return wrapper


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.calls = []

    @wrapper_with_try
    def forward(self, x):
        h = torch.relu(self.linear(x))
        self.calls.append(len(self.calls))  # (changed before the break: undone, then natively)
        h = opaque(h)
        return h.sum(-1)


def test_break_deep_in_a_wrapped_forward_breaks_there_only(capsys):
    torch.manual_seed(0)
    model, twin = Inner(), Inner()
    twin.load_state_dict(model.state_dict())
    compiled = ember.compile(twin)
    x = t(3, 4)
    for _ in range(2):
        same(compiled(x), model(x))
    assert twin.calls == [0, 1] and model.calls == [0, 1]
    report = ember.explain(Inner())(x)
    # the wrapper breaks at its call of forward, which is compiled on its own: linear and
    # relu, a break at opaque (compiled on its own: its print, then x * 3), then the sum
    assert (report.graph_count, report.graph_break_count) == (6, 3)
    assert report.ops_per_graph == [0, 2, 0, 1, 1, 0]


# -- objects made inside ---------------------------------------------------------------------
class Slotted:
    __slots__ = ("scale", "bias")

    def __init__(self, scale, bias):
        self.scale = scale
        self.bias = bias


class Layer(Slotted):  # (a subclass without __slots__ has a __dict__ too)
    def __init__(self, scale, bias):
        super().__init__(scale, bias)
        self.tag = "layer"


def makes_slotted(x):
    layer = Layer(x * 2, 1.5)
    return layer, layer.scale + layer.bias


def test_objects_with_slots_are_made_inside():
    x = t(5)
    compiled = ember.compile(makes_slotted)
    layer, out = compiled(x)
    expected_layer, expected = makes_slotted(x)
    same(out, expected)
    assert type(layer) is Layer and layer.tag == "layer" and layer.bias == 1.5
    same(layer.scale, expected_layer.scale)
    assert counts(makes_slotted, x) == (1, 0)


def makes_model_output(x):
    from transformers.modeling_outputs import BaseModelOutputWithPast

    out = BaseModelOutputWithPast(last_hidden_state=x * 2, hidden_states=(x, x + 1))
    return out


def reads_model_output(x):
    from transformers.modeling_outputs import CausalLMOutput

    out = CausalLMOutput(logits=torch.tanh(x))
    return out["logits"] + out.logits + out[0] + len(out.to_tuple())


def test_real_model_output_is_made_inside_and_returned():
    x = t(2, 3)
    compiled = ember.compile(makes_model_output)
    out, expected = compiled(x), makes_model_output(x)
    assert type(out) is type(expected)
    assert list(out.keys()) == list(expected.keys())
    same(out.last_hidden_state, expected.last_hidden_state)
    same(out[0], expected[0])
    same(out.hidden_states[1], expected.hidden_states[1])
    assert counts(makes_model_output, x) == (1, 0)
    same(ember.compile(reads_model_output)(x), reads_model_output(x))
    assert counts(reads_model_output, x) == (1, 0)


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: torch.Tensor | None = None

    def __post_init__(self):
        if self.second is None:
            self.second = self.first.neg()


def makes_dataclass(x):
    pair = Pair(x + 1)
    return pair.__dict__.get("second") * 2, pair


def test_dataclass_post_init_and_dict_reads():
    x = t(3)
    out, pair = ember.compile(makes_dataclass)(x)
    expected, expected_pair = makes_dataclass(x)
    same(out, expected)
    assert type(pair) is Pair
    same(pair.second, expected_pair.second)
    assert counts(makes_dataclass, x) == (1, 0)


# -- introspection and logging ---------------------------------------------------------------
class Chunked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def step(self, x, scale=2.0):
        return self.linear(x) * scale

    def forward(self, x):
        parameters = inspect.signature(self.step).parameters
        if len(parameters) == 2:  # (x, scale: the bound method drops self)
            return self.step(x)
        return x


def test_inspect_signature_is_answered_at_capture():
    torch.manual_seed(0)
    model = Chunked()
    x = t(2, 4)
    same(ember.compile(model)(x), model(x))
    assert counts(model, x) == (1, 0)


logger = logging.getLogger("ember.tests.library_python")


@functools.lru_cache(None)
def warning_once(self, *args):
    self.warning(*args)


def warns_once(x):
    warning_once(logger, "using the default loss")
    return x + 1


def test_lru_cached_logger_method_runs_after_the_graph(caplog):
    x = t(3)
    warning_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger=logger.name):
        compiled = ember.compile(warns_once)
        same(compiled(x), x + 1)
        same(compiled(x), x + 1)
    assert [r.getMessage() for r in caplog.records] == ["using the default loss"]
    assert counts(warns_once, x) == (1, 0)


# -- keyword renaming --------------------------------------------------------------------------
class Cache:
    def __init__(self):
        self.items = []


class Renamed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from transformers.utils.deprecation import deprecate_kwarg

        self.forward = deprecate_kwarg("past_key_value", new_name="past_key_values",
                                       version="4.0")(self._forward)

    def _forward(self, x, past_key_values=None):
        past_key_values.items.append(x * 2)
        return x + 1, past_key_values


def renames(**kwargs):
    kwargs["new"] = kwargs.pop("old")
    return kwargs["new"].items, kwargs


def test_a_renamed_keyword_argument_is_fetched_before_the_dict_changes():
    """transformers' deprecate_kwarg moves a keyword in the call's **kwargs dict: what came in
    under the old name is read before the effects write the dict back (a KeyError crashed
    the user's decoding loop)."""
    compiled = ember.compile(Renamed())
    for _ in range(2):
        cache = Cache()
        out, back = compiled(t(2), past_key_value=cache)
        same(out, t(2) + 1)
        assert back is cache and len(cache.items) == 1
        same(cache.items[0], t(2) * 2)
    compiled = ember.compile(renames)
    for _ in range(2):
        cache = Cache()
        items, kwargs = compiled(old=cache)
        assert items is cache.items and kwargs == {"new": cache}


# -- generators ----------------------------------------------------------------------------------
class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.log = []

    def blocks(self, count):
        for index, layer in enumerate(self.layers):
            if index < count:
                yield layer

    def logged(self):
        for layer in self.layers:
            self.log.append(len(self.log))  # (changes state: not run ahead of its consumer)
            yield layer

    def forward(self, x, logged=False):
        for layer in self.blocks(2):
            x = torch.relu(layer(x))
        if logged:
            for layer in self.logged():
                x = layer(x)
        return x


def test_a_pure_generator_function_runs_to_its_end_in_the_graph():
    torch.manual_seed(0)
    model = Blocks()
    x = t(2, 4)
    same(ember.compile(model)(x), model(x))
    assert counts(model, x) == (1, 0)
    assert ember.explain(model)(x).ops_per_graph == [4]


def test_a_generator_that_changes_state_breaks_and_runs_natively():
    torch.manual_seed(0)
    model = Blocks()
    x = t(2, 4)
    expected = model(x, logged=True)
    log = list(model.log)
    model.log.clear()
    same(ember.compile(model)(x, logged=True), expected)
    assert model.log == log == [0, 1, 2]


def chained(xs):
    """torch.nn.Module.named_modules' shape: a recursive generator delegating with yield from."""
    total = 0
    for x in xs:
        if isinstance(x, list):
            total += yield from chained(x)
        else:
            yield x
            total += 1
    return total


def test_yield_from_delegates_and_gives_the_delegate_s_return_value_in_one_graph():
    def fn(x):
        items = [x, [x * 2, [x + 1]], x.sin()]
        gathered = list(chained(items))
        counted = yield_from_count(items)
        return torch.stack(gathered).sum(0) * counted

    def yield_from_count(items):
        generator = chained(items)
        while True:
            try:
                next(generator)
            except StopIteration as stop:
                return stop.value

    x = t(3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


def test_yield_from_over_a_plain_iterable_and_a_generator_expression():
    def pieces(x):
        yield from (x, x * 2)
        yield from (y + 1 for y in (x, -x))
        yield from range(2)

    def fn(x):
        return [p * 2 for p in pieces(x)]

    x = t(2, 3)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (1, 0)


def test_a_generator_handed_back_unfinished_is_a_generator_with_eager_s_items_and_value():
    def fn(x):
        generator = chained([x, [x * 2, x + 1]])
        first = next(generator)
        return first * 2, generator

    x = t(3)
    expected_first, expected = fn(x)
    first, generator = ember.compile(fn)(x)
    same(first, expected_first)
    assert counts(fn, x) == (1, 0)
    assert inspect.isgenerator(generator)
    same(drained(generator), drained(expected))


def drained(generator):
    """Its items and then its return value (StopIteration's)."""
    items = []
    while True:
        try:
            items.append(next(generator))
        except StopIteration as stop:
            return items, stop.value


# -- copies and attribute hooks -------------------------------------------------------------------
class Settings:
    """A config-like object: names mapped at read and write time, as transformers' configs."""

    aliases = {"heads": "num_heads"}

    def __init__(self):
        self.num_heads = 2
        self.scale = 0.5
        self.extra = {"shift": 1.0}

    def __getattribute__(self, key):
        if key != "aliases" and key in super().__getattribute__("aliases"):
            key = super().__getattribute__("aliases")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if key in super().__getattribute__("aliases"):
            key = super().__getattribute__("aliases")[key]
        super().__setattr__(key, value)


def derives_settings(x, settings):
    derived = copy.deepcopy(settings)
    derived.heads = derived.heads * 2  # (through the alias: num_heads)
    del derived.scale
    kept = copy.copy(settings.extra)
    kept["shift"] = 3.0
    return x * derived.num_heads + settings.extra["shift"] + kept["shift"], \
        hasattr(derived, "scale"), id(derived) != id(settings)


def test_deepcopy_of_an_outside_object_with_attribute_hooks():
    settings = Settings()
    x = t(3)
    compiled = ember.compile(derives_settings)
    for _ in range(2):
        out, has_scale, other = compiled(x, settings)
        expected, expected_has, expected_other = derives_settings(x, settings)
        same(out, expected)
        assert (has_scale, other) == (expected_has, expected_other) == (False, True)
    assert settings.num_heads == 2 and settings.scale == 0.5 and settings.extra == {"shift": 1.0}
    assert counts(derives_settings, x, settings) == (1, 0)
    settings.num_heads = 3  # (read through the copy: guarded on the original)
    same(compiled(x, settings)[0], derives_settings(x, settings)[0])


def leaks_id(x):
    return x + 1, id(x)


def test_an_id_taken_inside_does_not_leave_the_graph():
    x = t(2)
    out, number = ember.compile(leaks_id)(x)
    same(out, x + 1)
    assert number == id(x)


# -- modules made inside, tables keyed by types -------------------------------------------------
def loss_made_inside(logits, labels):
    loss_function = torch.nn.CrossEntropyLoss(ignore_index=-100)
    return loss_function(logits.view(-1, logits.shape[-1]), labels.view(-1))


def test_a_module_without_state_made_inside_is_one_graph():
    logits, labels = t(2, 3, 5), torch.tensor([[0, 4, -100], [2, 2, 1]])
    same(ember.compile(loss_made_inside)(logits, labels), loss_made_inside(logits, labels))
    assert counts(loss_made_inside, logits, labels) == (1, 0)


def linear_made_inside(x):
    return torch.nn.Linear(3, 3)(x)  # (random weights each call: eager's own, not a graph's)


def test_a_module_with_parameters_made_inside_runs_natively():
    x = t(2, 3)
    compiled = ember.compile(linear_made_inside)
    assert compiled(x).shape == (2, 3)
    assert compiled(x).requires_grad
    # (a break at its making: Linear(3, 3) runs natively, the call of it is a graph)
    assert counts(linear_made_inside, x) == (2, 1)


VALIDATORS = {int: lambda v: v * 2, float: lambda v: v + 0.5, "name": lambda v: v}


def validated(x, scale):
    check = VALIDATORS.get(type(scale))
    return x * check(scale)


def test_a_table_keyed_by_types_is_read_in_the_graph():
    x = t(3)
    compiled = ember.compile(validated)
    for scale in (2, 1.5, 3):
        same(compiled(x, scale), validated(x, scale))
    assert counts(validated, x, 2) == (1, 0)


# -- layers looped over through a slice ------------------------------------------------------
class PartialActivation(torch.nn.Module):
    """transformers' GELUTanh: its activation is a functools.partial held as an attribute."""

    def __init__(self, approximate="tanh"):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.act = functools.partial(torch.nn.functional.gelu, approximate=approximate)

    def forward(self, x):
        return self.act(self.linear(x))


class SlicedLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(PartialActivation() for _ in range(3))
        self.count = 2

    def forward(self, x):
        for layer in self.layers[: self.count]:  # (transformers' models loop so)
            x = layer(x) * 2
        return x


def test_layers_looped_over_through_a_slice_keep_their_sources():
    # (a slice of a ModuleList made modules without sources: Gemma's partial activation in
    # each layer then broke the graph twice a layer)
    torch.manual_seed(0)
    model = SlicedLayers()
    x = t(2, 4)
    compiled = ember.compile(model)
    same(compiled(x), model(x))
    assert counts(model, x) == (1, 0)
    # what the layers hold is guarded through the container they were sliced from
    model.layers[1].act = functools.partial(torch.nn.functional.gelu, approximate="none")
    same(compiled(x), model(x))
    model.count = 3
    same(compiled(x), model(x))



# -- torch.jit.script'd helpers --------------------------------------------------------------
@torch.jit.script
def scripted_bucket(relative: torch.Tensor, size: int) -> torch.Tensor:
    # (DeBERTa's relative positions go through helpers like this one)
    sign = torch.sign(relative)
    return sign * torch.clamp(relative.abs(), max=size)


def uses_a_scripted_helper(x):
    positions = torch.arange(x.shape[-1], device=x.device)
    return x * scripted_bucket(positions[None, :] - positions[:, None], 3)


def test_a_scripted_function_is_inlined_from_its_python():
    # (its call in the graph was written by FX as a call of ScriptFunction's class: every
    # run of the captured graph as eager runs it — explain, an eager fallback — raised
    # "ScriptFunction: No constructor defined!")
    x = t(5, 5)
    same(ember.compile(uses_a_scripted_helper)(x), uses_a_scripted_helper(x))
    assert counts(uses_a_scripted_helper, x) == (1, 0)


def test_a_scripted_function_without_its_python_runs_outside_the_graph():
    @torch.jit.script
    def halved(x: torch.Tensor) -> torch.Tensor:
        return x / 2

    del halved._torchdynamo_inline  # (as one loaded from a file has none)

    def fn(x):
        return halved(x * 3) + 1

    x = t(4)
    same(ember.compile(fn)(x), fn(x))
    assert counts(fn, x) == (2, 1)


# -- LayerDrop -------------------------------------------------------------------------------
class LayerDrop(torch.nn.Module):
    def __init__(self, layerdrop):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.layerdrop = layerdrop

    def forward(self, x):
        for layer in self.layers:
            if self.training:  # (transformers' BART, OPT, Whisper, ... write LayerDrop so)
                dropout_probability = torch.rand([])
                if dropout_probability < self.layerdrop:
                    continue
            x = layer(x)
        return x


@pytest.mark.parametrize("layerdrop, graphs", [(0.0, 1), (0.5, 4)])
def test_a_uniform_draw_compared_with_a_bound_it_never_crosses_is_no_break(layerdrop, graphs):
    # (torch.rand([]) < 0.0 is False whatever is drawn: no break, and the draw still moves
    # the generator as eager's does; with 0.5 the branch depends on the draw)
    torch.manual_seed(0)
    model = LayerDrop(layerdrop).train()
    x = t(2, 4)
    torch.manual_seed(1)
    expected, after = model(x), torch.rand(3)
    compiled = ember.compile(model)
    torch.manual_seed(1)
    same(compiled(x), expected)
    same(torch.rand(3), after)
    assert ember.explain(model)(x).graph_count == graphs


def test_a_half_precision_draw_is_not_decided():
    # (a bfloat16 draw may round up to 1.0: only float32 and float64 draws are decided)
    def fn(x):
        if torch.rand([], dtype=torch.bfloat16) < 1.0:
            return x + 1
        return x - 1

    x = t(3)
    torch.manual_seed(2)
    expected = fn(x)
    torch.manual_seed(2)
    same(ember.compile(fn)(x), expected)
    assert ember.explain(fn)(x).graph_break_count == 1


# -- a class's own __getattribute__ (transformers' configs map names through theirs) -------
def reads_config(x, config):
    scale = config.hidden_size / config.n_embd + config.n_layer  # (hidden_size: n_embd's alias)
    if hasattr(config, "vision_feature_layer"):
        scale = scale + 100
    return x * scale + getattr(config, "missing_setting", 0.5)


def test_a_config_read_through_its_own_getattribute_is_guarded_past_it(recompiles):
    config = transformers.GPT2Config(n_embd=8, n_layer=2, n_head=2)
    x = t(3)
    compiled = ember.compile(reads_config)
    same(compiled(x, config), reads_config(x, config))
    guards = compiled.entries[0].guard_source
    # (the hook inlined once: reads and absences asked of object.__getattribute__, not of
    # the config's Python __getattribute__ on every call)
    assert "object.__getattribute__" in guards and "hasattr" not in guards
    assert "vision_feature_layer" in guards and "missing_setting" in guards
    config.n_layer = 5
    same(compiled(x, config), reads_config(x, config))
    config.hidden_size = 16  # (written through the alias: n_embd)
    same(compiled(x, config), reads_config(x, config))
    config.vision_feature_layer = -1
    same(compiled(x, config), reads_config(x, config))
    config.missing_setting = 2.0
    same(compiled(x, config), reads_config(x, config))
    for name in ("vision_feature_layer", "missing_setting"):
        assert f"config.{name} now exists" in recompiles.text
    versions = len(compiled.entries)
    other = transformers.GPT2Config(n_embd=8, n_layer=2, n_head=2)
    same(compiled(x, other), reads_config(x, other))
    assert len(compiled.entries) == versions  # (an equal config: served by the first)


class Mapped:
    """An object whose own __getattribute__ answers some names itself."""

    def __init__(self):
        self.width = 3

    def __getattribute__(self, key):
        if key == "double":
            return object.__getattribute__(self, "width") * 2
        return object.__getattribute__(self, key)


def test_a_python_getattribute_that_computes_a_value_is_followed():
    settings = Mapped()
    x = t(3)

    def fn(x, settings):
        return x * settings.double + settings.width

    compiled = ember.compile(fn)
    same(compiled(x, settings), fn(x, settings))
    settings.width = 7
    same(compiled(x, settings), fn(x, settings))
    assert counts(fn, x, settings) == (1, 0)


class Absent:
    __slots__ = ("present",)

    def __init__(self):
        self.present = 1


def test_an_absence_on_modules_slots_and_tensors_is_guarded_and_seen_when_it_changes():
    layer = torch.nn.Linear(3, 3)
    slotted = Absent()
    x = t(3)

    def fn(x, layer, slotted):
        out = layer(x)
        if hasattr(layer, "scale"):
            out = out * layer.scale
        if not hasattr(slotted, "present"):
            out = out - 1
        if hasattr(x, "jax"):
            out = out + 1
        return out

    compiled = ember.compile(fn)
    same(compiled(x, layer, slotted), fn(x, layer, slotted))
    assert "hasattr" not in compiled.entries[0].guard_source
    layer.register_buffer("scale", torch.full((3,), 2.0))
    same(compiled(x, layer, slotted), fn(x, layer, slotted))
    del slotted.present
    same(compiled(x, layer, slotted), fn(x, layer, slotted))
    torch.nn.Linear.scale = 3.0  # (a class attribute appears: the module has it)
    try:
        other = torch.nn.Linear(3, 3)
        same(compiled(x, other, Absent()), fn(x, other, Absent()))
    finally:
        del torch.nn.Linear.scale
    assert len(compiled.entries) == 4


class Defaulted:
    """A __getattribute__ that answers a missing name itself."""

    def __init__(self):
        self.width = 3

    def __getattribute__(self, key):
        try:
            return object.__getattribute__(self, key)
        except AttributeError:
            return 10


def test_a_getattribute_that_catches_the_missing_name_answers_as_eager():
    settings = Defaulted()
    x = t(3)

    def fn(x, settings):
        return x * settings.width + (1 if hasattr(settings, "depth") else 0) + settings.depth

    compiled = ember.compile(fn)
    same(compiled(x, settings), fn(x, settings))
    settings.width = 5
    same(compiled(x, settings), fn(x, settings))
