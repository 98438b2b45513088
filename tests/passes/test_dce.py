"""ember.passes.dce: unused nodes go, except library calls that draw random numbers."""

import torch

from ember.ir import Graph, Op
from ember.ir.library import Slot
from ember.passes.dce import eliminate_dead_code


def _library(graph, target, x):
    return graph.add(Op.LIBRARY, (x,), target=target, args=(Slot(0),), kwargs={},
                     results=(((3,), torch.float32, (1,)),), tuple_result=False)


def test_unused_nodes_go_and_random_draws_stay():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((3,), torch.float32)
    unused_input = graph.add_input((3,), torch.float32)
    dead = graph.add(Op.EXP, (x,))
    dead_library = _library(graph, torch.ops.aten.cumsum.default, dead)
    noise = _library(graph, torch.ops.aten.rand_like.default, graph.add(Op.NEG, (x,)))
    kept = graph.add(Op.SIN, (x,))
    written = graph.add(Op.COS, (x,))
    graph.outputs = [kept]
    graph.writebacks = [(1, written)]
    assert eliminate_dead_code(graph) == 2
    assert dead not in graph.nodes and dead_library not in graph.nodes
    assert noise in graph.nodes and noise.inputs[0] in graph.nodes  # its operand stays too
    assert {kept, written, unused_input} <= set(graph.nodes)
    assert [n.op for n in graph.nodes] == [Op.INPUT, Op.INPUT, Op.NEG, Op.LIBRARY, Op.SIN,
                                           Op.COS]
