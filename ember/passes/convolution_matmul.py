"""CPU convolutions that eager gives to oneDNN called as one matrix product where it pays.

oneDNN reorders the weight into its blocked layout on every call; when the output has few
positions (a batch of small images, a network's late stages) that reorder costs more than the
product (ResNet-50 at 64x64, batch 4: its last 1x1 convolution 2.8 ms as eager calls it,
1.1 ms as a GEMM that reads the weight where it lies). The product is
`runtime.matmul_convolution.convolution_as_matmul`: rows of input patches (a view for a 1x1
convolution of a channels-last image, else a copy) times the weight, viewed as a matrix.

Chosen where the patch rows cost no copy (1x1, stride 1, channels-last: eager's slow path
copies such an image to row-major and back, oneDNN reorders the weight), or where eager would
call oneDNN and there are no more output positions than output channels (the rows' copy is
then no larger than the weight's reorder). Eager's choice of oneDNN depends on the thread
count, asked at compile time; its slow path's per-image GEMMs over a row-major image reorder
nothing and stay. Values: eager's
up to the order of the sums (the GEMM accumulates the same products).
"""

from __future__ import annotations

import torch

from ember import config
from ember.ir.graph import Graph, Node, row_major
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.passes.convolution_calls import channels_last, convolution_call, uses_onednn
from ember.passes.rewrite import rewrite
from ember.runtime.matmul_convolution import (
    channels_last_gradients,
    convolution_as_matmul,
    convolution_backward_as_matmul,
)

aten = torch.ops.aten
DTYPES = (torch.float32,)
# the smallest weight (elements) whose backward runs as GEMMs (see _backward)
BACKWARD_WEIGHT = 32 * 1024


def convolutions_as_matmuls(graph: Graph) -> int:
    """convolution(x, w, b, ...) -> convolution_as_matmul(x, w, b, ...) on the CPU, where
    the module's docstring says."""
    if graph.device.type != "cpu" or not config.settings.convolution_matmul:
        return 0

    def visit(node: Node) -> Node | None:
        if node.op is Op.LIBRARY and node.attrs["target"] is aten.convolution_backward.default:
            return _backward(graph, node)
        call = convolution_call(node)
        if call is None:
            return None
        args, x, weight = node.attrs["args"], call.x, call.weight
        stride, padding, dilation = call.stride, call.padding, call.dilation
        if call.transposed or call.groups != 1 or x.ndim != 4 or node.dtype not in DTYPES or \
                x.dtype != node.dtype or weight.dtype != node.dtype or \
                not _static(node, x, weight):
            return None
        layouts = node.attrs.get("operand_strides") or ()
        x_strides = layouts[args[0].index] if len(layouts) > args[0].index else None
        w_strides = layouts[args[1].index] if len(layouts) > args[1].index else None
        result_strides = node.attrs["results"][0][2]
        if _same_layout(node.shape, result_strides, channels_last(node.shape)):
            last = True
        elif _same_layout(node.shape, result_strides, row_major(node.shape)):
            last = False
        else:
            return None
        x_strides = x_strides or row_major(x.shape)
        positions = node.shape[0] * node.shape[2] * node.shape[3]
        pointwise = weight.shape[2:] == (1, 1) and tuple(stride) == (1, 1) and \
            not any(padding) and _image(x) and \
            _same_layout(x.shape, x_strides, channels_last(x.shape))
        if not pointwise and not (positions <= node.shape[1] and uses_onednn(
                x, x_strides, weight, w_strides or row_major(weight.shape), stride, padding,
                dilation)):
            return None
        call = graph.add(Op.LIBRARY, node.inputs, target=convolution_as_matmul,
                         args=(args[0], args[1], args[2], list(stride), list(padding),
                               list(dilation), last),
                         kwargs={}, results=node.attrs["results"], tuple_result=False,
                         operand_strides=node.attrs.get("operand_strides"))
        call.strides = node.strides
        return call

    return rewrite(graph, visit)


def _backward(graph: Graph, node: Node) -> Node | None:
    """convolution_backward -> its GEMMs, where the forward would take them (the same two
    conditions: oneDNN reorders all three tensors in the backward)."""
    args = node.attrs["args"]
    if node.attrs["kwargs"] or len(args) != 11 or \
            args[:3] != (Slot(0), Slot(1), Slot(2)):
        return None
    grad, x, weight = node.inputs
    _, stride, padding, dilation, transposed, _, groups, _ = args[3:]
    layouts = node.attrs.get("operand_strides") or ()
    if transposed or groups != 1 or x.ndim != 4 or len(layouts) != 3 or \
            any(n.dtype not in DTYPES for n in node.inputs) or \
            not _static(*node.inputs):
        return None
    grad_strides, x_strides, w_strides = (s or row_major(n.shape)
                                          for s, n in zip(layouts, node.inputs))
    # (eager's gradients' layouts, which the GEMMs give: checked)
    metas = [torch.empty_strided(n.shape, strides, dtype=n.dtype, device="meta")
             for n, strides in ((x, x_strides), (weight, w_strides))]
    last = channels_last_gradients(*metas)
    results = node.attrs["results"]
    for (shape, _, strides), mask in zip(results[:2], args[10]):
        expected = channels_last(shape) if last else row_major(shape)
        if mask and not _same_layout(shape, strides, expected):
            return None
    positions = grad.shape[0] * grad.shape[2] * grad.shape[3]
    # Unlike the forward, eager's backward of a channels-last 1x1 convolution is oneDNN's
    # too, and faster than the GEMMs' Python calls on small images (ResNet-50's at 16x16 and
    # below, batch 4: 1.1-1.5x eager's time as GEMMs); so is a 1x1 image's (a squeeze-excite
    # block's). The GEMMs pay where oneDNN's reorders of the weight dominate: few positions
    # and a weight of 32K elements or more (0.4-0.9x eager's time; below, 1.3-1.4x).
    if not (positions <= grad.shape[1] and _image(x) and weight.numel >= BACKWARD_WEIGHT
            and uses_onednn(x, x_strides, weight, w_strides, stride, padding, dilation)):
        return None
    call = graph.add(Op.LIBRARY, node.inputs, **dict(node.attrs,
                                                     target=convolution_backward_as_matmul))
    call.strides = node.strides
    return call


def _image(x: Node) -> bool:
    """More than one position per image: a 1x1 image (a squeeze-excite block's pooled
    channels) lies the same either way, eager's slow path copies nothing, and the GEMM's
    Python calls cost more than the product."""
    return x.shape[2] * x.shape[3] > 1


def _static(*nodes: Node) -> bool:
    """(symbolic sizes: the choice would depend on the call; left to eager's convolution)"""
    return all(type(d) is int for n in nodes for d in n.shape)


def _same_layout(shape: tuple[int, ...], strides: tuple[int, ...] | None,
                 expected: tuple[int, ...]) -> bool:
    """(a size-1 dim's stride places nothing)"""
    return strides is not None and all(s == e for n, s, e in zip(shape, strides, expected)
                                       if n != 1)
