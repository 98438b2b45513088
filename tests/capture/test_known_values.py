"""Tensors whose values capture knows (ember/capture/known_values.py): made from Python
constants alone, their numbers fold where Python or an op needs one (arange's bounds,
.item(), int(), a branch) and the function stays one graph; a value that depends on the
inputs, was written by an op of the inputs, or was drawn at random is not known, and reading
it still breaks the graph. Each case runs eagerly and compiled and compares the results,
the graphs, breaks and eager islands, and the reason of a break."""

from __future__ import annotations

import pytest
import torch
from checks import same

import ember


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def relative_positions(x):
    # Funnel Transformer's relative positions: a position table made of constants, pooled
    # with a new_tensor, and arange over 0-d tensors read from it
    length = x.shape[1]
    pos = torch.arange(0, length, dtype=torch.int64, device=x.device).to(x.dtype)
    cls = pos.new_tensor([-1])
    pooled = torch.cat([cls, pos[1:-1][::2]], 0)
    reference = pooled[0] - pos[0]
    top = reference + 2 * pooled.shape[0]
    bottom = pooled[0] - pos[-1]
    relative = torch.arange(top, bottom - 1, -1, dtype=torch.long, device=x.device)
    return x.sum(-1, keepdim=True) * relative.to(x.dtype)


def numbers_of_constants(x):
    counts = torch.tensor([1, 2, 3], device=x.device) * 2
    total = counts.sum()
    return x * total.item(), int(total), float(counts[0]), bool(total), counts.tolist()


def branch_on_a_constant(x):
    table = torch.arange(4, device=x.device)
    if table.sum() > 5:
        return x + 1
    return x - 1


def slice_by_a_constant(x):
    window = torch.zeros(3, device=x.device)
    window[1] = 4
    window.mul_(2)
    return x[: int(window[1])]


def made_like_an_input(x):
    # (new_ones and zeros_like read only the input's dtype, device and shape)
    count = x.new_ones(2).sum() + torch.zeros_like(x).sum()
    return x[: int(count)]


def size_of_a_constant(x):
    rows = torch.tensor(2, device=x.device) + 1
    return torch.zeros(rows, x.shape[0], device=x.device) + x


def list_indexed_by_a_constant(x):
    # (a Python list indexed by a 0-d tensor: the tensor's __index__)
    scales = [0.5, 2.0, 3.0]
    return x * scales[torch.tensor(0) + 1]


@pytest.mark.parametrize("fn, args", [
    (relative_positions, (t(2, 12),)),
    (list_indexed_by_a_constant, (t(3),)),
    (numbers_of_constants, (t(3),)),
    (branch_on_a_constant, (t(3),)),
    (slice_by_a_constant, (t(10),)),
    (made_like_an_input, (t(5),)),
    (size_of_a_constant, (t(4),)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_a_tensor_made_of_constants_folds_to_its_number_in_one_graph(fn, args):
    report = ember.explain(fn)(*args)
    assert (report.graph_count, report.graph_break_count, report.eager_islands) == (1, 0, []), \
        report
    compiled = ember.compile(fn)
    for _ in range(2):
        same(compiled(*args), fn(*args))


def bound_from_the_input(x, n):
    return x.sum() + torch.arange(0, n.sum()).sum()


def written_by_the_input(x):
    offset = torch.zeros(())
    offset.add_(x.sum())
    return torch.arange(0, offset + 5)


def written_through_a_view(x):
    table = torch.zeros(3)
    tail = table[1:]
    tail.add_(x[0])  # (table[0] stays 0, but its storage is no longer known)
    return torch.arange(0, table[0] + 3)


def written_through_a_view_too_large_to_know(x):
    table = torch.zeros(4)
    wide = table.expand(2000, 4)  # (8000 elements: not a known value, but table's memory)
    wide[0].add_(x[0])
    return torch.arange(0, table[0] + 3)


def set_from_the_input(x):
    table = torch.zeros(3)
    table[1] = x.sum()
    return torch.arange(0, table[1] + 3)


def drawn_at_random(x):
    drawn = torch.rand(())
    return x * int(drawn * 0)


@pytest.mark.parametrize("fn, args, reason", [
    (bound_from_the_input, (t(3), torch.tensor([2, 3])), "depend on the inputs"),
    (written_by_the_input, (torch.ones(2),), "depend on the inputs"),
    (written_through_a_view, (torch.ones(2),), "depend on the inputs"),
    (written_through_a_view_too_large_to_know, (torch.ones(2),), "depend on the inputs"),
    (set_from_the_input, (torch.ones(2),), "depend on the inputs"),
    (drawn_at_random, (t(3),), "int() of a tensor reads its value"),
], ids=lambda v: getattr(v, "__name__", None))
def test_a_value_of_the_inputs_or_of_a_draw_still_breaks_the_graph(fn, args, reason):
    report = ember.explain(fn)(*args)
    assert (report.graph_count, report.graph_break_count) == (2, 1), report
    assert reason in report.break_reasons[0].reason
    compiled = ember.compile(fn)
    for _ in range(2):
        torch.manual_seed(0)
        expected = fn(*args)
        torch.manual_seed(0)
        same(compiled(*args), expected)


def test_capture_draws_no_random_numbers_of_its_own():
    # a draw is never run at capture time: the generator moves only as eager's does
    def draws(x):
        noise = torch.rand(3)
        return x + noise, torch.randn(()).abs() < 10

    x = t(3)
    torch.manual_seed(0)
    expected = draws(x), torch.rand(4)
    torch.manual_seed(0)
    got = ember.compile(draws)(x), torch.rand(4)
    same(got, expected)


def test_symbolic_sizes_are_not_known_values():
    # with the length a symbol, the positions depend on the input's size: a break, and the
    # answers of every length eager's
    compiled = ember.compile(relative_positions, dynamic=True)
    for length in (12, 16, 20):
        x = t(2, length)
        same(compiled(x), relative_positions(x))
    report = ember.explain(relative_positions, dynamic=True)(t(2, 24))
    assert report.graph_break_count == 1, report


def test_new_tensor_of_numbers_compiles_without_an_island():
    def prepend(x):
        return torch.cat([x.new_tensor([-1.0, 2.0]), x * 2])

    x = t(3)
    report = ember.explain(prepend)(x)
    assert (report.graph_count, report.eager_islands) == (1, []), report
    same(ember.compile(prepend)(x), prepend(x))
