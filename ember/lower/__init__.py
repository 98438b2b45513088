"""FX graph → ember IR (aten ops lowered through the `lowerings` table)."""

from typing import Any

from ember.lower.registry import Decline, Unsupported, lowerings

__all__ = ["Decline", "Lowered", "OutputSpec", "Unsupported", "lowerings", "trace"]


def __getattr__(name: str) -> Any:
    """The tracer's names, imported at their first use: a warm start reads what lowering
    made (OutputSpec, ember/lower/results.py) without importing the lowering itself."""
    if name in ("Lowered", "OutputSpec", "trace"):
        from ember.lower import tracer

        return getattr(tracer, name)
    raise AttributeError(f"module 'ember.lower' has no attribute {name!r}")
