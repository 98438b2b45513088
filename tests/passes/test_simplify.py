"""ember.passes.simplify: only rewrites that keep every bit (NaN, inf and signed zeros)."""

import torch

from ember.ir import Graph, Op
from ember.ir.interpreter import interpret
from ember.passes.simplify import simplify_algebra


def _setup(dtype=torch.float32, shape=(4,)):
    graph = Graph(torch.device("cpu"))
    x = graph.add_input(shape, dtype)
    return graph, x


def _full(graph, value, dtype=torch.float32, shape=(4,)):
    return graph.add(Op.FULL, (), value=value, shape=shape, dtype=dtype)


def test_exact_identities_are_removed():
    graph, x = _setup()
    graph.outputs = [graph.add(Op.MUL, (x, _full(graph, 1.0))),
                     graph.add(Op.MUL, (_full(graph, 1.0), x)),
                     graph.add(Op.DIV, (x, _full(graph, 1.0))),
                     graph.add(Op.SUB, (x, _full(graph, 0.0))),
                     graph.add(Op.NEG, (graph.add(Op.NEG, (x,)),)),
                     graph.add(Op.CAST, (graph.add(Op.CAST, (x,), dtype=torch.float64),),
                               dtype=torch.float32)]
    assert simplify_algebra(graph) == 6
    assert all(node is x for node in graph.outputs)


def test_rewrites_that_would_change_bits_are_not_made():
    graph, x = _setup()
    plus_zero = graph.add(Op.ADD, (x, _full(graph, 0.0)))           # -0.0 + 0.0 is 0.0
    minus_negative_zero = graph.add(Op.SUB, (x, _full(graph, -0.0)))  # -0.0 - -0.0 is 0.0
    times_zero = graph.add(Op.MUL, (x, _full(graph, 0.0)))           # NaN * 0 is NaN
    through_half = graph.add(Op.CAST, (graph.add(Op.CAST, (x,), dtype=torch.float16),),
                             dtype=torch.float32)                     # rounds to half
    graph.outputs = [plus_zero, minus_negative_zero, times_zero, through_half]
    assert simplify_algebra(graph) == 0
    assert graph.outputs == [plus_zero, minus_negative_zero, times_zero, through_half]
    value = torch.tensor([-0.0, float("nan"), 1e-8, 3.0])
    results, _ = interpret(graph, [value])
    assert [torch.signbit(r[0]).item() for r in results[:2]] == [False, False]
    assert torch.isnan(results[2][1])
    assert results[3][2].item() != value[2].item()


def test_integer_round_trips_and_view_chains():
    graph, x = _setup(torch.int32, (2, 3))
    wide = graph.add(Op.CAST, (graph.add(Op.CAST, (x,), dtype=torch.int64),), dtype=torch.int32)
    narrow = graph.add(Op.CAST, (graph.add(Op.CAST, (x,), dtype=torch.int8),), dtype=torch.int32)
    transposed_twice = graph.add(Op.PERMUTE, (graph.add(Op.PERMUTE, (x,), perm=(1, 0)),),
                                 perm=(1, 0))
    reshaped_back = graph.add(Op.RESHAPE, (graph.add(Op.RESHAPE, (x,), shape=(6,)),),
                              shape=(2, 3))
    flattened_twice = graph.add(Op.RESHAPE, (graph.add(Op.RESHAPE, (x,), shape=(3, 2)),),
                                shape=(6,))
    graph.outputs = [wide, narrow, transposed_twice, reshaped_back, flattened_twice]
    simplify_algebra(graph)
    assert graph.outputs[0] is x
    assert graph.outputs[1] is narrow  # int8 does not hold every int32
    assert graph.outputs[2] is x and graph.outputs[3] is x
    flat = graph.outputs[4]
    assert flat.op is Op.RESHAPE and flat.inputs == (x,) and flat.shape == (6,)
    value = torch.arange(6, dtype=torch.int32).reshape(2, 3) * 100
    results, _ = interpret(graph, [value])
    assert results[1].tolist() == value.to(torch.int8).to(torch.int32).tolist()
    assert results[4].tolist() == value.reshape(6).tolist()
