"""Subscripts with 0-d integer tensors (ember/capture/scalar_indices.py): eager indexes with
the tensor's value, a view (`x[t]` is `x.select(0, t)`); ember gathers, one graph with no
break, where nothing can tell the gather from the view — and breaks as before where
something can (the result returned, written, or its base written after). `x[t] = v` is an
index_put_ at the view's elements."""

from __future__ import annotations

import pytest
import torch
from checks import same

import ember


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def index(value, dtype=torch.int64):
    return torch.tensor(value, dtype=dtype)


def shape_of(report):
    return report.graph_count, report.graph_break_count, report.eager_islands


def reads(x, i, j):
    first = x[i] * 2                     # a row
    column = x[:, j].sum()               # a column
    element = x[i, j] + x[i, 1]          # an element, beside a number
    last = x[..., j].exp()               # after an Ellipsis
    spread = x[None, i, 1:] + 1          # beside None and a slice
    return first, column, element, last, spread


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16], ids=str)
@pytest.mark.parametrize("i, j", [(3, 2), (-1, -4), (0, 0)], ids=str)
def test_reads_are_one_graph_with_eager_s_values(i, j, dtype):
    x = t(5, 4)
    args = (x, index(i, dtype), index(j, dtype))
    assert shape_of(ember.explain(reads)(*args)) == (1, 0, [])
    compiled = ember.compile(reads, fullgraph=True)
    for row in (i, 4, -5):
        args = (x, index(row, dtype), index(j, dtype))
        same(compiled(*args), reads(*args))


def beside_advanced(x, idx, i):
    # eager selects with the 0-d index first: the 1-d one is then alone (adjacent), and its
    # dimension stays where it is
    return x[:, idx, :, i], x[i, idx], x[idx, :, i]


def test_beside_an_advanced_index_the_result_is_laid_out_as_eager_s():
    x, idx = t(3, 4, 5, 6), torch.tensor([0, 2, 1, 0, 2, 1])
    args = (x, idx, index(1))
    assert shape_of(ember.explain(beside_advanced)(*args)) == (1, 0, [])
    same(ember.compile(beside_advanced, fullgraph=True)(*args), beside_advanced(*args))


@pytest.mark.parametrize("value", [5, -6, 40])
def test_an_index_out_of_range_raises_eager_s_index_error(value):
    def row(x, i):
        return x[i] + 1

    x = t(5, 4)
    compiled = ember.compile(row)
    compiled(x, index(0))
    if -5 <= value < 5:
        same(compiled(x, index(value)), row(x, index(value)))
        return
    with pytest.raises(IndexError) as eager:
        row(x, index(value))
    with pytest.raises(IndexError) as ours:
        compiled(x, index(value))
    assert str(ours.value) == str(eager.value)


class Scheduler(torch.nn.Module):
    # a diffusion scheduler's step: per-timestep constants read with a 0-d tensor
    def __init__(self):
        super().__init__()
        alphas = torch.linspace(0.99, 0.5, 10)
        self.register_buffer("alphas", alphas)
        self.register_buffer("previous", torch.cat([torch.ones(1), alphas[:-1]]))

    def forward(self, sample, noise, timestep):
        alpha, previous = self.alphas[timestep], self.previous[timestep]
        return (sample - (1 - alpha).sqrt() * noise) / alpha.sqrt() * previous.sqrt()


def test_a_scheduler_step_is_one_graph_over_its_timesteps():
    scheduler = Scheduler().to(torch.get_default_device())
    sample, noise = t(2, 3, seed=1), t(2, 3, seed=2)
    report = ember.explain(scheduler)(sample, noise, index(4))
    assert shape_of(report) == (1, 0, [])
    compiled = ember.compile(scheduler)
    for step in (9, 4, 1, 0):
        args = (sample, noise, index(step))
        same(compiled(*args), scheduler(*args))
    assert len(compiled._compiled_forward.records) == 1  # (one capture serves each timestep)


def test_gradients_reach_the_indexed_tensor_as_eager_s():
    def loss(x, w, i):
        return (x[i] * w[:, i]).sum() + x[i].pow(2).sum()

    x, w = t(5, 4, seed=3).requires_grad_(), t(4, 5, seed=4).requires_grad_()
    compiled = ember.compile(loss, fullgraph=True)
    for row in (2, -1):
        expected = loss(x, w, index(row))
        expected_grads = torch.autograd.grad(expected, (x, w))
        actual = compiled(x, w, index(row))
        same(actual, expected)
        same(torch.autograd.grad(actual, (x, w)), expected_grads)


def returned(x, i):
    return x[i]


def viewed_and_returned(x, i):
    return x[i].view(2, 2)


def base_written_after(x, i):
    y = x[i]
    x.mul_(2)
    return y + 1


def result_written(x, i):
    y = x[i]
    y.add_(1)       # writes x's row in eager
    return x.sum()


@pytest.mark.parametrize("fn", [returned, viewed_and_returned, base_written_after,
                                result_written], ids=lambda f: f.__name__)
def test_where_the_view_shows_the_subscript_breaks_and_eager_s_view_is_kept(fn):
    x = t(5, 4)
    report = ember.explain(fn)(x.clone(), index(1))
    assert shape_of(report)[:2] == (2, 1)
    compiled = ember.compile(fn)
    for row in (1, 3):
        ours, eagers = x.clone(), x.clone()
        actual, expected = compiled(ours, index(row)), fn(eagers, index(row))
        same(actual, expected)
        same(ours, eagers)
        assert (actual._base is ours) == (expected._base is eagers)
        if fn is returned:  # the user's write through the result reaches the input
            actual.fill_(7)
            assert bool((ours[row] == 7).all())


def one_returned_among_others(x, i):
    rows = x[i] + x[i - 1]
    return rows, x[i + 1]       # the last is eager's view: only that subscript breaks


def test_only_the_subscript_whose_view_shows_breaks():
    x = t(5, 4)
    assert shape_of(ember.explain(one_returned_among_others)(x, index(2))) == (2, 1, [])
    compiled = ember.compile(one_returned_among_others)
    for row in (2, -2):
        actual = compiled(x, index(row))
        expected = one_returned_among_others(x, index(row))
        same(actual, expected)
        assert actual[1]._base is x


def writes(x, i, v):
    x = x.clone()
    x[i] = v                       # a row from a tensor
    x[:, i] = 2.5                  # a column from a number
    x[..., i + 1] = v.flip(0) * 3  # after an Ellipsis, a computed index
    return x


@pytest.mark.parametrize("row", [0, 2, -3])
def test_writes_are_one_graph_with_eager_s_values(row):
    x, v = t(6, 6), t(6, seed=5)
    args = (x, index(row), v)
    assert shape_of(ember.explain(writes)(*args)) == (1, 0, [])
    same(ember.compile(writes, fullgraph=True)(*args), writes(*args))


def test_a_write_casts_and_broadcasts_the_value_as_eager_s_copy():
    def write(x, i, v):
        x[i] = v
        return x

    x, v = t(4, 3), torch.arange(3)      # int64 into float32, broadcast over nothing
    compiled = ember.compile(write, fullgraph=True)
    ours, eagers = x.clone(), x.clone()
    same(compiled(ours, index(1), v), write(eagers, index(1), v))
    same(ours, eagers)
    ours, eagers = x.clone(), x.clone()
    same(compiled(ours, index(2), v[:1]), write(eagers, index(2), v[:1]))
    same(ours, eagers)


def augmented(counts, idx, v):
    counts = counts.clone()
    counts[idx] += 1            # a gather, written, then stored back by the same statement
    counts[idx, 1:] *= v
    return counts


def test_an_augmented_assignment_is_one_graph_with_eager_s_values():
    counts, v = t(4, 3), t(2, seed=6)
    assert shape_of(ember.explain(augmented)(counts, index(2), v)) == (1, 0, [])
    compiled = ember.compile(augmented, fullgraph=True)
    for row in (2, -1, 0):
        same(compiled(counts, index(row), v), augmented(counts, index(row), v))


def written_then_read(x, i):
    y = x[i]
    y.add_(1)            # writes x's row in eager
    total = x.sum()      # which this reads
    x[i] = y             # (y is eager's view here: the store copies it onto itself)
    return total


def test_a_gather_written_and_its_base_read_before_the_store_breaks():
    # (the store after the read does not make the gather a view: the subscript breaks, and
    # the resumed code's store takes a value that overlaps its target)
    x = t(5, 4)
    assert shape_of(ember.explain(written_then_read)(x.clone(), index(1)))[:2] == (2, 1)
    compiled = ember.compile(written_then_read)
    for row in (1, -2):
        ours, eagers = x.clone(), x.clone()
        same(compiled(ours, index(row)), written_then_read(eagers, index(row)))
        same(ours, eagers)
