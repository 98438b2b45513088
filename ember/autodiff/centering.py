"""A centered value sums to zero: the backward of `x - mean(x)` drops what it knows is zero.

A normalization (batch, layer, group or instance norm; a user's own `x - x.mean(d, True)`)
centers its input: `d = x - expand(sum_A(x) / n)`. The gradient of the mean is
`-sum_A(g_d) / n`, and wherever `g_d` holds a term `c * d` with `c` constant along A (the
variance's path: `2 * d * g_var / n`), that term's sum is `c * sum_A(d)`, which is zero. Eager's
closed-form backwards never compute it; ember's autodiff, which differentiates the forward's
primitives, would, and the sum would read every element of `d` once more after the variance's
own sum: one more pass over a batch norm's whole activation (a second level of split
reductions on the GPU: ResNet-50's backward read each activation three times where eager's and
Inductor's read it twice). Dropping the term also agrees with eager better: its computed value
is rounding noise.
"""

from __future__ import annotations

from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.ir.patterns import broadcast_mean

_DEPTH = 8  # terms looked for this deep in a cotangent's sums


def centering_subtractions(expand: Node, users: dict[Node, list[Node]]) -> list[Node]:
    """The forward's `x - expand` nodes where `expand` broadcasts back the mean of that `x`
    over exactly the dims it grows."""
    total = broadcast_mean(expand)
    if total is None:
        return []
    return [user for user in users.get(expand, ())
            if user.op is Op.SUB and user.inputs[0] is total.inputs[0] and
            user.inputs[1] is expand]


def terms(node: Node, sign: int = 1, depth: int = _DEPTH) -> list[tuple[int, Node]]:
    """`node` as a signed sum of terms, through ADD, SUB and NEG (`depth` of them at most)."""
    if depth and node.op in (Op.ADD, Op.SUB) and node.inputs[0].shape == node.shape and \
            node.inputs[1].shape == node.shape and node.inputs[0].dtype == node.dtype and \
            node.inputs[1].dtype == node.dtype:
        other = sign if node.op is Op.ADD else -sign
        return terms(node.inputs[0], sign, depth - 1) + \
            terms(node.inputs[1], other, depth - 1)
    if depth and node.op is Op.NEG:
        return terms(node.inputs[0], -sign, depth - 1)
    return [(sign, node)]


def sums_to_zero(term: Node, axes: list[int], centered: set[Node]) -> bool:
    """Is `term` a centered value times (or over) factors constant along `axes` (its sum
    along them is zero)?"""
    if term in centered:
        return True
    if term.op is Op.NEG:
        return sums_to_zero(term.inputs[0], axes, centered)
    if term.op is Op.MUL:
        a, c = term.inputs
        return (constant_along(c, axes) and sums_to_zero(a, axes, centered)) or \
            (constant_along(a, axes) and sums_to_zero(c, axes, centered))
    if term.op is Op.DIV:
        return constant_along(term.inputs[1], axes) and \
            sums_to_zero(term.inputs[0], axes, centered)
    return False


def constant_along(node: Node, axes: list[int]) -> bool:
    """Does `node` take one value along `axes` (size 1 there, or broadcast from such)?"""
    while node.op is Op.EXPAND:
        node = node.inputs[0]
    return node.op is Op.FULL or all(node.shape[d] == 1 for d in axes if d < node.ndim) and \
        node.ndim >= max(axes, default=-1) + 1
