"""A Python exception that the captured code raises and catches (a missing key behind
Mapping.get, os.getenv, `try: d[k] except KeyError`, a `raise ... from None` in a helper) runs
its handler in the capture, as eager does: one graph, no break, eager's answers and side
effects. One that nothing in the captured code catches still raises as eager raises. One the
graph raises at run time (a factorization that fails, an index out of range) reaches the
user's handler: the call runs eagerly from the function's start."""

from __future__ import annotations

import collections.abc
import os

import pytest
import torch
from checks import check_calls, same

import ember

LOG: list = []


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


class Registry(collections.abc.Mapping):
    """Hugging Face's AttentionInterface in small: a Mapping whose __getitem__ raises
    KeyError for a name it lacks, read with the inherited get() and a default."""

    _shared = {"sin": torch.sin}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._shared[key]

    def __iter__(self):
        return iter(self._shared)

    def __len__(self):
        return len(self._shared)


REGISTRY = Registry()


def counts(fn, *args):
    explained = ember.explain(fn)(*args)
    return explained.graph_count, explained.graph_break_count, explained.eager_islands


def mapping_get_with_a_default(x):
    return REGISTRY.get("eager", torch.cos)(x) + REGISTRY.get("sin", torch.cos)(x)


class Settings:
    def __init__(self):
        self.values = {"scale": 2.0}

    def __getitem__(self, key):  # (os._Environ's: the KeyError again, its context dropped)
        try:
            return self.values[key]
        except KeyError:
            raise KeyError(key) from None

    def lookup(self, key, default):
        try:
            return self[key]
        except KeyError as error:
            LOG.append(str(error))
            return default


SETTINGS = Settings()


def reraised_and_caught_a_frame_above(x):
    return x * SETTINGS.lookup("scale", 1.0) + SETTINGS.lookup("shift", 0.5)


def caught_in_the_compiled_function(x, table):
    try:
        y = x * table["missing"]
    except KeyError:
        y = x - 1
    try:
        z = [x][3]
    except (IndexError, TypeError) as error:
        LOG.append(type(error).__name__)
        z = x + 1
    return y * z


def _finish(x, done):
    try:
        return x * {"a": 2}["b"]
    finally:
        done.append("finally")  # (runs on the way out, the exception still going)


def finally_on_the_way_out(x):
    done = []
    try:
        y = _finish(x, done)
    except KeyError:
        y = -x
    return y, done


def a_bare_raise_goes_to_the_handler_above(x):
    def inner(key):
        try:
            return {"a": 1}[key]
        except KeyError:
            LOG.append("inner")
            raise
    try:
        scale = inner("b")
    except LookupError as error:
        scale = len(error.args)
    return x * scale


@pytest.mark.parametrize("fn, args", [
    (mapping_get_with_a_default, (t(4),)),
    (reraised_and_caught_a_frame_above, (t(4),)),
    (caught_in_the_compiled_function, (t(4), {"present": 1})),
    (finally_on_the_way_out, (t(4),)),
    (a_bare_raise_goes_to_the_handler_above, (t(4),)),
])
def test_a_caught_exception_runs_its_handler_in_one_graph(fn, args):
    LOG.clear()  # (the handlers' side effects: eager's, in eager's order)
    check_calls(fn, [(args, {})], fullgraph=True, state=lambda: LOG)
    assert counts(fn, *args) == (1, 0, [])


def test_getenv_of_an_unset_variable_is_guarded():
    name = "EMBER_TEST_UNSET_VARIABLE"
    os.environ.pop(name, None)

    def fn(x):
        if os.getenv(name, "0") == "1":
            return x + 1
        return x - 1

    compiled = ember.compile(fn, fullgraph=True, backend="eager")
    assert torch.equal(compiled(t(3)), t(3) - 1)
    assert counts(fn, t(3)) == (1, 0, [])
    os.environ[name] = "1"
    try:  # (the guard that the variable stays unset fails: captured again, eager's answer)
        assert torch.equal(compiled(t(3)), t(3) + 1)
    finally:
        del os.environ[name]


def test_an_exception_nothing_catches_raises_as_eager():
    def fn(x, table):
        return x * table["missing"]

    with pytest.raises(KeyError, match="missing"):
        fn(t(3), {})
    with pytest.raises(KeyError, match="missing"):
        ember.compile(fn, backend="eager")(t(3), {})
    with pytest.raises(ember.capture.errors.CaptureError, match="KeyError"):
        ember.compile(fn, fullgraph=True, backend="eager")(t(3), {})


def test_an_op_failing_on_fakes_leaves_no_traceback_on_the_user_s_stderr():
    # (FakeTensorMode logs an op that raised on fakes, traceback and all, at ERROR level;
    # capture handles the error as eager does — here the user's except clause — so the record
    # is noise on the user's stderr)
    import logging

    def fn(x, y):
        try:
            z = x + y
        except RuntimeError:
            z = x * 2
        return z + 1

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    try:
        x, y = t(3, 4), t(5, 4, seed=1)
        same(ember.compile(fn)(x, y), fn(x, y))
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []


def _factor_or_zeros(x, log):
    try:
        factor = torch.linalg.cholesky(x)
    except torch.linalg.LinAlgError:
        log.append("not positive-definite")
        factor = torch.zeros_like(x)
    return factor * 2


def _row_or_zeros(x, rows):
    try:
        return x[rows] * 2
    except IndexError:
        return x * 0


def test_an_error_the_graph_raises_at_run_time_reaches_the_user_s_handler():
    # (the graph's run raised the factorization's error past the user's except clause: the
    # program crashed where eager's handler returned zeros)
    cases = [(_factor_or_zeros, [torch.eye(3) * 2, -torch.eye(3), torch.eye(3)])]
    if torch.get_default_device().type == "cpu":  # (on CUDA an index out of range is a
        # device-side assert, eager's too: the process's CUDA context is lost)
        cases.append((_row_or_zeros, [torch.tensor([1]), torch.tensor([5])]))
    for fn, calls in cases:
        compiled = ember.compile(fn)
        for value in calls:
            if fn is _factor_or_zeros:
                ours, theirs = [], []
                same(compiled(value, ours), fn(value, theirs))
                assert ours == theirs
            else:
                x = t(3)
                same(compiled(x, value), fn(x, value))
        assert len(compiled.entries) == 1


class _CountedFactor(torch.nn.Module):
    """A buffer written in place, then a factorization that may fail, inside try."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.log = []

    def forward(self, x):
        try:
            self.calls.add_(1)
            factor = torch.linalg.cholesky(x)
        except torch.linalg.LinAlgError:
            self.log.append("not positive-definite")
            factor = torch.zeros_like(x)
        return factor * self.calls


def _scale_then_factor(x, y):
    # (the input written in place inside a with-block, inside the try statement)
    try:
        with torch.no_grad():
            y.mul_(2)
            return torch.linalg.cholesky(x) + y.sum()
    except torch.linalg.LinAlgError:
        return x * 0 + y.sum()


def test_an_error_the_graph_raises_after_writing_an_input_reaches_the_user_s_handler():
    # (an eager rerun would write the input twice: the graph keeps what it writes and puts
    # it back before the rerun, where a handler of the captured code could catch the error)
    ours, theirs = _CountedFactor(), _CountedFactor()
    compiled = ember.compile(ours)
    for value in (torch.eye(3) * 2, -torch.eye(3), torch.eye(3), -torch.eye(3)):
        same(compiled(value), theirs(value))
        same(ours.calls, theirs.calls)
        assert ours.log == theirs.log
    assert ours.log == ["not positive-definite"] * 2
    compiled = ember.compile(_scale_then_factor)
    for value in (torch.eye(3) * 2, -torch.eye(3)):
        y, y_eager = t(3), t(3)
        same(compiled(value, y), _scale_then_factor(value, y_eager))
        same(y, y_eager)
    assert len(compiled.entries) == 1


def test_a_graph_that_writes_an_input_outside_any_except_clause_keeps_no_copy():
    def fn(x, y):
        y.add_(1)
        return torch.linalg.cholesky(x) * y

    def in_finally(x, y):  # (transformers' output capturing: every model's forward)
        try:
            with torch.no_grad():
                return fn(x, y)
        finally:
            LOG.append("reset")

    for function in (fn, in_finally):
        compiled = ember.compile(function)
        y, y_eager = t(3), t(3)
        same(compiled(torch.eye(3), y), function(torch.eye(3), y_eager))
        same(y, y_eager)
        (entry,) = compiled.entries
        assert "saved = " not in entry.captured.runner_source


def test_a_graph_that_raises_inside_no_grad_leaves_grad_mode_as_it_came():
    # (the graph's own `_set_grad_enabled(False)` stayed in force past its error: the user's
    # handler, and every later call, ran without autograd)
    def factor(x):
        with torch.no_grad():
            return torch.linalg.cholesky(x)

    def factor_or_zeros(x):
        try:
            return factor(x)
        except torch.linalg.LinAlgError:
            return (x * 0).requires_grad_(torch.is_grad_enabled())

    compiled, caller = ember.compile(factor), ember.compile(factor_or_zeros)
    same(compiled(torch.eye(3)), factor(torch.eye(3)))
    with pytest.raises(torch.linalg.LinAlgError):
        compiled(-torch.eye(3))
    assert torch.is_grad_enabled()
    for value in (torch.eye(3), -torch.eye(3)):
        same(caller(value), factor_or_zeros(value))
        assert torch.is_grad_enabled()


def _mask(x):
    # (transformers' mask helpers in small: under compilation they build a full mask that
    # eager's path never builds)
    if torch.compiler.is_compiling():
        return torch.zeros(x.shape[0], 1, x.shape[1], x.shape[1])
    return None


class _Landmarks(torch.nn.Module):
    def forward(self, x, mask):
        scores = x[:, None, :2, :] * 2  # (2 landmarks by the whole sequence)
        if mask is not None:
            scores = scores + mask  # (refused by the shapes: the compiled path's own mask)
        return scores.softmax(-1)


_LANDMARKS = _Landmarks()


def _landmarks(x):
    return _LANDMARKS(x.relu(), _mask(x)) * 2


def test_an_op_that_refuses_its_arguments_on_the_compiled_path_runs_eagerly_from_the_start():
    # (a break there handed the compiled path's mask to eager's add, which raised where
    # eager runs: Nystromformer's landmark scores under transformers' compiled-path mask)
    x = t(2, 5, 3)
    same(ember.compile(_landmarks)(x), _landmarks(x))
    report = ember.explain(_landmarks)(x)
    assert report.graph_count == 0 and "failed while capturing" in str(report.break_reasons[0])

    def caught(x):  # (where the captured code's handler may catch it: a break, as before)
        try:
            return x.view(3, -1)
        except RuntimeError:
            return x * 2

    same(ember.compile(caught)(t(4)), caught(t(4)))
    assert counts(caught, t(4)) == (1, 1, [])
