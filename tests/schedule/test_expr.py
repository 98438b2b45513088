"""ember.schedule.expr: index expressions simplify with value ranges and stay equal to what
they compute."""

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from property.strategies import index_expressions, index_variables

from ember.schedule.expr import ZERO, Div, Expr, Mod, Opaque, Var, floordiv, modulo, ravel, unravel

i, j, k = Var("i", 4), Var("j", 3), Var("k", 5)
vi, vj, vk = Expr.of(i), Expr.of(j), Expr.of(k)


def test_division_and_modulo_use_value_ranges():
    assert (vi * 4 + 3) // 4 == vi                      # 3 < 4: the remainder never carries
    assert (vj * 4 + vi) // 4 == vj and (vj * 4 + vi) % 4 == vi
    assert vi // 4 == ZERO and vi % 4 == vi
    assert (vi + 1) // 8 == ZERO                       # i + 1 <= 4 < 8
    assert (vi + 1) // 4 == Expr.of(Div(vi + 1, 4))     # i = 3 reaches 4
    assert (vj * 6 + vi * 2) // 2 == vj * 3 + vi
    assert (vi * 2) % 4 == modulo(vi, 2) * 2            # common factor taken out
    assert (vk + 12) % 4 == (vk) % 4                    # constant multiple of the divisor dropped
    assert floordiv(vi, 1) is vi and modulo(vk, 1) == ZERO


def test_nested_divisions_and_modulos_fold():
    n = Expr.of(Var("n", 100))
    assert (n // 4) // 5 == n // 20
    assert (n % 12) % 4 == n % 4
    assert (n % 12) % 5 == Expr.of(Mod(Expr.of(Mod(n, 12)), 5))  # 5 does not divide 12


def test_a_reshape_inside_a_row_folds_by_a_coefficient_that_divides_the_divisor():
    # (a (2, 128, 8192) view of a (256, 8192) row-major buffer: the batch index was
    # (8192*i + j) // 1048576, recomputed per element in C, twice as slow as the fold)
    row, column = Expr.of(Var("i", 256)), Expr.of(Var("j", 8192))
    linear = row * 8192 + column
    assert linear // 1048576 == row // 128
    assert linear % 1048576 == (row % 128) * 8192 + column
    assert (linear // 1048576) * 1048576 + (row % 128) * 8192 + column == linear
    assert (vi * 6 + vj) // 12 == vi // 2                 # j < 3 <= 6
    assert (vi * 2 + vj) // 4 == Expr.of(Div(vi * 2 + vj, 4))  # j may reach 2: no fold


def test_split_indices_recombine():
    n = Expr.of(Var("n", 100))
    assert (n // 4) * 4 + n % 4 == n
    assert (n // 4) * 12 + (n % 4) * 3 == n * 3
    assert ravel(unravel(n, (5, 4, 5)), (5, 4, 5)) == n
    assert ravel(unravel(vk * 3 + vi, (5, 3)), (5, 3)) == vk * 3 + vi


def test_a_dim_split_after_a_modulo_recombines():
    # (a (4, 256, 16, 16) view of a (4, 256, 256) buffer read as the buffer: PVT-v2's gelu
    # backward computed this identity with divisions per element, and gcc left it scalar)
    i0 = Expr.of(Var("i0", 262144))
    split = ((i0 // 256) % 256 // 16) * 4096 + ((i0 // 256) % 16) * 256
    assert split == ((i0 // 256) % 256) * 256
    assert split + i0 % 256 + (i0 // 65536) * 65536 == i0
    n = Expr.of(Var("n", 100))
    assert ((n % 12) // 4) * 12 + (n % 4) * 3 == (n % 12) * 3   # 4 divides 12
    assert ((n % 10) // 4) * 4 + n % 4 != n % 10                # 4 does not divide 10


def test_unravel_of_a_row_major_index_is_the_index():
    assert unravel(ravel((vk, vj), (5, 3)), (5, 3)) == [vk, vj]
    assert unravel(ravel((vk, ZERO, vj), (5, 1, 3)), (5, 1, 3)) == [vk, ZERO, vj]
    # an empty shape has no positions, but its index still varies with the position: a load
    # through it stays inside the loop that never runs (hoisted, it read past the end)
    assert "i" in set().union(*(e.variables() for e in unravel(vi, (0, 4))))


def test_substitute_and_coefficient():
    expr = vi * 6 + (vj + vk) // 2 + 1
    assert expr.coefficient(i) == 6
    assert expr.coefficient(j) is None                # inside a division
    assert expr.coefficient(Var("z", 2)) == 0
    replaced = expr.substitute({i: vj * 2, k: Expr.of(1)})
    assert replaced == vj * 12 + (vj + 1) // 2 + 1
    assert replaced.variables() == {"j"}
    assert (vi * 2 + Expr.of(Opaque("t", 0, 9))).bounds() == (0, 15)
    assert (vi * -2 + 5).bounds() == (-1, 5)


@settings(max_examples=300)
@given(st.data())
def test_simplified_expressions_compute_what_they_were_built_from(data):
    variables = data.draw(index_variables())
    expr, reference = data.draw(index_expressions(variables))
    low, high = expr.bounds()
    for values in itertools.product(*(range(v.extent) for v in variables)):
        point = {v.name: value for v, value in zip(variables, values)}
        want = reference(point)
        assert _evaluate(expr, point) == want, (str(expr), point)
        assert low <= want <= high, (str(expr), point, (low, high))


def _evaluate(expr: Expr, point: dict[str, int]) -> int:
    total = expr.const
    for atom, coefficient in expr.terms:
        if isinstance(atom, Var):
            value = point[atom.name]
        elif isinstance(atom, Div):
            value = _evaluate(atom.expr, point) // atom.divisor
        else:
            value = _evaluate(atom.expr, point) % atom.divisor
        total += coefficient * value
    return total


def test_divided_and_remaindered_expressions_never_go_negative():
    # (C and Triton truncate toward zero, Div and Mod are floor's: a flipped index 3 - i
    # became Mod(-i + 1, 2), and C's (-1) % 2 is -1)
    i = Var("i0", 4)
    flipped = Expr.of(i) * -1 + 3
    for expr in (floordiv(flipped, 2), modulo(flipped, 2),
                 modulo(floordiv(flipped * 2 + 1, 3), 2)):
        for atom in expr.atoms():
            if isinstance(atom, (Div, Mod)):
                assert atom.expr.bounds()[0] >= 0, expr
        for value in range(4):  # and they still mean floor division and remainder
            c_like = {Div: lambda a, d: int(a / d), Mod: lambda a, d: int(math.fmod(a, d))}
            assert _evaluate_as(expr, {i: value}, c_like) == _evaluate_as(expr, {i: value}, None)


def _evaluate_as(expr, values, c_like):
    total = expr.const
    for atom, coefficient in expr.terms:
        if isinstance(atom, (Div, Mod)):
            inner = _evaluate_as(atom.expr, values, c_like)
            if c_like is None:
                value = inner // atom.divisor if isinstance(atom, Div) else inner % atom.divisor
            else:
                value = c_like[type(atom)](inner, atom.divisor)
        else:
            value = values[atom]
        total += coefficient * value
    return total
