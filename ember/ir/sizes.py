"""Symbolic sizes below the lowering: a `Size` is a polynomial over named symbols with int
coefficients, in one canonical form, so `==` and `hash` are structural and never guard.

The lowering tracer converts each torch SymInt into a Size once (through torch_internals, the
only place that sees sympy); the IR, the schedule and codegen do plain arithmetic on them.
A question that needs a size's value (`<`, `bool`, `int`) is answered from the symbols' ranges
when they prove it, and otherwise raises `Undecided`: the graph then compiles per shape, never
wrongly.

    Size     := sum(coefficient * Monomial) + const    (at least one non-constant term)
    Monomial := Symbol * Symbol * ...                   (sorted by name)
    Symbol   := name, low <= value <= high (high None: unbounded)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any, Union

Dim = Union[int, "Size"]


class Undecided(Exception):
    """A question about a symbolic size that its symbols' ranges cannot answer (or an
    operation the polynomial form cannot express): the graph is compiled per shape instead."""


@dataclasses.dataclass(frozen=True, order=True)
class Symbol:
    name: str
    low: int = 2
    high: int | None = None


Monomial = tuple[Symbol, ...]


def _monomial_key(monomial: Monomial) -> tuple:
    return (-len(monomial), tuple(s.name for s in monomial))


class Size:
    """A symbolic size (see the module's grammar). Build one with `symbol` or arithmetic;
    arithmetic that cancels every symbol gives back a plain int."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: tuple[tuple[Monomial, int], ...]):
        self.terms = terms
        self._hash = hash(terms)

    # -- construction ----------------------------------------------------------------------
    @staticmethod
    def make(table: Mapping[Monomial, int]) -> Dim:
        """The canonical form of a table monomial -> coefficient (an int if constant)."""
        terms = tuple(sorted(((m, c) for m, c in table.items() if c),
                             key=lambda item: _monomial_key(item[0])))
        if not terms:
            return 0
        if len(terms) == 1 and terms[0][0] == ():
            return terms[0][1]
        return Size(terms)

    def table(self) -> dict[Monomial, int]:
        return dict(self.terms)

    # -- arithmetic ------------------------------------------------------------------------
    def __add__(self, other: Any) -> Dim:
        if not isinstance(other, (int, Size)) or isinstance(other, bool):
            return NotImplemented
        table = self.table()
        for monomial, coefficient in _terms(other):
            table[monomial] = table.get(monomial, 0) + coefficient
        return Size.make(table)

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return Size.make({m: -c for m, c in self.terms})

    def __sub__(self, other: Any) -> Dim:
        if not isinstance(other, (int, Size)) or isinstance(other, bool):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other: Any) -> Dim:
        return (-self) + other

    def __mul__(self, other: Any) -> Dim:
        if not isinstance(other, (int, Size)) or isinstance(other, bool):
            return NotImplemented
        table: dict[Monomial, int] = {}
        for ma, ca in self.terms:
            for mb, cb in _terms(other):
                monomial = tuple(sorted(ma + mb))
                table[monomial] = table.get(monomial, 0) + ca * cb
        return Size.make(table)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Dim:
        """Exact division only (768*s0 // 768, 768*s0 // s0): anything else is a stage-3
        floor-division atom, not expressed here."""
        quotient = exact_quotient(self, other)
        if quotient is None:
            raise Undecided(f"{self} // ({other}) is not exact")
        return quotient

    def __rfloordiv__(self, other: Any) -> Dim:
        if isinstance(other, int) and self.bounds()[0] > abs(other):
            return 0 if other >= 0 else -1
        raise Undecided(f"{other} // {self}")

    def __mod__(self, other: Any) -> Dim:
        if isinstance(other, int) and other > 0 and \
                all(c % other == 0 for m, c in self.terms if m):
            return dict(self.terms).get((), 0) % other
        if exact_quotient(self, other) is not None:
            return 0
        raise Undecided(f"{self} % {other}")

    def __rmod__(self, other: Any) -> Dim:
        raise Undecided(f"{other} % {self}")

    def __truediv__(self, other: Any) -> Any:
        raise Undecided(f"{self} / {other} (a symbolic float)")

    __rtruediv__ = __truediv__

    # -- questions answered from the ranges -----------------------------------------------
    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) value over the symbols' ranges (every symbol is >= 0)."""
        low = high = 0.0
        for monomial, coefficient in self.terms:
            a = math.prod(s.low for s in monomial)
            b = math.prod(math.inf if s.high is None else s.high for s in monomial)
            if coefficient > 0:
                low, high = low + coefficient * a, high + coefficient * b
            else:
                low, high = low + coefficient * b, high + coefficient * a
        return max(low, self._shifted_low(1)), min(high, -self._shifted_low(-1))

    def _shifted_low(self, sign: int) -> float:
        """A lower bound that keeps the terms' correlation (interval sums lose it: 96*s0*s1 -
        96*s1 has interval low -inf): write each symbol as low + t with t >= 0; when every
        term in the t's has a non-negative coefficient, the constant is the lowest value.
        (Of sign * self: sign -1 gives minus the highest value.)"""
        table: dict[tuple[str, ...], int] = {}
        for monomial, coefficient in self.terms:
            expansion = {(): sign * coefficient}
            for s in monomial:
                grown: dict[tuple[str, ...], int] = {}
                for key, value in expansion.items():
                    grown[key] = grown.get(key, 0) + value * s.low
                    longer = tuple(sorted(key + (s.name,)))
                    grown[longer] = grown.get(longer, 0) + value
                expansion = grown
            for key, value in expansion.items():
                table[key] = table.get(key, 0) + value
        if all(value >= 0 for key, value in table.items() if key):
            return table.get((), 0)
        return -math.inf

    def _compare(self, other: Any) -> tuple[float, float]:
        if isinstance(other, float):  # (an index's bound: it may be infinite)
            low, high = self.bounds()
            return low - other, high - other
        if not isinstance(other, (int, Size)):
            raise Undecided(f"{self} compared with {other!r}")
        difference = self - other
        if isinstance(difference, int):
            return difference, difference
        return difference.bounds()

    def __lt__(self, other: Any) -> bool:
        low, high = self._compare(other)
        return _decide(high < 0, low >= 0, self, "<", other)

    def __le__(self, other: Any) -> bool:
        low, high = self._compare(other)
        return _decide(high <= 0, low > 0, self, "<=", other)

    def __gt__(self, other: Any) -> bool:
        low, high = self._compare(other)
        return _decide(low > 0, high <= 0, self, ">", other)

    def __ge__(self, other: Any) -> bool:
        low, high = self._compare(other)
        return _decide(low >= 0, high < 0, self, ">=", other)

    def __eq__(self, other: object) -> bool:
        # NOTE: structural: s0 == 5 is False although s0 may be 5 at run time. Whatever a
        # lowering needed to know about equality, the fake run already guarded.
        return isinstance(other, Size) and self.terms == other.terms

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        low, high = self.bounds()
        if low > 0 or high < 0:
            return True
        raise Undecided(f"is {self} nonzero?")

    def __index__(self) -> int:
        raise Undecided(f"the symbolic size {self} used as an int")

    __int__ = __index__

    # -- values and text -------------------------------------------------------------------
    def symbols(self) -> set[Symbol]:
        return {s for monomial, _ in self.terms for s in monomial}

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        return sum(c * math.prod(bindings[s.name] for s in m) for m, c in self.terms)

    def render(self, number=str) -> str:
        parts = []
        for monomial, coefficient in self.terms:
            names = "*".join(s.name for s in monomial)
            if not monomial:
                parts.append(number(coefficient))
            elif coefficient == 1:
                parts.append(names)
            elif coefficient == -1:
                parts.append(f"-{names}")
            else:
                parts.append(f"{number(coefficient)}*{names}")
        text = " + ".join(parts).replace("+ -", "- ")
        return f"({text})" if len(parts) > 1 else text

    def render_c(self) -> str:
        return self.render(lambda value: f"INT64_C({value})" if abs(value) >= 2 ** 31
                           else str(value))

    def render_python(self) -> str:
        return self.render()

    __str__ = render_python
    __repr__ = render_python


def _terms(value: Dim) -> tuple[tuple[Monomial, int], ...]:
    return value.terms if isinstance(value, Size) else (((), value),)


def exact_quotient(size: Size, divisor: Any) -> Dim | None:
    """size / divisor when it divides exactly (an int divisor > 0 dividing every term, a
    one-term Size, or a polynomial that is a factor: (256*s + 256) // (64*s + 64) is 4,
    DeepSeek-V3's heads from a cache's numel), else None."""
    if isinstance(divisor, Size) and len(divisor.terms) > 1:
        return _polynomial_quotient(size, divisor)
    if isinstance(divisor, int) and not isinstance(divisor, bool):
        if divisor > 0 and all(c % divisor == 0 for _, c in size.terms):
            return Size.make({m: c // divisor for m, c in size.terms})
        return None
    if isinstance(divisor, Size) and len(divisor.terms) == 1:
        (monomial, coefficient), = divisor.terms
        table = {}
        for m, c in size.terms:
            rest = list(m)
            for s in monomial:
                if s not in rest:
                    return None
                rest.remove(s)
            if coefficient <= 0 or c % coefficient:
                return None
            table[tuple(rest)] = c // coefficient
        return Size.make(table)
    return None


def _polynomial_quotient(size: Size, divisor: Size) -> Dim | None:
    """Long division by the divisor's leading term (terms are ordered by degree, then by
    name: a monomial order, so an exact factor leaves no remainder)."""
    leading = Size((divisor.terms[0],))
    quotient: Dim = 0
    remainder: Dim = size
    for _ in range(64):  # (a quotient may have more terms than the dividend: s**3 - 1)
        if isinstance(remainder, int):
            return quotient if remainder == 0 else None
        step = exact_quotient(Size((remainder.terms[0],)), leading)
        if step is None:
            return None
        quotient = quotient + step
        remainder = remainder - step * divisor
    return None


def _decide(true: bool, false: bool, a: Any, operator: str, b: Any) -> bool:
    if true:
        return True
    if false:
        return False
    raise Undecided(f"{a} {operator} {b}")


def symbol(name: str, low: int = 2, high: int | None = None) -> Size:
    return Size((((Symbol(name, low, high),), 1),))


def is_symbolic(value: Any) -> bool:
    return isinstance(value, Size)


def any_symbolic(values: Iterable[Any]) -> bool:
    return any(isinstance(v, Size) for v in values)


def evaluate(value: Dim, bindings: Mapping[str, int]) -> int:
    """An int or a Size, at the given symbol values."""
    return value.evaluate(bindings) if isinstance(value, Size) else value


# What heuristics take a symbol to be: batch and sequence lengths are what become symbols.
GUESS = 1024


def guess(value: Dim) -> int:
    """For heuristics only (loop merging, parallel thresholds, what to realize), never for
    correctness: `value` with each symbol at GUESS (within its range). A guess, not the first
    call's size, so that one graph gives one kernel source whatever shape came first."""
    if not isinstance(value, Size):
        return value
    return value.evaluate({s.name: min(max(s.low, GUESS), s.high or GUESS)
                           for s in value.symbols()})
