"""transposed_weights: mm(x, w.T) becomes linear(x, w), so a Linear layer's call does not
build a transposed view of its weight in Python on every call (the transpose happens inside
the library call, as eager's own Linear does)."""

from __future__ import annotations

import torch

from ember.ir.graph import Graph, Node
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.passes.rewrite import rewrite

aten = torch.ops.aten


def transposed_weights(graph: Graph) -> int:
    def visit(node: Node) -> Node | None:
        if node.op is not Op.LIBRARY or node.attrs["target"] is not aten.mm.default:
            return None
        x, y = node.inputs
        if y.op is not Op.PERMUTE or y.attrs["perm"] != (1, 0) or \
                node.attrs["args"] != (Slot(0), Slot(1)) or node.attrs["kwargs"]:
            return None
        weight = y.inputs[0]
        call = graph.add(Op.LIBRARY, (x, weight), target=torch._C._nn.linear,
                         args=(Slot(0), Slot(1)), kwargs={}, results=node.attrs["results"],
                         tuple_result=False)
        call.strides = node.strides
        return call

    return rewrite(graph, visit)
