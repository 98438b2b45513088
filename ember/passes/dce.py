"""eliminate_dead_code: drop nodes no output or writeback needs.

Library calls that draw random numbers stay even when unused: dropping one would shift the
random stream for everything after it.
"""

from __future__ import annotations

import torch

from ember.ir.graph import Graph
from ember.ir.ops import Op


def _has_effects(node) -> bool:
    if node.op is not Op.LIBRARY:
        return False
    tags = getattr(node.attrs["target"], "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def eliminate_dead_code(graph: Graph) -> int:
    live = set(graph.inputs)
    stack = graph.roots() + [node for node in graph.nodes if _has_effects(node)]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.inputs)
    before = len(graph.nodes)
    graph.nodes = [node for node in graph.nodes if node in live]
    return before - len(graph.nodes)
