"""What the C and Triton kernel writers share: nested scopes of emitted lines, and index
expressions as text."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ember.schedule.expr import Atom, Expr


@dataclasses.dataclass(eq=False)
class Scope:
    """A block of emitted lines inside `parent`; `memo` holds the values computed in it."""

    parent: Scope | None
    depth: int
    header: str = ""                # (Triton) the loop statement a row scope is the body of
    row: str = ""                   # (Triton) the row index variable of a row scope
    lines: list[str] = dataclasses.field(default_factory=list)
    memo: dict = dataclasses.field(default_factory=dict)

    def chain(self):
        scope = self
        while scope is not None:
            yield scope
            scope = scope.parent


def render_sum(expr: Expr, atom: Callable[[Atom], str], number: Callable[[int], str] = str,
               times: str = " * ") -> str:
    """`expr` as a sum of `coefficient times atom` terms and a constant."""
    parts = []
    for term, coefficient in expr.terms:
        text = atom(term)
        if coefficient == 1:
            parts.append(text)
        elif coefficient == -1:
            parts.append(f"-{text}")
        else:
            parts.append(f"{number(coefficient)}{times}{text}")
    if expr.const or not parts:
        parts.append(number(expr.const))
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]
