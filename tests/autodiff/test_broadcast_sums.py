"""A broadcast's gradient sum with the factors constant along it taken out (ember/autodiff/
broadcast_sums.py): a batch norm's backward sums two values per channel, as eager's closed
form does, where differentiating its primitives summed four; gradients stay eager's."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import check_grad, make

from ember import config
from ember.backends import compile_graph
from ember.ir import Op
from ember.runtime.training import TrainingGraph

TOLERANCE = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture
def unfactored():
    saved = config.settings
    config.settings = dataclasses.replace(saved, factored_sums=False)
    yield
    config.settings = saved


def _sums(fn, *args) -> list[tuple]:
    """The backward graph's sums: (the summed shape, the axes) of each."""
    graph = compile_graph(torch.fx.symbolic_trace(fn),
                          [a.clone().requires_grad_() for a in args])
    assert isinstance(graph, TrainingGraph)
    return [(n.inputs[0].shape, n.attrs["axes"]) for n in graph.split.backward.nodes
            if n.op is Op.SUM]


def _batch_norm_relu(x, w, b):
    return F.relu(F.batch_norm(x, None, None, w, b, training=True))


def test_a_batch_norm_s_backward_sums_two_values_per_channel_as_eager_does():
    x = make(6, 4, 5, 5, low=-2, high=3)
    w, b = make(4, seed=1, low=0.5, high=1.5), make(4, seed=2)
    check_grad(_batch_norm_relu, x, w, b, **TOLERANCE)
    assert _sums(_batch_norm_relu, x, w, b) == [((6, 4, 5, 5), (0, 2, 3))] * 2


def test_the_products_summed_as_they_are_when_switched_off(unfactored):
    x = make(6, 4, 5, 5, low=-2, high=3)
    w, b = make(4, seed=1, low=0.5, high=1.5), make(4, seed=2)
    check_grad(_batch_norm_relu, x, w, b, **TOLERANCE)
    assert len(_sums(_batch_norm_relu, x, w, b)) == 4


def test_a_channels_last_batch_norm_in_half_precision_keeps_eager_s_gradients():
    x = make(4, 8, 6, 6, low=-2, high=3).to(memory_format=torch.channels_last)
    w, b = make(8, seed=1, low=0.5, high=1.5), make(8, seed=2)
    check_grad(lambda x, w, b: _batch_norm_relu(x, w, b).float(),
               x.to(torch.bfloat16), w.to(torch.bfloat16), b.to(torch.bfloat16),
               rtol=2e-2, atol=2e-2)


def test_constant_factors_and_divisors_come_out_of_the_sum():
    # (the gradient of s broadcast: sum over rows of g * x * c / d, c and d one per column)
    def fn(x, s, c, d):
        return (x * s.expand_as(x) * c.expand_as(x) / d.expand_as(x)).tanh()

    x, s = make(7, 5), make(1, 5, seed=1)
    c, d = make(1, 5, seed=2), make(1, 5, seed=3, low=1, high=2)
    check_grad(fn, x, s, c, d, **TOLERANCE)


def test_a_divisor_that_varies_along_the_sum_stays_inside_it():
    def fn(x, y, s):
        return (s.expand_as(x) * x / y).sin()

    check_grad(fn, make(6, 4), make(6, 4, seed=1, low=1, high=2), make(1, 4, seed=2),
               **TOLERANCE)


def test_a_cotangent_of_constant_factors_only_sums_to_the_count_times_them():
    # (s's gradient: the sum over 6 rows of t broadcast, t constant along them)
    def fn(s, t):
        return s.expand(6, 4) * t.expand(6, 4)

    check_grad(fn, make(1, 4), make(1, 4, seed=1), **TOLERANCE)


def test_a_negated_and_scaled_term_keeps_its_sign():
    def fn(x, m):
        return torch.exp(-(x - m.expand_as(x)) * 0.5)

    check_grad(fn, make(5, 3, low=-1, high=1), make(5, 1, seed=1), **TOLERANCE)
