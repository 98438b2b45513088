"""Random programs (pointwise chains with broadcasting, promotion, comparisons, where, casts,
views, reductions, in-place writes) over inputs of random shapes, strides and dtypes: ember
gives eager's outputs, strides, memory sharing and mutated inputs (tests/helpers.py check)."""

from helpers import check
from hypothesis import given
from property.strategies import examples, large_reductions, programs, tolerance

from ember import config


@examples(200)
@given(programs())
def test_pointwise_programs_match_eager(program):
    check(program.function(), *program.inputs, may_switch_to_eager=True, **tolerance(program))


@examples(200)
@given(programs(reductions=True))
def test_reduction_programs_match_eager(program):
    check(program.function(), *program.inputs, may_switch_to_eager=True, **tolerance(program))


@examples(150)
@given(programs(reductions=True, mutations=True))
def test_programs_with_in_place_writes_match_eager(program):
    check(program.function(), *program.inputs, may_switch_to_eager=True, **tolerance(program))


@examples(60)
@given(programs(reductions=True))
def test_parallel_kernels_match_eager(program):
    """Every kernel opens an OpenMP parallel region (the threshold is one element)."""
    with config.override(parallel_threshold=1):
        check(program.function(), *program.inputs, may_switch_to_eager=True, **tolerance(program))


@examples(20)
@given(programs(reductions=True, mutations=True))
def test_programs_through_dynamo_match_eager(program):
    """The front door: torch.compile(fn, backend=...) with Dynamo capturing the graph."""
    check(program.function(), *program.inputs, may_switch_to_eager=True, dynamo=True,
          **tolerance(program))


@examples(40)
@given(large_reductions())
def test_large_reductions_match_eager(program):
    """Reductions long enough for column blocks, parallel regions and double accumulation."""
    check(program.function(), *program.inputs, may_switch_to_eager=True, **tolerance(program))
