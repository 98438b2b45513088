"""Integer index expressions: canonical sums of atoms, simplified with value ranges.

Index maps of views compose into these (a reshape is a floor-division and a modulo, a slice an
affine term), and simplification folds them back: with 0 <= j < 4, (4*i + j) // 4 is i, and
4*(n // 4) + n % 4 is n. Codegen renders the result as C or Triton; the scheduler compares
them to decide what may share a loop.

    Expr  := const + sum(coefficient * Atom)
    Atom  := Var(name, extent)            0 <= v < extent (an int, or a symbolic Size)
           | Opaque(name, low, high)      a value computed at run time (a loaded index)
           | Div(Expr, d) | Mod(Expr, d)  floor division and modulo by a positive size

Coefficients, constants and divisors are ints, or symbolic `Size`s where a graph's sizes are
symbols (issue 18, stage 3: a dim inside a symbolic one has a symbolic stride). Simplifying
then needs symbolic proofs: `(s1*i + j) // s1` is `i` because `0 <= j <= s1 - 1`, which
`symbolic_range` gives and `Size`'s comparisons decide; what they cannot prove stays an atom.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from ember.ir.sizes import Dim, Size, Undecided, exact_quotient


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
    high: Dim  # (a symbolic size where it indexes a symbolic dim)

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class Div:
    expr: Expr
    divisor: Dim

    def __str__(self) -> str:
        return f"({self.expr} // {self.divisor})"


@dataclasses.dataclass(frozen=True)
class Mod:
    expr: Expr
    divisor: Dim

    def __str__(self) -> str:
        return f"({self.expr} % {self.divisor})"


Atom = Var | Opaque | Div | Mod


@dataclasses.dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Atom, Dim], ...] = ()
    const: Dim = 0

    # -- construction ----------------------------------------------------------------------
    @staticmethod
    def of(value: Dim | Atom | Expr) -> Expr:
        if isinstance(value, Expr):
            return value
        if isinstance(value, (int, Size)):
            return Expr((), value)
        return Expr(((value, 1),), 0)

    def __add__(self, other: int | Expr) -> Expr:
        other = Expr.of(other)
        return _make(list(self.terms) + list(other.terms), self.const + other.const)

    __radd__ = __add__

    def __sub__(self, other: int | Expr) -> Expr:
        return self + Expr.of(other) * -1

    def __mul__(self, factor: Dim) -> Expr:
        if _is_zero(factor) or not self.terms and _is_zero(self.const):
            return ZERO
        return Expr(tuple((atom, c * factor) for atom, c in self.terms), self.const * factor)

    __rmul__ = __mul__

    def __floordiv__(self, divisor: Dim) -> Expr:
        return floordiv(self, divisor)

    def __mod__(self, divisor: Dim) -> Expr:
        return modulo(self, divisor)

    # -- questions -------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return not self.terms

    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) value over every index and every symbol value (may be inf)."""
        low, high = _numeric(self.const)
        for atom, coefficient in self.terms:
            a, b = _interval_product(_numeric(coefficient), atom_bounds(atom))
            low, high = low + a, high + b
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

    def coefficient(self, var: Var) -> Dim | None:
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
        if not _is_zero(self.const) or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


ZERO = Expr()


def _is_zero(value: Dim) -> bool:
    # (a Size is never zero: arithmetic that cancels it gives back the int 0)
    return isinstance(value, int) and value == 0


def _numeric(value: Dim) -> tuple[float, float]:
    return value.bounds() if isinstance(value, Size) else (value, value)


def _interval_product(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    products = [0 if x == 0 or y == 0 else x * y for x in a for y in b]
    return min(products), max(products)


def _sign(value: Dim) -> int | None:
    """1 or -1 when `value` is never negative or never positive (0 for zero), else None."""
    low, high = _numeric(value)
    if low == high == 0:
        return 0
    if low >= 0:
        return 1
    if high <= 0:
        return -1
    return None


def symbolic_range(expr: Expr) -> tuple[Dim | None, Dim | None]:
    """(lowest, highest) value of `expr` over its indices, as sizes of the symbols (None where
    unknown): pointwise in the symbols, so `j + s1*i` with j < s1, i < s0 tops at s0*s1 - 1,
    which numeric bounds (inf) cannot compare with s0*s1."""
    low: Dim | None = expr.const
    high: Dim | None = expr.const
    for atom, coefficient in expr.terms:
        a, b = _atom_range(atom)
        sign = _sign(coefficient)
        if sign is None:
            return None, None
        if sign < 0:
            a, b = b, a
        low = None if low is None or a is None else low + coefficient * a
        high = None if high is None or b is None else high + coefficient * b
    return low, high


def _atom_range(atom: Atom) -> tuple[Dim | None, Dim | None]:
    if isinstance(atom, Var):
        return 0, atom.extent - 1
    if isinstance(atom, Opaque):
        return atom.low, atom.high
    if isinstance(atom, Mod):
        low, high = symbolic_range(atom.expr)
        if proved(lambda: low >= 0 and high < atom.divisor):
            return low, high
        return 0, atom.divisor - 1
    low, high = atom_bounds(atom)
    return (int(low) if math.isfinite(low) else None), (int(high) if math.isfinite(high) else None)


def proved_le(a: Dim | None, b: Dim | None) -> bool:
    """a <= b for every value of the symbols (None, an unknown bound: no)."""
    return a is not None and b is not None and proved(lambda: a <= b)


def proved_lt(a: Dim | None, b: Dim | None) -> bool:
    return a is not None and b is not None and proved(lambda: a < b)


def proved(question) -> bool:
    """Does `question()` hold for every value of the symbols? (Unknown counts as no.)"""
    try:
        return bool(question())
    except (Undecided, TypeError):
        return False


def _inner_atoms(atom: Atom) -> set[Atom]:
    return atom.expr.atoms() if isinstance(atom, (Div, Mod)) else set()


def atom_bounds(atom: Atom) -> tuple[float, float]:
    if isinstance(atom, Var):
        if isinstance(atom.extent, Size):  # (its range's top: infinite when unbounded)
            return 0, atom.extent.bounds()[1] - 1
        return 0, atom.extent - 1
    if isinstance(atom, Opaque):
        return atom.low, _numeric(atom.high)[1]
    low, high = atom.expr.bounds()
    smallest, largest = _numeric(atom.divisor)  # (a symbolic divisor: at least 2)
    if isinstance(atom, Div):
        if low < 0:
            return _floor(low, smallest), _floor(high, smallest if high >= 0 else largest)
        return _floor(low, largest), _floor(high, smallest)
    if low >= 0 and high < smallest:
        return low, high
    return 0, largest - 1


def _floor(value: float, divisor: float) -> float:
    if math.isinf(value):
        return value
    if math.isinf(divisor):
        return 0 if value >= 0 else -1
    return value // divisor


def _substitute_atom(atom: Atom, mapping: Mapping[Var, Expr]) -> Expr:
    if isinstance(atom, Var):
        return mapping.get(atom, Expr.of(atom))
    if isinstance(atom, Opaque):
        return Expr.of(atom)
    inner = atom.expr.substitute(mapping)
    return floordiv(inner, atom.divisor) if isinstance(atom, Div) else modulo(inner, atom.divisor)


def _make(terms: Iterable[tuple[Atom, Dim]], const: Dim) -> Expr:
    merged: dict[Atom, Dim] = {}
    for atom, coefficient in terms:
        merged[atom] = merged.get(atom, 0) + coefficient
    merged = {atom: c for atom, c in merged.items() if not _is_zero(c)}
    # Recombine d*k*(x // d) + k*(x % d) into k*x: the inverse of splitting an index. Here
    # (e // a) // d is stored as e // (a*d), so that quotient is looked for too. And
    # d*k*((x % m) // d) + k*(x % d) into k*(x % m) where d divides m: a dim of m split in
    # two after a mod (a view (.., 16, 16) of (.., 256) read through its own reshape back:
    # PVT-v2's gelu backward read its input through divisions per element, unvectorized).
    while True:
        for atom in [a for a in merged if isinstance(a, Mod)]:
            k = merged[atom]
            for quotient in _quotients(atom):
                if merged.get(quotient) == k * atom.divisor:
                    del merged[atom], merged[quotient]
                    for inner, c in atom.expr.terms:
                        merged[inner] = merged.get(inner, 0) + c * k
                    const += atom.expr.const * k
                    merged = {a: c for a, c in merged.items() if not _is_zero(c)}
                    break
            else:
                wider = _wider_mod(atom, merged, k)
                if wider is None:
                    continue
                quotient, outer = wider
                del merged[atom], merged[quotient]
                merged[outer] = merged.get(outer, 0) + k
                merged = {a: c for a, c in merged.items() if not _is_zero(c)}
            break
        else:
            break
    return Expr(tuple(sorted(merged.items(), key=lambda item: str(item[0]))), const)


def _wider_mod(atom: Mod, merged: dict[Atom, Dim], k: Dim) -> tuple[Div, Mod] | None:
    """For k*(x % d): a term d*k*((x % m) // d) with d dividing m, as (that quotient, x % m)."""
    for quotient, coefficient in merged.items():
        if not isinstance(quotient, Div) or quotient.divisor != atom.divisor or \
                coefficient != k * atom.divisor or not _is_zero(quotient.expr.const) or \
                len(quotient.expr.terms) != 1 or quotient.expr.terms[0][1] != 1:
            continue
        outer = quotient.expr.terms[0][0]
        if isinstance(outer, Mod) and outer.expr == atom.expr and \
                _exact(outer.divisor, atom.divisor) is not None:
            return quotient, outer
    return None


def _quotients(atom: Mod) -> list[Div]:
    found = [Div(atom.expr, atom.divisor)]
    terms = atom.expr.terms
    if _is_zero(atom.expr.const) and len(terms) == 1 and terms[0][1] == 1 \
            and isinstance(terms[0][0], Div):
        inner = terms[0][0]
        found.append(Div(inner.expr, inner.divisor * atom.divisor))
    return found


def _exact(value: Dim, divisor: Dim) -> Dim | None:
    """value / divisor when it divides exactly for every value of the symbols, else None."""
    if isinstance(value, int) and isinstance(divisor, int):
        return value // divisor if value % divisor == 0 else None
    if isinstance(value, int):
        return 0 if value == 0 else None
    return exact_quotient(value, divisor)


def _split(value: Dim, divisor: Dim) -> tuple[Dim, Dim]:
    """(q, r) with value = q*divisor + r and r never negative (a constant term's split)."""
    if isinstance(value, int) and isinstance(divisor, int):
        return value // divisor, value % divisor
    quotient = _exact(value, divisor)
    if quotient is not None:
        return quotient, 0
    if isinstance(value, Size) and isinstance(divisor, int):
        # (each monomial of the symbols is positive, so c % d times it is never negative)
        table = value.table()
        return (Size.make({m: c // divisor for m, c in table.items()}),
                Size.make({m: c % divisor for m, c in table.items()}))
    return 0, value


def _check_divisor(divisor: Dim) -> None:
    if _numeric(divisor)[0] < 1:
        raise Undecided(f"division by {divisor}, which may not be positive")


def _non_negative(rest: Expr, divisor: Dim) -> tuple[Expr, int]:
    """`rest` plus the fewest whole divisors that make it never negative, and how many were
    added. Div and Mod mean floor division and remainder, but C and Triton truncate toward
    zero: the two agree on dividends that are never negative (a flipped index, 3 - i, left
    -i + 1 to divide: C's (-1) % 2 is -1, the floor remainder 1)."""
    low, _ = symbolic_range(rest)
    if proved(lambda: low >= 0):
        return rest, 0
    numeric_low = rest.bounds()[0]
    if math.isfinite(numeric_low):
        # (a symbolic divisor is never below its lowest value, so as many times that as
        # cover the lowest dividend cover it at every size: a pad's `16*i1 + i2 - 16` over
        # `16*s0`, in a backward that puts a slice's gradient back)
        lowest = divisor if isinstance(divisor, int) else int(_numeric(divisor)[0])
        times = int(-(numeric_low // lowest))
        return rest + times * divisor, times
    # NOTE: a dividend that may be negative by an amount no constant covers would divide
    # wrongly in C: refused (the graph compiles per shape)
    raise Undecided(f"{rest} may be negative where it is divided by {divisor}")


def floordiv(expr: Expr, divisor: Dim) -> Expr:
    expr = Expr.of(expr)
    _check_divisor(divisor)
    if divisor == 1:
        return expr
    quotient_terms, rest_terms = [], []
    for atom, coefficient in expr.terms:
        quotient = _exact(coefficient, divisor)
        if quotient is not None:
            quotient_terms.append((atom, quotient))
        else:
            rest_terms.append((atom, coefficient))
    const_quotient, const_rest = _split(expr.const, divisor)
    rest, added = _non_negative(_make(rest_terms, const_rest), divisor)
    quotient = _make(quotient_terms, const_quotient - added)
    low, high = symbolic_range(rest)
    if proved(lambda: low >= 0 and high < divisor):
        return quotient
    if _all_ints(rest, divisor):
        common = math.gcd(divisor, rest.const, *(c for _, c in rest.terms))
        if common > 1:
            rest = Expr(tuple((a, c // common) for a, c in rest.terms), rest.const // common)
            divisor //= common
    if len(rest.terms) == 1 and _is_zero(rest.const) and rest.terms[0][1] == 1 \
            and isinstance(rest.terms[0][0], Div):
        inner = rest.terms[0][0]
        return quotient + floordiv(inner.expr, inner.divisor * divisor)
    for first, remaining in _factors(divisor, rest):
        # x // (a*b) is (x // a) // b: dividing by a factor first may fold ((16*i + j) //
        # (64*s0), j < 16, is i // (4*s0)); only taken where it does, so nothing loops
        step = floordiv(rest, first)
        if not any(isinstance(atom, (Div, Mod)) for atom in step.atoms()):
            return quotient + floordiv(step, remaining)
    return quotient + Expr.of(Div(rest, divisor))


def _factors(divisor: Dim, dividend: Expr) -> list[tuple[Dim, Dim]]:
    """(a, divisor / a) for the proper factors a of a one-term symbolic divisor c*s*t...: the
    int factors of c, largest first, then each symbol. For an int divisor, the dividend's
    coefficients that divide it, largest first: (8192*i + j) // 1048576 with j < 8192 is
    i // 128 (a reshape's index inside a row), which C cannot see and recomputes per element."""
    if isinstance(divisor, int):
        return [(c, divisor // c) for c in sorted({c for _, c in dividend.terms
                                                   if isinstance(c, int)}, reverse=True)
                if 1 < c < divisor and divisor % c == 0]
    if not isinstance(divisor, Size) or len(divisor.terms) != 1:
        return []
    (monomial, coefficient), = divisor.terms
    if coefficient <= 0:
        return []
    found: list[Dim] = [d for d in range(coefficient, 1, -1) if coefficient % d == 0]
    if coefficient > 1 or len(monomial) > 1:
        found += [Size((((s,), 1),)) for s in dict.fromkeys(monomial)]
    return [(a, exact_quotient(divisor, a)) for a in found]


def modulo(expr: Expr, divisor: Dim) -> Expr:
    expr = Expr.of(expr)
    _check_divisor(divisor)
    if divisor == 1:
        return ZERO
    rest, _ = _non_negative(_make([(a, c) for a, c in expr.terms
                                   if _exact(c, divisor) is None],
                                  _split(expr.const, divisor)[1]), divisor)
    low, high = symbolic_range(rest)
    if proved(lambda: low >= 0 and high < divisor):
        return rest
    if _all_ints(rest, divisor):
        common = math.gcd(divisor, rest.const, *(c for _, c in rest.terms))
        if common > 1:
            reduced = Expr(tuple((a, c // common) for a, c in rest.terms), rest.const // common)
            return modulo(reduced, divisor // common) * common
    if len(rest.terms) == 1 and _is_zero(rest.const) and rest.terms[0][1] == 1 \
            and isinstance(rest.terms[0][0], Mod) \
            and _exact(rest.terms[0][0].divisor, divisor) is not None:
        return modulo(rest.terms[0][0].expr, divisor)
    for first, remaining in _factors(divisor, rest):
        # x % (a*b) is a*((x // a) % b) + x % a, where both halves fold
        high, low = floordiv(rest, first), modulo(rest, first)
        if not any(isinstance(atom, (Div, Mod)) for atom in high.atoms() | low.atoms()):
            return modulo(high, remaining) * first + low
    return Expr.of(Mod(rest, divisor))


def _all_ints(expr: Expr, divisor: Dim) -> bool:
    return isinstance(divisor, int) and isinstance(expr.const, int) and \
        all(isinstance(c, int) for _, c in expr.terms)


def ravel(index: Iterable[Expr], shape: Iterable[Dim]) -> Expr:
    """Row-major linear position of `index` in `shape`."""
    linear = ZERO
    for position, size in zip(index, shape):
        linear = linear * size + position
    return linear


def unravel(linear: Expr, shape: tuple[Dim, ...]) -> list[Expr]:
    """Row-major index in `shape` of the linear position `linear` (0 <= linear < numel)."""
    index = []
    for d, size in enumerate(shape):
        inner = math.prod(shape[d + 1:])
        if isinstance(inner, int):
            inner = max(inner, 1)
        if size == 1:
            index.append(ZERO)
            continue
        position = floordiv(linear, inner)
        # (an empty shape has no positions; its index still varies with `linear`, so a load
        # through it stays inside the loop that never runs instead of being hoisted out)
        index.append(position if d == 0 or _is_zero(size) else modulo(position, size))
    return index
