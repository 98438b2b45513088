"""A library call of aten.convolution as the convolution passes read it (convolution_bias,
convolution_depthwise, convolution_layout, convolution_matmul): its image, weight, bias and
options, and the channels-last strides they lay images out with."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ember.ir.graph import Node
from ember.ir.library import Slot
from ember.ir.ops import Op

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ConvolutionCall:
    node: Node
    x: Node
    weight: Node
    bias: Node | None
    stride: Any
    padding: Any
    dilation: Any
    transposed: bool
    output_padding: Any
    groups: int


def convolution_call(node: Node) -> ConvolutionCall | None:
    """`node` as a convolution: a library call of aten.convolution.default with one result
    and no keyword arguments, whose image, weight and bias (where given) are operands of the
    graph; None for anything else."""
    if node.op is not Op.LIBRARY or node.attrs["target"] is not aten.convolution.default \
            or node.attrs["tuple_result"] or node.attrs["kwargs"]:
        return None
    args = node.attrs["args"]
    if len(args) != 9 or not isinstance(args[0], Slot) or not isinstance(args[1], Slot) \
            or not (args[2] is None or isinstance(args[2], Slot)):
        return None
    bias = node.inputs[args[2].index] if args[2] is not None else None
    return ConvolutionCall(node, node.inputs[args[0].index], node.inputs[args[1].index], bias,
                           *args[3:])


def channels_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Channels-last strides of an N x C x H x W shape."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)
