"""ember.ir.interpreter: running the lowered IR with eager ops gives eager's results (it is
the oracle the other tests lean on, so it is checked against eager itself)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close

from ember.ir import Graph, Op
from ember.ir.interpreter import interpret
from ember.lower import trace
from ember.passes.pipeline import run_passes


def _interpret(fn, *args, passes=False):
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    graph = run_passes(lowered.graph, check=True) if passes else lowered.graph
    inputs = [a.clone() for a in args] + list(lowered.constants)
    outputs, written = interpret(graph, inputs)
    assert all(spec.kind == "node" for spec in lowered.outputs)
    return outputs, dict(zip((i for i, _ in graph.writebacks), written))


CASES = {
    "softmax": (lambda x: F.softmax(x, -1), (torch.randn(4, 7),)),
    "layer_norm": (lambda x, w: F.layer_norm(x, (6,), w), (torch.randn(3, 6), torch.randn(6))),
    "argmax_any": (lambda x: (x.argmax(1, keepdim=True), (x > 0).any(0)),
                   (torch.tensor([[1.0, 3.0, 3.0], [float("nan"), 0.0, 2.0]]),)),
    "views": (lambda x: x.t()[1:, ::2].reshape(-1) * 2, (torch.randn(5, 4),)),
    "pad_cat_flip": (lambda x: torch.cat([F.pad(x, (1, 2)), x.flip(0)], 1),
                     (torch.randn(2, 3),)),
    "gather_index": (lambda x, i: (torch.gather(x, 1, i), x[i[:, 0]]),
                     (torch.randn(3, 4), torch.tensor([[0, 3], [1, 1], [-1, 2]]).abs())),
    "casts": (lambda x: (x.to(torch.float16) * 3).to(torch.int32) // 2,
              (torch.randn(8) * 10,)),
    "library": (lambda x, w: torch.relu(x @ w).sum(0), (torch.randn(3, 5), torch.randn(5, 2))),
    "integer_math": (lambda x: (x << 2) ^ (x >> 1) % 5, (torch.arange(-6, 6),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("passes", [False, True])
def test_interpreting_the_ir_gives_eagers_results(name, passes):
    fn, args = CASES[name]
    outputs, _ = _interpret(fn, *args, passes=passes)
    expected = fn(*args)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    assert_close(outputs, expected)


def test_writebacks_hold_the_mutated_inputs():
    def fn(x, y):
        x[:, 1:].mul_(2)
        y.t()[0].add_(1)
        return x.sum()

    args = (torch.randn(3, 4), torch.randn(2, 3))
    outputs, written = _interpret(fn, *args)
    eager = [a.clone() for a in args]
    expected = fn(*eager)
    assert_close(outputs, [expected])
    assert sorted(written) == [0, 1]
    assert_close([written[0], written[1]], eager)


def test_a_hand_built_graph_with_every_leaf():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((2, 3), torch.float32)
    iota = graph.add(Op.IOTA, (), shape=(2, 3), dim=1, start=5, step=-2, dtype=torch.float32)
    full = graph.add(Op.FULL, (), value=0.25, shape=(2, 3), dtype=torch.float32)
    total = graph.add(Op.ADD, (graph.add(Op.MUL, (x, iota)), full))
    strided = graph.add(Op.AS_STRIDED, (total,), shape=(3, 2), strides=(1, 3), offset=0)
    graph.outputs = [strided]
    value = torch.randn(2, 3)
    (got,), _ = interpret(graph, [value])
    want = (value * torch.tensor([5.0, 3.0, 1.0]) + 0.25).as_strided((3, 2), (1, 3))
    assert_close(got, want)
