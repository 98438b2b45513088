"""What the OpInfo run expects to fail, with the reason: only errors (ember raises where eager
does not), never a wrong value or wrong metadata (those are fixed, or the op runs eagerly).
Keyed by (op name, "forward" | "backward")."""

from __future__ import annotations

EXPECTED_ERRORS: dict[tuple[str, str], str] = {}


def expected_failure(name: str, direction: str) -> str | None:
    return EXPECTED_ERRORS.get((name, direction))
