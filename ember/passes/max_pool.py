"""A max pooling whose indices nothing reads, as ember's own pointwise maximum over the
window's taps (inference; a training graph's backward reads the indices).

Eager's max_pool2d_with_indices computes and stores an int64 index per output beside the
value; ember otherwise called it as a library node, a pass of its own over the image. As
the maximum of kh*kw strided views of the image padded with -inf, the pooling fuses with
whatever computes the image (ResNet's stem: batch norm and relu) or reads the result.
Values: eager's (the maximum propagates NaN as eager's kernel does; -inf padding is never
chosen over a real element, and every window holds one).
"""

from __future__ import annotations

import torch

from ember.ir.graph import Graph, Node
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.lower.builder import Builder
from ember.passes.rewrite import rewrite

aten = torch.ops.aten
# windows of more taps stay with the library (each tap is a read of the image)
MAX_TAPS = 16


def pooled_maxima(graph: Graph) -> int:
    """ITEM 0 of max_pool2d_with_indices(x, ...) whose ITEM 1 nothing reads -> the maximum
    over the taps of strided views of x padded with -inf; changes made."""
    users = graph.users()
    roots = set(graph.roots())
    builder = Builder(graph)

    def read(node: Node) -> bool:
        return bool(users.get(node)) or node in roots

    def visit(node: Node) -> Node | None:
        if node.op is not Op.ITEM or node.attrs["index"] != 0:
            return None
        call = node.inputs[0]
        if call.op is not Op.LIBRARY or \
                call.attrs["target"] is not aten.max_pool2d_with_indices.default or \
                call.attrs["kwargs"] or call.attrs["args"][:1] != (Slot(0),) or \
                any((u.op is not Op.ITEM or u.attrs["index"] != 0) and read(u)
                    for u in users[call]):
            return None
        x = call.inputs[0]
        options = _options(call.attrs["args"][1:], x)
        if options is None or not x.dtype.is_floating_point:
            return None
        kernel, stride, padding, dilation = options
        out_h, out_w = node.shape[-2:]
        if kernel[0] * kernel[1] > MAX_TAPS or \
                any(type(d) is not int for d in (*x.shape, *node.shape)):
            return None
        # enough -inf after the image for every tap's last window (ceil mode may need more)
        high = [max(0, (out - 1) * s + (k - 1) * d + 1 - (size + p))
                for out, s, k, d, size, p in zip((out_h, out_w), stride, kernel, dilation,
                                                 x.shape[-2:], padding)]
        pads = [(0, 0, 0)] * (x.ndim - 2) + [(padding[0], high[0], 0), (padding[1], high[1], 0)]
        padded = builder.pad(x, pads, float("-inf"))
        result = None
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                top, left = i * dilation[0], j * dilation[1]
                tap = builder.slice(padded, -2, top, top + (out_h - 1) * stride[0] + 1,
                                    stride[0])
                tap = builder.slice(tap, -1, left, left + (out_w - 1) * stride[1] + 1,
                                    stride[1])
                result = tap if result is None else builder.maximum(result, tap)
        return result

    return rewrite(graph, visit)


def _options(args: tuple, x: Node) -> tuple | None:
    """(kernel, stride, padding, dilation) as pairs, from max_pool2d's arguments; None for a
    form this pass does not read."""
    names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
    values = dict(zip(names, args))
    if x.ndim not in (3, 4) or any(isinstance(v, Slot) for v in values.values()):
        return None

    def pair(value, default):
        if value is None or (isinstance(value, (list, tuple)) and not value):
            value = default
        value = list(value) if isinstance(value, (list, tuple)) else [value]
        return value * 2 if len(value) == 1 else value

    kernel = pair(values.get("kernel_size"), None)
    stride = pair(values.get("stride"), kernel)
    padding = pair(values.get("padding", 0), [0])
    dilation = pair(values.get("dilation", 1), [1])
    return kernel, stride, padding, dilation
