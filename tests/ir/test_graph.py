"""ember.ir.graph: nodes, use redirection, liveness and topological order."""

import torch

from ember.ir import Graph, Kind, Op
from ember.ir.graph import topological


def _chain():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((2, 3), torch.float32)
    a = graph.add(Op.NEG, (x,))
    b = graph.add(Op.EXP, (a,))
    c = graph.add(Op.ADD, (b, a))
    dead = graph.add(Op.SIN, (x,))
    graph.outputs = [c]
    return graph, x, a, b, c, dead


def test_nodes_know_their_kind_size_and_rank():
    graph, x, a, b, c, dead = _chain()
    assert (x.kind, a.kind) == (Kind.LEAF, Kind.POINTWISE)
    assert (c.numel, c.ndim, repr(c)) == (6, 2, "%3")
    total = graph.add(Op.SUM, (c,), axes=(0, 1))
    assert total.kind is Kind.REDUCTION and total.shape == (1, 1)


def test_replace_uses_follows_chains_and_reaches_roots():
    graph, x, a, b, c, dead = _chain()
    other = graph.add(Op.ABS, (x,))
    third = graph.add(Op.COS, (x,))
    graph.writebacks = [(0, a)]
    graph.replace_uses({a: other, other: third})
    assert c.inputs == (b, third) and b.inputs == (third,)
    assert graph.writebacks == [(0, third)]
    graph.replace_uses({c: dead})
    assert graph.outputs == [dead]


def test_live_nodes_and_users():
    graph, x, a, b, c, dead = _chain()
    assert graph.live_nodes() == [x, a, b, c]
    users = graph.users()
    assert users[a] == [b, c] and users[dead] == [] and users[x] == [a, dead]
    graph.writebacks = [(0, dead)]
    assert graph.roots() == [c, dead]
    assert dead in graph.live_nodes()


def test_topological_puts_inputs_first_and_keeps_existing_order():
    graph, x, a, b, c, dead = _chain()
    assert topological([c]) == [x, a, b, c]
    assert topological([c, dead]) == [x, a, b, c, dead]
    assert topological(list(reversed(graph.nodes))) == [x, dead, a, b, c]
