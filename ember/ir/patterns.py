"""Shapes of IR that several layers recognize: what a mean broadcast back looks like."""

from __future__ import annotations

import math

from ember.ir.graph import Node
from ember.ir.ops import Op


def grown_axes(expand: Node) -> list[int]:
    """The dims an EXPAND broadcasts (size 1 in its input, more in its result)."""
    source = expand.inputs[0]
    return [d for d, (a, c) in enumerate(zip(source.shape, expand.shape)) if a == 1 and c != 1]


def broadcast_mean(expand: Node) -> Node | None:
    """The sum of x where `expand` broadcasts back x's mean over exactly the dims it grows —
    `sum_A(x) / n`, n the count of A's elements, kept dims, x of the expand's shape — else
    None. (`x - expand` is then x centered over A: a normalization's deviation.)"""
    if expand.op is not Op.EXPAND:
        return None
    axes, center = grown_axes(expand), expand.inputs[0]
    if not axes or center.op is not Op.DIV or center.inputs[1].op is not Op.FULL:
        return None
    total, count = center.inputs
    if total.op is not Op.SUM or sorted(total.attrs.get("axes") or ()) != axes or \
            total.shape != center.shape:
        return None
    x = total.inputs[0]
    if x.shape != expand.shape or \
            count.attrs.get("value") != math.prod(x.shape[d] for d in axes):
        return None
    return total
