"""A partition (ember/partition.py) and its compiled regions → the Python function that runs
the pieces in order: the glue.

Like a compiled graph's wrapper (ember/codegen/wrapper.py), the glue is generated source: a
region is one call of its compiled form, an island the graph's own torch call with its
arguments; nothing is interpreted per call. A region was compiled for the strides that fake
tensors predicted for what it reads from other pieces: a call whose tensors have others runs
that region's eager form instead (`layout_differs`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember.codegen.wrapper import WrapperSource
from ember.partition import (
    Example,
    Island,
    Partition,
    Region,
    describe,
    switches_grad_mode,
    switches_mode,
)
from ember.runtime import switches


class _Names:
    """Names in the glue's namespace, none of them a node's (values keep their nodes' names)."""

    def __init__(self, module: torch.fx.GraphModule):
        self.taken = {node.name for node in module.graph.nodes} | {"args", "layout_differs"}
        self.namespace: dict[str, Any] = {}

    def add(self, hint: str, value: Any) -> str:
        hint = "".join(c if c.isalnum() or c == "_" else "_" for c in hint).lstrip("_") or "k"
        name, number = hint, 0
        while name in self.taken or not name.isidentifier() or name[0].isdigit():
            number += 1
            name = f"{hint}_{number}"
        self.taken.add(name)
        self.namespace[name] = value
        return name

    def render(self, value: Any) -> str:
        """Source for an argument: nodes by name, containers item by item, the rest as
        literals or namespace constants."""
        if isinstance(value, torch.fx.Node):
            return value.name
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            items = [self.render(v) for v in value]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(value, list):
            return "[" + ", ".join(self.render(v) for v in value) + "]"
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return "{" + ", ".join(f"{k!r}: {self.render(v)}" for k, v in value.items()) + "}"
        if isinstance(value, slice):
            return f"slice({self.render(value.start)}, {self.render(value.stop)}, " \
                   f"{self.render(value.step)})"
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float) and math.isfinite(value):
            return repr(value)
        return self.add("k", value)


def write_glue(partition: Partition, runs: dict[int, Callable],
               examples: dict[int, list[Example]], compiled: set[int]) -> WrapperSource:
    """Source of `call(*args)`: `runs[k]` runs region k (its compiled form, or its eager one
    where it could not be compiled); the regions in `compiled` have the strides of their
    inputs from other pieces checked against `examples[k]` first."""
    module = partition.module
    names = _Names(module)
    lines = []
    placeholders = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    if placeholders:
        lines.append(f"{', '.join(placeholders)}{',' if len(placeholders) == 1 else ''} = args")
    for node in module.graph.nodes:
        if node.op == "get_attr":
            names.namespace[node.name] = _fetch(module, node.target)
    for piece in partition.pieces:
        if isinstance(piece, Island):
            lines.extend(_island(piece, names, module))
        else:
            lines.extend(_region(piece, runs[piece.number], examples[piece.number],
                                 piece.number in compiled, names))
    output = next(n for n in module.graph.nodes if n.op == "output")
    lines.append(f"return {names.render(output.args[0])}")
    if any(isinstance(piece, Island) and switches_mode(piece.node) and
           not switches_grad_mode(piece.node) for piece in partition.pieces):
        # (a backend switch the glue enters: left again if a piece raises inside its block)
        lines = [f"with {names.add('contained', switches.contained)}():"] + \
            ["    " + line for line in lines]
    text = "def call(*args):\n" + "".join(f"    {line}\n" for line in lines)
    return WrapperSource(text, names.namespace)


def _island(island: Island, names: _Names, module: torch.fx.GraphModule) -> list[str]:
    node = island.node
    args = [names.render(a) for a in node.args] + \
        [f"{k}={names.render(v)}" for k, v in node.kwargs.items()]
    if node.op == "call_function" and node.target is operator.getitem and not node.kwargs:
        call = f"{args[0]}[{args[1]}]"
    elif node.op == "call_method":
        call = f"{args[0]}.{node.target}({', '.join(args[1:])})"
    else:
        target = _fetch(module, node.target) if node.op == "call_module" else node.target
        call = f"{names.add(describe(node).replace('module ', ''), target)}({', '.join(args)})"
    lines = []
    if island.reason is not None:
        lines.append(f"# eager island: {island.summary}")
    lines.append(f"{node.name} = {call}")
    return lines


def _region(region: Region, run: Callable, examples: list[Example], checked: bool,
            names: _Names) -> list[str]:
    function = names.add(f"region{region.number}", run)
    arguments = ", ".join(n.name for n in region.inputs)
    results = ", ".join(n.name for n in region.outputs)
    target = f"{results}{',' if len(region.outputs) == 1 else ''} = " if region.outputs else ""
    checks = []
    if checked:
        for node, example in zip(region.inputs, examples):
            if node.op != "placeholder" and example.tensor and math.prod(example.shape):
                strides = f"{node.name}.stride()"
                if 1 not in example.shape:
                    checks.append(f"{strides} == {example.stride!r}")
                else:  # (a size-1 dim's stride addresses nothing: eager's may differ)
                    checks.extend(f"{strides}[{d}] == {s}" for d, (n, s) in
                                  enumerate(zip(example.shape, example.stride)) if n != 1)
    if not checks:
        return [f"{target}{function}({arguments})"]
    return [f"if {' and '.join(checks)}:",
            f"    {target}{function}({arguments})",
            "else:  # (strides other than the ones compiled for: this call runs it eagerly)",
            f"    {target}layout_differs({region.number}, {arguments})"]


def _fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value
