"""IR graph → text, in the grammar written at the top of ember/ir/graph.py."""

from __future__ import annotations

from typing import Any

from ember.ir.dtypes import short_name
from ember.ir.graph import Graph, Node
from ember.ir.library import format_template
from ember.ir.ops import Op

_TYPE_ATTRS = ("shape", "dtype")


def format_type(node: Node) -> str:
    if node.op is Op.LIBRARY and node.attrs["tuple_result"]:
        parts = ", ".join(f"{short_name(d)}[{','.join(map(str, s))}]"
                          for s, d, _ in node.attrs["results"])
        return f"({parts})"
    return f"{short_name(node.dtype)}[{','.join(map(str, node.shape))}]"


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if hasattr(value, "is_floating_point"):  # a torch.dtype
        return short_name(value)
    return str(value)


def format_attrs(node: Node) -> str:
    if node.op is Op.LIBRARY:
        target = getattr(node.attrs["target"], "__name__", str(node.attrs["target"]))
        arguments = format_template(node.attrs["args"])
        extra = format_template(node.attrs["kwargs"])
        under = "".join(f" under {switch!r}" for switch in node.attrs.get("switches", ()))
        return f" {target}{arguments[:-1]}{', ' + extra if extra else ''}){under}"
    shown = {k: v for k, v in node.attrs.items()
             if not (k in _TYPE_ATTRS and node.op in (Op.INPUT, Op.FULL, Op.IOTA))
             and not (node.op is Op.CAST and k == "shape")}
    if node.op is Op.CAST:
        shown = {}
    if not shown:
        return ""
    return " " + " ".join(f"{k}={_format_value(v)}" for k, v in shown.items())


def format_node(node: Node) -> str:
    operands = ", ".join(repr(source) for source in node.inputs)
    return f"{node!r} = {node.op.value}({operands}){format_attrs(node)} : {format_type(node)}"


def format_graph(graph: Graph) -> str:
    header = ", ".join(f"{node!r}: {format_type(node)}" for node in graph.inputs)
    lines = [f"graph({header}) {{"]
    for node in graph.nodes:
        if node.op is not Op.INPUT:
            lines.append("  " + format_node(node))
    for index, node in graph.writebacks:
        lines.append(f"  write {node!r} -> input {index}")
    lines.append("  return (" + ", ".join(repr(node) for node in graph.outputs) + ")")
    lines.append("}")
    return "\n".join(lines)
