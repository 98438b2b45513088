"""ember.ir.printer: the text form of a graph, in the grammar of ember/ir/graph.py (golden)."""

import torch

from ember.ir import Graph, Op
from ember.ir.library import Slot
from ember.ir.printer import format_graph


def test_a_small_graph_prints_as_its_golden_text():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((4, 8), torch.float32)
    w = graph.add_input((8, 2), torch.bfloat16)
    half = graph.add(Op.FULL, (), value=0.5, shape=(4, 8), dtype=torch.float32)
    scaled = graph.add(Op.MUL, (x, half))
    total = graph.add(Op.SUM, (scaled,), axes=(1,))
    row = graph.add(Op.SQUEEZE, (total,), dims=(1,))
    cast = graph.add(Op.CAST, (x,), dtype=torch.bfloat16)
    product = graph.add(Op.LIBRARY, (cast, w), target=torch.ops.aten.mm.default,
                        args=(Slot(0), Slot(1)), kwargs={},
                        results=(((4, 2), torch.bfloat16, (2, 1)),), tuple_result=False)
    graph.outputs = [row, product]
    graph.writebacks = [(0, scaled)]
    assert format_graph(graph) == """\
graph(%0: f32[4,8], %1: bf16[8,2]) {
  %2 = full() value=0.5 : f32[4,8]
  %3 = mul(%0, %2) : f32[4,8]
  %4 = sum(%3) axes=(1,) : f32[4,1]
  %5 = squeeze(%4) dims=(1,) : f32[4]
  %6 = cast(%0) : bf16[4,8]
  %7 = library(%6, %1) mm.default($0, $1) : bf16[4,2]
  write %3 -> input 0
  return (%5, %7)
}"""
    assert str(graph) == format_graph(graph)


def test_tuple_results_zero_dims_and_special_floats_print():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((), torch.float64)
    inf = graph.add(Op.FULL, (), value=float("-inf"), shape=(), dtype=torch.float64)
    zero = graph.add(Op.FULL, (), value=-0.0, shape=(), dtype=torch.float64)
    low = graph.add(Op.MAXIMUM, (x, inf))
    pair = graph.add(Op.LIBRARY, (low,), target=torch.ops.aten.frexp.Tensor, args=(Slot(0),),
                     kwargs={}, results=(((), torch.float64, ()), ((), torch.int32, ())),
                     tuple_result=True)
    exponent = graph.add(Op.ITEM, (pair,), index=1)
    graph.outputs = [exponent, zero]
    assert format_graph(graph) == """\
graph(%0: f64[]) {
  %1 = full() value=-inf : f64[]
  %2 = full() value=-0.0 : f64[]
  %3 = maximum(%0, %1) : f64[]
  %4 = library(%3) frexp.Tensor($0) : (f64[], i32[])
  %5 = item(%4) index=1 : i32[]
  return (%5, %2)
}"""
