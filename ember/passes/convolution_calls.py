"""A library call of aten.convolution as the convolution passes read it (convolution_bias,
convolution_depthwise, convolution_layout, convolution_matmul): its image, weight, bias and
options, and the channels-last strides they lay images out with."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ember import torch_internals
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


def uses_onednn(x: Node, x_strides: tuple[int, ...], weight: Node, w_strides: tuple[int, ...],
                stride: Any, padding: Any, dilation: Any, groups: int = 1) -> bool:
    """Would eager's CPU convolution of operands of these shapes laid out so call oneDNN?
    torch decides by their geometry, dtype and the thread count of this moment (asked with
    uninitialized stand-ins)."""
    def stand_in(node: Node, strides: tuple[int, ...]) -> torch.Tensor:
        return torch.empty_strided(node.shape, strides, dtype=node.dtype)

    return torch_internals.convolution_uses_onednn(
        stand_in(x, x_strides), stand_in(weight, w_strides), list(stride), list(padding),
        list(dilation), groups)
