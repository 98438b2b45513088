"""The gradient of a broadcast, `sum_A(g)`, as few sums as the cotangent allows.

An EXPAND's gradient sums its cotangent over the dims A it grows. Differentiating a
normalization's primitives hands it cotangents that are products, some of whose factors are
constant along A: a batch norm's `(x - mean) * invstd * w + b` gives the scale `invstd` the
gradient `sum_A(dy * w * (x - mean))`, the weight `sum_A(dy * xhat)` with `xhat = (x - mean) *
invstd`, and the mean `-sum_A(dy * w * invstd)`, beside the bias's `sum_A(dy)`: four sums over
the whole activation, four accumulators in the kernel that reads it and four workspaces where
the sum is split. A factor constant along A comes out of the sum (`sum_A(c * h) = c *
sum_A(h)`), and the factors left are multiplied in one order (by node id), so that equal
products become equal nodes and common-subexpression elimination merges their sums: the four
become eager's two, `sum_A(dy)` and `sum_A(dy * (x - mean))`, each times its per-channel
factors. The values are eager's closed form (its batch-norm backward computes these two sums);
against the sums of products, only the roundings' order differs.

Terms that are zero are dropped first (centering.py); a cotangent that is still a sum of
several terms is summed as it is (taking factors out of each would make one sum of several).
EMBER_FACTORED_SUMS=0 leaves the factors in.
"""

from __future__ import annotations

from ember import config
from ember.autodiff.centering import constant_along, sums_to_zero, terms
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.lower.builder import Builder

_FACTORS = 8  # factors of a product looked for, at most


def broadcast_sum(b: Builder, g: Node, axes: list[int], centered: set[Node]) -> Node | None:
    """sum_A(g) with its zero terms dropped and its constant factors taken out, or None where
    neither applies (the plain sum is the answer)."""
    if not axes:
        return None
    found = terms(g)
    kept = [(sign, term) for sign, term in found
            if not (centered and sums_to_zero(term, axes, centered))]
    if not kept:
        return b.full(0, g.dtype, [1 if d in axes else n for d, n in enumerate(g.shape)])
    if len(kept) == 1 and g.dtype.is_floating_point and config.settings.factored_sums:
        factored = _factored_sum(b, *kept[0], axes)
        if factored is not None:
            return factored
    if len(kept) == len(found):
        return None
    value = None
    for sign, term in kept:
        if value is None:
            value = term if sign > 0 else b.unary(Op.NEG, term)
        else:
            value = b.add(value, term) if sign > 0 else b.sub(value, term)
    return b.reduce(Op.SUM, value, axes, keepdim=True)


def _factored_sum(b: Builder, sign: int, term: Node, axes: list[int]) -> Node | None:
    """sign * sum_A(term), its factors constant along A taken out, or None where it has
    none (or a divisor that varies along A)."""
    factors = _factors(term)
    constant = [(op, f) for op, f in factors
                if constant_along(f, axes) and _unexpanded(f).ndim == term.ndim]
    varying = sorted((f for op, f in factors if op is Op.MUL and not constant_along(f, axes)),
                     key=lambda f: f.id)
    if not constant or len(varying) + len(constant) != len(factors):
        return None
    product = varying[0] if varying else None
    for factor in varying[1:]:
        product = b.mul(product, factor)
    if product is None:  # (every factor constant: the sum is the count times the product)
        product = b.full(1, term.dtype, term.shape)
    summed = b.reduce(Op.SUM, product, axes, keepdim=True)
    for op, factor in constant:
        factor = _unexpanded(factor)
        if factor.op is Op.FULL:
            factor = b.full(factor.attrs["value"], factor.dtype, summed.shape)
        summed = b.mul(summed, factor) if op is Op.MUL else b.div(summed, factor)
    return summed if sign > 0 else b.unary(Op.NEG, summed)


def _factors(node: Node) -> list[tuple[Op, Node]]:
    """`node` as a product: (MUL, f) and (DIV, f) factors through MUL and DIV nodes of its own
    shape and dtype (a divisor's own factors are not looked into)."""
    found: list[tuple[Op, Node]] = []
    stack = [(Op.MUL, node)]
    while stack:
        op, current = stack.pop()
        inputs = current.inputs
        if op is Op.MUL and current.op in (Op.MUL, Op.DIV) and \
                len(found) + len(stack) < _FACTORS and \
                all(s.shape == current.shape and s.dtype == current.dtype for s in inputs):
            stack.append((Op.MUL, inputs[0]))
            stack.append((current.op, inputs[1]))
            continue
        found.append((op, current))
    return found


def _unexpanded(node: Node) -> Node:
    while node.op is Op.EXPAND:
        node = node.inputs[0]
    return node
