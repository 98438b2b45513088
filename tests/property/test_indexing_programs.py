"""Views with arbitrary strides and offsets, advanced indexing (read and write) and the
embedding family, drawn by hypothesis (tests/property/indexing_strategies.py) and compared
with eager by the OpInfo harness's check (values, shapes, strides, aliasing, requires_grad,
what the inputs hold afterwards, gradients). Run them with a fresh seed by
`pytest --hypothesis-profile=explore --hypothesis-seed=N`; what they found is kept below as
plain regression tests."""

import pytest
import torch
from hypothesis import given
from opinfo.harness import check_call
from property.indexing_strategies import Case, advanced_indices, embedding_calls, strided_views
from property.strategies import examples

LIMITS = (1e-5, 1.3e-6)   # (the values are quarters: every result here is exact or nearly)


def _check(case) -> None:
    check_call(case.function, case.args, {}, LIMITS, repr(case), gradients=case.gradients)


@examples(150)
@given(strided_views())
def test_strided_views_match_eager(case):
    _check(case)


@examples(150)
@given(advanced_indices())
def test_advanced_index_reads_match_eager(case):
    _check(case)


@examples(150)
@given(advanced_indices(write=True))
def test_advanced_index_writes_match_eager(case):
    _check(case)


@examples(150)
@given(embedding_calls())
def test_embedding_family_matches_eager(case):
    _check(case)


# -- what the generators found before it was fixed ------------------------------------------
def test_embedding_bag_of_every_other_index():
    """The indices a view with stride 2: eager's composite makes them contiguous before its
    kernel, which reads them as contiguous (ember passed the view: each bag summed the wrong
    rows)."""
    weight = torch.arange(3.0).reshape(3, 1)
    indices = torch.tensor([2, 0, 2, 1])[::2]

    def bag(indices, weight, offsets):
        return torch.nn.functional.embedding_bag(indices, weight, offsets, mode="sum") * 2

    _check(Case("embedding_bag(every other index)", bag,
                (indices, weight, torch.tensor([0]))))


@pytest.mark.parametrize("offset", [0, 3, 10])
def test_as_strided_with_an_offset_over_a_partial_view(offset):
    """as_strided's storage offset counts from its storage's start, not the view's (ember
    counted from the view's: values off by the view's offset)."""
    x = torch.arange(20.0)[5:15]
    _check(Case("as_strided over x[5:15]", lambda x: torch.as_strided(x, (2, 2), (1, 2), offset),
                (x,)))


@pytest.mark.parametrize("split", ["unsafe_split", "unsafe_chunk"])
def test_unsafe_splits_are_views(split):
    """Their results share the input's memory, as eager's do (ember's were copies)."""
    _check(Case(split, lambda x: getattr(torch, split)(x, 2), (torch.arange(6.0),)))
