"""The `lowerings` table: aten op → function that builds IR primitives.

A rule is called as rule(builder, *args, **kwargs) with every tensor argument replaced by its
IR node and every other argument as eager received it. It returns a node, or a tuple/list of
nodes for ops with several results. It raises `Decline` when it cannot handle a case (an
unsupported dtype, say); the op then becomes a library node that calls the aten op at run time.
`ByDesign` says the same of a case the library is meant to run (not a fallback).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Rule = Callable[..., Any]
lowerings: dict[Any, Rule] = {}


class Decline(Exception):
    """A rule's way of saying "call the aten op at run time instead" (with the reason)."""


class ByDesign(Decline):
    """A rule's way of saying "this case is the library's, by design" (a convolution other
    than those ember computes): called at run time as a declined op is, but neither logged
    nor counted as a fallback."""


class Unsupported(Exception):
    """The graph cannot be compiled as it is (the caller runs it eagerly and logs why).
    `node`: the name of the FX node being lowered when it was raised (that node can run as an
    eager island in a compiled graph), and `reason` what was said then; None: the graph as a
    whole."""

    node: str | None = None
    reason: str | None = None

    def at(self, node: str) -> None:
        if self.node is None:
            self.node, self.reason = node, str(self)


def lowering(*targets: Any) -> Callable[[Rule], Rule]:
    """Register a rule for aten overloads or whole packets (every overload of an op)."""

    def register(fn: Rule) -> Rule:
        for target in targets:
            lowerings[target] = fn
        return fn

    return register


def find_rule(func: Any) -> Rule | None:
    rule = lowerings.get(func)
    if rule is None:
        rule = lowerings.get(getattr(func, "overloadpacket", None))
    return rule


aten = torch.ops.aten
