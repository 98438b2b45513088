"""eliminate_common_subexpressions: one node per distinct (op, inputs, attributes).

Library nodes are never merged: two calls of a random op must draw twice, as eager does.
"""

from __future__ import annotations

from typing import Any

from ember.ir.graph import Graph, Node
from ember.ir.ops import Op
from ember.passes.rewrite import rewrite


def _freeze(value: Any) -> Any:
    if isinstance(value, float):
        return ("float", repr(value))  # keeps 0.0 and -0.0 apart; NaN equals NaN
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def eliminate_common_subexpressions(graph: Graph) -> int:
    seen: dict[Any, Node] = {}

    def visit(node: Node) -> Node | None:
        if node.op in (Op.INPUT, Op.LIBRARY, Op.ITEM):
            return None
        key = (node.op, tuple(id(s) for s in node.inputs), node.dtype, node.shape,
               _freeze(node.attrs))
        existing = seen.get(key)
        if existing is not None:
            return existing
        seen[key] = node
        return None

    return rewrite(graph, visit)
