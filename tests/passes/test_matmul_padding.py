"""aligned_matmuls: a half-precision matmul with a size that is not a multiple of 16 bytes is
called on zero-padded operands and its result sliced, with eager's values, strides and
gradients. On by default on CUDA only; here forced on (EMBER_SHAPE_PADDING=always) with the
size threshold lowered so that small tensors take the path."""

import pytest
import torch
from helpers import check, check_grad

from ember import config
from ember.ir import Graph, Op
from ember.ir.library import Slot
from ember.passes import matmul_operands, pipeline
from ember.passes.matmul_operands import aligned_matmuls


@pytest.fixture
def padding(monkeypatch):
    """Pads every misaligned call; yields the list of how many calls each graph padded."""
    monkeypatch.setattr(matmul_operands, "PAD_MIN_WORK", 1)
    padded: list[int] = []

    def counted(graph):
        padded.append(aligned_matmuls(graph))
        return padded[-1]

    counted.__name__ = "aligned_matmuls"
    monkeypatch.setattr(pipeline, "PASSES", tuple(counted if p is aligned_matmuls else p
                                                  for p in pipeline.PASSES))
    with config.override(shape_padding="always"):
        yield padded


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


CASES = {
    "linear head, odd vocab": (lambda h, w: torch.nn.functional.linear(h, w),
                               (_bf16(4, 6, 16), _bf16(13, 16))),
    "linear with bias, then relu": (lambda h, w, b: torch.nn.functional.linear(h, w, b).relu(),
                                    (_bf16(3, 20), _bf16(13, 20), _bf16(13))),
    "mm, odd inner and outer": (lambda a, b: (a @ b).float().softmax(-1),
                                (_bf16(5, 12), _bf16(12, 11))),
    "addmm": (lambda bias, a, b: torch.addmm(bias, a, b),
              (_bf16(11), _bf16(5, 12), _bf16(12, 11))),
    "bmm": (lambda a, b: torch.bmm(a, b), (_bf16(2, 5, 12), _bf16(2, 12, 11))),
    "transposed output": (lambda a, b: (a @ b).t(), (_bf16(5, 16), _bf16(16, 11))),
}


@pytest.mark.parametrize("name", CASES)
def test_padded_matmuls_match_eager(padding, name):
    padded = padding
    fn, args = CASES[name]
    check(fn, *args)
    assert padded == [1]


def test_padded_linear_gradients_match_eager(padding):
    check_grad(lambda h, w, b: torch.nn.functional.linear(h, w, b).sum(-1),
               _bf16(6, 20), _bf16(13, 20), _bf16(13))
    # the joint graph pads its call; the backward's products of the gradient (ember's rule for
    # a biased linear) are misaligned too, and padded in the backward graph
    assert padding == [1, 1]


def _head_graph(n: int, k: int, dtype=torch.bfloat16) -> Graph:
    graph = Graph(torch.device("cuda"))
    x = graph.add_input((64, k), dtype)
    w = graph.add_input((n, k), dtype)
    call = graph.add(Op.LIBRARY, (x, w), target=torch._C._nn.linear, args=(Slot(0), Slot(1)),
                     kwargs={}, results=(((64, n), dtype, (n, 1)),), tuple_result=False)
    graph.outputs = [call]
    return graph


def test_only_misaligned_large_half_precision_calls_are_padded(monkeypatch):
    monkeypatch.setattr(matmul_operands, "PAD_MIN_WORK", 64 * 16 * 8)
    assert aligned_matmuls(_head_graph(13, 16)) == 1              # n 13 -> 16
    assert aligned_matmuls(_head_graph(16, 16)) == 0              # aligned already
    assert aligned_matmuls(_head_graph(7, 16)) == 0               # too little work
    assert aligned_matmuls(_head_graph(13, 16, torch.float32)) == 0  # fp32: no tensor-core TMA
    graph = _head_graph(13, 12)
    aligned_matmuls(graph)
    pads = [n.attrs["pads"] for n in graph.nodes if n.op is Op.PAD]
    assert pads == [((0, 0, 0), (0, 4, 0)), ((0, 3, 0), (0, 4, 0))]   # k for both, n for w
    assert graph.outputs[0].op is Op.SLICE and graph.outputs[0].shape == (64, 13)
    with config.override(shape_padding="never"):
        assert aligned_matmuls(_head_graph(13, 16)) == 0


def test_padding_is_for_cuda_unless_forced():
    graph = _head_graph(13, 16)
    graph.device = torch.device("cpu")
    with config.override(shape_padding="auto"):
        assert aligned_matmuls(graph) == 0
