"""What the C and Triton kernel writers share: nested scopes of emitted lines, and index
expressions as text."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from ember.ir.sizes import Dim, Size
from ember.schedule.expr import Atom, Div, Expr, Mod, Opaque, Var


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
    if not (isinstance(expr.const, int) and expr.const == 0) or not parts:
        parts.append(number(expr.const))
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]


# -- C index text (ember/codegen/c.py and c_columns.py) -----------------------------------------
def render_c(expr: Expr) -> str:
    return render_sum(expr, _render_c_atom, c_int, "*")


def c_int(value: Dim) -> str:
    """An int (or a symbolic size, over the kernel's size parameters) as C."""
    if isinstance(value, Size):
        return value.render_c()
    return f"INT64_C({value})" if abs(value) >= 2 ** 31 else str(value)


def _c_divisor(value: Dim) -> str:
    text = c_int(value)  # (x / 4*s0 would divide by 4 and multiply by s0)
    return f"({text})" if "*" in text and not text.startswith("(") else text


# the symbols a kernel's text names (its size parameters): s0, s1, ...
SYMBOL_NAME = re.compile(r"\bs\d+\b")


def _render_c_atom(atom) -> str:
    if isinstance(atom, (Var, Opaque)):
        return atom.name
    if isinstance(atom, Div):
        return f"({render_c(atom.expr)} / {_c_divisor(atom.divisor)})"
    if isinstance(atom, Mod):
        return f"({render_c(atom.expr)} % {_c_divisor(atom.divisor)})"
    raise TypeError(atom)
