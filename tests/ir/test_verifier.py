"""ember.ir.verifier: well-formed graphs pass; each kind of breakage is named."""

import pytest
import torch

from ember.ir import Graph, IRError, Op
from ember.ir.verifier import verify


def _graph():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((3,), torch.float32)
    y = graph.add(Op.EXP, (x,))
    z = graph.add(Op.ADD, (y, x))
    graph.outputs = [z]
    return graph, x, y, z


def test_a_well_formed_graph_verifies():
    graph, x, y, z = _graph()
    graph.writebacks = [(0, y)]
    verify(graph)


def test_use_before_definition_is_caught():
    graph, x, y, z = _graph()
    graph.nodes = [x, z, y]
    with pytest.raises(IRError, match=r"%2 \(add\) uses %1 before it is defined"):
        verify(graph)


def test_a_wrong_type_is_caught():
    graph, x, y, z = _graph()
    y.dtype = torch.float64  # what a buggy pass might do: retype a node in place
    with pytest.raises(IRError, match=r"%1 \(exp\) says torch.float64\[3\] but its rule gives "
                                      r"torch.float32\[3\]"):
        verify(graph)


def test_a_node_the_rules_refuse_is_caught():
    graph, x, y, z = _graph()
    z.inputs = (y, graph.add_input((4,), torch.float32))
    graph.nodes.remove(graph.inputs[-1])
    graph.nodes.insert(0, graph.inputs[-1])
    with pytest.raises(IRError, match="shapes differ"):
        verify(graph)


def test_inputs_roots_and_writebacks_are_checked():
    graph, x, y, z = _graph()
    graph.inputs = [y]
    with pytest.raises(IRError, match="graph input 0 is %1"):
        verify(graph)

    graph, x, y, z = _graph()
    stray = Graph(torch.device("cpu")).add_input((3,), torch.float32)
    graph.outputs = [stray]
    with pytest.raises(IRError, match="is not a node of the graph"):
        verify(graph)

    graph, x, y, z = _graph()
    graph.writebacks = [(0, graph.add(Op.CAST, (y,), dtype=torch.float64))]
    with pytest.raises(IRError, match="writeback of %3 into input 0 changes its type"):
        verify(graph)
