"""The IR: a graph of primitive nodes with shapes (ints, or symbolic `Size`s) and dtypes.

Grammar of the printed form (ember/ir/printer.py):

    graph    := "graph" "(" input ("," input)* ")" "{" line* "}"
    input    := "%" id ":" type
    line     := "%" id "=" op "(" ("%" id)* ")" attrs? ":" type
              | "return" "(" ("%" id)* ")"
              | "write" "%" id "->" "input" index          (mutation of a graph input)
    type     := dtype "[" dim ("," dim)* "]"
    dim      := int | size                                    (size: ember/ir/sizes.py, s0*768)

A Node is immutable once built: passes build new nodes and `Graph.replace` redirects uses.
Shapes and dtypes come from `shape_rules`; building a node checks them, so an ill-typed node is
never created.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ember.ir.ops import KIND, Kind, Op
from ember.ir.sizes import Dim, Size

Shape = tuple[Dim, ...]


class IRError(Exception):
    """An ill-formed IR node or graph: a bug in a lowering or a pass, never the user's fault."""


@dataclasses.dataclass(eq=False, slots=True)
class Node:
    op: Op
    inputs: tuple[Node, ...]
    attrs: dict[str, Any]
    shape: Shape
    dtype: torch.dtype
    id: int
    # Strides eager PyTorch gives this value (when it is an aten op's result); buffers that hold
    # it use them so outputs have eager's layout. None: any layout (row-major by default).
    strides: tuple[int, ...] | None = None

    @property
    def kind(self) -> Kind:
        return KIND[self.op]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"%{self.id}"


@dataclasses.dataclass
class Graph:
    device: torch.device
    inputs: list[Node] = dataclasses.field(default_factory=list)
    nodes: list[Node] = dataclasses.field(default_factory=list)
    outputs: list[Node] = dataclasses.field(default_factory=list)
    # Strides of each output's buffer (eager's layout for that result).
    output_strides: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    # (input index, node): after the graph runs, input `index` must hold `node`'s value.
    writebacks: list[tuple[int, Node]] = dataclasses.field(default_factory=list)
    # Symbolic graphs: each symbol's name -> (input index, dim) where a call's size is read.
    symbols: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # A training graph's forward: outputs from this position on are values saved for the
    # backward (the caller never sees them); None elsewhere.
    saved_from: int | None = None
    _ids: Any = dataclasses.field(default_factory=itertools.count, repr=False)

    def symbol_values(self, inputs: Sequence[Any]) -> dict[str, int]:
        """Each symbol's value in a call with these graph inputs."""
        return {name: inputs[index].shape[dim] for name, (index, dim) in self.symbols.items()}

    def add(self, op: Op, inputs: Sequence[Node] = (), **attrs: Any) -> Node:
        from ember.ir.shape_rules import infer

        inputs = tuple(inputs)
        shape, dtype = infer(op, inputs, attrs)
        node = Node(op, inputs, attrs, shape, dtype, next(self._ids))
        self.nodes.append(node)
        return node

    def add_input(self, shape: Sequence[int], dtype: torch.dtype,
                  strides: Sequence[int] | None = None) -> Node:
        node = self.add(Op.INPUT, (), index=len(self.inputs), shape=tuple(shape), dtype=dtype)
        node.strides = tuple(strides) if strides is not None else None
        self.inputs.append(node)
        return node

    def roots(self) -> list[Node]:
        return list(self.outputs) + [node for _, node in self.writebacks]

    def users(self) -> dict[Node, list[Node]]:
        table: dict[Node, list[Node]] = {node: [] for node in self.nodes}
        for node in self.nodes:
            for source in node.inputs:
                table[source].append(node)
        return table

    def replace_uses(self, mapping: dict[Node, Node]) -> None:
        """Redirect every use of a key to its value (chains are followed)."""
        if not mapping:
            return

        def resolve(node: Node) -> Node:
            while node in mapping:
                node = mapping[node]
            return node

        for node in self.nodes:
            if any(source in mapping for source in node.inputs):
                node.inputs = tuple(resolve(source) for source in node.inputs)
        self.outputs = [resolve(node) for node in self.outputs]
        self.writebacks = [(index, resolve(node)) for index, node in self.writebacks]

    def copy(self) -> Graph:
        """A graph of new nodes equal to these (ids, attributes and strides kept): passes
        rewrite nodes in place, so a graph compiled twice, two ways, is copied first."""
        copied: dict[Node, Node] = {}
        graph = Graph(self.device)
        for node in self.nodes:
            twin = Node(node.op, tuple(copied[source] for source in node.inputs),
                        dict(node.attrs), node.shape, node.dtype, node.id, node.strides)
            copied[node] = twin
            graph.nodes.append(twin)
        for node in self.inputs:  # (an input no node reads, if a pass dropped it from nodes)
            copied.setdefault(node, Node(node.op, (), dict(node.attrs), node.shape, node.dtype,
                                         node.id, node.strides))
        graph.inputs = [copied[node] for node in self.inputs]
        graph.outputs = [copied[node] for node in self.outputs]
        graph.output_strides = list(self.output_strides)
        graph.writebacks = [(index, copied[node]) for index, node in self.writebacks]
        graph.symbols = dict(self.symbols)
        graph.saved_from = self.saved_from
        graph._ids = itertools.count(max((node.id for node in self.nodes), default=-1) + 1)
        return graph

    def live_nodes(self) -> list[Node]:
        """Nodes that the roots depend on, in the graph's order (inputs always kept)."""
        live: set[Node] = set(self.inputs)
        stack = self.roots()
        while stack:
            node = stack.pop()
            if node not in live:
                live.add(node)
                stack.extend(node.inputs)
        return [node for node in self.nodes if node in live]

    def __str__(self) -> str:
        from ember.ir.printer import format_graph

        return format_graph(self)


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a contiguous (C-order) tensor of `shape`, as torch gives them."""
    strides, step = [], 1
    for position, size in enumerate(reversed(shape)):
        strides.append(step)
        if position < len(shape) - 1:  # (the outermost size sets no stride: it may be symbolic)
            step *= size if isinstance(size, Size) and size.bounds()[0] >= 1 else max(size, 1)
    return tuple(reversed(strides))


def suggested_layout(shape: Sequence[int], like: torch.Tensor) -> tuple[int, ...]:
    """The strides of a result of `shape` that a kernel allocates in the memory format `like`
    suggests (`empty_like(x, x.suggest_memory_format())`, cat's result): channels-last (2-d
    or 3-d) when `like` is laid out so and not row-major, else row-major."""
    for rank, memory_format in ((4, torch.channels_last), (5, torch.channels_last_3d)):
        if like.dim() == rank and not like.is_contiguous() and \
                like.is_contiguous(memory_format=memory_format):
            return tuple(torch.empty(shape, device="meta", memory_format=memory_format).stride())
    return row_major(shape)


def topological(nodes: Iterable[Node]) -> list[Node]:
    """Nodes ordered so that inputs come first (stable for nodes already in order)."""
    order: list[Node] = []
    seen: set[Node] = set()
    for root in nodes:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((source, False) for source in reversed(node.inputs) if source not in seen)
    return order
