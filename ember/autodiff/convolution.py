"""The gradient of a convolution: eager's convolution_backward, one library call.

Without this rule a convolution took the generic library backward (vjp.library_vjp), which
runs the forward again under autograd before taking its gradient: every convolution paid
twice in the backward (ResNet-50's training step on the CPU: the backward's convolutions were
two thirds of its time, 1.45× eager's step). Eager's autograd calls convolution_backward with
the saved input and weight, and a mask of the gradients it wants; so does this rule, with the
layouts eager's kernels give (channels-last models: a run on stand-ins, lower/layout.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.ir.graph import Node, row_major
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.lower.builder import Builder
from ember.lower.layout import eager_layout

aten = torch.ops.aten


def convolution_vjp(b: Builder, node: Node, primal: Callable[[Node], Node], g: Node,
                    needs: Sequence[bool]) -> list[Node | None] | Any:
    """Gradients of convolution(x, w, bias, stride, padding, dilation, transposed,
    output_padding, groups) for the inputs whose `needs` is set, or NotImplemented."""
    args = node.attrs["args"]
    if node.attrs["kwargs"] or len(args) != 9 or not all(isinstance(a, Slot)
                                                         for a in args[:2]):
        return NotImplemented
    slots = [args[0], args[1], args[2] if isinstance(args[2], Slot) else None]
    if slots[2] is None and args[2] is not None:
        return NotImplemented
    mask = [slot is not None and needs[slot.index] for slot in slots]
    if not any(mask):
        return [None] * len(node.inputs)
    x, w = node.inputs[slots[0].index], node.inputs[slots[1].index]
    bias = node.inputs[slots[2].index] if slots[2] is not None else None
    # (the operands' layouts as the forward's call is given them: recorded by the tracer,
    # or set by a pass — passes/convolution_layout.py's channels-last images on the CPU,
    # where a computed value's own strides are only eager's layout of it, a hint)
    recorded = node.attrs.get("operand_strides") or (None,) * len(node.inputs)
    layouts = [node.strides or row_major(node.shape),
               recorded[slots[0].index] or x.strides or row_major(x.shape),
               recorded[slots[1].index] or w.strides or row_major(w.shape)]
    metas = [torch.empty_strided(n.shape, strides, dtype=n.dtype, device="meta")
             for n, strides in zip((node, x, w), layouts)]
    options = [list(bias.shape) if bias is not None else None, *args[3:9], mask]
    out = eager_layout(aten.convolution_backward.default, (*metas, *options), {},
                       aten.convolution_backward.default(*metas, *options),
                       b.graph.device.type)
    results = tuple((tuple(t.shape), t.dtype, tuple(t.stride())) if t is not None
                    else (tuple(n.shape), n.dtype, row_major(n.shape))
                    for t, n in zip(out, (x, w, bias if bias is not None else x)))
    call = b.graph.add(Op.LIBRARY, (g, primal(x), primal(w)),
                       target=aten.convolution_backward.default,
                       args=(Slot(0), Slot(1), Slot(2), *options), kwargs={}, results=results,
                       tuple_result=True, operand_strides=tuple(layouts))
    found: list[Node | None] = [None] * len(node.inputs)
    for k, slot in enumerate(slots):
        if mask[k]:
            item = b.graph.add(Op.ITEM, (call,), index=k)
            item.strides = results[k][2]
            found[slot.index] = item
    return found
