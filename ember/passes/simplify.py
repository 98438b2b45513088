"""simplify_algebra: exact identities only (x*1, x-0, neg(neg x), view chains, round trips).

Every rewrite here gives bit-identical results, NaN and signed zeros included; anything that
is only "equal in real arithmetic" (x+0 turns -0.0 into 0.0) is left alone.
"""

from __future__ import annotations

import math

import torch

from ember.ir import dtypes
from ember.ir.graph import Graph, Node
from ember.ir.ops import Op
from ember.passes.rewrite import rewrite


def _is_constant(node: Node, value) -> bool:
    """A full of exactly `value` (a zero must be +0.0: x - (-0.0) is not x for x = -0.0)."""
    if node.op is not Op.FULL or node.attrs["value"] != value:
        return False
    return math.copysign(1.0, node.attrs["value"]) > 0 if value == 0 else True


_FLOAT_WIDTH = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}


def _widens_exactly(narrow: torch.dtype, wide: torch.dtype) -> bool:
    """Every value of `narrow` survives a round trip through `wide`."""
    if narrow is torch.bool:
        return True
    if narrow in _FLOAT_WIDTH and wide in _FLOAT_WIDTH:
        return _FLOAT_WIDTH[narrow] < _FLOAT_WIDTH[wide]
    if dtypes.is_integral(narrow) and dtypes.is_integral(wide):
        if narrow.is_signed == wide.is_signed:
            return narrow.itemsize <= wide.itemsize
        return not narrow.is_signed and narrow.itemsize < wide.itemsize
    return False


def simplify_algebra(graph: Graph) -> int:
    def visit(node: Node) -> Node | None:
        op, sources = node.op, node.inputs
        if op is Op.MUL:
            a, b = sources
            if _is_constant(b, 1):
                return a
            if _is_constant(a, 1):
                return b
        if op is Op.DIV and _is_constant(sources[1], 1):
            return sources[0]
        if op is Op.SUB and _is_constant(sources[1], 0):
            return sources[0]
        if op is Op.NEG and sources[0].op is Op.NEG:
            return sources[0].inputs[0]
        if op is Op.CAST:
            inner = sources[0]
            if inner.dtype == node.dtype:
                return inner
            if inner.op is Op.CAST and inner.inputs[0].dtype == node.dtype \
                    and _widens_exactly(node.dtype, inner.dtype):
                return inner.inputs[0]
        if op is Op.RESHAPE and sources[0].op in (Op.RESHAPE, Op.SQUEEZE, Op.UNSQUEEZE):
            inner = sources[0].inputs[0]
            if inner.shape == node.shape:
                return inner
            return graph.add(Op.RESHAPE, (inner,), shape=node.shape)
        if op in (Op.SQUEEZE, Op.UNSQUEEZE) and sources[0].op in (Op.SQUEEZE, Op.UNSQUEEZE) \
                and sources[0].inputs[0].shape == node.shape:
            return sources[0].inputs[0]
        if op is Op.PERMUTE and sources[0].op is Op.PERMUTE:
            inner_perm = sources[0].attrs["perm"]
            perm = tuple(inner_perm[p] for p in node.attrs["perm"])
            inner = sources[0].inputs[0]
            if perm == tuple(range(len(perm))):
                return inner
            return graph.add(Op.PERMUTE, (inner,), perm=perm)
        if op is Op.EXPAND and sources[0].op is Op.EXPAND:
            return graph.add(Op.EXPAND, (sources[0].inputs[0],), shape=node.shape)
        return None

    return rewrite(graph, visit)
