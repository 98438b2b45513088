"""Integer index expressions: canonical sums of atoms, simplified with value ranges.

Index maps of views compose into these (a reshape is a floor-division and a modulo, a slice an
affine term), and simplification folds them back: with 0 <= j < 4, (4*i + j) // 4 is i, and
4*(n // 4) + n % 4 is n. Codegen renders the result as C or Triton; the scheduler compares
them to decide what may share a loop.

    Expr  := const + sum(coefficient * Atom)
    Atom  := Var(name, extent)            0 <= v < extent (an int, or a symbolic Size)
           | Opaque(name, low, high)      a value computed at run time (a loaded index)
           | Div(Expr, d) | Mod(Expr, d)  floor division and modulo by a positive constant
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from ember.ir.sizes import Size, Undecided


@dataclasses.dataclass(frozen=True)
class Var:
    name: str
    extent: int | Size  # (symbolic in a graph whose sizes are symbols: issue 18)

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class Opaque:
    name: str
    low: int
    high: int

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class Div:
    expr: Expr
    divisor: int

    def __str__(self) -> str:
        return f"({self.expr} // {self.divisor})"


@dataclasses.dataclass(frozen=True)
class Mod:
    expr: Expr
    divisor: int

    def __str__(self) -> str:
        return f"({self.expr} % {self.divisor})"


Atom = Var | Opaque | Div | Mod


@dataclasses.dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    # -- construction ----------------------------------------------------------------------
    @staticmethod
    def of(value: int | Atom | Expr) -> Expr:
        if isinstance(value, Expr):
            return value
        if isinstance(value, int):
            return Expr((), value)
        return Expr(((value, 1),), 0)

    def __add__(self, other: int | Expr) -> Expr:
        other = Expr.of(other)
        return _make(list(self.terms) + list(other.terms), self.const + other.const)

    __radd__ = __add__

    def __sub__(self, other: int | Expr) -> Expr:
        return self + Expr.of(other) * -1

    def __mul__(self, factor: int) -> Expr:
        if factor == 0 or not self.terms and self.const == 0:
            return ZERO
        if isinstance(factor, Size):
            # NOTE: stage 2 of issue 18 keeps coefficients ints: a symbolic stride (a dim
            # inside a symbolic one) compiles per shape until stage 3
            raise Undecided(f"symbolic stride: {self} * {factor}")
        return Expr(tuple((atom, c * factor) for atom, c in self.terms), self.const * factor)

    __rmul__ = __mul__

    def __floordiv__(self, divisor: int) -> Expr:
        return floordiv(self, divisor)

    def __mod__(self, divisor: int) -> Expr:
        return modulo(self, divisor)

    # -- questions -------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return not self.terms

    def bounds(self) -> tuple[float, float]:
        low = high = self.const
        for atom, coefficient in self.terms:
            a, b = atom_bounds(atom)
            if coefficient > 0:
                low, high = low + coefficient * a, high + coefficient * b
            else:
                low, high = low + coefficient * b, high + coefficient * a
        return low, high

    def atoms(self) -> set[Atom]:
        found: set[Atom] = set()
        for atom, _ in self.terms:
            found.add(atom)
            if isinstance(atom, (Div, Mod)):
                found |= atom.expr.atoms()
        return found

    def variables(self) -> set[str]:
        return {atom.name for atom in self.atoms() if isinstance(atom, (Var, Opaque))}

    def coefficient(self, var: Var) -> int | None:
        """The coefficient of `var` if it appears only as a plain term, else None."""
        plain = 0
        for atom, coefficient in self.terms:
            if atom == var:
                plain = coefficient
            elif var in _inner_atoms(atom):
                return None
        return plain

    def substitute(self, mapping: Mapping[Var, Expr]) -> Expr:
        result = Expr((), self.const)
        for atom, coefficient in self.terms:
            result = result + _substitute_atom(atom, mapping) * coefficient
        return result

    def __str__(self) -> str:
        parts = [f"{c}*{a}" if c != 1 else str(a) for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


ZERO = Expr()


def _inner_atoms(atom: Atom) -> set[Atom]:
    return atom.expr.atoms() if isinstance(atom, (Div, Mod)) else set()


def atom_bounds(atom: Atom) -> tuple[float, float]:
    if isinstance(atom, Var):
        if isinstance(atom.extent, Size):  # (its range's top: infinite when unbounded)
            return 0, atom.extent.bounds()[1] - 1
        return 0, atom.extent - 1
    if isinstance(atom, Opaque):
        return atom.low, atom.high
    low, high = atom.expr.bounds()
    if isinstance(atom, Div):
        return _floor(low, atom.divisor), _floor(high, atom.divisor)
    if low >= 0 and high < atom.divisor:
        return low, high
    return 0, atom.divisor - 1


def _floor(value: float, divisor: int) -> float:
    return value if math.isinf(value) else value // divisor


def _substitute_atom(atom: Atom, mapping: Mapping[Var, Expr]) -> Expr:
    if isinstance(atom, Var):
        return mapping.get(atom, Expr.of(atom))
    if isinstance(atom, Opaque):
        return Expr.of(atom)
    inner = atom.expr.substitute(mapping)
    return floordiv(inner, atom.divisor) if isinstance(atom, Div) else modulo(inner, atom.divisor)


def _make(terms: Iterable[tuple[Atom, int]], const: int) -> Expr:
    merged: dict[Atom, int] = {}
    for atom, coefficient in terms:
        merged[atom] = merged.get(atom, 0) + coefficient
    merged = {atom: c for atom, c in merged.items() if c}
    # Recombine d*k*(x // d) + k*(x % d) into k*x: the inverse of splitting an index. Here
    # (e // a) // d is stored as e // (a*d), so that quotient is looked for too.
    while True:
        for atom in [a for a in merged if isinstance(a, Mod)]:
            k = merged[atom]
            for quotient in _quotients(atom):
                if merged.get(quotient) == k * atom.divisor:
                    del merged[atom], merged[quotient]
                    for inner, c in atom.expr.terms:
                        merged[inner] = merged.get(inner, 0) + c * k
                    const += atom.expr.const * k
                    merged = {a: c for a, c in merged.items() if c}
                    break
            else:
                continue
            break
        else:
            break
    return Expr(tuple(sorted(merged.items(), key=lambda item: str(item[0]))), const)


def _quotients(atom: Mod) -> list[Div]:
    found = [Div(atom.expr, atom.divisor)]
    terms = atom.expr.terms
    if atom.expr.const == 0 and len(terms) == 1 and terms[0][1] == 1 \
            and isinstance(terms[0][0], Div):
        inner = terms[0][0]
        found.append(Div(inner.expr, inner.divisor * atom.divisor))
    return found


def _non_negative(rest: Expr, divisor: int) -> tuple[Expr, int]:
    """`rest` plus the fewest whole divisors that make it never negative, and how many were
    added. Div and Mod mean floor division and remainder, but C and Triton truncate toward
    zero: the two agree on dividends that are never negative (a flipped index, 3 - i, left
    -i + 1 to divide: C's (-1) % 2 is -1, the floor remainder 1)."""
    low, _ = rest.bounds()
    if low >= 0 or not math.isfinite(low):
        return rest, 0
    times = int(-(low // divisor))
    return rest + times * divisor, times


def floordiv(expr: Expr, divisor: int) -> Expr:
    expr = Expr.of(expr)
    if isinstance(divisor, Size):
        raise Undecided(f"symbolic stride: {expr} divided by {divisor}")
    assert divisor > 0
    if divisor == 1:
        return expr
    quotient_terms, rest_terms = [], []
    for atom, coefficient in expr.terms:
        if coefficient % divisor == 0:
            quotient_terms.append((atom, coefficient // divisor))
        else:
            rest_terms.append((atom, coefficient))
    rest, added = _non_negative(_make(rest_terms, expr.const % divisor), divisor)
    quotient = _make(quotient_terms, expr.const // divisor - added)
    low, high = rest.bounds()
    if 0 <= low and high < divisor:
        return quotient
    common = math.gcd(divisor, rest.const, *(c for _, c in rest.terms))
    if common > 1:
        rest = Expr(tuple((a, c // common) for a, c in rest.terms), rest.const // common)
        divisor //= common
    if len(rest.terms) == 1 and rest.const == 0 and rest.terms[0][1] == 1 \
            and isinstance(rest.terms[0][0], Div):
        inner = rest.terms[0][0]
        return quotient + floordiv(inner.expr, inner.divisor * divisor)
    return quotient + Expr.of(Div(rest, divisor))


def modulo(expr: Expr, divisor: int) -> Expr:
    expr = Expr.of(expr)
    if isinstance(divisor, Size):
        raise Undecided(f"symbolic stride: {expr} divided by {divisor}")
    assert divisor > 0
    if divisor == 1:
        return ZERO
    rest, _ = _non_negative(_make([(a, c) for a, c in expr.terms if c % divisor],
                                  expr.const % divisor), divisor)
    low, high = rest.bounds()
    if 0 <= low and high < divisor:
        return rest
    common = math.gcd(divisor, rest.const, *(c for _, c in rest.terms))
    if common > 1:
        reduced = Expr(tuple((a, c // common) for a, c in rest.terms), rest.const // common)
        return modulo(reduced, divisor // common) * common
    if len(rest.terms) == 1 and rest.const == 0 and rest.terms[0][1] == 1 \
            and isinstance(rest.terms[0][0], Mod) and rest.terms[0][0].divisor % divisor == 0:
        return modulo(rest.terms[0][0].expr, divisor)
    return Expr.of(Mod(rest, divisor))


def ravel(index: Iterable[Expr], shape: Iterable[int]) -> Expr:
    """Row-major linear position of `index` in `shape`."""
    linear = ZERO
    for position, size in zip(index, shape):
        linear = linear * size + position
    return linear


def unravel(linear: Expr, shape: tuple[int, ...]) -> list[Expr]:
    """Row-major index in `shape` of the linear position `linear` (0 <= linear < numel)."""
    index = []
    for d, size in enumerate(shape):
        inner = max(math.prod(shape[d + 1:]), 1)
        if size == 1:
            index.append(ZERO)
            continue
        position = floordiv(linear, inner)
        # (an empty shape has no positions; its index still varies with `linear`, so a load
        # through it stays inside the loop that never runs instead of being hoisted out)
        index.append(position if d == 0 or size == 0 else modulo(position, size))
    return index
