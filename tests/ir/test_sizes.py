"""ember.ir.sizes: canonical polynomials over symbols, questions answered from ranges only,
and the IR's symbolic shapes (printer, interpreter with bindings)."""

import math

import pytest
import torch

from ember.ir.graph import Graph
from ember.ir.interpreter import interpret
from ember.ir.ops import Op
from ember.ir.sizes import Undecided, exact_quotient, guess, symbol

s0, s1 = symbol("s0"), symbol("s1")


def test_arithmetic_is_canonical_and_structural():
    assert s0 * 768 == 768 * s0 and hash(s0 * 768) == hash(768 * s0)
    assert (s0 + 1) * s1 == s1 + s0 * s1 and str((s0 + 1) * s1) == "(s0*s1 + s1)"
    assert s0 - s0 == 0 and isinstance(s0 - s0, int)  # (cancelled: a plain int again)
    assert math.prod((s0, 4, 8)) // 32 == s0 and (s0 * s1) // s0 == s1
    assert s0 != 5 and (s0 == 5) is False  # structural: never a guess, never a guard


def test_questions_are_answered_from_ranges_or_refused():
    assert s0 > 1 and s0 >= 2 and 2 * s0 >= s0 and bool(s0)
    with pytest.raises(Undecided):
        _ = s0 < 5  # (s0 may be 2 or 2000)
    with pytest.raises(Undecided):
        int(s0)
    with pytest.raises(Undecided):
        _ = (s0 * 3) // 2  # (not exact: a floor-division atom is stage 3's)
    assert symbol("n", 3, 16) <= 16 and guess(s0 * 4) == 4096


def test_values_and_text():
    size = 768 * s0 + 2 ** 33
    assert size.evaluate({"s0": 3}) == 2304 + 2 ** 33
    assert size.render_c() == "(768*s0 + INT64_C(8589934592))"
    assert repr((s0, 768)) == "(s0, 768)"  # (what the wrapper writes)


def test_the_interpreter_binds_symbols_from_its_inputs():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((s0, 3), torch.float32)
    y = graph.add_input((3,), torch.float32)
    graph.symbols["s0"] = (0, 0)
    wide = graph.add(Op.EXPAND, (graph.add(Op.RESHAPE, (y,), shape=(1, 3)),), shape=(s0, 3))
    graph.outputs.append(graph.add(Op.ADD, (x, wide)))
    assert "f32[s0,3]" in str(graph)
    for rows in (2, 7):
        a, b = torch.randn(rows, 3), torch.randn(3)
        (out,), _ = interpret(graph, [a, b])
        torch.testing.assert_close(out, a + b)



def test_bounds_keep_the_correlation_of_terms():
    # interval sums would say 96*s0*s1 - 96*s1 may be anything: with s = 2 + t it is
    # 192 + 192*t0 + 96*t1 + 96*t0*t1, at least 192
    assert (96 * s0 * s1 - 96 * s1).bounds()[0] == 192
    assert 96 * s1 < 96 * s0 * s1 and s0 * s1 - 1 < s0 * s1
    with pytest.raises(Undecided):
        _ = s0 * s1 < 4 * s0  # (true for s1 < 4 only)


def test_a_polynomial_divides_exactly_by_a_factor():
    # (256*s + 256) // (64*s + 64): DeepSeek-V3's heads from a cached tensor's numel once
    # its batch is a symbol; not a factor: undecided, as before
    s, u = symbol("s1"), symbol("s2")
    assert (256 * s + 256) // (64 * s + 64) == 4
    assert exact_quotient(s * s * s - 1, s - 1) == s * s + s + 1
    assert exact_quotient(s * u + s + u + 1, s + 1) == u + 1
    assert exact_quotient(s * s + 1, s + 1) is None
    with pytest.raises(Undecided):
        (3 * s + 2) // (s + 1)
