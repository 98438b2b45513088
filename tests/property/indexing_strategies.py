"""Hypothesis strategies for how programs address memory: as_strided views with arbitrary
sizes, strides and storage offsets (over whole tensors and over partial views of a larger
storage), advanced indices mixing slices, integers, lists, index tensors, None and Ellipsis,
and calls of the embedding family. (strategies.py holds the random programs; these draw
single calls, whose failing example prints as the call itself.)

Every strategy draws a Case: a function, its arguments, and whether it writes (writes use
indices without repeats: where two positions write one element eager's order is undefined).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import assume
from hypothesis import strategies as st


@dataclasses.dataclass
class Case:
    description: str
    function: Callable
    args: tuple
    gradients: bool = False

    def __repr__(self) -> str:
        return self.description


def _values(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Distinct exact values (so a wrong element shows), on a grid of quarters."""
    generator = torch.Generator().manual_seed(seed)
    count = math.prod(shape)
    return (torch.randperm(max(count, 1), generator=generator)[:count].float() / 4 - 8
            ).reshape(shape)


# -- as_strided --------------------------------------------------------------------------
@st.composite
def strided_views(draw) -> Case:
    """as_strided(x, size, stride[, offset]) where x is a whole tensor or a partial view of a
    larger storage (from an offset), then read directly, through arithmetic, or written."""
    storage_size = draw(st.integers(1, 40))
    start = draw(st.integers(0, storage_size - 1))
    length = draw(st.integers(1, storage_size - start))
    rank = draw(st.integers(0, 3))
    size = tuple(draw(st.integers(0, 4)) for _ in range(rank))
    stride = tuple(draw(st.integers(0, 6)) for _ in range(rank))
    explicit = draw(st.booleans())
    offset = draw(st.integers(0, storage_size - 1)) if explicit else start
    reach = offset + sum((n - 1) * s for n, s in zip(size, stride) if n > 0)
    assume(math.prod(size) == 0 or reach < storage_size)
    # as_strided over memory the view does not cover is eager's to read: only from its start
    use = draw(st.sampled_from(["read", "compute", "of_computed", "write"]))
    if use == "of_computed":
        # a view of a value the graph computes: its memory is the computed value's alone
        assume(math.prod(size) == 0 or (offset >= start and reach < start + length))
    if use == "write":
        distinct = {sum(i * s for i, s in zip(index, stride))
                    for index in _positions(size)}
        assume(len(distinct) == math.prod(size))   # (overlapping writes are undefined)
    storage = _values((storage_size,), draw(st.integers(0, 3)))
    x = storage[start:start + length]
    keyword = dict(storage_offset=offset) if explicit else {}
    relative = offset - start

    def read(x):
        return torch.as_strided(x, size, stride, **keyword)

    def compute(x):
        return torch.as_strided(x, size, stride, **keyword) * 2 + 1

    def of_computed(x):
        return torch.as_strided(x + 1, size, stride, relative)

    def write(x):
        view = torch.as_strided(x, size, stride, **keyword)
        view.mul_(3)
        return x * 1

    function = {"read": read, "compute": compute, "of_computed": of_computed,
                "write": write}[use]
    return Case(f"{use}: as_strided(storage[{start}:{start + length}] of {storage_size}, "
                f"{size}, {stride}, {keyword or 'its own offset'})", function, (x,))


def _positions(size: tuple[int, ...]) -> list[tuple[int, ...]]:
    positions: list[tuple[int, ...]] = [()]
    for n in size:
        positions = [p + (i,) for p in positions for i in range(n)]
    return positions


# -- advanced indexing ---------------------------------------------------------------------
@st.composite
def _index_item(draw, length: int, unique: bool) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["slice", "int", "list", "tensor", "bool"]))
    if kind == "slice":
        start = draw(st.none() | st.integers(-length - 1, length + 1))
        stop = draw(st.none() | st.integers(-length - 1, length + 1))
        step = draw(st.none() | st.integers(1, 3))
        return "slice", slice(start, stop, step)
    if length == 0 or kind == "bool":
        mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        return "bool", torch.tensor(mask, dtype=torch.bool)
    position = st.integers(-length, length - 1)
    if kind == "int":
        return "int", draw(position)
    count = draw(st.integers(1, 4))
    if unique:
        chosen = draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=min(count, length),
                               unique=True))
    else:
        chosen = draw(st.lists(position, min_size=count, max_size=count))
    if kind == "list":
        return "list", chosen
    return "tensor", torch.tensor(chosen, dtype=torch.int64)


@st.composite
def advanced_indices(draw, write: bool = False) -> Case:
    """x[index] or x[index] = value, the index a tuple of slices, ints, lists, int64 and
    bool tensors, None and at most one Ellipsis."""
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(0 if rank > 1 else 1, 5)) for _ in range(rank))
    consumed = draw(st.integers(0, rank))
    items: list[Any] = []
    tensors_seen = 0
    for length in shape[:consumed]:
        kind, item = draw(_index_item(length, unique=write))
        if kind in ("tensor", "list", "bool"):
            tensors_seen += 1
            if write and tensors_seen > 1:
                item = slice(None)   # (two index tensors pair up positions: repeats again)
        items.append(item)
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    if draw(st.booleans()) and consumed < rank:
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
    index = tuple(items) if draw(st.booleans()) or len(items) != 1 else items[0]
    x = _values(shape, draw(st.integers(0, 3)))
    try:
        selected = x[index]
    except (IndexError, RuntimeError, ValueError):
        assume(False)
    gradients = draw(st.booleans())
    if not write:
        if draw(st.booleans()):  # the index an argument (guarded), as OpInfo passes it
            def read_given(x, index):
                return x[index] * 2

            return Case(f"x{list(shape)}[index={_describe(index)}]", read_given,
                        (x.requires_grad_(gradients), index), gradients)

        def read(x):
            return x[index] * 2

        return Case(f"x{list(shape)}[{_describe(index)}]", read,
                    (x.requires_grad_(gradients),), gradients)
    scalar = draw(st.booleans())
    value = 7.5 if scalar else _values(tuple(selected.shape), 9)

    def assign(x, value):
        y = x * 1
        y[index] = value
        return y

    return Case(f"x{list(shape)}[{_describe(index)}] = "
                f"{value if scalar else list(selected.shape)}", assign,
                (x.requires_grad_(gradients), value), gradients)


def _describe(index: Any) -> str:
    items = index if isinstance(index, tuple) else (index,)
    parts = []
    for item in items:
        if isinstance(item, torch.Tensor):
            parts.append(f"tensor({item.tolist()})")
        elif item is Ellipsis:
            parts.append("...")
        elif isinstance(item, slice):
            parts.append(f"{'' if item.start is None else item.start}:"
                         f"{'' if item.stop is None else item.stop}"
                         f"{'' if item.step is None else ':' + str(item.step)}")
        else:
            parts.append(repr(item))
    text = ", ".join(parts)
    return f"({text},)" if isinstance(index, tuple) and len(items) == 1 else text


# -- the embedding family ------------------------------------------------------------------
@st.composite
def embedding_calls(draw) -> Case:
    """embedding (padding_idx, max_norm, scale_grad_by_freq), embedding_bag (1-d input with
    offsets or 2-d bags; sum, mean, max; per_sample_weights; include_last_offset;
    padding_idx) and one_hot, with gradients of the weight where they are defined."""
    rows, width = draw(st.integers(1, 8)), draw(st.integers(1, 5))
    weight = _values((rows, width), draw(st.integers(0, 3)))
    family = draw(st.sampled_from(["embedding", "bag", "one_hot"]))
    padding = draw(st.none() | st.integers(-rows, rows - 1))
    if family == "one_hot":
        shape = tuple(draw(st.integers(0, 4)) for _ in range(draw(st.integers(1, 2))))
        indices = torch.randint(0, rows, shape, generator=_generator(draw))

        def one_hot(indices):
            return torch.nn.functional.one_hot(indices, rows) * 2

        return Case(f"one_hot({indices.tolist()}, {rows})", one_hot, (indices,))
    if family == "embedding":
        shape = tuple(draw(st.integers(0, 4)) for _ in range(draw(st.integers(1, 2))))
        indices = draw(_index_tensor(rows, shape))
        max_norm = draw(st.none() | st.sampled_from([1.0, 4.0]))
        by_frequency = draw(st.booleans())
        gradients = max_norm is None and draw(st.booleans())

        def embedding(indices, weight):
            return torch.nn.functional.embedding(indices, weight, padding_idx=padding,
                                                 max_norm=max_norm,
                                                 scale_grad_by_freq=by_frequency) * 2

        return Case(f"embedding({indices.tolist()}, weight{[rows, width]}, padding_idx="
                    f"{padding}, max_norm={max_norm}, scale_grad_by_freq={by_frequency})",
                    embedding, (indices, weight.requires_grad_(gradients)), gradients)
    mode = draw(st.sampled_from(["sum", "mean", "max"]))
    weighted = mode == "sum" and draw(st.booleans())
    two_dimensional = draw(st.booleans())
    last = not two_dimensional and draw(st.booleans())
    if two_dimensional:
        bags, size = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        indices = draw(_index_tensor(rows, (bags, size)))
        offsets = None
    else:
        count = draw(st.integers(0, 8))
        indices = draw(_index_tensor(rows, (count,)))
        cuts = sorted(draw(st.lists(st.integers(0, count), min_size=0, max_size=3)))
        offsets = torch.tensor([0, *cuts] + ([count] if last else []), dtype=torch.int64)
    per_sample = _values(tuple(indices.shape), 5) if weighted else None
    gradients = draw(st.booleans())
    if padding is not None:
        padding = padding % rows

    def bag(indices, weight, offsets, per_sample):
        return torch.nn.functional.embedding_bag(
            indices, weight, offsets, mode=mode, per_sample_weights=per_sample,
            include_last_offset=last, padding_idx=padding) * 2

    return Case(f"embedding_bag({indices.tolist()}, weight{[rows, width]}, offsets="
                f"{None if offsets is None else offsets.tolist()}, mode={mode}, "
                f"per_sample_weights={per_sample is not None}, include_last_offset={last}, "
                f"padding_idx={padding})", bag,
                (indices, weight.requires_grad_(gradients), offsets, per_sample), gradients)


def _generator(draw) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))


@st.composite
def _index_tensor(draw, rows: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Indices below `rows`, contiguous or every other element of a wider tensor (eager's
    composites make them contiguous before kernels that need it)."""
    generator = _generator(draw)
    if not shape or not draw(st.booleans()):
        return torch.randint(0, rows, shape, generator=generator)
    wide = (*shape[:-1], 2 * shape[-1])
    return torch.randint(0, rows, wide, generator=generator)[..., ::2]
