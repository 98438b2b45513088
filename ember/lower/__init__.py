"""FX graph → ember IR (aten ops lowered through the `lowerings` table)."""

from ember.lower.registry import Decline, Unsupported, lowerings
from ember.lower.tracer import Lowered, OutputSpec, trace

__all__ = ["Decline", "Lowered", "OutputSpec", "Unsupported", "lowerings", "trace"]
