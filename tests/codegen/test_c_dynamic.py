"""C kernels over symbolic sizes (issue 18, stage 2): the text of one (golden), the size
parameters and OpenMP's run-time `if`."""

import os
from pathlib import Path

import torch
from helpers import compile_ir

import ember
from ember import config
from ember.codegen.c import write_source
from ember.ir.graph import Graph
from ember.ir.ops import Op
from ember.ir.sizes import symbol
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
    # (OpenMP's run-time switch, the work depending on s0; on the parallel construct only:
    # a plain `if` on `parallel for simd` would also turn the loop's SIMD off when false)
    switches = [line for line in text.splitlines() if "#pragma" in line and "if(" in line]
    assert switches and all("if(parallel: " in line for line in switches)


def test_a_symbolic_extent_that_may_be_empty_is_skipped_per_call():
    # rows 2.. of x[s0, 4]: s0 - 2 rows, none when s0 is 2 (a graph built by hand: slices
    # with symbolic bounds come from the lowering in stage 3)
    graph = Graph(torch.device("cpu"))
    s0 = symbol("s0")
    x = graph.add_input((s0, 4), torch.float32, (4, 1))
    graph.symbols["s0"] = (0, 0)
    rows = graph.add(Op.SLICE, (x,), dim=0, start=2, stop=s0, step=1)
    graph.outputs.append(graph.add(Op.EXP, (rows,)))
    call = compile_ir(graph)
    for count in (2, 3, 7):
        x = torch.randn(count, 4)
        (out,) = call([x])
        torch.testing.assert_close(out, x[2:].exp())


def test_a_symbolic_float_sum_adds_in_float_blocks_and_keeps_eager_s_values():
    # (the rows' length symbolic: dim 0 of x.t(); a double accumulator throughout halved the
    # vector loop's lanes, a float one would lose eager's accuracy on long rows)
    def fn(x):
        return x.t().exp().sum(-1)

    _, kernels = symbolic_kernels(fn, torch.randn(7, 3))
    text = "\n".join(k.text for k in kernels)
    assert "_block = 0;" in text and "+= 1024)" in text
    compiled = ember.compile(fn)
    for n in (5, 1023, 1024, 1025, 3000, 9000):
        x = torch.randn(n, 3) * 3
        ember.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), fn(x), rtol=2e-6, atol=0)
