"""ember.runtime.compiled: the first call is checked; a layout ember did not predict makes
the graph run eagerly from then on, from the inputs the caller passed, with a warning."""

import logging

import torch
from helpers import captured_log

from ember.codegen.wrapper import LayoutMismatch, WrapperSource
from ember.runtime.compiled import CompiledGraph


def _eager(x, scale):
    x.mul_(scale)
    return x + 1


def _graph(checked_text: str) -> CompiledGraph:
    namespace = {"LayoutMismatch": LayoutMismatch}
    fast = WrapperSource("def call(args):\n    raise AssertionError('fast path')\n", namespace)
    checked = WrapperSource(checked_text, namespace)
    return CompiledGraph(checked, fast, tensor_positions=[0], argument_count=2, eager=_eager,
                         label="graph_test", kernel_count=1, library_count=1,
                         written_inputs=[0])


def test_a_layout_mismatch_falls_back_to_eager_from_the_original_inputs():
    compiled = _graph("def call(args):\n"
                      "    args[0].add_(100)\n"             # written before the check fails
                      "    raise LayoutMismatch('lib0')\n")
    x = torch.arange(4.0)
    with captured_log("fallbacks") as records:
        result = compiled(x, 3)
    assert torch.equal(x, torch.arange(4.0) * 3)            # mutated once, by eager
    assert torch.equal(result, torch.arange(4.0) * 3 + 1)
    (record,) = records
    assert record.levelno == logging.WARNING and "graph_test" in record.getMessage()
    y = torch.ones(2)
    assert torch.equal(compiled(y, 2), torch.full((2,), 3.0))  # eager from now on


def test_after_a_checked_first_call_the_fast_wrapper_runs():
    compiled = _graph("def call(args):\n    return args[0] * 10\n")
    x = torch.ones(2)
    assert torch.equal(compiled(x, 5), torch.full((2,), 10.0))
    try:
        compiled(x, 5)
    except AssertionError as error:
        assert str(error) == "fast path"
    else:
        raise AssertionError("the fast wrapper did not run")
