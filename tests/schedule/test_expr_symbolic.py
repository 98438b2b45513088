"""Index expressions with symbolic coefficients and divisors (issue 18, stage 3): folds proved
from symbolic ranges, what is not proved kept as an atom, never a wrong fold."""

import pytest

from ember.ir.sizes import Undecided, symbol
from ember.schedule.expr import (
    Div,
    Expr,
    Mod,
    Var,
    floordiv,
    modulo,
    ravel,
    symbolic_range,
    unravel,
)

s0, s1 = symbol("s0"), symbol("s1")
i = Expr.of(Var("i0", s0))
j = Expr.of(Var("i1", s1))
k = Expr.of(Var("i2", 4))


def evaluate(expr: Expr, values: dict) -> int:
    """An expression at given index and symbol values, by floor semantics."""
    total = expr.const.evaluate(values) if hasattr(expr.const, "evaluate") else expr.const
    for atom, coefficient in expr.terms:
        c = coefficient.evaluate(values) if hasattr(coefficient, "evaluate") else coefficient
        if isinstance(atom, Var):
            value = values[atom.name]
        else:
            d = atom.divisor.evaluate(values) if hasattr(atom.divisor, "evaluate") \
                else atom.divisor
            inner = evaluate(atom.expr, values)
            value = inner // d if isinstance(atom, Div) else inner % d
        total += c * value
    return total


def test_a_row_major_index_over_symbolic_sizes_folds_back():
    linear = i * s1 + j
    assert floordiv(linear, s1) == i and modulo(linear, s1) == j
    assert unravel(ravel([i, j], [s0, s1]), [s0, s1]) == [i, j]
    # a [s0, s1, 4] index read as [s0, 4*s1]: the inner pair merges, nothing is divided
    assert unravel(ravel([i, j, k], [s0, s1, 4]), [s0, 4 * s1]) == [i, j * 4 + k]


def test_what_cannot_be_proved_stays_an_atom():
    # i < s0 says nothing about s1: i // s1 and i % s1 are kept (and correct)
    assert floordiv(i, s1) == Expr.of(Div(i, s1)) and modulo(i, s1) == Expr.of(Mod(i, s1))
    for position, n in ((7, 3), (2, 5), (8, 2)):
        values = {"i0": position, "s0": 9, "s1": n}
        assert evaluate(floordiv(i, s1), values) == position // n
        assert evaluate(modulo(i, s1), values) == position % n


def test_a_flipped_index_is_proved_non_negative_before_dividing():
    flipped = i * -1 + (s0 - 1)  # (s0 - 1 - i: between 0 and s0 - 1, not below 0)
    low, high = symbolic_range(flipped)
    assert low == 0 and high == s0 - 1
    halves = floordiv(flipped, 2)
    for n in (2, 3, 8):
        for position in range(n):
            values = {"i0": position, "s0": n}
            assert evaluate(halves, values) == (n - 1 - position) // 2


def test_a_dividend_that_may_be_negative_is_refused_not_truncated():
    # C's / truncates toward zero; floor division of a negative dividend would differ
    with pytest.raises(Undecided):
        floordiv(i - j, s1)


def test_a_dividend_negative_by_a_constant_takes_whole_symbolic_divisors_first():
    # a pad's read of a slice's gradient in a training backward: [b, s0, 16] padded by 16 on
    # each side of its last dim, read through a [b, 2, s0, 8] reshape: 16*i + m - 16 may be
    # -16, and 16*s0 is at least 32, so one divisor added makes it never negative
    m = Expr.of(Var("i2", 48))
    b = Expr.of(Var("i3", 2))
    linear = b * (16 * s0) + i * 16 + m - 16
    quotient, remainder = floordiv(linear, 16 * s0), modulo(linear, 16 * s0)
    for n in (2, 3, 7):
        for values in ({"i3": 1, "i0": 0, "i2": 3}, {"i3": 0, "i0": n - 1, "i2": 47},
                       {"i3": 1, "i0": 1, "i2": 15}, {"i3": 0, "i0": 0, "i2": 0}):
            values = {**values, "s0": n}
            want = evaluate(linear, values)
            assert evaluate(quotient, values) == want // (16 * n)
            assert evaluate(remainder, values) == want % (16 * n)


def test_a_divisor_with_factors_divides_by_each_where_that_folds():
    # (16*i + j) // (16*s1) with j < 16 is i // s1; its remainder 16*(i % s1) + j
    m = Expr.of(Var("i3", 16))
    index = i * 16 + m
    assert floordiv(index, 16 * s1) == floordiv(i, s1)
    assert modulo(index, 16 * s1) == modulo(i, s1) * 16 + m
    for position, inner, n in ((7, 3, 3), (40, 15, 5), (2, 0, 2)):
        values = {"i0": position, "i3": inner, "s1": n, "s0": 64}
        assert evaluate(floordiv(index, 16 * s1), values) == (16 * position + inner) // (16 * n)
        assert evaluate(modulo(index, 16 * s1), values) == (16 * position + inner) % (16 * n)
    assert floordiv(index, 64 * s1) == floordiv(i, 4 * s1)  # (by 16 first: the factor that folds)
