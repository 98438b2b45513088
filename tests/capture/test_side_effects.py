"""Side effects on objects that outlive the call are replayed after the graph, in order."""

from __future__ import annotations

import copy
import io
import logging
import warnings
from contextlib import redirect_stdout

import torch
from checks import check_calls, same, warnings_of_each_run

import ember

EVENTS: list = []
COUNTERS: dict = {"calls": 0}
LAST = None


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def test_append_to_argument_list():
    def fn(x, log):
        log.append(x * 2)
        log.append("tag")
        return x + len(log)

    check_calls(fn, [((t(3), []), {}), ((t(3, seed=1), [1, 2]), {})])


def test_mutate_argument_dict():
    def fn(x, state):
        state["seen"] = state.get("seen", 0) + 1
        state["last"] = x.sum()
        del state["drop"]
        return x * state["seen"]

    check_calls(fn, [((t(3), {"drop": 1}), {}), ((t(3), {"drop": 2, "seen": 4}), {})])


def test_global_list_and_dict():
    def fn(x):
        EVENTS.append("called")
        COUNTERS["calls"] += 1
        return x * COUNTERS["calls"]

    def state():
        return [list(EVENTS), dict(COUNTERS)]

    EVENTS.clear()
    compiled = ember.compile(fn, fullgraph=True, backend="eager")
    for step in range(3):
        before = (list(EVENTS), dict(COUNTERS))
        expected = fn(t(3))
        eager_after = (list(EVENTS), dict(COUNTERS))
        EVENTS[:] = before[0]
        COUNTERS.clear()
        COUNTERS.update(before[1])
        actual = compiled(t(3))
        same(actual, expected)
        assert (list(EVENTS), dict(COUNTERS)) == eager_after, step


def test_global_assignment():
    def fn(x):
        global LAST
        LAST = x.shape[0]
        return x * 2

    global LAST
    compiled = ember.compile(fn, fullgraph=True, backend="eager")
    LAST = None
    compiled(t(5))
    assert LAST == 5
    compiled(t(5))
    compiled(t(7))
    assert LAST == 7


def test_nonlocal_of_outer_function():
    def make():
        count = 0

        def fn(x):
            nonlocal count
            count += 1
            return x * count

        return fn, lambda: count

    fn, read = make()
    compiled = ember.compile(fn, fullgraph=True, backend="eager")
    eager_fn, eager_read = make()
    for _ in range(3):
        same(compiled(t(2)), eager_fn(t(2)))
        assert read() == eager_read()


def test_module_attribute_writes():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.steps = 0
            self.history = []

        def forward(self, x):
            self.steps += 1
            self.history.append(self.steps)
            self.last_norm = x.norm()
            return self.lin(x) * self.steps

    torch.manual_seed(0)
    model, twin = Counter(), Counter()
    twin.load_state_dict(model.state_dict())
    compiled = ember.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        for step in range(3):
            x = t(2, 3, seed=step)
            same(compiled(x), twin(x))
            assert model.steps == twin.steps and model.history == twin.history
            same(model.last_norm, twin.last_norm)


def test_buffer_updated_in_place():
    class Running(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(3))

        def forward(self, x):
            self.mean.mul_(0.9).add_(x.mean(0) * 0.1)
            return x - self.mean

    model, twin = Running(), Running()
    compiled = ember.compile(model, fullgraph=True)
    for step in range(3):
        x = t(4, 3, seed=step)
        same(compiled(x), twin(x))
        same(model.mean, twin.mean)


def test_order_of_effects_is_eager_order():
    def fn(x, log, obj):
        log.append(1)
        obj.value = len(log)
        log.append(obj.value + 1)
        return x

    class Holder:
        value = 0

    compiled = ember.compile(fn, fullgraph=True, backend="eager")
    log, holder = [], Holder()
    compiled(t(2), log, holder)
    assert log == [1, 2] and holder.value == 1


def _deprecated_helper(x):
    warnings.warn("the helper is deprecated", FutureWarning, stacklevel=2)
    return x * 2


def test_warnings_are_issued_as_eager_issues_them_without_a_break():
    def fn(x):
        warnings.warn("careful")  # noqa: B028 (the line itself is the place)
        return _deprecated_helper(x) + 1

    x = t(3)
    report = ember.explain(fn)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    seen = []
    for run in (fn, ember.compile(fn)):
        for policy in ("always", "default"):  # (default: once per place, as eager's registry)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter(policy)
                for _ in range(2):
                    same(run(x), x * 2 + 1)
            seen.append([(str(w.message), w.category, w.filename, w.lineno) for w in caught])
    assert seen[:2] == seen[2:] and len(seen[0]) == 4 and len(seen[1]) == 2
    assert seen[0][0][2] == __file__ and seen[0][1][1] is FutureWarning


_model_log = logging.getLogger("ember.tests.model")


def test_logging_calls_make_eagers_records_without_a_break(caplog):
    # (a logger call inlined broke the graph three times inside logging's own code)
    def fn(x):
        y = x * 2
        _model_log.info("sum %s", y.sum())
        _model_log.debug("shape %s", tuple(y.shape))
        _model_log.log(logging.WARNING, "step %d of %d", 3, 4)
        return y + 1

    x = t(3)
    report = ember.explain(fn)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    seen = []
    for run in (fn, ember.compile(fn)):
        for level in (logging.DEBUG, logging.WARNING):  # (the level when the call is made)
            caplog.clear()
            with caplog.at_level(level, logger=_model_log.name):
                same(run(x), x * 2 + 1)
            seen.append([(r.levelno, r.getMessage(), r.pathname, r.lineno, r.funcName)
                         for r in caplog.records])
    assert seen[:2] == seen[2:] and len(seen[0]) == 3 and len(seen[1]) == 1
    assert seen[0][0][2] == __file__ and seen[0][0][4] == "fn"


class _Track:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, kind, value, traceback):
        self.log.append(("exit", self.name))
        return False


class _Fast:
    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.module.fast = True

    def __exit__(self, *exception):
        self.module.fast = False


def test_python_context_managers_run_their_enter_and_exit_in_the_graph():
    # (a with-block on a user's class sent the whole function to eager)
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)
            self.fast = False

        def forward(self, x, log):
            with _Track("outer", log) as tracked:
                with _Fast(self):
                    y = self.linear(x) * (2 if self.fast else 3)
                z = y + (1 if self.fast else 0) + len(tracked.name)
            return z, self.fast

    torch.manual_seed(0)
    model = Model()
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    x = t(2, 3)
    assert ember.explain(twin)(x, []).graph_break_count == 0
    for _ in range(2):
        log, twin_log = [], []
        want, got = model(x, log), compiled(x, twin_log)
        same(got, want)
        assert twin_log == log == [("enter", "outer"), ("exit", "outer")]

    def broken(x, log):  # (no break inside such a block: the function runs eagerly, right)
        with _Track("b", log):
            print("inside")
            return x + 1

    log = []
    with redirect_stdout(io.StringIO()):
        same(ember.compile(broken)(x, log), x + 1)
    assert log == [("enter", "b"), ("exit", "b")]


def test_an_op_s_own_warnings_are_eager_s_from_the_user_s_line():
    # (a C++ warning of an op, and torch's copy-construct warning, were issued while the op
    # ran on fakes, on constants and in the graph: up to three times, from ember's and FX's
    # lines)
    def fn(x):
        spread = torch.tensor([1.0]).var()
        copied = x.new_tensor(x)
        return x + spread.nan_to_num() + copied

    x = t(3)
    seen = []
    for run in (fn, ember.compile(fn)):
        for policy in ("always", "default"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter(policy)
                for _ in range(2):
                    same(run(x), x * 2)
            seen.append([(str(w.message), w.category, w.filename, w.lineno) for w in caught])
    assert seen[:2] == seen[2:] and len(seen[0]) == 4 and len(seen[1]) == 2
    assert {w[2] for w in seen[0]} == {__file__}


def _spread(x):
    return x.std(0, True) + torch.var_mean(x, dim=1, correction=4)[0].sum()


def test_a_reduction_left_without_degrees_of_freedom_warns_as_eager_from_the_user_s_line():
    # (eager's kernels warn from the input's sizes; the op's run on fakes does not, and
    # ember's kernels did not: no warning at all)
    def fn(x):
        return _spread(x) * 2

    seen = warnings_of_each_run(fn, [t(*shape) for shape in ((1, 4), (1, 4), (3, 4))],
                                lambda message: "degrees of freedom" in message)
    assert seen[:2] == seen[2:]
    assert [w[0][:10] for w in seen[0]] == ["std(): deg", "var_mean()"] * 2 + ["var_mean()"]
    assert {w[2] for w in seen[0]} == {__file__} and len(seen[1]) == 2


def test_setting_the_global_random_state_inside_draws_eagers_numbers():
    # torch.set_rng_state between two draws rewinds the generator: the second draw repeats
    # the first. The graph's draws cannot see a state set between them, so the call breaks.
    def fn(x):
        state = torch.get_rng_state()
        first = torch.rand(3)
        torch.set_rng_state(state)
        return first + x, torch.rand(3) + x

    compiled = ember.compile(fn)
    for _ in range(2):
        torch.manual_seed(7)
        expected = fn(torch.ones(3))
        after_eager = torch.rand(1)
        torch.manual_seed(7)
        actual = compiled(torch.ones(3))
        same(actual, expected)
        same(torch.rand(1), after_eager)
        torch.testing.assert_close(actual[0], actual[1])
