"""The scheduler's output: buffers and the ordered steps (kernels, library calls, copies).

    Plan     := Buffer* Step*
    Step     := Kernel | LibraryCall | Copy
    Kernel   := iteration space `shape`, reduced `axes` (the inner loops), member nodes computed
                inside, and Stores (node -> buffer) done at every point of the space
    Buffer   := shape, strides, dtype, and where its memory comes from (role)

Codegen turns a Kernel into C or Triton and the Plan into the Python wrapper that allocates
buffers, launches steps in order and frees each temporary after its last use.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ember.ir.graph import Graph, Node


@dataclasses.dataclass(eq=False)
class Buffer:
    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    # "input" (graph input `input_index`), "temp", "output", "library" (a library call's
    # result) or "alias" (a strided view of `base`, `offset` elements in)
    role: str
    input_index: int | None = None
    base: Buffer | None = None
    offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the buffer spans (its last element's end), as an allocation needs."""
        if self.numel == 0:
            return 0
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return span * self.dtype.itemsize

    def root(self) -> Buffer:
        return self.base.root() if self.base is not None else self

    def __repr__(self) -> str:
        return self.name


@dataclasses.dataclass(eq=False)
class Store:
    node: Node
    buffer: Buffer


@dataclasses.dataclass(eq=False)
class Matmul:
    """A matrix product a pointwise kernel computes itself, tile by tile, before its own work
    (the Triton backend's epilogue fusion): result[m, n] = sum_k a[m, k] * b[k, n], where b
    is `b` itself or, for linear(x, w), w transposed."""

    node: Node            # the library call it replaces
    result: Buffer        # that call's result: never allocated, read as the accumulator
    a: Buffer
    b: Buffer
    b_transposed: bool


@dataclasses.dataclass(eq=False)
class Kernel:
    name: str
    shape: tuple[int, ...]          # the iteration space
    axes: tuple[int, ...]           # reduced axes: iterated in inner loops, per outer point
    members: list[Node]             # realized nodes computed here (stored or not)
    stores: list[Store]
    matmul: Matmul | None = None    # a product computed first (see Matmul)

    @property
    def is_reduction(self) -> bool:
        return bool(self.axes)


@dataclasses.dataclass(eq=False)
class LibraryCall:
    node: Node
    inputs: list[Buffer]
    outputs: list[Buffer]


@dataclasses.dataclass(eq=False)
class Copy:
    """source → graph input `input_index` (a write-back that could not be done in place)."""

    source: Buffer
    target: Buffer


Step = Kernel | LibraryCall | Copy


@dataclasses.dataclass
class Plan:
    graph: Graph
    steps: list[Step]
    buffer_of: dict[Node, Buffer]
    inputs: list[Buffer]
    outputs: list[Buffer]
    buffers: list[Buffer]
    # temp buffers whose last use is each step (freed after it)
    frees: list[list[Buffer]] = dataclasses.field(default_factory=list)
    # buffer -> dead temporary of the same size whose memory it takes instead of allocating
    reuse: dict[Buffer, Buffer] = dataclasses.field(default_factory=dict)

    @property
    def kernels(self) -> list[Kernel]:
        return [step for step in self.steps if isinstance(step, Kernel)]

    def describe(self) -> str:
        lines = []
        for step in self.steps:
            if isinstance(step, Kernel):
                kind = f"reduce over {list(step.axes)}" if step.axes else "pointwise"
                if step.matmul is not None:
                    kind = f"matmul {step.matmul.node!r} then {kind}"
                stores = ", ".join(f"{s.node!r}->{s.buffer}" for s in step.stores)
                lines.append(f"{step.name}: {kind} {list(step.shape)} "
                             f"members {step.members} stores [{stores}]")
            elif isinstance(step, LibraryCall):
                target = getattr(step.node.attrs["target"], "__name__", "?")
                lines.append(f"library {target}({step.inputs}) -> {step.outputs}")
            else:
                lines.append(f"copy {step.source} -> {step.target}")
        return "\n".join(lines)
