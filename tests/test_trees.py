"""ember.trees: leaves and mapping over op arguments give torch pytree's answers."""

import collections

import pytest
import torch
import torch.utils._pytree as pytree

from ember.trees import leaves, map_leaves

Pair = collections.namedtuple("Pair", "a b")

TREES = [
    (torch.ones(2), [1, 2.5], None, {"dtype": torch.float32, "dims": (0, 1)}),
    [torch.Size([2, 3]), (torch.zeros(1),)],
    {"x": Pair(torch.ones(1), [3, 4]), "y": collections.OrderedDict(b=1, a=2)},
    torch.return_types.max((torch.ones(2), torch.zeros(2, dtype=torch.long))),
    ((), [], {}, "text", 7),
    torch.ones(3),
]


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_leaves_and_mapping_as_pytree(tree):
    assert _same(leaves(tree), pytree.tree_flatten(tree)[0])

    def bump(value):
        return value + 1 if isinstance(value, (int, float, torch.Tensor)) and \
            not isinstance(value, bool) else value

    mine, theirs = map_leaves(bump, tree), pytree.tree_map(bump, tree)
    assert type(mine) is type(theirs)
    assert _same(leaves(mine), pytree.tree_flatten(theirs)[0])
    assert pytree.tree_structure(mine) == pytree.tree_structure(theirs)


def _same(mine, theirs):
    return len(mine) == len(theirs) and all(
        type(a) is type(b) and (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b)
        for a, b in zip(mine, theirs))
