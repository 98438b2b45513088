"""A depthwise convolution as ember's own sum over the window's taps (inference, and a
training graph's forward once split: autodiff knows the convolution, not the sum).

Eager calls oneDNN for a depthwise convolution, which costs 35-40 us a call on the CPU even
for a few thousand multiply-adds (its primitive's set-up and the weight's reorder):
EfficientNet's and MobileNetV3's at 64x64 spent 0.45-0.7 ms of a 2-3 ms forward there. Each
output is the sum over kh*kw strided views of the zero-padded image, each times its channel's
weight: pointwise work that the kernel computing the image (batch norm, activation), or the
one reading the result, takes in (schedule/realize.py realizes an image that the taps would
compute again at each of their positions). Values: eager's up to the order of the sums.
"""

from __future__ import annotations

import torch

from ember import config
from ember.ir.graph import Graph, Node
from ember.ir.ops import Op
from ember.lower.builder import Builder
from ember.passes.convolution_calls import convolution_call
from ember.passes.rewrite import rewrite

aten = torch.ops.aten
# half precision accumulates in float in eager's kernels: a sum of rounded products would not
DTYPES = (torch.float32, torch.float64)
# windows of more taps stay with the library: ConvNeXt's 7x7 ones (49 reads of the image a
# position) ran 5% slower than oneDNN's at 16x16 and below, the 3x3 and 5x5 ones 2-4x faster
MAX_TAPS = 25


def depthwise_convolutions(graph: Graph) -> int:
    """convolution(x, w, b, stride, padding, dilation, groups=channels) of 2-d images, one
    filter per channel -> the sum over its taps; changes made."""
    if graph.device.type != "cpu" or not config.settings.convolution_depthwise:
        return 0
    builder = Builder(graph)

    def visit(node: Node) -> Node | None:
        call = convolution_call(node)
        if call is None:
            return None
        x, weight, bias, groups = call.x, call.weight, call.bias, call.groups
        if call.transposed or x.ndim != 4 or weight.ndim != 4 or \
                any(type(d) is not int for n in (x, weight, node) for d in n.shape) or \
                groups != x.shape[1] or weight.shape[:2] != (groups, 1) or \
                weight.shape[2] * weight.shape[3] > MAX_TAPS or \
                any(n.dtype not in DTYPES or n.dtype != node.dtype
                    for n in (x, weight) + ((bias,) if bias is not None else ())):
            return None
        return _taps(builder, x, weight, bias, call.stride, call.padding, call.dilation,
                     node.shape)

    return rewrite(graph, visit)


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
        result = b.add(result, b.reshape(bias, (1, channels, 1, 1)))
    return result
