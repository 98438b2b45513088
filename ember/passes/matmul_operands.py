"""Matmul operands as the library wants them.

whole_biased_matmuls: a matmul whose bias add nothing else fuses with is addmm again.

matmuls_onto_sums: a matmul added to a value of its own shape, the sum an output that nothing
else reads (a tied weight's gradient), is addmm onto that value.

transposed_weights: mm(x, w.T) becomes linear(x, w), so a Linear layer's call does not build a
transposed view of its weight in Python on every call (the transpose happens inside the
library call, as eager's own Linear does).

aligned_matmuls: on CUDA, a large half-precision matmul whose inner or output size is not a
multiple of 16 bytes is called on zero-padded operands and its result sliced (below).
"""

from __future__ import annotations

import math

import torch

from ember import config
from ember.ir.graph import Graph, Node, row_major
from ember.ir.library import Slot
from ember.ir.ops import VIEWS, Op
from ember.passes.rewrite import rewrite

aten = torch.ops.aten


def whole_biased_matmuls(graph: Graph) -> int:
    """add(mm(x, y), bias broadcast over rows) -> addmm(bias, x, y) where the sum is read only
    by library calls (through views: a Q/K/V projection read by attention), or is stored
    anyway, an output (a biased head's logits, which a loss then reads: BERT's add of the
    bias was a pass of its own over 2048 x 30522 logits, a write and a read more than
    torch.compile's addmm on the H200). Lowering splits
    addmm into a product and an add so that the add fuses with the pointwise work after it;
    with none there, the add would be a kernel of its own, a pass over the product that
    eager's addmm (the bias as BLAS's beta term) does not make. Then the values are eager's
    too: BLAS adds the bias into its accumulation, not after it."""
    users = graph.users()
    outputs = set(graph.outputs)

    def read_by_libraries_only(node: Node) -> bool:
        """(a view nothing reads is dead code: it reads nothing either)"""
        return node not in outputs and all(
            r.op is Op.LIBRARY or (r.op in VIEWS and read_by_libraries_only(r))
            for r in users.get(node, []))

    def stored(node: Node) -> bool:
        """Is `node` an output, or viewed by one: stored whoever computes it?"""
        return node in outputs or any(r.op in VIEWS and stored(r) for r in users.get(node, []))

    def visit(node: Node) -> Node | None:
        if node.op is not Op.ADD or len(node.inputs) != 2:
            return None
        product, bias = node.inputs
        if product.op is not Op.LIBRARY or product.attrs["target"] is not aten.mm.default \
                or product.attrs["kwargs"] or len(users.get(product, [])) != 1 \
                or product in outputs:
            return None
        row = _row_broadcast(bias, product.shape)
        if row is None or row.dtype != product.dtype or node.dtype != product.dtype or \
                not (stored(node) or users.get(node) and read_by_libraries_only(node)):
            return None
        x, y = product.inputs
        call = graph.add(Op.LIBRARY, (row, x, y), target=aten.addmm.default,
                         args=(Slot(0), Slot(1), Slot(2)), kwargs={},
                         results=product.attrs["results"], tuple_result=False)
        call.strides = product.strides
        return call

    return rewrite(graph, visit)


def matmuls_onto_sums(graph: Graph) -> int:
    """add(mm(x, y), c) -> addmm(c, x, y) where c has the product's shape and dtype and the
    sum is a graph output that no kernel reads. A weight used twice gets the sum of two
    gradients: a language model's embedding tied to its head (BERT, GPT-2, T5) added its
    head's product (vocabulary x hidden) to its lookup's in a kernel of its own, a pass over
    three such arrays, one of them a fresh output; BLAS adds c as its beta term instead,
    as torch.compile's addmm does; an output's bias add (a last linear layer) likewise becomes
    eager's linear. (A kernel that reads the sum keeps the add: it fuses there.)"""
    users = graph.users()
    outputs = set(graph.outputs)

    def visit(node: Node) -> Node | None:
        if node.op is not Op.ADD or len(node.inputs) != 2 or node not in outputs or \
                any(r.op is not Op.LIBRARY for r in users.get(node, [])):
            return None
        for product, other in (node.inputs, reversed(node.inputs)):
            if product.op is Op.LIBRARY and product.attrs["target"] is aten.mm.default \
                    and not product.attrs["kwargs"] and len(users.get(product, [])) == 1 \
                    and product not in outputs and other.shape == product.shape \
                    and other.dtype == product.dtype == node.dtype and other is not product:
                x, y = product.inputs
                # (a bias broadcast over rows goes in whole: transposed_weights then makes an
                # output's biased linear eager's linear call)
                row = _row_broadcast(other, product.shape)
                call = graph.add(Op.LIBRARY, (row if row is not None else other, x, y),
                                 target=aten.addmm.default,
                                 args=(Slot(0), Slot(1), Slot(2)), kwargs={},
                                 results=product.attrs["results"], tuple_result=False)
                call.strides = product.strides
                return call
        return None

    return rewrite(graph, visit)


def _row_broadcast(node: Node, shape: tuple[int, ...]) -> Node | None:
    """The (n,) vector `node` broadcasts over the rows of an (m, n) `shape`, or None."""
    if len(shape) != 2:
        return None
    if node.op is Op.EXPAND and node.shape == shape:
        node = node.inputs[0]
    if node.op is Op.UNSQUEEZE and node.attrs.get("dim") == 0 and node.shape == (1, shape[1]):
        node = node.inputs[0]
    return node if node.shape == (shape[1],) else None


def transposed_weights(graph: Graph) -> int:
    """mm(x, w.T) -> linear(x, w); addmm(b, x, w.T) with a bias per output column and no
    scaling -> linear(x, w, b) (which eager's linear calls addmm for: the same product and
    the same bias epilogue)."""
    def visit(node: Node) -> Node | None:
        if node.op is not Op.LIBRARY or node.attrs["tuple_result"]:
            return None
        target = node.attrs["target"]
        if target is aten.mm.default and not node.attrs["kwargs"]:
            bias, (x, y) = None, node.inputs
        elif target is aten.addmm.default and node.attrs["kwargs"] in ({}, {"beta": 1,
                                                                           "alpha": 1}):
            bias, x, y = node.inputs
            if bias.shape != (y.shape[1],) or bias.dtype != x.dtype:
                return None
        else:
            return None
        if node.attrs["args"] != tuple(Slot(i) for i in range(len(node.inputs))) or \
                y.op is not Op.PERMUTE or y.attrs["perm"] != (1, 0):
            return None
        operands = (x, y.inputs[0]) if bias is None else (x, y.inputs[0], bias)
        call = graph.add(Op.LIBRARY, operands, target=torch._C._nn.linear,
                         args=tuple(Slot(i) for i in range(len(operands))), kwargs={},
                         results=node.attrs["results"], tuple_result=False)
        call.strides = node.strides
        return call

    return rewrite(graph, visit)


# -- aligned_matmuls: pad a large half-precision matmul's odd dims to a multiple of 8 ---------
# cuBLAS's fast kernels (tensor-core tiles loaded by TMA) need every leading dimension a
# multiple of 16 bytes. A GPT-2 head (vocab 50257) gives an output whose rows are 50257
# elements apart, and cuBLAS falls back to a legacy kernel: 1.68 ms on the H200 where the
# padded call takes 0.23 ms. Padding costs a copy of the padded operand (the weight: 0.04 ms)
# and a slice of the result, which the kernel that reads it (or the copy into the output's
# layout) absorbs. Zero rows and columns add exact zeros, so the values are eager's.
ALIGN_BYTES = 16
# multiply-adds below which a misaligned call is cheap anyway (the copies would dominate)
PAD_MIN_WORK = 1 << 30

# target: (position of the left operand among the node's inputs, of the right one, of the bias
# or None, whether the right operand is stored transposed as linear's weight is)
_OPERANDS = {
    aten.mm.default: (0, 1, None, False),
    aten.bmm.default: (0, 1, None, False),
    aten.addmm.default: (1, 2, 0, False),
    aten.baddbmm.default: (1, 2, 0, False),
    torch._C._nn.linear: (0, 1, 2, True),
}


def aligned_matmuls(graph: Graph) -> int:
    mode = config.settings.shape_padding
    if mode == "never" or (mode == "auto" and graph.device.type != "cuda"):
        return 0

    def visit(node: Node) -> Node | None:
        if node.op is not Op.LIBRARY or node.attrs["tuple_result"]:
            return None
        roles = _OPERANDS.get(node.attrs["target"])
        if roles is None or node.dtype.itemsize > 2 or not node.dtype.is_floating_point:
            return None
        if node.attrs["args"] != tuple(Slot(i) for i in range(len(node.inputs))):
            return None  # (only calls whose arguments are exactly their inputs, in order)
        left, right, bias, transposed = roles
        a, b = node.inputs[left], node.inputs[right]
        k = a.shape[-1]
        n = b.shape[-2] if transposed else b.shape[-1]
        align = ALIGN_BYTES // node.dtype.itemsize
        padded_k, padded_n = _round_up(k, align), _round_up(n, align)
        if (padded_k, padded_n) == (k, n) or math.prod(a.shape) * n < PAD_MIN_WORK:
            return None
        inputs = list(node.inputs)
        inputs[left] = _pad_last(graph, a, {a.ndim - 1: padded_k - k})
        if transposed:  # weight [n, k]
            inputs[right] = _pad_last(graph, b, {0: padded_n - n, 1: padded_k - k})
        else:  # [..., k, n]
            inputs[right] = _pad_last(graph, b, {b.ndim - 2: padded_k - k,
                                                 b.ndim - 1: padded_n - n})
        if bias is not None and bias < len(inputs) and inputs[bias].ndim \
                and inputs[bias].shape[-1] == n and padded_n != n:
            inputs[bias] = _pad_last(graph, inputs[bias], {inputs[bias].ndim - 1: padded_n - n})
        shape = node.shape[:-1] + (padded_n,)
        strides = row_major(shape)
        call = graph.add(Op.LIBRARY, inputs, target=node.attrs["target"],
                         args=node.attrs["args"], kwargs=node.attrs["kwargs"],
                         results=((shape, node.dtype, strides),), tuple_result=False)
        call.strides = strides
        if padded_n == n:
            return call
        return graph.add(Op.SLICE, (call,), dim=node.ndim - 1, start=0, stop=n, step=1)

    return rewrite(graph, visit)


def _round_up(size: int, align: int) -> int:
    return -(-size // align) * align


def _pad_last(graph: Graph, x: Node, extra: dict[int, int]) -> Node:
    """x with `extra[d]` zeros appended along each dim d; a transposed view is padded before
    its transpose, so that the copy reads and writes in the same order."""
    if not any(extra.values()):
        return x
    if x.op is Op.PERMUTE:
        perm = x.attrs["perm"]
        inner = _pad_last(graph, x.inputs[0], {perm[d]: more for d, more in extra.items()})
        return graph.add(Op.PERMUTE, (inner,), perm=perm)
    pads = tuple((0, extra.get(d, 0), 0) for d in range(x.ndim))
    return graph.add(Op.PAD, (x,), pads=pads, value=0)
