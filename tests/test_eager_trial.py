"""A function whose graph breaks is timed against eager once its compiles are done
(ember/giving_up.py, TRIAL_ROUNDS): where its compiled calls cost more than TRIAL_MARGIN of
eager's, it is called directly from then on in that grad mode; otherwise it stays compiled
and the trial ends. The times are set here (a compiled or an eager call made slower on
purpose), so each decision is the test's, not the host's load."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import captured_log

import ember
from ember import config, giving_up

CALLS = giving_up.TRIAL_WARM + 2 * giving_up.TRIAL_ROUNDS


@pytest.fixture(autouse=True)
def trial_on():
    with config.override(eager_trial=True):
        yield


def breaking(x):
    y = torch.relu(x) * 2
    print("between", end="")  # (a break: a resume function finishes the call)
    return y.sum(0) + 1


def whole(x):
    return torch.relu(x).sum(0) * 2


def slowed(monkeypatch, side):
    """Make every compiled call (side="compiled") or every eager call ("eager") of a trial
    take 20 ms more."""
    if side == "compiled":
        untried = giving_up._untried

        def slow(*args):
            time.sleep(0.02)
            return untried(*args)

        monkeypatch.setattr(giving_up, "_untried", slow)
    else:
        eager = ember.api.CompiledFunction._eager

        def slow(self, args, kwargs):
            time.sleep(0.02)
            return eager(self, args, kwargs)

        monkeypatch.setattr(ember.api.CompiledFunction, "_eager", slow)


def test_a_breaking_function_slower_than_eager_is_called_directly(monkeypatch, capsys):
    slowed(monkeypatch, "compiled")
    compiled = ember.compile(breaking)
    x = torch.randn(4, 3)
    with captured_log("fallbacks") as records:
        compiled(x)  # (the capture: a trial starts)
        assert compiled.trial is not None
        for _ in range(CALLS):
            torch.testing.assert_close(compiled(x), breaking(x))
    assert compiled.trial is None and compiled.direct is not None
    said = [r.getMessage() for r in records if "eager's time" in r.getMessage()]
    assert len(said) == 1 and "called directly from now on" in said[0], said
    assert "test_eager_trial.py:" in said[0]  # (where the graph breaks)
    captures = len(compiled.records)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), breaking(x))
    assert len(compiled.records) == captures
    # (each call printed once, compiled, eager or direct, and so did each of eager's)
    assert capsys.readouterr().out == "between" * (1 + 2 * CALLS + 6)


def test_a_breaking_function_faster_than_eager_stays_compiled(monkeypatch):
    slowed(monkeypatch, "eager")
    compiled = ember.compile(breaking)
    x = torch.randn(4, 3)
    with captured_log("perf") as records:
        compiled(x)
        for _ in range(CALLS):
            torch.testing.assert_close(compiled(x), breaking(x))
    assert compiled.trial is None and compiled.direct is None
    assert sum("compiled it stays" in r.getMessage() for r in records) == 1


def test_each_round_runs_one_call_eagerly():
    # (no time set: whatever the trial decides, its rounds call the function itself once)
    compiled = ember.compile(breaking)
    x = torch.randn(4, 3)
    compiled(x)
    calls = []
    function = compiled.function

    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)

    compiled.function = counted
    for _ in range(giving_up.TRIAL_WARM + 2 * giving_up.TRIAL_ROUNDS):
        compiled(x)
    assert len(calls) == giving_up.TRIAL_ROUNDS


def test_a_whole_graph_is_never_on_trial():
    compiled = ember.compile(whole)
    compiled(torch.randn(4, 3))
    assert compiled.trial is None


def test_off_no_trial():
    with config.override(eager_trial=False):
        compiled = ember.compile(breaking)
        compiled(torch.randn(4, 3))
    assert compiled.trial is None


def test_a_training_call_judged_in_its_grad_mode_only(monkeypatch):
    slowed(monkeypatch, "compiled")
    linear = torch.nn.Linear(3, 3)

    def step(x):
        y = linear(x).relu()
        print("", end="")
        return y.sum()

    compiled = ember.compile(step)
    x = torch.randn(4, 3)
    for _ in range(CALLS + 1):
        compiled(x).backward()
    assert compiled.direct_modes == frozenset({True})
    with torch.no_grad():  # (inference: captured again, and on trial on its own)
        torch.testing.assert_close(compiled(x), step(x))
    assert compiled.direct_modes == frozenset({True}) and compiled.trial is not None


def test_a_trial_times_only_the_calls_of_its_own_grad_mode(monkeypatch):
    # (calls alternately with and without grad: the trial started by the no_grad capture
    # takes only no_grad calls; the others pass through it untimed)
    slowed(monkeypatch, "compiled")
    linear = torch.nn.Linear(3, 3)

    def step(x):
        y = linear(x).relu()
        print("", end="")
        return y.sum()

    compiled = ember.compile(step)
    x = torch.randn(4, 3)
    compiled(x)
    with torch.no_grad():
        compiled(x)  # (captured again: the trial now is this mode's)
    for _ in range(CALLS):
        compiled(x)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), step(x))
    assert compiled.direct_modes == frozenset({False}) and compiled.trial is None
