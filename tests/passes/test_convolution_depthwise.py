"""depthwise_convolutions: a CPU depthwise convolution is ember's sum over the window's taps,
computed in ember's kernels with the work around it; values, layouts and gradients against
eager, kernel counts, and the convolutions left to the library."""

import re

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, check, check_grad, make

from ember import config
from ember.codegen.c import write_source
from ember.ir import Op
from ember.lower import trace
from ember.passes.convolution_depthwise import depthwise_convolutions
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="a CPU pass")


def _calls_left(fn, *args) -> int:
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    depthwise_convolutions(lowered.graph)
    return sum(n.op is Op.LIBRARY for n in lowered.graph.live_nodes())


@pytest.mark.parametrize("kernel, stride, padding, dilation", [
    (3, 1, 1, 1), (3, 2, 1, 1), (5, 2, 2, 1), (5, 1, 2, 1), (3, 1, 2, 2), (3, 2, 0, 1),
    (2, 1, 0, 1)])
@pytest.mark.parametrize("layout", ["rows", "channels_last"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_depthwise_convolution_is_the_sum_of_its_taps(kernel, stride, padding, dilation,
                                                        layout, bias):
    x, w = make(2, 6, 9, 8), make(6, 1, kernel, kernel, seed=1)
    b = make(6, seed=2) if bias else None
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)

    def fn(x, w, b):
        return F.conv2d(x, w, b, stride, padding, dilation, groups=6)

    assert _calls_left(fn, x, w, b) == 0
    check(fn, x, w, b, atol=1e-5, rtol=1e-5)


def test_the_image_is_computed_once_padded_and_the_weight_relaid_once():
    """Batch norm and SiLU of an image, a 3x3 depthwise convolution, batch norm and SiLU
    again: the padded image (one kernel), the weight's taps (one), the convolution with the
    work after it (one); not the image's SiLU once per tap."""
    x = make(2, 8, 10, 10).contiguous(memory_format=torch.channels_last)
    w, mean, var = make(8, 1, 3, 3, seed=1), make(8, seed=2), make(8, low=0.5, high=2, seed=3)

    def fn(x, w, mean, var):
        image = F.silu(F.batch_norm(x, mean, var, training=False))
        y = F.conv2d(image, w, padding=1, groups=8)
        return F.silu(F.batch_norm(y, mean, var, training=False))

    check(fn, x, w, mean, var, kernels=3, atol=1e-5, rtol=1e-5)
    lowered = trace(torch.fx.symbolic_trace(fn), [x, w, mean, var])
    _, kernels = write_source(schedule(run_passes(lowered.graph)))
    text = "\n".join(kernel.text for kernel in kernels)
    assert text.count("expf(") == 2  # (each SiLU once, not the image's once per tap)
    # the padded image's row and column are fixed in the loop over channels: clamped there,
    # once a row or column, and the loop over channels loads at affine positions, no clamps
    innermost = [part.split("}")[0] for part in text.split("#pragma omp simd")[1:]]
    assert innermost and not [body for body in innermost if "ember_clamp_index" in body]


def test_taps_over_a_channels_last_view_load_at_affine_positions_unguarded():
    # (timm's PVT-v2: a linear's (B, N, C) result seen as a (B, C, H, W) image through
    # `transpose(1, 2).reshape`, then a 3x3 depthwise convolution: the loop over channels is
    # innermost, and each tap's row and column checks are fixed inside it. Loads under such a
    # check, their index divided and reduced per element, kept the loop scalar: 4.7 ms where
    # the vectorized taps take 0.3)
    def fn(x, w, b):
        image = torch.tanh(x).transpose(1, 2).reshape(2, 8, 6, 5)
        return F.conv2d(image, w, b, padding=1, groups=8).flatten(2).transpose(1, 2)

    x, w, b = make(2, 30, 8), make(8, 1, 3, 3, seed=1), make(8, seed=2)
    check(fn, x, w, b, atol=1e-5, rtol=1e-5)
    lowered = trace(torch.fx.symbolic_trace(fn), [x, w, b])
    _, kernels = write_source(schedule(run_passes(lowered.graph)))
    text = "\n".join(kernel.text for kernel in kernels)
    loads = re.findall(r"a_\w+\[([^\]]*)\]", text)
    assert loads and not [load for load in loads if "%" in load or "/" in load], loads
    assert not re.search(r"\? a_\w+\[", text), text


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_depthwise_convolution_sums_in_float(dtype):
    # eager's kernels accumulate half-precision products in float32 and round once: so do
    # the taps
    x, w = make(2, 6, 9, 8, dtype=dtype), make(6, 1, 5, 5, dtype=dtype, seed=1)
    b = make(6, dtype=dtype, seed=2)

    def fn(x, w, b):
        return F.conv2d(x, w, b, 1, 2, 1, groups=6)

    assert _calls_left(fn, x, w, b) == 0
    check(fn, x, w, b)


def test_grouped_convolutions_stay_with_the_library():
    x = make(2, 8, 6, 6)
    assert _calls_left(lambda x, w: F.conv2d(x, w, padding=1, groups=4), x,
                       make(8, 2, 3, 3, seed=1)) == 1
    assert _calls_left(lambda x, w: F.conv2d(x, w, padding=1, groups=8), x,
                       make(16, 1, 3, 3, seed=1)) == 1  # (two filters per channel)
    assert _calls_left(lambda x, w: F.conv2d(x, w, padding=3, groups=8), x,
                       make(8, 1, 7, 7, seed=1)) == 1  # (more taps than MAX_TAPS)
    with config.override(convolution_depthwise=False):
        assert _calls_left(lambda x, w: F.conv2d(x, w, padding=1, groups=8), x,
                           make(8, 1, 3, 3, seed=1)) == 1


@pytest.mark.parametrize("stride", [1, 2])
def test_training_takes_the_taps_forward_and_eagers_backward(stride):
    """(a 7x7 image: the backward keeps eager's convolution_backward for the image and
    reduces the weight's gradient itself, see below)"""
    x = make(2, 6, 7, 7).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    w = make(6, 1, 3, 3, seed=1).requires_grad_(True)
    b = make(6, seed=2).requires_grad_(True)

    def fn(x, w, b):
        return F.conv2d(F.silu(x), w, b, stride, 1, groups=6).sigmoid()

    check_grad(fn, x, w, b, atol=1e-5, rtol=1e-5)


def _backward_masks(graph) -> list[list[bool]]:
    """The gradients each convolution_backward call of a training graph's backward asks."""
    return [n.attrs["args"][10] for n in graph.split.backward.live_nodes()
            if n.op is Op.LIBRARY
            and n.attrs["target"] is torch.ops.aten.convolution_backward.default]


@pytest.mark.parametrize("kernel, stride, padding, dilation", [
    (3, 1, 1, 1), (3, 2, 1, 1), (5, 1, 2, 1), (5, 2, 2, 1), (3, 1, 2, 2), (3, 2, 0, 1),
    (2, 1, 0, 1)])
@pytest.mark.parametrize("layout", ["rows", "channels_last"])
def test_a_short_weight_gradient_is_a_reduction_and_the_call_keeps_the_rest(
        kernel, stride, padding, dilation, layout):
    """oneDNN's depthwise weight gradient costs per channel and tap however few products it
    sums: where each sums few (here 2 x 3 x 3 positions and fewer), ember reduces the taps'
    view of the padded image times the output's gradient, and convolution_backward is asked
    for the image's and the bias's gradients only."""
    x, w, b = make(2, 6, 6, 5), make(6, 1, kernel, kernel, seed=1), make(6, seed=2)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)

    def fn(x, w, b):
        return F.conv2d(F.silu(x), w, b, stride, padding, dilation, groups=6).sigmoid()

    graph = check_grad(fn, x, w, b, atol=1e-5, rtol=1e-5)
    assert _backward_masks(graph) == [[True, False, True]]


def test_a_weight_gradient_alone_needs_no_library_call():
    x, w = make(2, 6, 5, 5), make(6, 1, 3, 3, seed=1)

    def fn(x, w):  # (the image's gradient is not asked)
        return F.conv2d(x.detach(), w, padding=1, groups=6).tanh()

    graph = check_grad(fn, x, w, atol=1e-5, rtol=1e-5)
    assert _backward_masks(graph) == []


def test_a_long_weight_gradient_stays_with_the_library():
    """(at 2 x 12 x 12 = 288 positions a channel and tap: past WEIGHT_GRADIENT_POSITIONS)"""
    x, w = make(2, 6, 12, 12), make(6, 1, 3, 3, seed=1)

    def fn(x, w):
        return F.conv2d(F.silu(x), w, padding=1, groups=6).tanh()

    graph = check_grad(fn, x, w, atol=1e-5, rtol=1e-5)
    assert _backward_masks(graph) == [[True, True, False]]
