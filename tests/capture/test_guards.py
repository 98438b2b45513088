"""Guard soundness: whatever changes between calls, the compiled function either recompiles
(and says why) or stays correct — never a stale result."""

from __future__ import annotations

import collections
import enum
import logging

import pytest
import torch
from checks import same

import ember
from ember import config

SCALE = 2.0


def t(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(dtype)


@pytest.fixture(autouse=True)
def on_the_cpu():
    """Guards do not depend on the device: these run on the CPU even under
    EMBER_TEST_DEVICE=cuda (whose default device would put the models on the GPU)."""
    with torch.device("cpu"):
        yield


def entries(compiled) -> int:
    return len(compiled.entries)


def test_changed_global_recompiles(recompiles):
    global SCALE

    def fn(x):
        return x.repeat(int(SCALE))  # (the number decides a shape: guarded on its value)

    compiled = ember.compile(fn, backend="eager")
    x = t(3)
    SCALE = 2.0
    same(compiled(x), x.repeat(2))
    SCALE = 3.0
    same(compiled(x), x.repeat(3))
    assert entries(compiled) == 2
    assert "G['SCALE'] changed 2.0 -> 3.0" in recompiles.text


def test_a_number_in_arithmetic_is_an_input_not_a_constant(recompiles):
    # (a learning rate that changes every call, a loop index after a break: each value
    # compiled again, and eight later the function ran eagerly)
    def fn(x, lr, scale):
        return x * scale - lr * x

    compiled = ember.compile(fn, backend="eager")
    x = t(3)
    for scale, lr in ((2.0, 0.1), (3.0, 0.05), (0.5, 1e-3)):
        same(compiled(x, lr, scale), x * scale - lr * x)
    assert entries(compiled) == 1 and not recompiles.text
    for x in (t(3, dtype=torch.float64), t(3).sum(), torch.arange(3, dtype=torch.int32),
              torch.tensor([True, False]), t(3).half()):
        for number in (3, 2.5, -1):
            def mixed(x, number):
                return (x * number, x + number, x - number) if x.dtype != torch.bool else \
                    (x * number, x + number)

            got, want = ember.compile(mixed, backend="eager")(x, number), mixed(x, number)
            assert [g.dtype for g in got] == [w.dtype for w in want]
            same(got, want)


def test_a_number_given_to_a_tensor_method_is_an_input_too(recompiles):
    # (an EMA with a decay that warms up: `e.mul_(d).add_(p, alpha=1 - d)`, `e.lerp_(p, w)`)
    def fn(x, decay):
        average = x.clone().mul_(decay).add_(x * 2, alpha=1 - decay)
        return average, x.lerp(average, decay), torch.lerp(x, average, 1 - decay), x.mul(decay)

    compiled = ember.compile(fn, backend="eager")
    x = t(3)
    for decay in (0.5, 0.9, 0.99):
        got, want = compiled(x, decay), fn(x, decay)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    assert entries(compiled) == 1 and not recompiles.text


def test_a_seed_handed_to_manual_seed_is_not_guarded(recompiles):
    # (manual_seed runs natively at a break: the seed it takes is read again on each call;
    # it was compared as a torch op's argument, guarded, and each new seed compiled again)
    def fn(x, seed):
        torch.manual_seed(seed)
        return x + torch.rand(2)

    compiled = ember.compile(fn)
    for seed in (1, 2, 3):
        same(compiled(t(2), seed), fn(t(2), seed))
    assert not recompiles.text


def test_shape_change_recompiles_and_says_which_dim(recompiles):
    compiled = ember.compile(lambda x: x.sum(0) * x.shape[0], backend="eager")
    for n in (4, 4, 8):
        x = t(n, 3)
        same(compiled(x), x.sum(0) * n)
    assert entries(compiled) == 2
    assert "because x.shape[0] changed 4 -> 8." in recompiles.text


def test_dtype_change_recompiles():
    compiled = ember.compile(lambda x: x * 2, backend="eager")
    for dtype in (torch.float32, torch.float64, torch.float32):
        x = t(3, dtype=dtype)
        same(compiled(x), x * 2)
    assert entries(compiled) == 2


def test_python_float_argument():
    # (in arithmetic a float is read each call; where it decides something, by its value)
    compiled = ember.compile(lambda x, s: x * s, backend="eager")
    x = t(3)
    for s in (2.0, 3.0, 2.0, 0.5):
        same(compiled(x, s), x * s)
    assert entries(compiled) == 1
    compiled = ember.compile(lambda x, s: x * s if s > 1 else x.repeat(2), backend="eager")
    for s in (2.0, 3.0, 2.0, 0.5):
        same(compiled(x, s), x * s if s > 1 else x.repeat(2))
    assert entries(compiled) == 2


def test_int_versus_float_argument_of_equal_value():
    compiled = ember.compile(lambda x, s: x * s, backend="eager")
    x = torch.arange(3)
    same(compiled(x, 2), x * 2)
    same(compiled(x, 2.0), x * 2.0)  # a float promotes the result: must not reuse the int entry


def test_module_attribute_change():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = 1.0

        def forward(self, x):
            return x * self.factor

    model = Scaled()
    compiled = ember.compile(model, backend="eager")
    x = t(3)
    same(compiled(x), x)
    model.factor = 4.0
    same(compiled(x), x * 4.0)


def test_train_eval_switch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5),
                                torch.nn.BatchNorm1d(4))
    compiled = ember.compile(model)
    x = t(8, 4)
    with torch.no_grad():
        model.eval()
        same(compiled(x), model(x))
        model.train()
        torch.manual_seed(1)
        got = compiled(x)
        torch.manual_seed(1)
        same(got, model(x))  # the same random draws, in eager's order
        model.eval()
        same(compiled(x), model(x))


def test_grad_mode_is_guarded():
    w = torch.randn(3, requires_grad=True)
    compiled = ember.compile(lambda x: (x * w).sum())
    x = t(3)
    with torch.no_grad():
        assert not compiled(x).requires_grad
    result = compiled(x)
    assert result.requires_grad
    result.backward()
    same(w.grad, x)


def test_default_dtype_is_guarded():
    compiled = ember.compile(lambda x: x + torch.ones(3), backend="eager")
    x = t(3, dtype=torch.float64)
    same(compiled(x), x + torch.ones(3))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        same(compiled(x), x + torch.ones(3))
        assert compiled(x).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_requires_grad_change_recompiles():
    compiled = ember.compile(lambda x: x * 2, backend="eager")
    x = t(3)
    assert not compiled(x).requires_grad
    y = t(3).requires_grad_()
    assert compiled(y).requires_grad


def test_strides_are_guarded():
    compiled = ember.compile(lambda x: x + 1)
    x = t(4, 5)
    same(compiled(x), x + 1)
    same(compiled(x.t()), x.t() + 1)
    same(compiled(x[:, ::2].contiguous()[:, :2].t().contiguous().t()), x[:, ::2][:, :2] + 1)
    assert entries(compiled) >= 2


def test_list_length_and_contents_are_guarded():
    compiled = ember.compile(lambda x, ks: x * sum(ks), backend="eager")
    x = t(3)
    same(compiled(x, [1, 2]), x * 3)
    same(compiled(x, [1, 2, 3]), x * 6)
    same(compiled(x, [5, 2]), x * 7)


def test_replaced_parameter_object_is_seen():
    model = torch.nn.Linear(3, 3)
    compiled = ember.compile(model, backend="eager")
    x = t(2, 3)
    with torch.no_grad():
        same(compiled(x), model(x))
        model.weight = torch.nn.Parameter(torch.ones(3, 3))
        same(compiled(x), model(x))
        model.weight.mul_(2)  # in place: same object, new values
        same(compiled(x), model(x))


def test_recompile_limit_falls_back_to_eager_with_one_warning(recompiles):
    # (n: a shape; dynamic=False: under the default, automatic dynamic makes n a symbol at
    # its second value and one capture serves the rest, tests/capture/test_dynamic.py)
    compiled = ember.compile(lambda x, n: x.repeat(n), backend="eager", dynamic=False)
    x = t(2)
    with config.override(recompile_limit=3):
        for n in range(6):
            same(compiled(x, n), x.repeat(n))
    assert entries(compiled) == 3
    assert compiled.given_up
    warnings = [r for r in recompiles.records
                if "recompile limit of 3 compiled versions" in r.getMessage()]
    assert len(warnings) == 1
    # the versions kept still serve the calls they fit (a detector's shapes seen before);
    # only the others run eagerly
    from ember.api import MISS

    kept, answers = compiled.entries[0], []
    take = kept.call
    kept.call = lambda arguments: answers.append(take(arguments)) or answers[-1]
    same(compiled(x, 2), x.repeat(2))  # (n=2 was the last compiled: its version runs)
    same(compiled(x, 9), x.repeat(9))  # (never compiled: eager)
    assert entries(compiled) == 3
    assert answers[0] is not MISS and answers[1] is MISS


def test_reset_forgets_everything():
    compiled = ember.compile(lambda x: x + 1, backend="eager")
    compiled(t(2))
    assert entries(compiled) == 1
    ember.reset()
    assert entries(compiled) == 0
    same(compiled(t(2)), t(2) + 1)


def test_guard_source_is_readable():
    compiled = ember.compile(lambda x, k=2: x * k, backend="eager")
    compiled(t(3))
    text = compiled.entries[0].guard_source
    assert "L['x']" in text and "L['k']" in text and "def guard(L):" in text


def test_guards_channel_prints_the_guard_function():
    from helpers import captured_log

    with captured_log("guards") as records:
        ember.compile(lambda x: x * 2, backend="eager")(t(3))
    (record,) = [r for r in records if "guards of" in r.getMessage()]
    text = record.getMessage()
    assert "def guard(L):" in text and "v0 = L['x']" in text and "v0.shape == (3,)" in text


def test_a_module_list_that_grows_or_shrinks_recompiles():
    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x + self.layers[-1].bias

    model = Stack().eval()
    compiled = ember.compile(model, backend="eager")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model.layers.append(torch.nn.Linear(4, 4))
        torch.testing.assert_close(compiled(x), model(x))
        del model.layers[0]
        torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled._compiled_forward.entries) == 3


def test_parameter_metadata_is_checked_in_one_batch_and_each_change_recompiles(recompiles):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    compiled = ember.compile(model)
    x = t(2, 4)
    with torch.no_grad():
        same(compiled(x), model(x))
    guard_text = compiled._compiled_forward.entries[0].guard_source
    assert ".stride()" not in guard_text  # the five tensors are checked by one call
    # a parameter replaced by a transposed copy: same shape, other strides
    weight = model[2].weight
    model[2].weight = torch.nn.Parameter(weight.detach().t().contiguous().t())
    with torch.no_grad():
        same(compiled(x), model(x))
    assert "because self._modules['2']._parameters['weight']" in recompiles.text
    assert "stride" in recompiles.text
    model.double()  # every parameter float64: recompiles again
    with torch.no_grad():
        same(compiled(x.double()), model(x.double()))
    assert len(compiled._compiled_forward.entries) == 3


class _Context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_frame_that_runs_eagerly_is_captured_once_whatever_objects_come_in(recompiles):
    def fn(x, context):
        with context:  # a with-block ember does not capture: the frame runs eagerly
            return x * 2

    compiled = ember.compile(fn)
    for _ in range(4):
        x = t(3)
        same(compiled(x, _Context()), x * 2)  # a fresh object per call
    assert len(compiled.entries) == 1 and "compiled again" not in recompiles.text
    same(compiled(t(3, dtype=torch.float64), _Context()), t(3, dtype=torch.float64) * 2)
    assert len(compiled.entries) == 2  # another dtype: worth trying to capture again


def test_weak_references_are_followed_and_guarded(recompiles):
    import weakref

    class Holder:
        pass

    def fn(x, holder):
        target = holder.ref()
        if target is None:
            return x - 1
        return x * target

    first, second = t(3, seed=1), t(3, seed=2)
    holder = Holder()
    holder.ref = weakref.ref(first)
    compiled = ember.compile(fn, backend="eager")
    x = t(3)
    explained = ember.explain(fn)(x, holder)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    same(compiled(x, holder), x * first)
    same(compiled(x, holder), x * first)
    assert entries(compiled) == 1
    holder.ref = weakref.ref(second)  # another tensor alike: an input fetched through ref()
    same(compiled(x, holder), x * second)
    assert entries(compiled) == 1
    del first
    holder.ref = weakref.ref(Holder())  # (dead at once): None, another branch
    same(compiled(x, holder), x - 1)
    assert entries(compiled) == 2
    assert "because holder.ref() failed its tensor guard" in recompiles.text


def test_rnn_modules_are_one_graph():
    # nn.RNNBase checks its flat weights through weak references on every forward
    x = t(3, 5, 8)
    for module in (torch.nn.GRU(8, 16, num_layers=2, batch_first=True),
                   torch.nn.LSTM(8, 16, batch_first=True)):
        explained = ember.explain(module)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        compiled = ember.compile(module, backend="eager")
        same(compiled(x), module(x))


PARTIAL = None


def test_calling_a_partial_inlines_its_function_and_guards_its_arguments(recompiles):
    import functools

    global PARTIAL

    def fn(x):
        return PARTIAL(x) * 2

    x = t(3, 4)
    PARTIAL = functools.partial(torch.softmax, dim=-1)
    explained = ember.explain(fn)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = ember.compile(fn, backend="eager")
    same(compiled(x), torch.softmax(x, -1) * 2)
    PARTIAL = functools.partial(torch.softmax, dim=0)  # another keyword: guarded
    same(compiled(x), torch.softmax(x, 0) * 2)
    PARTIAL = functools.partial(torch.add, 1.0)  # another function and a bound argument
    same(compiled(x), (x + 1.0) * 2)
    assert entries(compiled) == 3


_LOG = logging.getLogger("ember.tests.forward")


def test_disabled_log_calls_cost_nothing_and_enabling_them_recompiles(recompiles, caplog):
    def fn(x):
        _LOG.debug("forward of %s", tuple(x.shape))
        return x * 2

    _LOG.setLevel(logging.WARNING)
    x = t(3)
    explained = ember.explain(fn)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = ember.compile(fn, backend="eager")
    same(compiled(x), x * 2)
    _LOG.setLevel(logging.DEBUG)  # the guard on isEnabledFor(DEBUG) sees it
    with caplog.at_level(logging.DEBUG, logger=_LOG.name):
        same(compiled(x), x * 2)
    assert "forward of (3,)" in caplog.text
    assert "isEnabledFor(10)" in recompiles.text
    _LOG.setLevel(logging.NOTSET)


def test_a_partial_made_inside_survives_a_break():
    import functools

    def fn(x):
        scale = functools.partial(torch.mul, 3.0)
        if x.sum() > 0:  # a break with the partial alive
            return scale(x), scale
        return scale(-x), scale

    compiled = ember.compile(fn)
    for sign in (1.0, -1.0):
        x = t(3).abs() * sign
        got, made = compiled(x)
        same(got, fn(x)[0])
        assert isinstance(made, functools.partial) and made.args == (3.0,)


def test_autocast_is_applied_and_guarded(recompiles):
    # (compiled under torch.autocast, the graph is traced again with autocast's casts made
    # explicit; each autocast state is its own entry)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 4), torch.nn.Softmax(-1))
    compiled = ember.compile(model)
    x = t(2, 8)
    with torch.no_grad():
        same(compiled(x), model(x))
        for dtype in (torch.bfloat16, torch.float16):
            with torch.autocast("cpu", dtype=dtype):
                got, want = compiled(x), model(x)
                explained = ember.explain(model)(x)
            assert got.dtype == want.dtype == dtype
            assert (explained.graph_count, explained.graph_break_count) == (1, 0)
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
        same(compiled(x), model(x))  # outside again: the first entry
    assert entries(compiled._compiled_forward) == 3
    assert "autocast changed None -> ((True, torch.bfloat16)" in recompiles.text

    def region(x):  # a region inside: a break at it, the region eager
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        return y.float() * 2

    with torch.no_grad():
        torch.testing.assert_close(ember.compile(region)(x), region(x), rtol=1e-2, atol=1e-2)


def test_training_under_autocast_matches_eager():
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    x = t(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = model(x), compiled(x)
    assert got.dtype == want.dtype == torch.bfloat16
    want.float().pow(2).sum().backward()
    got.float().pow(2).sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert q.grad.dtype == p.grad.dtype == torch.float32
        torch.testing.assert_close(q.grad, p.grad, rtol=2e-2, atol=2e-2)


def test_autocast_regions_inside_are_captured():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))

    def regions(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x)
            with torch.autocast(device_type="cpu", enabled=False):  # (as rotary embeddings do)
                full = model(x.float()) * 2
        return low, full, model(x)

    x = t(2, 8)
    explained = ember.explain(regions)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    with torch.no_grad():
        got, want = ember.compile(regions, fullgraph=True)(x), regions(x)
    assert [g.dtype for g in got] == [w.dtype for w in want] == \
        [torch.bfloat16, torch.float32, torch.float32]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)
    assert not torch.is_autocast_enabled("cpu")


def test_what_cannot_be_captured_in_an_autocast_region_runs_eagerly():
    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x.T
            if y.sum() > 0:  # (no break inside a region: the frame runs eagerly)
                y = y + 1
            else:  # (a body alone, only computing, would be merged with where)
                y = y - 1
        return y

    x = t(3, 3)
    compiled = ember.compile(fn)
    same(compiled(x), fn(x))
    assert not torch.is_autocast_enabled("cpu")  # (the region capture entered, left again)
    assert "inside an autocast region" in compiled.entries[0].eager_reason.reason


def test_the_device_spellings_of_autocast_are_regions_too():
    import warnings

    def fn(x):
        with torch.cpu.amp.autocast():  # (deprecated, bfloat16 by default)
            return x @ x.T

    x = t(3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        explained = ember.explain(fn)(x)
        want = fn(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    got = ember.compile(fn)(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_a_guarded_runner_misses_on_a_failed_or_unreadable_guard_and_raises_its_own_errors():
    # one function per cache entry: the guards, then the run fetching through their variables
    from ember.capture.guards import MISS, GuardSet, compile_guarded_runner, tensor_signature
    from ember.capture.sources import AttrSource, LocalSource

    class Holder:
        pass

    holder = Holder()
    holder.weight = t(3)
    guards = GuardSet()
    guards.add("type", LocalSource("h"), Holder)
    weight = AttrSource(LocalSource("h"), "weight")
    guards.add("tensor", weight, tensor_signature(holder.weight))
    reads = []
    runner = ["outputs = compiled(*inputs)", "return outputs"]

    def compiled(w):
        reads.append(w)
        if w.shape == (0,):
            raise ValueError("the run's own error")
        return w * 2

    call = compile_guarded_runner(guards, {}, {"h": holder}, [weight], runner,
                                  {"compiled": compiled}, "test")
    same(call({"h": holder}), holder.weight * 2)
    assert reads[-1] is holder.weight
    assert call({"h": object()}) is MISS            # a type guard fails
    other = Holder()
    assert call({"h": other}) is MISS               # reading h.weight raises: a miss
    other.weight = t(4)
    assert call({"h": other}) is MISS               # a tensor guard fails
    assert len(reads) == 1
    empty = Holder()
    empty.weight = torch.empty(0)
    empty_guards = GuardSet()
    empty_guards.add("tensor", weight, tensor_signature(empty.weight))
    call = compile_guarded_runner(empty_guards, {}, {"h": empty}, [weight], runner,
                                  {"compiled": compiled}, "test")
    with pytest.raises(ValueError, match="the run's own error"):
        call({"h": empty})


_MISSING = object()


class _Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


class _Rank(enum.IntEnum):
    LOW = 0
    HIGH = 1


def test_identity_and_enum_decisions_are_guarded():
    # (`v is _MISSING` and `mode == Mode.TRAIN` were decided once, with no guard; an
    # IntEnum's equality guard was written with its repr and did not compile)
    def sentinel(x, v=_MISSING):
        return x * 2 if v is _MISSING else x + 1

    def by_mode(x, mode):
        return x * 2 if mode == _Mode.TRAIN else x + 1

    def by_identity(x, mode):
        return x * 2 if mode is _Mode.TRAIN else x + 1

    def by_rank(x, rank):
        return x * 2 if rank == _Rank.HIGH else x

    x = t(3)
    calls = [(sentinel, [(), (object(),), ()]), (by_mode, [(_Mode.TRAIN,), (_Mode.EVAL,)]),
             (by_identity, [(_Mode.TRAIN,), (_Mode.EVAL,)]),
             (by_rank, [(_Rank.HIGH,), (_Rank.LOW,), (_Rank.HIGH,)])]
    for fn, arguments in calls:
        compiled = ember.compile(fn)
        for extra in arguments:
            same(compiled(x, *extra), fn(x, *extra))


def test_is_none_of_a_passed_object_guards_its_type_not_its_identity(recompiles):
    # (a decoding loop passes a new cache object each run: `cache is None` was guarded on
    # the object itself, and every run compiled again)
    class Cache:
        def __init__(self, scale):
            self.scale = scale

    def fn(x, cache=None):
        missing = cache is None  # (a value: IS_OP, not a jump on None)
        return x + 1 if missing else x * cache.scale

    compiled = ember.compile(fn)
    x = t(3)
    for cache in (Cache(2.0), Cache(2.0), None, Cache(2.0)):
        same(compiled(x, cache), fn(x, cache))
    assert len(compiled.records) == 2, recompiles.text  # (an object, and None)


def test_mappings_from_outside_are_read_on_every_call():
    # (obj["k"] of a UserDict / BatchEncoding, a Counter's values() and a defaultdict's items
    # were read once and kept: the first call's values on every call)
    class Batch(collections.UserDict):
        pass

    def first(batch):
        return batch["input_ids"] + 1

    def counted(x, counts):
        return x + len(list(counts.items())) + sum(counts.values()) + (counts.get("a") or 0)

    def bucketed(x, labels):
        buckets = collections.defaultdict(list)
        for i, label in enumerate(labels):
            buckets[label].append(x[i])
        return sorted(buckets), [torch.stack(buckets[k]).sum() for k in sorted(buckets)]

    compiled = ember.compile(first)
    for kind in (Batch, collections.OrderedDict, dict,
                 lambda **k: collections.defaultdict(list, **k)):
        for value in (1.0, 7.0):
            batch = kind(input_ids=torch.full((2,), value))
            same(compiled(batch), first(batch))
    compiled = ember.compile(counted)
    for counts in (collections.Counter("aab"), collections.Counter("abcd"),
                   collections.OrderedDict(a=5)):
        same(compiled(t(1), counts), counted(t(1), counts))
    compiled = ember.compile(bucketed)
    for labels in (["a", "b", "a", "c"], [1, 1, 2], ["z", "z"]):
        x = t(len(labels))
        same(compiled(x, labels), bucketed(x, labels))


def test_a_buffer_registered_in_forward_is_read_back():
    # (old Hugging Face rotary caches: register_buffer in forward, then self.cos_cached read
    # the module's table as it was before the call)
    class Growing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cached = 4
            self.register_buffer("table", torch.arange(4.0), persistent=False)

        def forward(self, x, length):
            if length > self.cached:
                self.cached = length
                self.register_buffer("table", torch.arange(float(length)), persistent=False)
            return self.table[:length] + x.sum()

    eager, model = Growing(), Growing()
    compiled = ember.compile(model)
    for length in (3, 6, 2, 9):
        same(compiled(t(2), length), eager(t(2), length))
        assert model.table.shape == eager.table.shape


def test_a_cache_keyed_by_shape_tuples_is_tracked():
    # (a dict from outside with tuple keys sent the whole function to eager)
    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = {}

        def forward(self, x):
            key = tuple(x.shape)
            if key not in self.cache:
                self.cache[key] = torch.ones(x.shape) * len(self.cache)
            return x + self.cache[key]

    eager, model = Cached(), Cached()
    compiled = ember.compile(model)
    assert ember.explain(Cached())(t(2, 3)).graph_break_count == 0
    for shape in ((2, 3), (2, 3), (4, 1), (2, 3), (4, 1)):
        x = torch.randn(shape)
        same(compiled(x), eager(x))
    assert list(model.cache) == list(eager.cache) == [(2, 3), (4, 1)]


def test_state_that_changes_between_calls_is_seen_by_the_next_call():
    # (found missing, None, a class's method or attribute: each was read once, unguarded)
    class Model(torch.nn.Module):
        MODE = "plain"

        def __init__(self):
            super().__init__()
            self.register_buffer("bias", None)

        def act(self, x):
            return torch.relu(x)

        def forward(self, x):
            y = self.act(x) + (0 if getattr(self, "offset", None) is None else self.offset)
            y = y if self.bias is None else y + self.bias
            y = y * 10 if type(self).MODE != "plain" else y
            return y * 2 if hasattr(self, "scale_up") else y

    x = t(3)
    model = Model()
    compiled = ember.compile(model, backend="eager")
    changes = [lambda: None,
               lambda: model.register_buffer("offset", torch.ones(3)),
               lambda: setattr(model, "bias", torch.full((3,), 5.0)),
               lambda: setattr(model, "act", torch.tanh),
               lambda: delattr(model, "act"),
               lambda: setattr(Model, "act", lambda self, x: x * 3),
               lambda: setattr(Model, "MODE", "loud"),
               lambda: setattr(model, "scale_up", True)]
    try:
        for change in changes:
            change()
            same(compiled(x), model(x))
    finally:
        Model.MODE = "plain"


def test_torch_s_global_state_asked_by_the_code_is_asked_again_on_each_call():
    # (a torch function's number was kept as a constant: right for what the guarded tensors
    # decide, wrong for global state)
    def fn(x):
        y = x.cumsum(0) if torch.are_deterministic_algorithms_enabled() else x * 2
        return y + 1 if torch.get_num_threads() == 1 else y

    compiled = ember.compile(fn, backend="eager")
    x = t(3)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        same(compiled(x), fn(x))
        torch.use_deterministic_algorithms(not deterministic)
        torch.set_num_threads(1 if threads != 1 else 2)
        same(compiled(x), fn(x))
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
    same(compiled(x), fn(x))


def test_torch_s_default_device_and_dtype_asked_by_the_code_are_asked_again():
    def fn(x):
        return x + torch.ones(3, device=torch.get_default_device()), torch.get_default_dtype()

    report = ember.explain(fn)(t(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    compiled = ember.compile(fn, fullgraph=True)
    dtype = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64):
            torch.set_default_dtype(default)
            same(compiled(t(3)), fn(t(3)))
    finally:
        torch.set_default_dtype(dtype)
    assert len(compiled.records) == 2


def test_a_set_read_by_the_code_is_guarded_on_its_members():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.skip = set()

        def forward(self, x, i):
            return x if i in self.skip else x * 2

    model, x = Model(), t(2)
    compiled = ember.compile(model, backend="eager")
    same(compiled(x, 1), model(x, 1))
    model.skip.add(1)
    same(compiled(x, 1), model(x, 1))


def test_a_call_under_inference_mode_is_its_own_version():
    # (inference mode was guarded as grad mode: a version captured under no_grad answered
    # is_inference() False for what eager makes as inference tensors)
    def fn(x):
        y = x * 2
        return y, y.is_inference(), torch.is_inference_mode_enabled()

    compiled = ember.compile(fn, backend="eager")
    x = t(2)
    for mode in (torch.no_grad, torch.inference_mode, torch.no_grad):
        with mode():
            got, want = compiled(x), fn(x)
        assert got[1:] == want[1:] and got[0].is_inference() == want[0].is_inference()
        same(got[0], want[0])


def test_a_c_method_of_an_object_made_each_call_does_not_recompile(recompiles):
    # (generator.manual_seed is a new bound-method object each read: guarded by identity,
    # every call compiled again)
    def fn(p, seed):
        generator = torch.Generator().manual_seed(seed)
        return torch.multinomial(p, 1, generator=generator)

    compiled = ember.compile(fn)
    p = torch.rand(2, 6)
    for seed in (1, 1, 1, 2):
        same(compiled(p, seed), fn(p, seed))
    assert not recompiles.text


def test_guard_variables_are_reused_once_dead_and_the_runner_runs_on_a_small_frame():
    """A deep model's guards read hundreds of sources; each name is taken again once its
    value is dead, and the guards return before the compiled call runs (a large frame under
    it made CPython map and unmap a frame-stack chunk on the call's own Python calls)."""
    from ember.capture.guards import reuse_variables

    lines = ["v0 = L['self']", "v1 = v0._modules['v0']", "if not (v1 is k1): return False",
             "v2 = v0.training", "if not (v2 is True): return False", "v3 = v1.weight",
             "return [v3, v0]"]
    assert reuse_variables(lines) == [
        "v0 = L['self']", "v1 = v0._modules['v0']", "if not (v1 is k1): return False",
        "v2 = v0.training", "if not (v2 is True): return False", "v1 = v1.weight",
        "return [v1, v0]"]
    blocks = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
              for _ in range(40)]
    model = torch.nn.Sequential(*blocks)
    compiled = ember.compile(model)
    x = t(2, 4)
    with torch.no_grad():
        same(compiled(x), model(x))
        entry = compiled._compiled_forward.entries[0]
        call = entry.call
        assert call.__code__.co_nlocals < 8  # (the runner's frame: the guards are a callee)
        guarded = call.__globals__["guarded_inputs"].__code__
        # 40 x (4 parameters, 3 modules, 3 dictionaries; 600 names with one a source): the
        # parameters and the modules whose parameters are read later stay live
        assert guarded.co_nlocals < 300
        model[5][0].weight = torch.nn.Parameter(model[5][0].weight.detach() * 2)
        same(compiled(x), model(x))


def test_class_lookups_see_a_class_changed_after_they_looked_in_it():
    # (the classes' dicts are kept as live views per class: a name set on a base later, or
    # bases assigned, must be seen by the guards that look there on every call)
    from ember.capture.attributes import MISSING, class_lookup, lacks, lacks_past_hooks

    class Base:
        pass

    class Derived(Base):
        pass

    obj = Derived()
    assert class_lookup(Derived, "f") is MISSING and lacks_past_hooks(obj, "f") and lacks(obj, "f")
    Base.f = 1
    assert class_lookup(Derived, "f") == 1
    assert not lacks_past_hooks(obj, "f") and not lacks(obj, "f")

    class Other:
        g = 2

    Derived.__bases__ = (Other,)
    assert class_lookup(Derived, "f") is MISSING and class_lookup(Derived, "g") == 2
    assert lacks_past_hooks(obj, "f") and not lacks_past_hooks(obj, "g")
    obj.f = 3
    assert not lacks_past_hooks(obj, "f") and not lacks(obj, "f")


def test_a_method_replaced_on_the_class_after_the_capture_is_called():
    class Scaler(torch.nn.Module):
        def scale(self, x):
            return x * 2

        def forward(self, x):
            return self.scale(x) + 1

    model = Scaler()
    compiled = ember.compile(model)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), model(x))
    Scaler.scale = lambda self, x: x * 5
    torch.testing.assert_close(compiled(x), model(x))
