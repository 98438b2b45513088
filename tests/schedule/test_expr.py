"""ember.schedule.expr: index expressions simplify with value ranges and stay equal to what
they compute."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from property.strategies import index_expressions, index_variables

from ember.schedule.expr import ZERO, Div, Expr, Mod, Opaque, Var, floordiv, modulo, ravel, unravel

i, j, k = Var("i", 4), Var("j", 3), Var("k", 5)
I, J, K = Expr.of(i), Expr.of(j), Expr.of(k)


def test_division_and_modulo_use_value_ranges():
    assert (I * 4 + 3) // 4 == I                      # 3 < 4: the remainder never carries
    assert (J * 4 + I) // 4 == J and (J * 4 + I) % 4 == I
    assert I // 4 == ZERO and I % 4 == I
    assert (I + 1) // 8 == ZERO                       # i + 1 <= 4 < 8
    assert (I + 1) // 4 == Expr.of(Div(I + 1, 4))     # i = 3 reaches 4
    assert (J * 6 + I * 2) // 2 == J * 3 + I
    assert (I * 2) % 4 == modulo(I, 2) * 2            # common factor taken out
    assert (K + 12) % 4 == (K) % 4                    # constant multiple of the divisor dropped
    assert floordiv(I, 1) is I and modulo(K, 1) == ZERO


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
    assert ravel(unravel(K * 3 + I, (5, 3)), (5, 3)) == K * 3 + I


def test_unravel_of_a_row_major_index_is_the_index():
    assert unravel(ravel((K, J), (5, 3)), (5, 3)) == [K, J]
    assert unravel(ravel((K, ZERO, J), (5, 1, 3)), (5, 1, 3)) == [K, ZERO, J]
    assert unravel(I, (0, 4)) == [ZERO, ZERO]         # an empty shape has no positions


def test_substitute_and_coefficient():
    expr = I * 6 + (J + K) // 2 + 1
    assert expr.coefficient(i) == 6
    assert expr.coefficient(j) is None                # inside a division
    assert expr.coefficient(Var("z", 2)) == 0
    replaced = expr.substitute({i: J * 2, k: Expr.of(1)})
    assert replaced == J * 12 + (J + 1) // 2 + 1
    assert replaced.variables() == {"j"}
    assert (I * 2 + Expr.of(Opaque("t", 0, 9))).bounds() == (0, 15)
    assert (I * -2 + 5).bounds() == (-1, 5)


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
