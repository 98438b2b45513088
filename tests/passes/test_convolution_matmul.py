"""convolutions_as_matmuls: CPU convolutions that oneDNN would run with a per-call weight
reorder become one GEMM (`runtime.matmul_convolution`), with eager's values and layout; the
others stay as eager calls them. Counts by the graph's library calls, values against eager."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check, check_grad, make, significant_strides

from ember import config
from ember.ir import Op
from ember.lower import trace
from ember.passes import convolution_matmul
from ember.passes.convolution_matmul import convolutions_as_matmuls
from ember.runtime.matmul_convolution import convolution_as_matmul, convolution_backward_as_matmul


def _products(fn, *args) -> tuple[int, int]:
    """(convolutions made GEMMs, convolutions left) in fn's graph after the pass."""
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    convolutions_as_matmuls(lowered.graph)
    targets = [n.attrs["target"] for n in lowered.graph.nodes if n.op is Op.LIBRARY]
    return (targets.count(convolution_as_matmul),
            targets.count(torch.ops.aten.convolution.default))


def _channels_last(*tensors):
    return tuple(t.to(memory_format=torch.channels_last) for t in tensors)


def _conv_bn_relu(x, w, mean, var, gamma, beta):
    y = F.conv2d(x, w)
    return F.relu(F.batch_norm(y, mean, var, gamma, beta, training=False))


def _bn_args(channels: int):
    return (make(channels, seed=3), make(channels, low=0.5, high=2.0, seed=4),
            make(channels, seed=5), make(channels, seed=6))


def test_a_channels_last_pointwise_convolution_is_a_gemm_on_a_view():
    x, w = _channels_last(make(2, 16, 5, 5), make(24, 16, 1, 1, seed=1))
    args = (x, w, *_bn_args(24))
    assert _products(_conv_bn_relu, *args) == (1, 0)
    # the GEMM's result, channels-last as eager's, read by one batch-norm + relu kernel
    check(_conv_bn_relu, *args, kernels=1, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("stride, padding, kernel", [(1, 1, 3), (2, 1, 3), (2, 0, 1),
                                                     (2, 0, 2)])
@pytest.mark.parametrize("channels_last", [False, True], ids=["rows", "channels_last"])
def test_few_positions_many_channels(stride, padding, kernel, channels_last):
    """A late stage: 4x4 images, 64 output channels; eager would call oneDNN (strided, or
    channels-last, or more than one thread)."""
    x, w, b = make(2, 8, 4, 4), make(64, 8, kernel, kernel, seed=1), make(64, seed=2)
    if channels_last:
        x, w = _channels_last(x, w)

    def fn(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding)

    made, left = _products(fn, x, w, b)
    onednn = torch._C._select_conv_backend(x, w, b, [stride] * 2, [padding] * 2, [1, 1], False,
                                           [0, 0], 1) == torch._C._ConvBackend.Mkldnn
    assert (made, left) == ((1, 0) if onednn else (0, 1))
    check(fn, x, w, b, kernels=0, atol=1e-5, rtol=1e-5)


def test_many_positions_keep_the_convolution():
    """A 3x3 convolution over 16x16 images with 8 channels: more positions than channels, the
    patch rows' copy would cost more than the weight's reorder."""
    x, w = _channels_last(make(2, 8, 16, 16), make(8, 8, 3, 3, seed=1))

    def fn(x, w):
        return F.conv2d(x, w, padding=1)

    assert _products(fn, x, w) == (0, 1)


def test_groups_and_transposed_convolutions_are_left_alone():
    x, w = _channels_last(make(2, 8, 4, 4), make(8, 1, 3, 3, seed=1))
    assert _products(lambda x, w: F.conv2d(x, w, padding=1, groups=8), x, w) == (0, 1)
    x, w = _channels_last(make(2, 8, 4, 4), make(8, 4, 1, 1, seed=1))
    assert _products(lambda x, w: F.conv_transpose2d(x, w), x, w) == (0, 1)


def test_switched_off():
    x, w = _channels_last(make(2, 16, 5, 5), make(24, 16, 1, 1, seed=1))
    with config.override(convolution_matmul=False):
        assert _products(lambda x, w: F.conv2d(x, w), x, w) == (0, 1)


def test_training_differentiates_the_convolution_and_runs_the_gemm(monkeypatch):
    """Passes before autodiff leave the convolution (its VJP is eager's backward); the
    forward takes the GEMM after the split."""
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return convolution_as_matmul(*args)

    monkeypatch.setattr(convolution_matmul, "convolution_as_matmul", counted)
    x, w = _channels_last(make(2, 16, 5, 5), make(24, 16, 1, 1, seed=1))
    x.requires_grad_(True)
    w.requires_grad_(True)
    check_grad(lambda x, w: F.conv2d(x, w).relu(), x, w, atol=1e-5, rtol=1e-5)
    assert calls


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("weight", ["small", "large"])
def test_a_pointwise_convolutions_backward_is_two_gemms_where_the_weight_is_large(
        monkeypatch, stride, bias, weight):
    # oneDNN's backward reorders the weight: the GEMMs pay on few positions and a weight of
    # BACKWARD_WEIGHT elements or more; below, eager's backward is faster
    calls = []

    def counted(*args):
        calls.append(args[-1])
        return convolution_backward_as_matmul(*args)

    monkeypatch.setattr(convolution_matmul, "convolution_backward_as_matmul", counted)
    c, o = (16, 24) if weight == "small" else (128, 256)
    x, w = _channels_last(make(2, c, 3, 3), make(o, c, 1, 1, seed=1))
    b = make(o, seed=2) if bias else None
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_(True)

    def fn(x, w, b):
        return F.conv2d(x, w, b, stride=stride).relu()

    check_grad(fn, x, w, b, atol=1e-4, rtol=1e-4)
    onednn = torch._C._select_conv_backend(x, w, b, [stride] * 2, [0, 0], [1, 1], False,
                                           [0, 0], 1) == torch._C._ConvBackend.Mkldnn
    assert calls == ([[True, True, bias]] if weight == "large" and onednn else [])


@pytest.mark.parametrize("kernel, stride, padding, dilation, size", [
    (1, 1, 0, 1, 7), (1, 2, 0, 1, 7), (3, 1, 1, 1, 7), (3, 2, 1, 1, 7), (2, 2, 0, 1, 7),
    (3, 1, 2, 2, 7), (2, 2, 0, 1, 8), (3, 3, 0, 1, 9)])  # (the last two: patches tile x)
@pytest.mark.parametrize("layout", ["rows", "channels_last", "channels_last_weight"])
def test_the_gemms_give_eagers_gradients_and_layouts(kernel, stride, padding, dilation, size,
                                                      layout):
    x, w = make(2, 5, size, 6 if size == 7 else size), make(4, 5, kernel, kernel, seed=1)
    if layout != "rows":
        x, w = _channels_last(x, w)
    if layout == "channels_last_weight":
        x = x.contiguous()
    options = ([4], [stride] * 2, [padding] * 2, [dilation] * 2, False, [0, 0], 1)
    g = make(*F.conv2d(x, w, None, stride, padding, dilation).shape, seed=2)
    for mask in ([True, True, True], [False, True, False], [True, False, False]):
        expected = torch.ops.aten.convolution_backward(g, x, w, *options, mask)
        got = convolution_backward_as_matmul(g, x, w, *options, mask)
        for want, have in zip(expected, got):
            assert (want is None) == (have is None)
            if want is None:
                continue
            torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-5)
            assert significant_strides(have) == significant_strides(want)


def test_a_late_stage_3x3_convolution_trains_through_the_gemms(monkeypatch):
    calls = []

    def counted(*args):
        calls.append(args[-1])
        return convolution_backward_as_matmul(*args)

    monkeypatch.setattr(convolution_matmul, "convolution_backward_as_matmul", counted)
    x, w = _channels_last(make(2, 64, 4, 4), make(64, 64, 3, 3, seed=1))
    x.requires_grad_(True)
    w.requires_grad_(True)
    with config.override(convolution_layout="never"):
        check_grad(lambda x, w: F.conv2d(x, w, stride=2, padding=1).relu(), x, w,
                   atol=1e-4, rtol=1e-4)
    onednn = torch._C._select_conv_backend(x, w, None, [2, 2], [1, 1], [1, 1], False,
                                           [0, 0], 1) == torch._C._ConvBackend.Mkldnn
    assert calls == ([[True, True, False]] if onednn else [])


@pytest.mark.parametrize("shape", [(4, 16, 8, 8, 24), (4, 96, 2, 2, 512), (1, 8, 3, 3, 16)],
                         ids=["image_by_image", "rows", "one_image"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_row_major_pointwise_product_gives_eagers_values_and_layout(shape, bias):
    # a row-major 1x1 convolution of stride 1: image by image (a batched product, no copy)
    # where the images have enough positions, else as rows of positions (the weight read once)
    n, c, h, o = shape[0], shape[1], shape[2], shape[4]
    x, w = make(n, c, h, h), make(o, c, 1, 1, seed=1)
    b = make(o, seed=2) if bias else None
    got = convolution_as_matmul(x, w, b, [1, 1], [0, 0], [1, 1], False)
    want = F.conv2d(x, w, b)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.stride() == want.stride()
