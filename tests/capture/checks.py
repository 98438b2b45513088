"""Run a function compiled by ember beside eager over several calls and compare everything:
results, what happened to the arguments, and module/global state the tests expose."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch

import ember


def same(actual: Any, expected: Any, path: str = "result") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)} is not a tensor"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad differs"
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            same(a, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), \
            f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            same(actual[key], expected[key], f"{path}[{key!r}]")
        if hasattr(expected, "__dict__"):  # a dict subclass's object: its attributes too
            same(vars(actual), vars(expected), f"{path}.__dict__")
    elif type(expected).__module__ != "builtins" and hasattr(expected, "__dict__") and \
            not isinstance(expected, torch.nn.Module) and not isinstance(expected, type):
        # an object of the user's own class (a dataclass, a record): its class and attributes
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        same(vars(actual), vars(expected), f"{path}.__dict__")
    elif isinstance(expected, torch.nn.Module):
        same(dict(actual.state_dict()), dict(expected.state_dict()), f"{path}.state_dict()")
        same(_plain_state(actual), _plain_state(expected), f"{path}.__dict__")
    else:
        assert type(actual) is type(expected) and actual == expected, \
            f"{path}: {actual!r} != {expected!r}"


def _plain_state(module: torch.nn.Module) -> dict[str, Any]:
    return {k: v for k, v in vars(module).items()
            if isinstance(v, (int, float, str, bool, list, tuple, dict, type(None)))
            and not k.startswith("_")}


def check_calls(fn: Callable, inputs: list[tuple[tuple, dict]], backend: str = "eager",
                fullgraph: bool = True, state: Callable[[], Any] | None = None) -> Any:
    """Call `fn` and ember.compile(fn) on copies of each (args, kwargs); compare results,
    arguments afterwards, and `state()` (globals a test mutates) after each call."""
    compiled = ember.compile(fn, fullgraph=fullgraph, backend=backend)
    for number, (args, kwargs) in enumerate(inputs):
        eager_in = copy.deepcopy((args, kwargs))
        compiled_in = copy.deepcopy((args, kwargs))
        before = copy.deepcopy(state()) if state else None
        expected = fn(*eager_in[0], **eager_in[1])
        eager_state = copy.deepcopy(state()) if state else None
        if state:
            _restore(state(), before)
        actual = compiled(*compiled_in[0], **compiled_in[1])
        same(actual, expected, f"call {number} result")
        same(compiled_in, eager_in, f"call {number} arguments")
        if state:
            same(state(), eager_state, f"call {number} state")
    return compiled


def _restore(target: Any, snapshot: Any) -> None:
    if isinstance(target, dict):
        target.clear()
        target.update(snapshot)
    elif isinstance(target, list):
        target[:] = snapshot


def counts(fn: Callable, *args: Any, **kwargs: Any) -> tuple[int, int]:
    """(graphs, breaks) that ember.explain finds in fn(*args, **kwargs)."""
    report = ember.explain(fn)(*args, **kwargs)
    return report.graph_count, report.graph_break_count


def warnings_of_each_run(fn: Callable, inputs: list[torch.Tensor],
                         keep: Callable[[str], bool] = lambda message: True) -> list[list]:
    """What eager's fn and ember.compile(fn) warn over one call per input, under the "always"
    filter and then the "default" one (eager's two lists, then ember's), each warning kept
    as (message, category, file, line); every result is checked against eager's."""
    seen = []
    for run in (fn, ember.compile(fn)):
        for policy in ("always", "default"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter(policy)
                results = [run(x) for x in inputs]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for x, result in zip(inputs, results):
                    same(result, fn(x))
            seen.append([(str(w.message), w.category, w.filename, w.lineno) for w in caught
                         if keep(str(w.message))])
    return seen
