"""ember.ir.shape_rules: well-formed nodes get eager's shape and dtype; ill-formed ones are
refused when they are built (Graph.add), never later."""

import pytest
import torch

from ember.ir import Graph, IRError, Op


def _graph():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((2, 3), torch.float32)
    i = graph.add_input((2, 3), torch.int64)
    b = graph.add_input((2, 3), torch.bool)
    return graph, x, i, b


@pytest.mark.parametrize("build, message", [
    (lambda g, x, i, b: g.add(Op.ADD, (x, g.add_input((3, 2), torch.float32))), "shapes differ"),
    (lambda g, x, i, b: g.add(Op.ADD, (x, i)), "dtypes differ"),
    (lambda g, x, i, b: g.add(Op.ADD, (x,)), "takes 2 inputs"),
    (lambda g, x, i, b: g.add(Op.EXP, (i,)), "needs a floating input"),
    (lambda g, x, i, b: g.add(Op.ATAN2, (i, i)), "needs floating inputs"),
    (lambda g, x, i, b: g.add(Op.BITWISE_NOT, (x,)), "needs integers"),
    (lambda g, x, i, b: g.add(Op.LOGICAL_NOT, (i,)), "needs a bool input"),
    (lambda g, x, i, b: g.add(Op.WHERE, (i, x, x)), "condition must be bool"),
    (lambda g, x, i, b: g.add(Op.WHERE, (b, x, g.add_input((2, 3), torch.float64))),
     "branch dtypes differ"),
    (lambda g, x, i, b: g.add(Op.SUM, (x,), axes=(1, 0)), "sorted and unique"),
    (lambda g, x, i, b: g.add(Op.SUM, (x,), axes=(2,)), "out of range"),
    (lambda g, x, i, b: g.add(Op.ARGMAX, (x,), axes=(0, 1)), "exactly one axis"),
    (lambda g, x, i, b: g.add(Op.ANY, (x,), axes=(0,)), "needs a bool input"),
    (lambda g, x, i, b: g.add(Op.MAX, (g.add_input((0, 3), torch.float32),), axes=(0,)),
     "no identity"),
    (lambda g, x, i, b: g.add(Op.RESHAPE, (x,), shape=(7,)), "changes the size"),
    (lambda g, x, i, b: g.add(Op.PERMUTE, (x,), perm=(0, 0)), "not a permutation"),
    (lambda g, x, i, b: g.add(Op.EXPAND, (x,), shape=(4, 3)), "only size-1 dims grow"),
    (lambda g, x, i, b: g.add(Op.EXPAND, (x,), shape=(1, 2, 3)), "keeps the rank"),
    (lambda g, x, i, b: g.add(Op.SLICE, (x,), dim=1, start=2, stop=1, step=1), "bad bounds"),
    (lambda g, x, i, b: g.add(Op.SLICE, (x,), dim=1, start=0, stop=4, step=1), "bad bounds"),
    (lambda g, x, i, b: g.add(Op.SLICE, (x,), dim=0, start=0, stop=2, step=0), "bad bounds"),
    (lambda g, x, i, b: g.add(Op.SQUEEZE, (x,), dims=(0,)), "must be size 1"),
    (lambda g, x, i, b: g.add(Op.UNSQUEEZE, (x,), dim=3), "out of range"),
    (lambda g, x, i, b: g.add(Op.AS_STRIDED, (x,), shape=(2, 2), strides=(3, 1), offset=3),
     "reaches element"),
    (lambda g, x, i, b: g.add(Op.PAD, (x,), pads=((0, 0, 0),), value=0.0), r"one \(low, high"),
    (lambda g, x, i, b: g.add(Op.PAD, (x,), pads=((0, 0, 0), (-1, 0, 0)), value=0.0),
     "must be >= 0"),
    (lambda g, x, i, b: g.add(Op.CAT, (x, i), dim=0), "ranks and dtypes"),
    (lambda g, x, i, b: g.add(Op.CAT, (x, g.add_input((2, 4), torch.float32)), dim=0),
     "sizes differ"),
    (lambda g, x, i, b: g.add(Op.TAKE, (x, x), dim=0, wrap=False), "int32 or int64"),
    (lambda g, x, i, b: g.add(Op.GATHER, (x, g.add_input((3,), torch.int64)), dim=0),
     "ranks must agree"),
    (lambda g, x, i, b: g.add(Op.GATHER, (x, g.add_input((2, 4), torch.int64)), dim=0),
     "larger than input"),
    (lambda g, x, i, b: g.add(Op.INPUT, (x,), index=0, shape=(1,), dtype=torch.float32),
     "take no inputs"),
    (lambda g, x, i, b: g.add(Op.FULL, (), value=0.0, shape=(-1,), dtype=torch.float32),
     "bad shape"),
    (lambda g, x, i, b: g.add(Op.ITEM, (x,), index=0), "item of a non-tuple"),
])
def test_ill_formed_nodes_are_refused(build, message):
    graph, x, i, b = _graph()
    count = len(graph.nodes)
    with pytest.raises(IRError, match=message):
        build(graph, x, i, b)
    assert all(node.op is Op.INPUT for node in graph.nodes[count:])  # nothing half-built


def test_shapes_and_dtypes_of_well_formed_nodes():
    graph, x, i, b = _graph()
    cases = [
        (graph.add(Op.LT, (x, x)), (2, 3), torch.bool),
        (graph.add(Op.ISNAN, (x,)), (2, 3), torch.bool),
        (graph.add(Op.CAST, (x,), dtype=torch.float16), (2, 3), torch.float16),
        (graph.add(Op.SUM, (x,), axes=(1,)), (2, 1), torch.float32),
        (graph.add(Op.SUM, (x,), axes=()), (2, 3), torch.float32),
        (graph.add(Op.ARGMIN, (x,), axes=(0,)), (1, 3), torch.int64),
        (graph.add(Op.ALL, (b,), axes=(0, 1)), (1, 1), torch.bool),
        (graph.add(Op.PERMUTE, (x,), perm=(1, 0)), (3, 2), torch.float32),
        (graph.add(Op.SLICE, (x,), dim=1, start=0, stop=3, step=2), (2, 2), torch.float32),
        (graph.add(Op.SLICE, (x,), dim=1, start=3, stop=3, step=2), (2, 0), torch.float32),
        (graph.add(Op.UNSQUEEZE, (x,), dim=2), (2, 3, 1), torch.float32),
        (graph.add(Op.PAD, (x,), pads=((1, 0, 0), (0, 2, 1)), value=0.0), (3, 7),
         torch.float32),
        (graph.add(Op.CAT, (x, x, x), dim=1), (2, 9), torch.float32),
        (graph.add(Op.TAKE, (x, graph.add_input((4, 5), torch.int32)), dim=1, wrap=True),
         (2, 4, 5), torch.float32),
        (graph.add(Op.AS_STRIDED, (x,), shape=(3, 2), strides=(1, 3), offset=0), (3, 2),
         torch.float32),
        (graph.add(Op.IOTA, (), shape=(4, 2), dim=0, start=1, step=2, dtype=torch.int32),
         (4, 2), torch.int32),
    ]
    for node, shape, dtype in cases:
        assert (node.shape, node.dtype) == (shape, dtype), node.op
    # and each agrees with eager on real tensors of those shapes
    real = torch.zeros(2, 3)
    assert tuple(real[:, 0:3:2].shape) == (2, 2)
    assert tuple(torch.cat([real] * 3, 1).shape) == (2, 9)


def test_library_nodes_take_their_types_from_eager_results():
    graph, x, i, b = _graph()
    single = graph.add(Op.LIBRARY, (x,), target=torch.ops.aten.mm.default, args=(), kwargs={},
                       results=(((2, 2), torch.float64, (2, 1)),), tuple_result=False)
    assert (single.shape, single.dtype) == ((2, 2), torch.float64)
    pair = graph.add(Op.LIBRARY, (x,), target=torch.ops.aten.sort.default, args=(), kwargs={},
                     results=(((2, 3), torch.float32, (3, 1)), ((2, 3), torch.int64, (3, 1))),
                     tuple_result=True)
    second = graph.add(Op.ITEM, (pair,), index=1)
    assert (second.shape, second.dtype) == ((2, 3), torch.int64)
