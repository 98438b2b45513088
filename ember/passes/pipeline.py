"""The graph passes, in the order they run. Each is `pass(graph) -> changes made`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ember import logs
from ember.ir.graph import Graph
from ember.ir.verifier import verify
from ember.passes.convolution_bias import convolution_biases
from ember.passes.convolution_depthwise import depthwise_convolutions
from ember.passes.convolution_layout import channels_last_convolutions
from ember.passes.convolution_matmul import convolutions_as_matmuls
from ember.passes.cse import eliminate_common_subexpressions
from ember.passes.dce import eliminate_dead_code
from ember.passes.fold_constants import fold_constants
from ember.passes.joined_cats import joined_cats
from ember.passes.matmul_operands import (
    aligned_matmuls,
    matmuls_onto_sums,
    transposed_weights,
    whole_biased_matmuls,
)
from ember.passes.max_pool import pooled_maxima
from ember.passes.simplify import simplify_algebra

Pass = Callable[[Graph], int]

PASSES: tuple[Pass, ...] = (
    fold_constants,
    simplify_algebra,
    convolution_biases,
    whole_biased_matmuls,
    matmuls_onto_sums,
    transposed_weights,
    aligned_matmuls,
    depthwise_convolutions,
    channels_last_convolutions,
    convolutions_as_matmuls,
    pooled_maxima,
    joined_cats,
    eliminate_common_subexpressions,
    eliminate_dead_code,
)

# Passes for a graph that is not differentiated after them (an inference graph, a backward,
# a training graph's forward once split): merged subexpressions would scale a sum of
# cotangents, and autodiff knows convolution, not the product that replaces it. A training
# graph's forward takes them after the split (`after_differentiation`).
AFTER_DIFFERENTIATION: tuple[Pass, ...] = (depthwise_convolutions, convolutions_as_matmuls,
                                           pooled_maxima, joined_cats,
                                           eliminate_common_subexpressions)


# Passes a CPU graph about to be differentiated skips. Channels-last convolutions in a
# training step (2026-12-07, interleaved, ember against eager, switched / kept row-major):
# ReXNet-100 1.79x / 0.81x, ResNeXt-26ts 1.31x / 1.00x, DenseNet-121 1.14x / 0.96x,
# Xception-41 1.28x / 1.16x, InceptionNeXt 1.13x / 1.06x; the zoo's MobileNetV3 0.69x /
# 0.75x, EfficientNet-B0 0.76x / 0.71x, ResNet-50 0.69x / 0.71x (oneDNN's channels-last
# weight and input gradients, and the copies around them, cost more than the forward
# gains). Inference keeps the switch (EfficientNet-B0 0.44x eager against 0.90x).
CPU_INFERENCE_ONLY: tuple[Pass, ...] = (channels_last_convolutions,)


def run_passes(graph: Graph, dump: Path | None = None, check: bool = False,
               merge: bool = True) -> Graph:
    """Run every pass once, in order; dump the IR after each into `dump`. `merge=False` keeps
    equal subexpressions apart: a graph about to be differentiated, whose duplicates must each
    take their own cotangent as eager's autograd gives them (a merged value would scale the
    sum of the cotangents instead: inf·g0 + inf·g1 is not (g0 + g1)·inf); its forward is
    merged after the split."""
    for number, graph_pass in enumerate(PASSES, start=1):
        if graph_pass in AFTER_DIFFERENTIATION and not merge:
            continue
        if graph_pass in CPU_INFERENCE_ONLY and not merge and graph.device.type == "cpu":
            continue
        changes = graph_pass(graph)
        if check:
            verify(graph)
        heading = f"# {graph_pass.__name__}: {changes} changes\n"
        logs.dump(dump, f"ir_{number:02d}_{graph_pass.__name__}.txt",
                  lambda heading=heading: f"{heading}{graph}\n")  # (called at once)
    if logs.enabled("ir"):
        logs.channel("ir").info("IR after passes:\n%s", graph)
    return graph


def after_differentiation(forward: Graph) -> int:
    """The passes a training graph's forward skipped before its split; changes made."""
    return sum(graph_pass(forward) for graph_pass in AFTER_DIFFERENTIATION)
