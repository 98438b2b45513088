"""`@contextlib.contextmanager` functions in compiled code: the generator runs to its first
yield when the with-block enters, the block's body runs while it is suspended there (inside
the grad mode, autocast region or try block the generator opened), and the generator runs on
to its end when the block is left — one graph, no break, with eager's results, grad flags,
dtypes and side effects. Every test compares with eager and counts graphs and breaks."""

from __future__ import annotations

import contextlib

import pytest
import torch
from checks import check_calls, same

import ember

LOG: list = []


def t(*shape, seed=0, grad=False):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                    device="cpu").to(torch.get_default_device())
    return x.requires_grad_(grad)


@contextlib.contextmanager
def nothing():
    yield


@contextlib.contextmanager
def no_grad_inside():
    with torch.no_grad():
        yield


@contextlib.contextmanager
def maybe_autocast(enabled):
    if enabled:
        with torch.autocast(torch.get_default_device().type, dtype=torch.bfloat16):
            yield
    else:
        yield


@contextlib.contextmanager
def logged(name, state):
    LOG.append(f"enter {name}")
    state["depth"] = state.get("depth", 0) + 1
    try:
        yield state["depth"] * 2
    finally:
        state["depth"] -= 1
        LOG.append(f"leave {name}")


def uses_nothing(x):
    with nothing():
        return x + 1


def uses_no_grad(x):
    with no_grad_inside():
        y = x * 2
    return y + x, y.requires_grad


def uses_autocast(x, w):
    with maybe_autocast(True):
        a = x @ w
    with maybe_autocast(False):
        b = x @ w
    return a, b


def uses_state(x):
    state = {}
    with logged("outer", state) as two:
        with logged("inner", state) as four:
            y = x * two + four + state["depth"]
    return y, state["depth"]


@pytest.mark.parametrize("fn, args", [
    (uses_nothing, lambda: (t(5),)),
    (uses_no_grad, lambda: (t(5, grad=True),)),
    (uses_autocast, lambda: (t(4, 4), t(4, 4, seed=1))),
    (uses_state, lambda: (t(5),)),
])
def test_the_body_runs_inside_what_the_generator_opened(fn, args):
    report = ember.explain(fn)(*args())
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    LOG.clear()
    check_calls(fn, [(args(), {}), (args(), {})], fullgraph=True,
                state=lambda: LOG)


class Scaled(torch.nn.Module):
    """A module that changes its own attribute for the length of a block (a library's
    `with self.temporarily(...)`)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.scale = 1.0

    @contextlib.contextmanager
    def scaled(self, scale):
        previous, self.scale = self.scale, scale
        try:
            yield self
        finally:
            self.scale = previous

    def forward(self, x):
        with self.scaled(3.0) as module:
            y = module.linear(x) * self.scale
        return y * self.scale


def test_a_method_that_sets_and_restores_an_attribute():
    model = Scaled()
    report = ember.explain(model)(t(2, 4))
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    compiled = ember.compile(model, fullgraph=True)
    for seed in range(2):
        same(compiled(t(2, 4, seed=seed)), model(t(2, 4, seed=seed)))
        assert model.scale == 1.0


def test_a_break_inside_the_block_runs_the_function_as_eager_does():
    def fn(x):
        with logged("block", {}) as two:
            y = x * two
            print("inside")
            return y + 1

    LOG.clear()
    compiled = ember.compile(fn)
    same(compiled(t(3)), fn(t(3)))
    assert LOG == ["enter block", "leave block"] * 2


def test_an_exception_in_the_body_reaches_the_generator_as_in_eager():
    @contextlib.contextmanager
    def suppressing():
        try:
            yield
        except ValueError:
            LOG.append("suppressed")

    def fn(x):
        with suppressing():
            if x.shape[0] == 3:
                raise ValueError("three")
        return x + 1

    LOG.clear()
    compiled = ember.compile(fn)
    same(compiled(t(3)), fn(t(3)))
    assert LOG == ["suppressed", "suppressed"]


def test_a_generator_that_does_not_yield_raises_eager_s_error():
    @contextlib.contextmanager
    def empty():
        if False:
            yield

    def fn(x):
        with empty():
            return x + 1

    with pytest.raises(RuntimeError, match="generator didn't yield"):
        fn(t(3))
    with pytest.raises(RuntimeError, match="generator didn't yield"):
        ember.compile(fn)(t(3))


def test_a_generator_driven_by_send_at_a_break_runs_natively():
    """A generator the code drives with send() (which capture does not follow) breaks the
    graph; the generator function is called natively there, not handed to ember.compile."""
    def running_total(x):
        total = x
        while True:
            sent = yield total
            total = total + (0 if sent is None else sent)

    def fn(x):
        totals = running_total(x)
        first = next(totals)
        return first + totals.send(x * 2) + totals.send(x * 3)

    compiled = ember.compile(fn)
    for seed in range(2):
        same(compiled(t(3, seed=seed)), fn(t(3, seed=seed)))
