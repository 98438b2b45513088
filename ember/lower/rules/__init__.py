"""Lowering rules, one module per family of aten ops; importing this fills `lowerings`."""

from ember.lower.rules import activations, data, nn, pointwise, reductions, views  # noqa: F401
