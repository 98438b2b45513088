"""Reverse-mode differentiation of IR graphs: vjp rules per primitive (vjp.py) and the split of
a graph into a forward that saves what the backward needs and a backward (differentiate.py)."""
