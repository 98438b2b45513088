"""The leaves of an op's arguments and results, and a function mapped over them, with torch's
pytree's answers (utils/_pytree.py) at a fraction of its cost: an op's arguments are tuples,
lists and dicts of tensors and numbers, walked here directly; any other container pytree
knows (a named tuple, torch.Size, an OrderedDict) is handed to it. The lowering asks several
times per op (a BERT forward's lowering spent a third of its time in pytree)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.torch_internals import tree_flatten, tree_map


def leaves(tree: Any) -> list[Any]:
    """tree_flatten(tree)[0]."""
    found: list[Any] = []
    _collect(tree, found)
    return found


def _collect(tree: Any, found: list[Any]) -> None:
    kind = type(tree)
    if kind is tuple or kind is list:
        for item in tree:
            _collect(item, found)
    elif kind is dict:
        for item in tree.values():
            _collect(item, found)
    elif isinstance(tree, (tuple, list, dict)):
        found.extend(tree_flatten(tree)[0])
    else:
        found.append(tree)


def map_leaves(function: Callable[[Any], Any], tree: Any) -> Any:
    """tree_map(function, tree)."""
    kind = type(tree)
    if kind is tuple:
        return tuple([map_leaves(function, item) for item in tree])
    if kind is list:
        return [map_leaves(function, item) for item in tree]
    if kind is dict:
        return {key: map_leaves(function, item) for key, item in tree.items()}
    if isinstance(tree, (tuple, list, dict)):
        return tree_map(function, tree)
    return function(tree)
