"""joined_cats: on the CPU, a large cat of three inputs or more is one call of torch.cat into a
buffer laid out as most of its inputs lie (DenseNet's features, read by batch norms); a cat of
two, or a small one, stays inlined in the kernels that read it. Counted by the graph's
library calls; values, gradients and layouts against eager."""

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, check, check_grad, make

from ember.ir import Op
from ember.lower import trace
from ember.passes.joined_cats import JOINED_ELEMENTS, JoinedCall, joined_cats

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="a pass of the CPU's")


def _joined(fn, *args) -> list[JoinedCall]:
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    joined_cats(lowered.graph)
    return [n.attrs["target"] for n in lowered.graph.nodes
            if n.op is Op.LIBRARY and isinstance(n.attrs["target"], JoinedCall)]


def _features(a, b, c, d, mean, var):
    x = torch.cat([a, b, c, d], 1)
    return F.relu(F.batch_norm(x, mean, var, training=False)) * 2


def _args(channels_last: bool):
    images = [make(2, n, 16, 16, seed=i) for i, n in enumerate((16, 8, 8, 8))]
    if channels_last:
        images = [x.to(memory_format=torch.channels_last) for x in images]
    return (*images, make(40, seed=7), make(40, low=0.5, high=2.0, seed=8))


@pytest.mark.parametrize("channels_last", [False, True], ids=["rows", "channels_last"])
def test_many_features_are_joined_once_in_their_layout(channels_last):
    args = _args(channels_last)
    (joined,) = _joined(_features, *args)
    want = torch.cat(args[:4], 1)
    assert joined.strides == want.stride() and joined.shape == tuple(want.shape)
    # the cat's call, then one batch-norm + relu kernel reading its buffer
    check(_features, *args, kernels=1, atol=1e-5, rtol=1e-5)


def test_features_of_two_layouts_join_in_the_layout_most_of_them_have():
    a, b, c, d, mean, var = _args(True)
    a = a.contiguous()  # (16 of the 40 channels row-major, 24 channels-last)
    (joined,) = _joined(_features, a, b, c, d, mean, var)
    assert joined.strides == (40 * 16 * 16, 1, 16 * 40, 40)
    check(_features, a, b, c, d, mean, var, atol=1e-5, rtol=1e-5)


def test_a_cat_of_two_or_a_small_one_stays_in_the_kernels():
    def two(a, b):
        return torch.cat([a, b], -1).sin()

    def small(a, b, c):
        return torch.cat([a, b, c], 0).sin()

    assert _joined(two, make(64, 256), make(64, 256, seed=1)) == []
    assert 3 * 8 * 16 < JOINED_ELEMENTS
    assert _joined(small, make(8, 16), make(8, 16, seed=1), make(8, 16, seed=2)) == []
    check(two, make(64, 256), make(64, 256, seed=1), kernels=1)


def test_joined_features_train_as_eager():
    # (the pass runs after differentiation: the backward slices the cat's gradient)
    def dense(x, w1, w2, w3):
        f1 = F.conv2d(x, w1, padding=1)
        f2 = F.conv2d(torch.cat([x, f1], 1), w2, padding=1)
        f3 = F.conv2d(torch.cat([x, f1, f2], 1), w3, padding=1)
        return torch.cat([x, f1, f2, f3], 1).relu().mean((2, 3))

    x = make(2, 8, 32, 32)
    check_grad(dense, x, make(4, 8, 3, 3, seed=1), make(4, 12, 3, 3, seed=2),
               make(4, 16, 3, 3, seed=3), atol=1e-4, rtol=1e-4)
