"""ember.passes.pipeline: every pass runs once, in order, and each one's IR is dumped."""

import torch

from ember.ir import Graph, Op
from ember.passes.pipeline import PASSES, run_passes


def test_passes_run_in_order_and_dump_their_ir(tmp_path):
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((2,), torch.float32)
    one = graph.add(Op.FULL, (), value=1.0, shape=(2,), dtype=torch.float32)
    two = graph.add(Op.ADD, (one, one))                 # folded
    scaled = graph.add(Op.MUL, (x, graph.add(Op.DIV, (two, two))))  # x * 1 after folding
    graph.add(Op.EXP, (x,))                            # dead
    graph.outputs = [graph.add(Op.ADD, (scaled, graph.add(Op.NEG, (graph.add(Op.NEG, (x,)),))))]
    run_passes(graph, tmp_path, check=True)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"ir_{i:02d}_{p.__name__}.txt" for i, p in enumerate(PASSES, start=1)]
    assert [p.__name__ for p in PASSES] == ["fold_constants", "simplify_algebra",
                                            "convolution_biases", "whole_biased_matmuls",
                                            "matmuls_onto_sums", "transposed_weights",
                                            "aligned_matmuls", "depthwise_convolutions",
                                            "channels_last_convolutions",
                                            "convolutions_as_matmuls", "pooled_maxima",
                                            "joined_cats", "eliminate_common_subexpressions",
                                            "eliminate_dead_code"]
    assert str(graph) == """\
graph(%0: f32[2]) {
  %8 = add(%0, %0) : f32[2]
  return (%8)
}"""
    assert (tmp_path / "ir_14_eliminate_dead_code.txt").read_text().startswith(
        "# eliminate_dead_code: ")


def test_a_linear_layer_calls_linear_not_mm_of_a_transposed_view():
    from helpers import check

    graph = check(lambda x, w, b: torch.nn.functional.linear(x, w, b).relu(),
                  torch.randn(4, 8), torch.randn(3, 8), torch.randn(3), kernels=1)
    assert "op0(in0, in1)" in graph.wrapper_source and "as_strided" not in graph.wrapper_source


def test_a_half_precision_linear_layer_with_bias_calls_linear():
    # in bfloat16 the bias is added inside the library call (addmm with w.T): rewritten as
    # linear(x, w, b), which eager's linear runs as that same addmm
    from helpers import check

    args = [torch.randn(4, 8).bfloat16(), torch.randn(3, 8).bfloat16(),
            torch.randn(3).bfloat16()]
    graph = check(lambda x, w, b: torch.nn.functional.linear(x, w, b), *args)
    assert "op0(in0, in1, in2)" in graph.wrapper_source and \
        "as_strided" not in graph.wrapper_source
