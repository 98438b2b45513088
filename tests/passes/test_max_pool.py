"""pooled_maxima: a max pooling whose indices nothing reads is ember's own maximum over the
window's taps, fused with the kernel that computes the image; values (NaN, -inf, ceil mode,
dilation, channels-last) and kernel counts against eager."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check, check_grad, make

from ember.ir import Op
from ember.lower import trace
from ember.passes.max_pool import pooled_maxima


def _calls_left(fn, *args) -> int:
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    pooled_maxima(lowered.graph)
    return sum(n.op is Op.LIBRARY for n in lowered.graph.live_nodes())


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    (3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 2, 0, 1, True), (3, 1, 1, 2, False),
    (2, 3, 1, 1, True)])
@pytest.mark.parametrize("channels_last", [False, True], ids=["rows", "channels_last"])
def test_a_pooling_after_relu_is_one_kernel(kernel, stride, padding, dilation, ceil_mode,
                                            channels_last):
    x = make(2, 4, 9, 8)
    x[0, 0, 0, 0], x[1, 2, 3, 4], x[1, 3] = math.nan, -math.inf, -math.inf
    if channels_last:
        x = x.to(memory_format=torch.channels_last)

    def fn(x):
        return F.max_pool2d(x * 2 + 1, kernel, stride, padding, dilation, ceil_mode)

    assert _calls_left(fn, x) == 0
    check(fn, x, kernels=1)


def test_training_keeps_the_indices():
    x = make(2, 3, 6, 6).requires_grad_(True)
    check_grad(lambda x: F.max_pool2d(x.sin(), 3, 2, 1), x)
