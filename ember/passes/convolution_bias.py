"""A CUDA convolution's bias as a pointwise add that fuses with what reads the result.

Eager's convolution on CUDA calls cuDNN without the bias and then adds it with a kernel of its
own (`output.add_(bias)`: a pass over the result). When something ember computes reads the
result (ConvNeXt's depthwise convolution, then its layer norm), the add fuses into that kernel
instead; the values are eager's up to that add's rounding, as every fused chain's are. On the
CPU oneDNN adds the bias inside the convolution: nothing to gain there.
"""

from __future__ import annotations

import torch

from ember.ir.graph import Graph, Node
from ember.ir.library import Slot
from ember.ir.ops import VIEWS, Op
from ember.lower.builder import Builder
from ember.passes.convolution_calls import convolution_call
from ember.passes.rewrite import rewrite

aten = torch.ops.aten

# the devices whose convolutions add their bias in a kernel of its own
SEPARATE_BIAS_DEVICES = frozenset({"cuda"})


def convolution_biases(graph: Graph) -> int:
    """convolution(x, w, b, ...) -> convolution(x, w, None, ...) + b per channel, on CUDA,
    where the result is read by something other than library calls."""
    if graph.device.type not in SEPARATE_BIAS_DEVICES:
        return 0
    users = graph.users()
    builder = Builder(graph)

    def read_by_a_kernel(node: Node) -> bool:
        return any(r.op is not Op.LIBRARY and (r.op not in VIEWS or read_by_a_kernel(r))
                   for r in users.get(node, []))

    def visit(node: Node) -> Node | None:
        call = convolution_call(node)
        if call is None or call.bias is None or not read_by_a_kernel(node):
            return None
        args, bias = node.attrs["args"], call.bias
        if bias.ndim != 1 or bias.dtype != node.dtype or not node.dtype.is_floating_point:
            return None
        kept = [k for k in range(len(node.inputs)) if k != args[2].index]
        renumber = {old: new for new, old in enumerate(kept)}
        template = (Slot(renumber[args[0].index]), Slot(renumber[args[1].index]), None,
                    *args[3:])
        attrs = dict(node.attrs, args=template)
        if attrs.get("operand_strides"):
            attrs["operand_strides"] = tuple(attrs["operand_strides"][k] for k in kept)
        product = graph.add(Op.LIBRARY, tuple(node.inputs[k] for k in kept), **attrs)
        product.strides = node.strides
        per_channel = builder.reshape(bias, (1, bias.shape[0]) + (1,) * (node.ndim - 2))
        return builder.add(product, per_channel)

    return rewrite(graph, visit)
