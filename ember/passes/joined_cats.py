"""A cat of many inputs made by one call of torch.cat on the CPU, into a buffer laid out as
most of its inputs lie.

Inlined into the kernels that read it, a cat is a chain of selects: every element loads each
of its inputs and keeps one, so a cat of k inputs costs k loads an element in every kernel,
and every pass of a kernel, that reads it. DenseNet's layers each normalize the features of
all the layers before them (cats of up to 32 inputs, each read by a batch norm's three
passes): DenseNet-121's training step took 1.7x eager's time on the CPU, most of it in those
norms (a 4x992x4x4 one: 2.4 ms). Joined once by torch.cat, the cat costs one read and one
write an element, and its readers read one buffer. The result takes the layout of the
inputs whose layout is known before scheduling (library results, the graph's inputs), by
their elements: a channels-last convolution's features joined channels-last (a cat across
layouts runs 3-7x slower than one within a layout, single-threaded).

Only cats of `JOINED_INPUTS` inputs or more, of at least `JOINED_ELEMENTS` elements: a cat of
two (rotary embeddings' halves, a KV cache's step) or a small one stays inlined, where its
selects cost less than a call and a buffer. On CUDA, Triton's kernels keep them (their
selects are not yet measured against a call there).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ember.ir.graph import Graph, Node, row_major
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.passes.rewrite import rewrite
from ember.schedule.layout import dense_order, strides_in_order

JOINED_INPUTS = 3
JOINED_ELEMENTS = 16384


@dataclasses.dataclass(frozen=True)
class JoinedCall:
    """torch.cat(tensors, dim) into a buffer of `strides`: the library call's target."""

    dim: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    __name__ = "cat"  # (what plans and profiles call it)

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        out = torch.empty_strided(self.shape, self.strides, dtype=self.dtype,
                                  device=tensors[0].device)
        return torch.cat(tensors, self.dim, out=out)


def joined_cats(graph: Graph) -> int:
    """Make each large cat of many inputs one call of torch.cat; changes made."""
    if graph.device.type != "cpu":
        return 0

    def visit(node: Node) -> Node | None:
        if node.op is not Op.CAT or len(node.inputs) < JOINED_INPUTS or \
                any(type(d) is not int for n in (node, *node.inputs) for d in n.shape) or \
                math.prod(node.shape) < JOINED_ELEMENTS:
            return None
        strides = _most_read_layout(node)
        target = JoinedCall(node.attrs["dim"], tuple(node.shape), strides, node.dtype)
        call = graph.add(Op.LIBRARY, node.inputs, target=target,
                         args=tuple(Slot(i) for i in range(len(node.inputs))), kwargs={},
                         results=((tuple(node.shape), node.dtype, strides),),
                         tuple_result=False)
        call.strides = strides
        return call

    return rewrite(graph, visit)


def _most_read_layout(node: Node) -> tuple[int, ...]:
    """The strides, for the cat's shape, of the dense order that most of its inputs' elements
    have among those whose layout is known now; row-major where none is."""
    elements: dict[tuple[int, ...], int] = {}
    for source in node.inputs:
        if source.strides is None or len(source.strides) != node.ndim:
            continue
        order = dense_order(source.shape, source.strides)
        if order is not None:
            elements[tuple(order)] = elements.get(tuple(order), 0) + math.prod(source.shape)
    if not elements:
        return row_major(node.shape)
    return strides_in_order(node.shape, list(max(elements, key=elements.__getitem__)))
