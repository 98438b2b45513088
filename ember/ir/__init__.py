"""ember's IR: primitive ops, nodes and graphs, shape rules, printer, verifier, interpreter."""

from ember.ir.graph import Graph, IRError, Node
from ember.ir.ops import KIND, Kind, Op

__all__ = ["Graph", "IRError", "KIND", "Kind", "Node", "Op"]
