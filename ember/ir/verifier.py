"""Checks that an IR graph is well formed: order, types, and that roots exist.

Run after lowering and after every pass when EMBER_LOGS=ir is on, and always in tests.
"""

from __future__ import annotations

from ember.ir.graph import Graph, IRError
from ember.ir.ops import Op
from ember.ir.shape_rules import infer


def verify(graph: Graph) -> None:
    defined = set()
    for node in graph.nodes:
        for source in node.inputs:
            if source not in defined:
                raise IRError(f"{node!r} ({node.op.value}) uses {source!r} before it is defined")
        shape, dtype = infer(node.op, node.inputs, node.attrs)
        if (shape, dtype) != (node.shape, node.dtype):
            raise IRError(f"{node!r} ({node.op.value}) says {node.dtype}{list(node.shape)} but "
                          f"its rule gives {dtype}{list(shape)}")
        defined.add(node)
    for index, node in enumerate(graph.inputs):
        if node.op is not Op.INPUT or node.attrs["index"] != index:
            raise IRError(f"graph input {index} is {node!r} ({node.op.value})")
    for node in graph.roots():
        if node not in defined:
            raise IRError(f"root {node!r} is not a node of the graph")
    for index, node in graph.writebacks:
        target = graph.inputs[index]
        if (node.shape, node.dtype) != (target.shape, target.dtype):
            raise IRError(f"writeback of {node!r} into input {index} changes its type")
