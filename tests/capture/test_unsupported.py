"""What capture cannot put in a graph: a graph break (or, for try/except, the frame runs
eagerly) that says why; fullgraph=True raises with the user's file, line, construct and a
hint; explain() reports it."""

from __future__ import annotations

import inspect

import pytest
import torch
from checks import same

import ember
from ember.capture.errors import CaptureError


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def data_dependent_branch(x):
    x = x * 2
    if x.sum() > 0:
        return x + 1
    return x - 1


def uses_item(x):
    return x * x.sum().item()


def prints(x):
    print("value", x.shape)
    return x + 1


def try_except(x):
    try:
        return x.view(3, -1)  # (4 elements: eager raises, and its handler runs)
    except RuntimeError:
        return x


def builds_object(x):
    class Local:
        pass

    return x + (1 if Local() else 0)


def nonzero(x):
    return torch.nonzero(x)


UNSUPPORTED = [
    (data_dependent_branch, "depends on a tensor's value", "torch.where"),
    (uses_item, "needs the tensor's data", ""),
    (prints, "print()", ""),
    (try_except, "RuntimeError: shape '[3, -1]' is invalid", ""),
    (nonzero, "needs tensor values", ""),
]


def _line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset
    raise AssertionError(text)


@pytest.mark.parametrize("fn, reason, hint", UNSUPPORTED, ids=[u[0].__name__ for u in UNSUPPORTED])
def test_right_answer_and_reason(fn, reason, hint, capsys):
    compiled = ember.compile(fn, backend="eager")
    for seed in range(3):
        x = t(4, seed=seed)
        same(compiled(x), fn(x))
    entry = compiled.entries[0]
    # a graph break: the graph before it, the instruction natively, then a resume (in a try
    # block, the handler's when the instruction raises)
    assert entry.captured is not None and reason in entry.captured.break_reason.reason


@pytest.mark.parametrize("fn, reason, hint", UNSUPPORTED, ids=[u[0].__name__ for u in UNSUPPORTED])
def test_fullgraph_error_names_file_line_and_fix(fn, reason, hint):
    with pytest.raises(CaptureError) as raised:
        ember.compile(fn, fullgraph=True)(t(4))
    message = str(raised.value)
    assert __file__ in message
    assert reason in message
    if hint:
        assert hint in message
    key = {"data_dependent_branch": "if x.sum()", "uses_item": ".item()",
           "prints": "print(", "try_except": "x.view(3, -1)",
           "nonzero": "torch.nonzero"}[fn.__name__]
    assert f"line {_line_of(fn, key)}" in message


def test_a_try_body_that_does_not_fail_is_captured():
    def fn(x, n):
        try:
            y = x.view(n, -1) * 2
        except RuntimeError:
            y = x
        finally:
            y = y + 1
        return y

    report = ember.explain(fn)(t(4), 2)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    compiled = ember.compile(fn)
    for n in (2, 3, 4):  # (3: the body fails, the frame runs eagerly and its handler runs)
        same(compiled(t(4), n), fn(t(4), n))


def test_explain_reports_the_break():
    report = ember.explain(data_dependent_branch)(t(4))
    assert report.graph_count == 2
    assert report.graph_break_count == 1
    (reason,) = report.break_reasons
    assert reason.location.line == _line_of(data_dependent_branch, "if x.sum()")
    assert "torch.where" in str(report)


def test_explain_of_a_clean_function():
    def clean(x, w):
        return torch.relu(x @ w + 1)

    report = ember.explain(clean)(t(2, 3), t(3, 4))
    assert report.graph_count == 1
    assert report.graph_break_count == 0
    assert report.ops_per_graph == [3]
    assert len(report.graphs) == 1
    assert "Graph count: 1" in str(report) and "Graph break count: 0" in str(report)
    assert report.guards and "L['x']" in report.guards[0]


def test_explain_counts_graph_break_call():
    def broken(x):
        y = x + 1
        ember.graph_break()
        return y * 2

    report = ember.explain(broken)(t(3))
    assert report.graph_break_count == 1
    assert "graph_break" in report.break_reasons[0].reason


def test_non_callable_is_a_clear_error():
    with pytest.raises(TypeError, match="function or an nn.Module"):
        ember.compile(42)


def test_generator_function_is_a_clear_error():
    def generate(x):
        yield x

    with pytest.raises(TypeError, match="generator"):
        ember.compile(generate)


def test_wrong_arguments_raise_like_eager():
    compiled = ember.compile(lambda x, y: x + y, backend="eager")
    with pytest.raises(TypeError):
        compiled(t(2))


def test_exception_in_user_code_is_raised_as_eager_raises():
    def fails(x):
        return x @ x  # 1-d @ 1-d of different sizes fails in eager too

    compiled = ember.compile(fails, backend="eager")
    with pytest.raises(RuntimeError):
        compiled(t(2, 3))


def test_assert_that_fails_raises_assertion_error():
    def checked(x, n):
        assert n > 0, "n must be positive"
        return x * n

    compiled = ember.compile(checked, backend="eager")
    same(compiled(t(2), 3), t(2) * 3)
    with pytest.raises(AssertionError, match="n must be positive"):
        compiled(t(2), -1)


class _Counted(torch.Tensor):
    """A tensor subclass with a __torch_function__ of its own: it sees every torch call."""

    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_with_its_own_torch_function_runs_as_eager_runs_it():
    # (it was captured and then run eagerly: its hook saw 73 calls on the first call, the
    # capture's and the guards' reads of strides and sizes, and 7 on each call after)
    def fn(x):
        return (x * 2).sum()

    seen = []
    for run in (fn, ember.compile(fn)):
        for _ in range(2):
            _Counted.seen = []
            result = run(t(3).as_subclass(_Counted))
            seen.append((type(result), result.as_subclass(torch.Tensor), _Counted.seen))
    same([s[1] for s in seen[2:]], [s[1] for s in seen[:2]])
    assert [(s[0], s[2]) for s in seen[2:]] == [(s[0], s[2]) for s in seen[:2]]
    report = ember.explain(fn)(t(3).as_subclass(_Counted))
    assert (report.graph_count, report.graph_break_count) == (0, 1)
    assert "__torch_function__" in report.break_reasons[0].reason
