"""ember.codegen.c_rules: each primitive's C equals eager's op on the values where they are
easiest to get wrong (NaN, infinities, signed zeros, ties, overflow), for every dtype that
lowering hands it. The oracle is the IR interpreter, which runs eager's own ops."""

import math

import numpy
import pytest
import torch
from helpers import TOLERANCES, assert_close, compile_ir

from ember.codegen.c_rules import literal
from ember.ir import Graph, Op
from ember.ir.interpreter import interpret
from ember.ir.ops import BINARY, FLOAT_ONLY, UNARY

FLOAT_VALUES = [math.nan, math.inf, -math.inf, -0.0, 0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5,
                3.5, 1e-3, -7.25, 100.0, 0.9999, 1e-30, 70000.0]
INT_VALUES = [0, 1, -1, 2, -2, 3, 7, -8, 100, -128, 127, 2 ** 31 - 1, -2 ** 31]
SHIFTS = [0, 1, 3, 7, 8, 15, 31, 32, 63, 64, -1]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
# Integer ops the lowering never builds for integers: eager raises on division by zero, so
# integer division, remainder and power decline to library calls.
FLOAT_ARITHMETIC = {Op.DIV, Op.FLOORDIV, Op.REMAINDER, Op.FMOD, Op.POW}


def _values(dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.tensor(FLOAT_VALUES, dtype=torch.float64).to(dtype)
    if dtype is torch.bool:
        return torch.tensor([True, False])
    info = torch.iinfo(dtype)
    return torch.tensor([v for v in INT_VALUES if info.min <= v <= info.max], dtype=dtype)


def _applies(op: Op, dtype: torch.dtype) -> bool:
    if op in FLOAT_ONLY or op in FLOAT_ARITHMETIC or op in (Op.FLOOR, Op.CEIL, Op.ROUND,
                                                            Op.TRUNC, Op.ISNAN, Op.ISINF):
        return dtype.is_floating_point
    if op in (Op.BITWISE_NOT, Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR):
        return not dtype.is_floating_point
    if op in (Op.SHIFT_LEFT, Op.SHIFT_RIGHT):
        return dtype in INTEGERS
    if op is Op.LOGICAL_NOT:
        return dtype is torch.bool
    if dtype is torch.bool:
        return op in (Op.ADD, Op.MUL, Op.MAXIMUM, Op.MINIMUM, Op.EQ, Op.NE, Op.LT, Op.LE,
                      Op.GT, Op.GE)
    return True


def _compare(graph: Graph, inputs: list[torch.Tensor], dtype: torch.dtype) -> None:
    expected, _ = interpret(graph, inputs)
    got = compile_ir(graph)(inputs)
    for node, actual, want in zip(graph.outputs, got, expected):
        tolerance = TOLERANCES.get(want.dtype, dict(rtol=0, atol=0))
        try:
            assert_close(actual, want, **tolerance)
        except AssertionError as error:
            raise AssertionError(f"{node.op.value} on {dtype}: {error}") from None


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS + [torch.bool])
def test_unary_rules_match_eager(dtype):
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((len(_values(dtype)),), dtype)
    ops = [op for op in sorted(UNARY, key=lambda o: o.value) if _applies(op, dtype)]
    graph.outputs = [graph.add(op, (x,)) for op in ops]
    _compare(graph, [_values(dtype)], dtype)


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS + [torch.bool])
def test_binary_rules_match_eager(dtype):
    values = _values(dtype)
    a = values.repeat_interleave(len(values))
    b = values.repeat(len(values))
    graph = Graph(torch.device("cpu"))
    x, y = graph.add_input(a.shape, dtype), graph.add_input(b.shape, dtype)
    ops = [op for op in sorted(BINARY, key=lambda o: o.value) if _applies(op, dtype)
           and op not in (Op.SHIFT_LEFT, Op.SHIFT_RIGHT)]
    graph.outputs = [graph.add(op, (x, y)) for op in ops]
    _compare(graph, [a, b], dtype)


@pytest.mark.parametrize("dtype", INTEGERS)
def test_shifts_match_eager(dtype):
    values = _values(dtype)
    shifts = torch.tensor([s for s in SHIFTS if dtype is not torch.uint8 or s >= 0])
    a = values.repeat_interleave(len(shifts))
    b = shifts.repeat(len(values)).to(dtype)
    graph = Graph(torch.device("cpu"))
    x, y = graph.add_input(a.shape, dtype), graph.add_input(b.shape, dtype)
    graph.outputs = [graph.add(Op.SHIFT_LEFT, (x, y)), graph.add(Op.SHIFT_RIGHT, (x, y))]
    _compare(graph, [a, b], dtype)


@pytest.mark.parametrize("source", FLOATS + INTEGERS + [torch.bool])
def test_casts_match_eager(source):
    """Every dtype to every dtype, on values each target holds or rounds (never a float
    outside an integer target's range: C leaves that undefined, and so does eager)."""
    values = _values(source)
    graph = Graph(torch.device("cpu"))
    x = graph.add_input(values.shape, source)
    outputs = []
    targets = FLOATS + INTEGERS + [torch.bool]
    inputs = [values]
    for target in targets:
        node = x
        if source.is_floating_point and not target.is_floating_point and target is not torch.bool:
            info = torch.iinfo(target)
            finite = torch.isfinite(values) & (values >= info.min) & (values <= info.max)
            safe = torch.where(finite, values, torch.zeros_like(values))
            node = graph.add_input(values.shape, source)
            inputs.append(safe)
        outputs.append(graph.add(Op.CAST, (node,), dtype=target))
    graph.outputs = outputs
    _compare(graph, inputs, source)


def test_where_and_reduced_float_literals():
    graph = Graph(torch.device("cpu"))
    condition = graph.add_input((4,), torch.bool)
    x = graph.add_input((4,), torch.float16)
    tenth = graph.add(Op.FULL, (), value=0.1, shape=(4,), dtype=torch.float16)
    graph.outputs = [graph.add(Op.WHERE, (condition, x, tenth))]
    inputs = [torch.tensor([True, False, True, False]), torch.randn(4).half()]
    _compare(graph, inputs, torch.float16)
    # literals are the dtype's value, rounded as eager rounds it, read back exactly by C
    for value, dtype in [(0.1, torch.float16), (1 / 3, torch.bfloat16), (0.1, torch.float32)]:
        text = literal(value, dtype)
        assert text.endswith("f")
        assert numpy.float32(text[:-1]) == torch.tensor(value).to(dtype).float().item()
    assert literal(0.1, torch.float64) == "0.1"
    assert literal(-(2 ** 63), torch.int64) == "INT64_MIN"
    assert literal(2 ** 40, torch.int64) == "INT64_C(1099511627776)"
    assert literal(float("-inf"), torch.float32) == "-INFINITY"
    assert literal(float("nan"), torch.bfloat16) == "NAN"
    assert literal(True, torch.bool) == "true"
