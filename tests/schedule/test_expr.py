"""ember.schedule.expr: index expressions simplify with value ranges and stay equal to what
they compute."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from property.strategies import index_expressions, index_variables

from ember.schedule.expr import ZERO, Div, Expr, Mod, Opaque, Var, floordiv, modulo, ravel, unravel

i, j, k = Var("i", 4), Var("j", 3), Var("k", 5)
EI, EJ, EK = Expr.of(i), Expr.of(j), Expr.of(k)


def test_division_and_modulo_use_value_ranges():
    assert (EI * 4 + 3) // 4 == EI                      # 3 < 4: the remainder never carries
    assert (EJ * 4 + EI) // 4 == EJ and (EJ * 4 + EI) % 4 == EI
    assert EI // 4 == ZERO and EI % 4 == EI
    assert (EI + 1) // 8 == ZERO                       # i + 1 <= 4 < 8
    assert (EI + 1) // 4 == Expr.of(Div(EI + 1, 4))     # i = 3 reaches 4
    assert (EJ * 6 + EI * 2) // 2 == EJ * 3 + EI
    assert (EI * 2) % 4 == modulo(EI, 2) * 2            # common factor taken out
    assert (EK + 12) % 4 == (EK) % 4                    # constant multiple of the divisor dropped
    assert floordiv(EI, 1) is EI and modulo(EK, 1) == ZERO


def test_nested_divisions_and_modulos_fold():
    n = Expr.of(Var("n", 100))
    assert (n // 4) // 5 == n // 20
    assert (n % 12) % 4 == n % 4
    assert (n % 12) % 5 == Expr.of(Mod(Expr.of(Mod(n, 12)), 5))  # 5 does not divide 12


def test_split_indices_recombine():
    n = Expr.of(Var("n", 100))
    assert (n // 4) * 4 + n % 4 == n
    assert (n // 4) * 12 + (n % 4) * 3 == n * 3
    assert ravel(unravel(n, (5, 4, 5)), (5, 4, 5)) == n
    assert ravel(unravel(EK * 3 + EI, (5, 3)), (5, 3)) == EK * 3 + EI


def test_unravel_of_a_row_major_index_is_the_index():
    assert unravel(ravel((EK, EJ), (5, 3)), (5, 3)) == [EK, EJ]
    assert unravel(ravel((EK, ZERO, EJ), (5, 1, 3)), (5, 1, 3)) == [EK, ZERO, EJ]
    assert unravel(EI, (0, 4)) == [ZERO, ZERO]         # an empty shape has no positions


def test_substitute_and_coefficient():
    expr = EI * 6 + (EJ + EK) // 2 + 1
    assert expr.coefficient(i) == 6
    assert expr.coefficient(j) is None                # inside a division
    assert expr.coefficient(Var("z", 2)) == 0
    replaced = expr.substitute({i: EJ * 2, k: Expr.of(1)})
    assert replaced == EJ * 12 + (EJ + 1) // 2 + 1
    assert replaced.variables() == {"j"}
    assert (EI * 2 + Expr.of(Opaque("t", 0, 9))).bounds() == (0, 15)
    assert (EI * -2 + 5).bounds() == (-1, 5)


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
