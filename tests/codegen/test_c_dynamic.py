"""C kernels over symbolic sizes (issue 18, stage 2): the text of one (golden), the size
parameters and OpenMP's run-time `if`."""

import os
from pathlib import Path

import torch

import ember
from ember import config
from ember.codegen.c import write_source
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str) -> None:  # (as test_c.py's: EMBER_UPDATE_GOLDEN=1)
    path = GOLDEN / name
    if os.environ.get("EMBER_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; EMBER_UPDATE_GOLDEN=1 rewrites it"


def symbolic_graph(fn, *args):
    """fn's FX graph as ember captures it with dim 0 of the first argument a symbol, and its
    example inputs."""
    found = []

    def keep(gm, example_inputs):
        found.append((gm, example_inputs))
        return gm.forward

    keep.serves_any_shape = True
    ember.mark_dynamic(args[0], 0)
    ember.compile(fn, backend=keep)(*args)
    return found[0]


def symbolic_kernels(fn, *args):
    gm, example_inputs = symbolic_graph(fn, *args)
    with config.override(parallel_threshold=32768):
        lowered = trace(gm, example_inputs, symbolic=True)
        plan = schedule(run_passes(lowered.graph))
        _, kernels = write_source(plan)
    return lowered.graph, kernels


def test_dynamic_pointwise_kernel_text_is_golden():
    graph, kernels = symbolic_kernels(lambda x, y: torch.sigmoid(x * y + 1.5),
                                      torch.randn(4, 6), torch.randn(6))
    assert graph.symbols == {"s0": (0, 0)}
    assert "f32[s0,6]" in str(graph)
    assert_golden("pointwise_dynamic.c", "\n\n".join(k.text for k in kernels) + "\n")
    assert [k.sizes for k in kernels] == [["s0"]]


def test_a_symbolic_reduction_takes_its_size_and_decides_parallelism_per_call():
    _, kernels = symbolic_kernels(lambda x: x.softmax(-1).sum(0), torch.randn(5, 12))
    text = "\n".join(k.text for k in kernels)
    assert "int64_t s0)" in text and "< s0;" in text
    assert "if(" in text  # (OpenMP's run-time switch: the work depends on s0)
