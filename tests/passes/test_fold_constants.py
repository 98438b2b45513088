"""ember.passes.fold_constants: constants computed at compile time exactly as eager would."""

import math

import pytest
import torch

from ember.ir import Graph, Op
from ember.ir.interpreter import interpret
from ember.ir.verifier import verify
from ember.passes.fold_constants import fold_constants


def _full(graph, value, dtype, shape=()):
    return graph.add(Op.FULL, (), value=value, shape=shape, dtype=dtype)


@pytest.mark.parametrize("op, a, b, dtype", [
    (Op.ADD, 0.1, 0.2, torch.float16),      # rounds in half, as eager does
    (Op.ADD, 0.1, 0.2, torch.bfloat16),
    (Op.MUL, 0.1, 3.0, torch.float32),      # float32 product, not Python's double
    (Op.ADD, 100, 100, torch.int8),         # wraps around
    (Op.SUB, -128, 1, torch.int8),
    (Op.DIV, 7, -2, torch.int32),           # truncation
    (Op.FLOORDIV, 7.0, -2.0, torch.float32),
    (Op.REMAINDER, -7.0, 3.0, torch.float64),
    (Op.POW, 2.0, 0.5, torch.float32),
    (Op.MAXIMUM, math.nan, 1.0, torch.float32),
    (Op.SHIFT_LEFT, 1, 70, torch.int64),
    (Op.LT, 0.1, 0.1000001, torch.float32),
])
def test_folding_uses_eagers_arithmetic(op, a, b, dtype):
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((2,), dtype)
    node = graph.add(op, (_full(graph, a, dtype, (2,)), _full(graph, b, dtype, (2,))))
    graph.outputs = [node]
    assert fold_constants(graph) == 1
    (folded,) = graph.outputs
    assert folded.op is Op.FULL and folded.shape == (2,) and folded.dtype == node.dtype
    eager = interpret_value(op, a, b, dtype)
    got = torch.tensor(folded.attrs["value"], dtype=folded.dtype)
    torch.testing.assert_close(got, eager, rtol=0, atol=0, equal_nan=True)
    verify(graph)
    assert x in graph.nodes


def interpret_value(op, a, b, dtype):
    graph = Graph(torch.device("cpu"))
    u, v = graph.add_input((), dtype), graph.add_input((), dtype)
    graph.outputs = [graph.add(op, (u, v))]
    (value,), _ = interpret(graph, [torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)])
    return value


def test_unary_ops_and_casts_fold_like_eager():
    graph = Graph(torch.device("cpu"))
    third = _full(graph, 1.0 / 3.0, torch.float32)
    cast = graph.add(Op.CAST, (third,), dtype=torch.bfloat16)
    exp = graph.add(Op.EXP, (cast,))
    to_int = graph.add(Op.CAST, (_full(graph, -2.7, torch.float64),), dtype=torch.int32)
    graph.outputs = [exp, to_int]
    fold_constants(graph)
    assert [n.op for n in graph.outputs] == [Op.FULL, Op.FULL]
    want = torch.exp(torch.tensor(1.0 / 3.0).to(torch.bfloat16))
    assert graph.outputs[0].attrs["value"] == want.item()
    assert graph.outputs[1].attrs["value"] == -2


def test_views_of_constants_are_constants_and_where_picks_its_branch():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((3, 2), torch.float32)
    y = graph.add_input((3, 2), torch.float32)
    ones = _full(graph, 1.5, torch.float32, (2, 1))
    expanded = graph.add(Op.EXPAND, (ones,), shape=(2, 3))
    permuted = graph.add(Op.PERMUTE, (expanded,), perm=(1, 0))
    padded = graph.add(Op.PAD, (_full(graph, 0.0, torch.float32, (1, 2)),),
                       pads=((1, 1, 0), (0, 0, 0)), value=0.0)
    picked = graph.add(Op.WHERE, (_full(graph, False, torch.bool, (3, 2)), x, y))
    graph.outputs = [permuted, padded, picked]
    fold_constants(graph)
    assert [(n.op, n.shape) for n in graph.outputs[:2]] == [(Op.FULL, (3, 2)), (Op.FULL, (3, 2))]
    assert graph.outputs[0].attrs["value"] == 1.5
    assert graph.outputs[2] is y
    verify(graph)


def test_nodes_that_read_inputs_are_left_alone():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((2,), torch.float32)
    node = graph.add(Op.ADD, (x, _full(graph, 0.0, torch.float32, (2,))))
    graph.outputs = [node]
    assert fold_constants(graph) == 0
    assert graph.outputs == [node]
