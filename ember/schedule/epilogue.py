"""Matmul epilogue fusion (Triton backend): a small matrix product whose only reader is one
pointwise kernel over its result is computed by that kernel, tile by tile, instead of by a
library call that writes the product to memory for the kernel to read back.

    library linear(x, w) -> lib1                kernel0: matmul linear(x, w) then pointwise
    kernel0: pointwise [M, N] reads lib1   =>            (bias, tanh, ...) on the tile

For a chain of small layers (a deep, thin MLP) this halves the launches and removes each
product's round trip through memory. Large products stay with cuBLAS, which is faster there
than a simple Triton matmul; so do products whose result anything else reads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ember.ir.sizes import guess
from ember.schedule.fuse import reuse_memory
from ember.schedule.plan import Buffer, Kernel, LibraryCall, Matmul, Plan

aten = torch.ops.aten
# (target, whether the second operand is stored transposed, as linear's weight is)
_PRODUCTS = {torch._C._nn.linear: True, aten.mm.default: False}
_DTYPES = (torch.float32, torch.float16)
# Fuse when the product is small: up to this many multiply-adds (where a cuBLAS call is a
# few microseconds of launch-bound work: measured on the H200 at 64x256x256, 4.2M; larger
# products are not measured yet and stay with cuBLAS), and a second operand of at most this
# many elements (a weight read once per row-tile; beyond this cuBLAS's split-K kernels read
# it faster).
MAX_MACS = 1 << 22
MAX_B_ELEMENTS = 1 << 20


def fuse_matmul_epilogues(plan: Plan, find_readers: Callable[[Plan], dict[Buffer, list[int]]],
                          reads_elsewhere: Callable[[Kernel, Plan], bool]) -> int:
    """Fold each fusable library product into the kernel that reads it; `find_readers(plan)`
    maps each buffer to the positions of the steps that read it (asked once, where some
    product is small enough: it writes every kernel); `reads_elsewhere(kernel, plan)` says
    whether a kernel given a matmul reads the product anywhere but at its own position (a
    tile holds only its own part). Returns how many were folded."""
    folded = 0
    position = 0
    readers: dict[Buffer, list[int]] | None = None
    while position < len(plan.steps):
        step = plan.steps[position]
        consumer = None
        if isinstance(step, LibraryCall) and _fusable_product(plan, step):
            readers = find_readers(plan) if readers is None else readers
            consumer = _consumer(plan, position, readers)
        if consumer is None:
            position += 1
            continue
        kernel = plan.steps[consumer]
        a, b = step.inputs
        kernel.matmul = Matmul(step.node, step.outputs[0], a, b,
                               _PRODUCTS[step.node.attrs["target"]])
        if reads_elsewhere(kernel, plan):
            kernel.matmul = None
            position += 1
            continue
        # the call's step goes; what it last used is now last used by the kernel, and so is
        # an operand's memory that a step in between last used (Llama 4's backward: the
        # product's operand also read, through a view, by another product before the kernel)
        operands = {a.root(), b.root()}
        moved = list(plan.frees[position])
        for between in range(position + 1, consumer):
            kept = []
            for buffer in plan.frees[between]:
                (moved if buffer.root() in operands else kept).append(buffer)
            plan.frees[between] = kept
        plan.frees[consumer] = plan.frees[consumer] + moved
        for frees in plan.frees:
            if step.outputs[0] in frees:
                frees.remove(step.outputs[0])
        del plan.steps[position]
        del plan.frees[position]
        for buffer, positions in readers.items():
            readers[buffer] = [p - (p > position) for p in positions if p != position]
        folded += 1
    if folded:  # a kernel now reads what the removed call read: lifetimes changed
        plan.reuse = reuse_memory(plan)
    return folded


def _fusable_product(plan: Plan, step: LibraryCall) -> bool:
    """Is this library call a product a kernel could compute (its kind, operands and size),
    its result read by kernels only?"""
    node = step.node
    transposed = _PRODUCTS.get(node.attrs["target"])
    if transposed is None or len(step.inputs) != 2 or len(step.outputs) != 1 or \
            node.attrs["kwargs"] or node.attrs.get("tuple_result"):
        return False
    a, b = step.inputs
    result = step.outputs[0]
    if result is None or not _matrix(a) or not _matrix(b) or not _matrix(result) or \
            not a.dtype == b.dtype == result.dtype or a.dtype not in _DTYPES:
        return False
    m, k = a.shape
    n = b.shape[0] if transposed else b.shape[1]
    # (a symbolic size is taken at its guess: a heuristic; any size is computed correctly)
    if (b.shape[1] if transposed else b.shape[0]) != k or result.shape != (m, n) or \
            min(map(guess, (m, n, k))) < 16 or guess(m * n * k) > MAX_MACS or \
            guess(k * n) > MAX_B_ELEMENTS:
        return False
    return not (any(output.root() is result for output in plan.outputs) or
                result in plan.reuse or result in plan.reuse.values())


def _consumer(plan: Plan, position: int, readers: dict[Buffer, list[int]]) -> int | None:
    """The position of the kernel that can compute this (fusable) product, if any."""
    step = plan.steps[position]
    a, b = step.inputs
    result = step.outputs[0]
    m, n = result.shape
    users = readers.get(result, [])
    if len(users) != 1:
        return None
    consumer = plan.steps[users[0]]
    if not isinstance(consumer, Kernel) or consumer.axes or consumer.matmul is not None or \
            consumer.shape != (m, n):
        return None
    # nothing in between may write the operands (a write-back into a graph input)
    for between in plan.steps[position + 1:users[0]]:
        written = {s.buffer.root() for s in between.stores} if isinstance(between, Kernel) \
            else {getattr(between, "target", None)}
        if a.root() in written or b.root() in written:
            return None
    return users[0]


def _matrix(buffer: Buffer) -> bool:
    return len(buffer.shape) == 2
