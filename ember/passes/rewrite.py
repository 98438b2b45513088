"""The one way passes change a graph: visit nodes in order, optionally replace each.

`rewrite(graph, visit)` calls visit(node) for every node with its inputs already rewritten;
visit returns a replacement (new nodes it builds with graph.add land before the visited node's
position, so order stays topological) or None to keep the node.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.ir.graph import Graph, Node


def rewrite(graph: Graph, visit: Callable[[Node], Node | None]) -> int:
    """Apply `visit` to every node; return how many nodes were replaced."""
    old_nodes = graph.nodes
    graph.nodes = []
    mapping: dict[Node, Node] = {}
    for node in old_nodes:
        if any(source in mapping for source in node.inputs):
            node.inputs = tuple(mapping.get(source, source) for source in node.inputs)
        replacement = visit(node)
        if replacement is None or replacement is node:
            graph.nodes.append(node)
            continue
        if replacement.strides is None and replacement.shape == node.shape:
            replacement.strides = node.strides
        mapping[node] = replacement
    graph.outputs = [mapping.get(node, node) for node in graph.outputs]
    graph.writebacks = [(index, mapping.get(node, node)) for index, node in graph.writebacks]
    return len(mapping)
