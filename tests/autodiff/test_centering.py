"""The backward of `x - mean(x)` leaves out the sums it knows are zero (ember/autodiff/
centering.py): a normalization's gradient sums each row once, as eager's closed-form backwards
do, where differentiating the mean's primitives summed the variance's term again after the
variance's own sum (one more pass over a batch norm's activation)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check_grad, make

from ember.backends import compile_graph
from ember.ir import Op
from ember.ir.ops import Kind
from ember.runtime.training import TrainingGraph

TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _batch_norm(x, w, b):
    return F.relu(F.batch_norm(x, None, None, w, b, training=True))


def _layer_norm(x, w, b):
    return torch.tanh(F.layer_norm(x, x.shape[-1:], w, b))


def _group_norm(x, w, b):
    return F.group_norm(x, 2, w, b) * x


def _by_hand(x, w, b):
    # (a model's own normalization: the mean subtracted, the variance of what is left)
    centered = x - x.mean(-1, keepdim=True)
    return centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + 1e-6) * w + b


CASES = {
    "batch_norm": (_batch_norm, (6, 4, 5, 5), 4),
    "layer_norm": (_layer_norm, (6, 40), 40),
    "group_norm": (_group_norm, (3, 4, 5, 5), 4),
    "by_hand": (_by_hand, (6, 40), 40),
}


def _depth(graph) -> int:
    """The longest chain of reductions in `graph` where each reads the one before it."""
    depth: dict = {}
    for node in graph.nodes:
        below = max((depth[s] for s in node.inputs), default=0)
        depth[node] = below + (node.kind is Kind.REDUCTION)
    return max(depth.values(), default=0)


@pytest.mark.parametrize("name", CASES)
def test_a_normalization_s_gradients_are_eager_s_with_each_row_summed_once(name):
    fn, shape, channels = CASES[name]
    x = make(*shape, low=-2, high=3)
    w, b = make(channels, seed=1), make(channels, seed=2)
    check_grad(fn, x, w, b, **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn),
                          [t.clone().requires_grad_() for t in (x, w, b)])
    assert isinstance(graph, TrainingGraph)
    assert _depth(graph.split.backward) == 1


def test_a_mean_subtracted_from_another_value_keeps_its_gradient():
    # (x - mean(y): not centered, its sum is not zero)
    def fn(x, y):
        return (x - y.mean(0, keepdim=True)) ** 2

    check_grad(fn, make(5, 3), make(5, 3, seed=1), **TOLERANCE)


def test_a_term_that_varies_along_the_rows_is_kept():
    # (d * x is no multiple of the centered d: its sum is not zero)
    def fn(x):
        d = x - x.mean(1, keepdim=True)
        return (d * x).sum(1, keepdim=True) * d

    check_grad(fn, make(4, 7, low=-1, high=2), **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [make(4, 7).requires_grad_()])
    assert sum(n.op is Op.SUM for n in graph.split.backward.nodes) >= 2
