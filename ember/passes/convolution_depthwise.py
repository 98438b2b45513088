"""A depthwise convolution as ember's own sum over the window's taps (inference, and a
training graph's forward once split: autodiff knows the convolution, not the sum); and in a
backward, its weight's gradient as ember's reduction where oneDNN's costs most.

Not on CUDA: there eager's row-major bf16 depthwise convolution is ATen's own kernel, 61 us
a call on average for EfficientNet-B0's at batch 32, 224x224 on an H100 (cuDNN's
channels-last ones under torch.compile take 20), yet the taps in Triton, fused with the batch
norm and activation around them, made the whole call slower: 2.72 ms against 2.56 with the
library's (one process, interleaved; notes/device-runs.md, call 110).

Eager calls oneDNN for a depthwise convolution, which costs 35-40 us a call on the CPU even
for a few thousand multiply-adds (its primitive's set-up and the weight's reorder):
EfficientNet's and MobileNetV3's at 64x64 spent 0.45-0.7 ms of a 2-3 ms forward there. Each
output is the sum over kh*kw strided views of the zero-padded image, each times its channel's
weight: pointwise work that the kernel computing the image (batch norm, activation), or the
one reading the result, takes in (schedule/realize.py realizes an image that the taps would
compute again at each of their positions). Values: eager's up to the order of the sums.

oneDNN's weight gradient of a depthwise convolution over a row-major image costs about
50-200 ns per channel and tap however few positions it sums over: EfficientNet-B0's
1152-channel 5x5 at 2x2, batch 4 (16 products a channel and tap) took 1.4 ms of a 1.5 ms
convolution_backward, its input's gradient 0.07 ms. Where each sum is that short, the
backward's call is asked for the other gradients only, and the weight's is one reduction over
the taps' view of the padded image times the output's gradient (0.19 ms there).
"""

from __future__ import annotations

import torch

from ember import config
from ember.ir.graph import Graph, Node
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.lower.builder import Builder
from ember.passes.convolution_calls import convolution_call
from ember.passes.rewrite import rewrite

aten = torch.ops.aten
# (float16 and bfloat16 are summed in float32 and rounded once, as eager's kernels accumulate
# them: a sum of rounded products would not be eager's)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HALVES = (torch.float16, torch.bfloat16)
# windows of more taps stay with the library: ConvNeXt's 7x7 ones (49 reads of the image a
# position) ran 5% slower than oneDNN's at 16x16 and below, the 3x3 and 5x5 ones 2-4x faster
MAX_TAPS = 25
# the longest sum (batch x output positions) of a weight gradient's channel and tap that
# ember's reduction takes over from oneDNN: at 256 and below it ran 2-11x faster (EfficientNet-
# B0's and MobileNetV3's 3x3 and 5x5 at 8x8 and below, batch 4); at 1024 (16x16) oneDNN's
# kernel was as fast or 2x faster (one thread and two)
WEIGHT_GRADIENT_POSITIONS = 256


def depthwise_convolutions(graph: Graph) -> int:
    """convolution(x, w, b, stride, padding, dilation, groups=channels) of 2-d images, one
    filter per channel -> the sum over its taps; in a backward, convolution_backward of one
    whose weight gradient sums few products -> the call without it, and the reduction;
    changes made."""
    if graph.device.type != "cpu" or not config.settings.convolution_depthwise:
        return 0
    builder = Builder(graph)
    # backward calls asked no longer for the weight's gradient -> that gradient
    weight_gradients: dict[Node, Node] = {}

    def visit(node: Node) -> Node | None:
        if node.op is Op.ITEM and node.inputs[0] in weight_gradients and \
                node.attrs["index"] == 1:
            return weight_gradients[node.inputs[0]]
        if node.op is Op.LIBRARY and node.attrs["target"] is aten.convolution_backward.default:
            return _backward(builder, node, weight_gradients)
        call = convolution_call(node)
        if call is None or call.transposed or \
                not _depthwise(call.x, call.weight, call.groups, node, call.bias):
            return None
        return _taps(builder, call.x, call.weight, call.bias, call.stride, call.padding,
                     call.dilation, node.shape)

    return rewrite(graph, visit)


def _depthwise(x: Node, weight: Node, groups: int, result: Node, bias: Node | None) -> bool:
    """A 2-d convolution of static sizes with one filter per channel, of at most MAX_TAPS
    taps, in float32 or float64 throughout."""
    return x.ndim == 4 and weight.ndim == 4 and \
        all(type(d) is int for n in (x, weight, result) for d in n.shape) and \
        groups == x.shape[1] and weight.shape[:2] == (groups, 1) and \
        weight.shape[2] * weight.shape[3] <= MAX_TAPS and \
        all(n.dtype in DTYPES and n.dtype == result.dtype
            for n in (x, weight) + ((bias,) if bias is not None else ()))


def _backward(b: Builder, node: Node, weight_gradients: dict[Node, Node]) -> Node | None:
    """convolution_backward(grad, x, w, ...) of a depthwise convolution that asks for the
    weight's gradient where each channel and tap sums at most WEIGHT_GRADIENT_POSITIONS
    products -> the call asking for the others (the node itself where none is left: then
    unused), its weight gradient recorded in `weight_gradients` for the ITEM that reads it."""
    args = node.attrs["args"]
    if node.attrs["kwargs"] or len(args) != 11 or args[:3] != (Slot(0), Slot(1), Slot(2)):
        return None
    grad, x, weight = node.inputs
    _, stride, padding, dilation, transposed, _, groups, mask = args[3:]
    if transposed or not mask[1] or not _depthwise(x, weight, groups, grad, None) or \
            grad.shape[0] * grad.shape[2] * grad.shape[3] > WEIGHT_GRADIENT_POSITIONS:
        return None
    gradient = _weight_gradient(b, grad, x, weight.shape[2:], stride, padding, dilation)
    rest = [mask[0], False, mask[2]]
    call = node
    if any(rest):
        call = b.graph.add(Op.LIBRARY, node.inputs, **dict(node.attrs, args=(*args[:10], rest)))
        call.strides = node.strides
    weight_gradients[call] = gradient
    return call


def _weight_gradient(b: Builder, grad: Node, x: Node, kernel: tuple[int, int], stride,
                     padding, dilation) -> Node:
    """w[c, 0, i, j] = the sum over (n, oh, ow) of grad[n, c, oh, ow] times the padded image
    at tap (i, j) of that position: one reduction over (n, c, kh, kw, oh, ow), the taps a
    strided view of the padded image, which is stored."""
    batch, channels, out_h, out_w = grad.shape
    kh, kw = kernel
    padded = b.pad(x, [(0, 0, 0), (0, 0, 0), (padding[0], padding[0], 0),
                       (padding[1], padding[1], 0)], 0.0)
    if padded is not x:
        # stored once: the reduction then reads each tap with no bounds check (4-15% of the
        # weight gradient's time at EfficientNet-B0's sizes, its copy included)
        padded.attrs["realize"] = True
    padded_h, padded_w = padded.shape[2:]
    shape = (batch, channels, kh, kw, out_h, out_w)
    taps = b.graph.add(Op.AS_STRIDED, (padded,), shape=shape,
                       strides=(channels * padded_h * padded_w, padded_h * padded_w,
                                dilation[0] * padded_w, dilation[1], stride[0] * padded_w,
                                stride[1]), offset=0)
    spread = b.expand(b.reshape(grad, (batch, channels, 1, 1, out_h, out_w)), shape)
    total = b.reduce(Op.SUM, b.mul(spread, taps), (0, 4, 5))
    return b.reshape(total, (channels, 1, kh, kw))


def _taps(b: Builder, x: Node, weight: Node, bias: Node | None, stride, padding, dilation,
          shape: tuple[int, ...]) -> Node:
    """sum over (i, j) of the padded image's strided view at tap (i, j) times w[:, 0, i, j]."""
    channels, _, kh, kw = weight.shape
    out_h, out_w = shape[2:]
    padded = b.pad(x, [(0, 0, 0), (0, 0, 0), (padding[0], padding[0], 0),
                       (padding[1], padding[1], 0)], 0.0)
    # the weight relaid tap by tap (kh*kw rows of the channels), once a call: a kernel that
    # walks the channels innermost (a channels-last image) reads each tap's row contiguously,
    # where the weight's own layout would be a gather per tap
    rows = b.graph.add(Op.STOP_GRADIENT, (b.permute(b.reshape(weight, (channels, kh * kw)),
                                                     (1, 0)),), realize=True)
    dtype = x.dtype
    if dtype in HALVES:
        padded, rows = b.cast(padded, torch.float32), b.cast(rows, torch.float32)
    result = None
    for i in range(kh):
        for j in range(kw):
            top, left = i * dilation[0], j * dilation[1]
            tap = b.slice(padded, 2, top, top + (out_h - 1) * stride[0] + 1, stride[0])
            tap = b.slice(tap, 3, left, left + (out_w - 1) * stride[1] + 1, stride[1])
            row = b.slice(rows, 0, i * kw + j, i * kw + j + 1)
            term = b.mul(tap, b.reshape(row, (1, channels, 1, 1)))
            result = term if result is None else b.add(result, term)
    if bias is not None:
        result = b.add(result, b.reshape(b.cast(bias, result.dtype), (1, channels, 1, 1)))
    return b.cast(result, dtype)
