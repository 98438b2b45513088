"""What the OpInfo run expects beyond eager's exact contract, each with its reason.

EXPECTED_ERRORS: ops for which ember raises where eager does not (a strict xfail: when the
error goes away, the entry must go too). Never a wrong value or wrong metadata: those are
fixed, or the op runs eagerly.

LOOSER_TOLERANCES: comparisons whose difference from eager is rounding, not a wrong answer,
measured and explained (ember's value is the closer one to the exact answer in each case).
Keyed by (op name, "forward" | "backward").
"""

from __future__ import annotations

EXPECTED_ERRORS: dict[tuple[str, str], str] = {}

_NEAR_ONE = ("the derivative's 1 - x**2 loses digits as |x| nears 1; ember's C kernel contracts "
             "x*x into a fused multiply-add (one rounding), eager rounds x**2 first: at "
             "x = 0.986 ember's gradient is within 1e-7 of the float64 answer, eager's 1e-6 off")
LOOSER_TOLERANCES: dict[tuple[str, str], tuple[float, float, str]] = {
    ("asin", "backward"): (1e-5, 1e-5, _NEAR_ONE),
    ("atanh", "backward"): (1e-5, 1e-5, _NEAR_ONE),
    ("nn.functional.layer_norm", "backward"): (
        1e-4, 1.3e-6, "over a single element, x - mean is exactly 0 in ember and ~4e-8 in "
        "eager's kernel, which its 1/sqrt(eps) = 316 scales into a weight gradient of 1e-5"),
}


def expected_failure(name: str, direction: str) -> str | None:
    return EXPECTED_ERRORS.get((name, direction))


def looser_tolerance(name: str, direction: str) -> tuple[float, float] | None:
    found = LOOSER_TOLERANCES.get((name, direction))
    return None if found is None else found[:2]
