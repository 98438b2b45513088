"""ember.passes.cse: one node per distinct computation, never merging what differs in bits
(0.0 and -0.0) or what draws random numbers."""

import torch

from ember.ir import Graph, Op
from ember.ir.library import Slot
from ember.passes.cse import eliminate_common_subexpressions


def _full(graph, value, dtype=torch.float32):
    return graph.add(Op.FULL, (), value=value, shape=(3,), dtype=dtype)


def test_equal_computations_merge():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((3,), torch.float32)
    a, b = graph.add(Op.EXP, (x,)), graph.add(Op.EXP, (x,))
    c, d = graph.add(Op.ADD, (a, x)), graph.add(Op.ADD, (b, x))
    e = graph.add(Op.ADD, (x, a))  # operands in another order: a different node
    graph.outputs = [c, d, e]
    assert eliminate_common_subexpressions(graph) == 2
    assert graph.outputs[0] is graph.outputs[1] is c and graph.outputs[2] is e
    assert e.inputs == (x, a)


def test_zero_and_negative_zero_stay_apart_and_nans_merge():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((3,), torch.float32)
    plus, minus = _full(graph, 0.0), _full(graph, -0.0)
    nan1, nan2 = _full(graph, float("nan")), _full(graph, float("nan"))
    graph.outputs = [graph.add(Op.MUL, (x, plus)), graph.add(Op.MUL, (x, minus)),
                     graph.add(Op.ADD, (x, nan1)), graph.add(Op.ADD, (x, nan2))]
    eliminate_common_subexpressions(graph)
    first, second, third, fourth = graph.outputs
    assert first is not second
    signs = [repr(s.attrs["value"]) for s in (first.inputs[1], second.inputs[1])]
    assert signs == ["0.0", "-0.0"]
    assert third is fourth


def test_attributes_and_dtypes_distinguish_nodes():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((2, 3), torch.float32)
    graph.outputs = [graph.add(Op.SUM, (x,), axes=(0,)), graph.add(Op.SUM, (x,), axes=(1,)),
                     graph.add(Op.CAST, (x,), dtype=torch.float16),
                     graph.add(Op.CAST, (x,), dtype=torch.bfloat16),
                     graph.add(Op.FULL, (), value=1, shape=(2,), dtype=torch.int32),
                     graph.add(Op.FULL, (), value=1, shape=(2,), dtype=torch.int64),
                     graph.add(Op.FULL, (), value=True, shape=(2,), dtype=torch.bool)]
    assert eliminate_common_subexpressions(graph) == 0
    assert len(set(graph.outputs)) == 7


def test_library_calls_are_never_merged():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((3,), torch.float32)

    def draw():
        return graph.add(Op.LIBRARY, (x,), target=torch.ops.aten.rand_like.default,
                         args=(Slot(0),), kwargs={}, results=(((3,), torch.float32, (1,)),),
                         tuple_result=False)

    first, second = draw(), draw()
    graph.outputs = [first, second]
    assert eliminate_common_subexpressions(graph) == 0
    assert graph.outputs == [first, second]
