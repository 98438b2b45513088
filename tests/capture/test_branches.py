"""Branches on a tensor's value whose body only computes (capture/branches.py): both sides in
one graph, merged with torch.where, eager's answers and gradients whichever side a call
takes; a body with effects beyond its locals still breaks."""

from __future__ import annotations

import pytest
import torch
from checks import same

import ember


def clamped(x, w):
    # DETR's encoder layer in training: clamp only where the values overflowed
    h = torch.tanh(x @ w) * 3e38 * x.sum(-1, keepdim=True)
    if not torch.isfinite(h).all():
        clamp_value = torch.finfo(h.dtype).max - 1000
        h = torch.clamp(h, min=-clamp_value, max=clamp_value)
    return h.sum(-1) * 1e-38


def scaled(x):
    y = x * 2
    scale = x.new_ones(())
    if y.abs().max() > 4:  # (a float tensor's truth; the body rebinds two tensors)
        y = y / 4
        scale = scale * 4
    return y, scale


def _explained(fn, *args):
    explained = ember.explain(fn)(*args)
    return explained.graph_count, explained.graph_break_count


@pytest.mark.parametrize("fill", [None, 1.0, 1e-30])
def test_a_body_that_only_computes_is_merged_with_where(fill):
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4) if fill is None else torch.full((3, 4), fill)
    assert _explained(clamped, x, w) == (1, 0)
    compiled = ember.compile(clamped)
    got, want = compiled(x, w), clamped(x, w)
    same(got, want)
    same(torch.autograd.grad(got.sum(), w), torch.autograd.grad(want.sum(), w))


@pytest.mark.parametrize("size", [1.0, 9.0])
def test_several_locals_rebound_by_the_body_are_each_merged(size):
    x = torch.linspace(-size, size, 6)
    assert _explained(scaled, x) == (1, 0)
    same(ember.compile(scaled)(x), scaled(x))


def bound_only_in_the_body(x):
    if x.sum() > 0:
        y = x + 1
    return x * 2, "y" in locals()


def appends(x, seen):
    if x.sum() > 0:
        seen.append(1)
    return x * 2


def in_place(x):
    y = x * 1
    if y.sum() > 0:
        y.add_(1)
    return y


def with_else(x):
    if x.sum() > 0:
        y = x + 1
    else:
        y = x - 1
    return y


def draws(x):
    y = x * 1
    if y.sum() > 0:
        y = torch.nn.functional.dropout(y, 0.5)
    return y


def indexes(x, index):
    y = x * 1
    if (index < 4).all():
        y = y[index]
    return y


@pytest.mark.parametrize("fn, args", [
    (in_place, (torch.ones(4),)), (with_else, (torch.ones(4),)), (draws, (torch.ones(4),)),
    (indexes, (torch.ones(4), torch.tensor([0, 1, 2, 3]))),
], ids=lambda v: getattr(v, "__name__", ""))
def test_a_body_with_effects_or_another_shape_still_breaks(fn, args):
    # (a write in place, an else side, a random draw, an index that may be out of range
    # where the condition rejects the body)
    assert _explained(fn, *args) == (2, 1)
    torch.manual_seed(0)
    got = ember.compile(fn)(*args)
    torch.manual_seed(0)
    same(got, fn(*args))


def test_a_body_that_appends_or_binds_a_name_read_later_still_breaks():
    x = torch.ones(3)
    assert _explained(appends, x, [])[1] == 1
    seen, theirs = [], []
    same(ember.compile(appends)(x, seen), appends(x, theirs))
    assert seen == theirs == [1]
    assert _explained(bound_only_in_the_body, x)[1] == 1
