"""Where a captured value came from, as a Python expression evaluated at call time.

Guards check values through their sources and the compiled function fetches its tensor inputs
through them. Expressions are written over `L` (the frame's arguments by name), `G` (the
function's globals), `GG` (globals of other functions it calls), `C` (its closure cells) and
`K` (objects the entry keeps), so guard code reads like the user's code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


class Source:
    def expr(self) -> str:
        raise NotImplementedError

    def over(self, part: Callable[[Source], str]) -> str:
        """The expression with each source it reads from written by `part` (the guards write
        their variables: guards._Writer); expr() writes them whole."""
        return self.expr()

    def evaluate(self, scope: dict[str, Any]) -> Any:
        return eval(self.expr(), {}, scope)  # noqa: S307 (our own expressions)

    def __str__(self) -> str:
        return self.expr()


@dataclasses.dataclass(frozen=True)
class LocalSource(Source):
    name: str

    def expr(self) -> str:
        return f"L[{self.name!r}]"


@dataclasses.dataclass(frozen=True)
class GlobalSource(Source):
    """A global of the compiled function (index 0, `G`) or of another function it calls
    (`GG[index]`, the globals dicts the entry keeps)."""

    name: str
    index: int = 0

    def expr(self) -> str:
        if self.index == 0:
            return f"G[{self.name!r}]"
        return f"GG[{self.index}][{self.name!r}]"


@dataclasses.dataclass(frozen=True)
class ClosureSource(Source):
    index: int
    name: str

    def expr(self) -> str:
        return f"C[{self.index}].cell_contents"


@dataclasses.dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    attr: str
    # read as object.__getattribute__ reads it, past a class's own __getattribute__ (which
    # the capture inlined: attributes.object_attribute)
    past_hooks: bool = False

    def expr(self) -> str:
        return self.over(_whole)

    def over(self, part: Callable[[Source], str]) -> str:
        if self.past_hooks:
            return f"object.__getattribute__({part(self.base)}, {self.attr!r})"
        if self.attr.isidentifier() and not self.attr.startswith("__"):
            return f"{part(self.base)}.{self.attr}"
        return f"getattr({part(self.base)}, {self.attr!r})"


@dataclasses.dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: Any

    def expr(self) -> str:
        return self.over(_whole)

    def over(self, part: Callable[[Source], str]) -> str:
        return f"{part(self.base)}[{self.key!r}]"


@dataclasses.dataclass(frozen=True)
class CallSource(Source):
    """What calling an object without side effects answers now: a weak reference's referent
    (`ref()`, None once it died) or a method's answer (`logger.isEnabledFor(10)`)."""

    base: Source
    method: str = ""  # "" calls the object itself
    args: tuple = ()
    label: str = ""  # what the call asks, for recompile messages (its expression is terse)

    def expr(self) -> str:
        return self.over(_whole)

    def over(self, part: Callable[[Source], str]) -> str:
        called = f"{part(self.base)}.{self.method}" if self.method else part(self.base)
        arguments = (part(a) if isinstance(a, Source) else repr(a) for a in self.args)
        return f"{called}({', '.join(arguments)})"


def _whole(source: Source) -> str:
    """source.expr(), kept on the source (frozen: its expression never changes; a guard
    set writes a module's paths tens of thousands of times, each through its bases)."""
    found = source.__dict__.get("_expression")
    if found is None:
        found = source.expr()
        object.__setattr__(source, "_expression", found)
    return found


# what every expression read through an iterator's position contains
AHEAD_MARK = ".__reduce__()[1][0]"


@dataclasses.dataclass(frozen=True)
class AheadSource(Source):
    """The item `ahead` places past where an iterator over a list, tuple or range stands, read
    without advancing it (its __reduce__ gives the sequence and the position)."""

    base: Source
    ahead: int

    def expr(self) -> str:
        base = self.base.expr()
        return f"{base}{AHEAD_MARK}[{base}.__reduce__()[2] + {self.ahead}]"


def items_left(iterator: Source) -> Source:
    """How many items an iterator over a list, tuple or range has left."""
    return CallSource(iterator, "__length_hint__")


def advance(iterator: Any, count: int) -> None:
    """Take `count` items from a real iterator (what the captured code took from it)."""
    for _ in range(count):
        next(iterator)


@dataclasses.dataclass(frozen=True)
class ArithmeticSource(Source):
    """`left op right` of numbers, each a Source or a number (a running total)."""

    op: str
    left: Any
    right: Any

    def expr(self) -> str:
        def side(value: Any) -> str:
            return value.expr() if isinstance(value, Source) else repr(value)

        return f"({side(self.left)} {self.op} {side(self.right)})"


@dataclasses.dataclass(frozen=True)
class FormatSource(Source):
    """A number formatted as an f-string's `{value!conversion:spec}` formats it."""

    base: Source
    conversion: int
    spec: str

    def expr(self) -> str:
        value = self.base.expr()
        value = {0: value, 1: f"str({value})", 2: f"repr({value})",
                 3: f"ascii({value})"}[self.conversion]
        return f"format({value}, {self.spec!r})"


@dataclasses.dataclass(frozen=True)
class JoinSource(Source):
    """Strings joined: each piece a Source or a str."""

    parts: tuple

    def expr(self) -> str:
        pieces = ", ".join(p.expr() if isinstance(p, Source) else repr(p) for p in self.parts)
        return f"''.join([{pieces}])"


@dataclasses.dataclass(frozen=True)
class NumberTensorSource(Source):
    """A Python number read as a 0-d tensor (a graph input instead of a constant)."""

    base: Source
    dtype: Any

    def expr(self) -> str:
        return f"torch.tensor({self.base.expr()}, dtype={self.dtype})"


@dataclasses.dataclass(frozen=True)
class ConstantSource(Source):
    """An object reachable from no argument (a tensor created at import time and captured
    by a closure, say): the cache entry keeps it, as `K[index]`."""

    index: int

    def expr(self) -> str:
        return f"K[{self.index}]"


@dataclasses.dataclass(frozen=True)
class EntrySource(Source):
    """An entry of one of a module's own tables (`_parameters`, `_buffers`, `_modules`): what
    `module.weight` or `sequential[3]` resolve to, read with one dict lookup instead of
    Module.__getattr__ (or Sequential.__getitem__, which walks the modules)."""

    base: Source
    table: str
    key: str

    def expr(self) -> str:
        return self.over(_whole)

    def over(self, part: Callable[[Source], str]) -> str:
        return f"{part(self.base)}.{self.table}[{self.key!r}]"
