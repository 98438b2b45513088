"""fold_constants: compute at compile time what depends only on constants.

Views and casts of a `full` are a `full` of the new shape; pointwise ops whose inputs are all
`full` are evaluated once with eager torch (so the folded value is exactly eager's; on a wide
scalar, in float32, and wide itself); a `where` with a constant condition picks its branch.
"""

from __future__ import annotations

import torch

from ember.ir.graph import Graph, Node
from ember.ir.interpreter import interpret_rules
from ember.ir.ops import Kind, Op
from ember.ir.sizes import Size
from ember.passes.rewrite import rewrite

_SHAPE_ONLY = {Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.SQUEEZE, Op.UNSQUEEZE, Op.FLIP,
               Op.AS_STRIDED}


def _full(graph: Graph, value, node: Node, wide: bool = False) -> Node:
    attrs = {"wide": True} if wide else {}
    return graph.add(Op.FULL, (), value=value, shape=node.shape, dtype=node.dtype, **attrs)


def fold_constants(graph: Graph) -> int:
    def visit(node: Node) -> Node | None:
        sources = node.inputs
        if not sources or not all(s.op is Op.FULL for s in sources):
            if node.op is Op.WHERE and sources[0].op is Op.FULL:
                return sources[1] if sources[0].attrs["value"] else sources[2]
            return None
        if node.op in _SHAPE_ONLY:
            return _full(graph, sources[0].attrs["value"], node, sources[0].attrs.get("wide"))
        if node.op is Op.PAD and sources[0].attrs["value"] == node.attrs["value"]:
            return _full(graph, node.attrs["value"], node)
        if node.kind is Kind.POINTWISE:
            if any(isinstance(s.attrs["value"], Size) for s in sources):
                return None  # (a symbolic size's value is known per call only)
            # (arithmetic on a wide scalar stays in float32, as in eager's kernel: wide too)
            wide = any(s.attrs.get("wide") for s in sources) and node.dtype.is_floating_point
            scalars = [torch.tensor(s.attrs["value"], dtype=torch.float32
                                    if s.attrs.get("wide") else s.dtype) for s in sources]
            result = interpret_rules[node.op](node, scalars)
            return _full(graph, (result if wide else result.to(node.dtype)).item(), node, wide)
        return None

    return rewrite(graph, visit)
