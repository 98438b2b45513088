"""Checks on tensors' values whose failing side only raises (`assert (x >= 0).all()`, `if
not ok: raise ValueError(...)`, a distribution's validation) are assumed to pass: one graph,
the condition tested by the runner after it; where one fails, the function runs eagerly from
its start, so the exception, its message, its handlers and the side effects are eager's."""

from __future__ import annotations

import pytest
import torch
from checks import counts

import ember
from ember.exported import ExportError


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def raised(fn, *args):
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 (what eager raises, compared)
        return type(error), str(error)
    return None


# (made from source: pytest rewrites the assert statements of test modules)
_ASSERTED = """
def asserted(x, log):
    y = x * 2
    log.append(len(log))
    assert (y >= 0).all(), f"negative values in {tuple(y.shape)}"
    return y.sqrt() + 1
"""
_made: dict = {"torch": torch}
exec(compile(_ASSERTED, "<asserted>", "exec"), _made)  # noqa: S102 (our own source)
asserted = _made["asserted"]


def validated(x, scale):
    if not torch._is_all_true(scale > 0):
        raise ValueError(f"scale must be positive, got {scale}")
    return x / scale


def handled(x):
    try:
        if not torch._is_all_true(x.isfinite()):
            raise ArithmeticError("not finite")
        y = x.exp()
    except ArithmeticError:
        y = torch.zeros_like(x)
    return y + 1


@pytest.mark.parametrize("fn, good, bad", [
    (validated, (t(3), t(3, seed=1).abs() + 0.1), (t(3), -t(3, seed=1).abs())),
    (handled, (t(3),), (torch.tensor([1.0, float("inf")]),)),
], ids=["validated", "handled"])
def test_a_check_that_passes_is_one_graph_and_one_that_fails_runs_as_eager(fn, good, bad):
    assert counts(fn, *good) == (1, 0)
    compiled = ember.compile(fn)
    torch.testing.assert_close(compiled(*good), fn(*good))
    if fn is handled:  # (eager's handler runs)
        torch.testing.assert_close(compiled(*bad), fn(*bad))
    else:
        assert raised(compiled, *bad) == raised(fn, *bad) is not None
    torch.testing.assert_close(compiled(*good), fn(*good))  # (compiled again after)


def test_an_assert_fails_with_eagers_message_and_effects_once():
    x = t(4).abs()
    assert counts(asserted, x, []) == (1, 0)
    compiled = ember.compile(asserted)
    compiled_log, eager_log = [], []
    torch.testing.assert_close(compiled(x, compiled_log), asserted(x, eager_log))
    assert raised(compiled, -x, compiled_log) == raised(asserted, -x, eager_log) == \
        (AssertionError, "negative values in (4,)")
    assert compiled_log == eager_log == [0, 1]


def test_a_graph_that_writes_its_input_breaks_at_the_check_instead():
    def scaled(buffer, x):
        buffer.mul_(0.5)  # (an eager rerun from the start would halve it twice)
        if not torch._is_all_true(x > 0):
            raise ValueError("x must be positive")
        return buffer + x

    assert counts(scaled, torch.ones(3), t(3).abs() + 0.1)[1] == 1
    compiled = ember.compile(scaled)
    eager_buffer, compiled_buffer, bad = torch.ones(3), torch.ones(3), -t(3).abs()
    assert raised(compiled, compiled_buffer, bad) == raised(scaled, eager_buffer, bad)
    torch.testing.assert_close(compiled_buffer, eager_buffer)


def checked_then_printed(x):
    if not torch._is_all_true(x > -10):
        raise ValueError("too small")
    y = x * 2
    print("inside", tuple(y.shape))  # (a break inside the inlined call: its capture undone)
    return y + 1


def calls_the_checked(x):
    y = x * 2 - 1  # (the root's graph computes before the call and after it)
    return checked_then_printed(y) * y


def test_a_check_in_a_call_that_breaks_is_undone_with_it(capsys):
    x = t(3)
    compiled = ember.compile(calls_the_checked)
    got = compiled(x)
    printed = capsys.readouterr().out
    torch.testing.assert_close(got, calls_the_checked(x))
    assert printed == capsys.readouterr().out == "inside (3,)\n"
    assert raised(compiled, x - 20) == raised(calls_the_checked, x - 20) is not None


def test_ahead_of_time_and_export_keep_eagers_check():
    compiled = ember.compile(validated).lower(t(3), t(3, seed=1).abs() + 0.1).compile()
    good, bad = (t(3), t(3, seed=1).abs() + 0.1), (t(3), -t(3, seed=1).abs())
    torch.testing.assert_close(compiled(*good), validated(*good))
    assert raised(compiled, *bad) == raised(validated, *bad) is not None
    with pytest.raises(ExportError, match="checks a tensor.s value and raises"):
        ember.export(validated, *(x.cpu() for x in good))  # (export takes CPU programs)
