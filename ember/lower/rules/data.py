"""Creation and data movement: full/arange/eye, cat/stack, pad, indexing, gather, repeat, ..."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ember.ir import dtypes
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.ir.sizes import Dim, Size, Undecided
from ember.lower.builder import Builder, normalize_dim
from ember.lower.registry import Decline, aten, lowering


def _dtype(dtype, value=None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if value is None:
        return torch.get_default_dtype()
    return dtypes.scalar_dtype(value)


# -- creation -----------------------------------------------------------------------------
@lowering(aten.full.default)
def _full(b: Builder, size, fill_value, *, dtype=None, layout=None, device=None,
          pin_memory=None) -> Node:
    return b.full(fill_value, _dtype(dtype, fill_value), tuple(size))


@lowering(aten.zeros.default, aten.empty.memory_format)
def _zeros(b: Builder, size, *, dtype=None, layout=None, device=None, pin_memory=None,
           memory_format=None, names=None) -> Node:
    return b.full(0, _dtype(dtype), tuple(size))


@lowering(aten.ones.default)
def _ones(b: Builder, size, *, dtype=None, layout=None, device=None, pin_memory=None) -> Node:
    return b.full(1, _dtype(dtype), tuple(size))


@lowering(aten.empty_strided)
def _empty_strided(b: Builder, size, stride, *, dtype=None, layout=None, device=None,
                   pin_memory=None) -> Node:
    return b.full(0, _dtype(dtype), tuple(size))


@lowering(aten.scalar_tensor)
def _scalar_tensor(b: Builder, value, *, dtype=None, layout=None, device=None,
                   pin_memory=None) -> Node:
    return b.full(value, _dtype(dtype), ())


def _like(value_of):
    def rule(b: Builder, x: Node, *args, dtype=None, layout=None, device=None, pin_memory=None,
             memory_format=None) -> Node:
        value = value_of(args)
        return b.full(value, dtype or x.dtype, x.shape)

    return rule


lowering(aten.zeros_like, aten.empty_like)(_like(lambda args: 0))
lowering(aten.ones_like)(_like(lambda args: 1))
lowering(aten.full_like)(_like(lambda args: args[0]))


def _new(value_of):
    def rule(b: Builder, x: Node, size, *args, dtype=None, layout=None, device=None,
             pin_memory=None) -> Node:
        return b.full(value_of(args), dtype or x.dtype, tuple(size))

    return rule


lowering(aten.new_zeros, aten.new_empty)(_new(lambda args: 0))
lowering(aten.new_ones)(_new(lambda args: 1))
lowering(aten.new_full)(_new(lambda args: args[0]))


@lowering(aten.new_empty_strided)
def _new_empty_strided(b: Builder, x: Node, size, stride, *, dtype=None, layout=None,
                       device=None, pin_memory=None) -> Node:
    return b.full(0, dtype or x.dtype, tuple(size))


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(b: Builder, start, end=None, step=1, *, dtype=None, layout=None, device=None,
            pin_memory=None) -> Node:
    if end is None:
        start, end = 0, start
    if isinstance(start, Size) or isinstance(end, Size):
        count = _symbolic_count(start, end, step)
    else:
        count = max(0, math.ceil((end - start) / step))
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, (int, Size)) for v in (start, end, step)) \
            else torch.get_default_dtype()
    if all(isinstance(v, (int, Size)) for v in (start, step)):
        return b.cast(b.iota((count,), 0, torch.int64, start, step), dtype)
    # start + step * i in double, as eager accumulates, then rounded once
    index = b.cast(b.iota((count,), 0), torch.float64)
    return b.cast(b.add(b.mul(index, float(step)), float(start)), dtype)


def _symbolic_count(start, end, step) -> Dim:
    """arange's length over symbolic bounds (`arange(past, past + n)`, `arange(s)`) with an
    int step; a length the symbols' ranges cannot settle is Undecided (per shape)."""
    if not isinstance(step, int) or isinstance(step, bool) or step <= 0 or \
            not all(isinstance(v, (int, Size)) for v in (start, end)):
        raise Undecided(f"arange({start}, {end}, {step}) over symbolic sizes")
    count = (end - start + step - 1) // step  # (exact, or Undecided)
    return count if count >= 0 else 0


@lowering(aten.linspace.default)
def _linspace(b: Builder, start, end, steps: int, *, dtype=None, layout=None, device=None,
              pin_memory=None) -> Node:
    """Eager's kernel: the first half counts up from start, the second down from end (so both
    ends are exact), in the dtype itself for floats and in double for integers."""
    dtype = _dtype(dtype)
    if steps <= 1:
        return b.full(start, dtype, (steps,))
    compute = dtype if dtype in (torch.float32, torch.float64) else torch.float64
    if dtype in dtypes.REDUCED_FLOAT:
        compute = torch.float32
    first = torch.tensor(start, dtype=dtype).to(compute)
    last = torch.tensor(end, dtype=dtype).to(compute)
    step = ((last - first) / (steps - 1)).item()
    index = b.cast(b.iota((steps,), 0), compute)
    rising = b.add(b.mul(index, step), first.item())
    falling = b.sub(last.item(), b.mul(b.sub(steps - 1, index), step))
    halfway = b.compare(Op.LT, b.iota((steps,), 0), steps // 2)
    return b.cast(b.where(halfway, rising, falling), dtype)


@lowering(aten.eye.default, aten.eye.m)
def _eye(b: Builder, n: int, m: int | None = None, *, dtype=None, layout=None, device=None,
         pin_memory=None) -> Node:
    m = n if m is None else m
    rows, cols = b.iota((n, m), 0), b.iota((n, m), 1)
    return b.cast(b.compare(Op.EQ, rows, cols), _dtype(dtype))


def _triangle(b: Builder, x: Node, diagonal: int, lower: bool) -> Node:
    rows, cols = x.shape[-2], x.shape[-1]
    row, col = b.iota((rows, cols), 0), b.iota((rows, cols), 1)
    offset = b.sub(col, row)
    keep = b.compare(Op.LE, offset, diagonal) if lower else b.compare(Op.GE, offset, diagonal)
    return b.where(b.broadcast_to(keep, x.shape), x, b.full(0, x.dtype))


@lowering(aten.tril)
def _tril(b: Builder, x: Node, diagonal: int = 0) -> Node:
    return _triangle(b, x, diagonal, True)


@lowering(aten.triu)
def _triu(b: Builder, x: Node, diagonal: int = 0) -> Node:
    return _triangle(b, x, diagonal, False)


# -- joining and padding ------------------------------------------------------------------
@lowering(aten.cat.default)
def _cat(b: Builder, tensors: Sequence[Node], dim: int = 0) -> Node:
    dtype = b.compute_dtype(*tensors)
    legacy_empty = [t for t in tensors if t.shape == (0,)]
    kept = [b.cast(t, dtype) for t in tensors if t.shape != (0,)]
    if not kept:
        return b.cast(legacy_empty[0], dtype)
    return b.cat(kept, dim)


@lowering(aten.stack.default)
def _stack(b: Builder, tensors: Sequence[Node], dim: int = 0) -> Node:
    dim = normalize_dim(dim, tensors[0].ndim + 1)
    dtype = b.compute_dtype(*tensors)
    return b.cat([b.unsqueeze(b.cast(t, dtype), dim) for t in tensors], dim)


@lowering(aten.constant_pad_nd)
def _constant_pad(b: Builder, x: Node, pad: Sequence[int], value=0) -> Node:
    pads = [(0, 0, 0)] * x.ndim
    for position in range(len(pad) // 2):
        dim = x.ndim - 1 - position
        low, high = pad[2 * position], pad[2 * position + 1]
        if low < 0:
            x = b.slice(x, dim, -low, None)
            low = 0
        if high < 0:
            x = b.slice(x, dim, 0, x.shape[dim] + high)
            high = 0
        pads[dim] = (low, high, 0)
    return b.pad(x, pads, value)


@lowering(aten.flip)
def _flip(b: Builder, x: Node, dims: Sequence[int]) -> Node:
    dims = tuple(sorted({normalize_dim(d, x.ndim) for d in dims}))
    if not dims or x.ndim == 0:
        return x
    return b.graph.add(Op.FLIP, (x,), dims=dims)


@lowering(aten.rot90)
def _rot90(b: Builder, x: Node, k: int = 1, dims: Sequence[int] = (0, 1)) -> Node:
    first, second = (normalize_dim(d, x.ndim) for d in dims)
    turns = k % 4
    if turns == 0:
        return x
    if turns == 2:
        return _flip(b, x, [first, second])
    flipped = _flip(b, x, [second if turns == 1 else first])
    return b.transpose(flipped, first, second)


@lowering(aten.roll)
def _roll(b: Builder, x: Node, shifts: Sequence[int], dims: Sequence[int] = ()) -> Node:
    if not dims:
        flat = b.reshape(x, (x.numel,))
        return b.reshape(_roll(b, flat, shifts, [0]), x.shape)
    for shift, dim in zip(shifts, dims):
        dim = normalize_dim(dim, x.ndim)
        size = x.shape[dim]
        if size == 0 or shift % size == 0:
            continue
        cut = size - shift % size
        x = b.cat([b.slice(x, dim, cut, size), b.slice(x, dim, 0, cut)], dim)
    return x


@lowering(aten.repeat)
def _repeat(b: Builder, x: Node, repeats: Sequence[int]) -> Node:
    lead = len(repeats) - x.ndim
    x = b.reshape(x, (1,) * lead + x.shape)
    grown, final = [], []
    for count, size in zip(repeats, x.shape):
        grown += [count, size]
        final.append(count * size)
    pairs = b.reshape(x, tuple(n for size in x.shape for n in (1, size)))
    return b.reshape(b.expand(pairs, tuple(grown)), tuple(final))


# -- resampling ---------------------------------------------------------------------------
def _upsample_nearest(b: Builder, x: Node, output_size: Sequence[int], scales) -> Node:
    """Nearest neighbours over the trailing dims: source = min(floor(out * scale), in - 1),
    in float32 as eager computes it (scale = 1/scale_factor when given, else in/out)."""
    for position, (size, scale) in enumerate(zip(output_size, scales)):
        dim = x.ndim - len(output_size) + position
        source_size = x.shape[dim]
        if size == source_size:
            continue
        ratio = 1.0 / scale if scale is not None and scale > 0 else source_size / size
        ratio = float(torch.tensor(ratio, dtype=torch.float32))
        position_float = b.cast(b.iota((size,), 0), torch.float32)
        source = b.cast(b.unary(Op.FLOOR, b.mul(position_float, ratio)), torch.int64)
        source = b.minimum(source, source_size - 1)
        x = b.take(x, source, dim)
    return x


@lowering(aten.upsample_nearest1d.default)
def _upsample_nearest1d(b: Builder, x: Node, output_size, scales=None) -> Node:
    return _upsample_nearest(b, x, output_size, [scales])


@lowering(aten.upsample_nearest2d.default)
def _upsample_nearest2d(b: Builder, x: Node, output_size, scales_h=None, scales_w=None) -> Node:
    return _upsample_nearest(b, x, output_size, [scales_h, scales_w])


@lowering(aten.upsample_nearest3d.default)
def _upsample_nearest3d(b: Builder, x: Node, output_size, scales_d=None, scales_h=None,
                        scales_w=None) -> Node:
    return _upsample_nearest(b, x, output_size, [scales_d, scales_h, scales_w])


@lowering(aten.pixel_shuffle)
def _pixel_shuffle(b: Builder, x: Node, upscale_factor: int) -> Node:
    r = upscale_factor
    *batch, channels, height, width = x.shape
    lead = len(batch)
    split = b.reshape(x, (*batch, channels // (r * r), r, r, height, width))
    moved = b.permute(split, [*range(lead), lead, lead + 3, lead + 1, lead + 4, lead + 2])
    return b.reshape(moved, (*batch, channels // (r * r), height * r, width * r))


@lowering(aten.pixel_unshuffle)
def _pixel_unshuffle(b: Builder, x: Node, downscale_factor: int) -> Node:
    r = downscale_factor
    *batch, channels, height, width = x.shape
    lead = len(batch)
    split = b.reshape(x, (*batch, channels, height // r, r, width // r, r))
    moved = b.permute(split, [*range(lead), lead, lead + 2, lead + 4, lead + 1, lead + 3])
    return b.reshape(moved, (*batch, channels * r * r, height // r, width // r))


# -- indexing -----------------------------------------------------------------------------
@lowering(aten.index_select)
def _index_select(b: Builder, x: Node, dim: int, index: Node) -> Node:
    if x.ndim == 0:  # a 0-d tensor stays 0-d (its one-element index must hold 0)
        return b.reshape(b.take(b.reshape(x, (1,)), b.reshape(index, (index.numel,)), 0), ())
    return b.take(x, b.reshape(index, (index.numel,)) if index.ndim else index, dim)


@lowering(aten.embedding)
def _embedding(b: Builder, weight: Node, indices: Node, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Node:
    if scale_grad_by_freq or sparse:
        # (each row's gradient divided by how often it was looked up: torch's own backward)
        shape = (*indices.shape, *weight.shape[1:])
        return b.library(aten.embedding.default, (weight, indices, padding_idx,
                                                  scale_grad_by_freq, sparse), shape,
                         weight.dtype)
    looked_up = b.take(weight, indices, 0)
    if padding_idx < 0:
        return looked_up
    # the padding row gets no gradient: where it was looked up, the value comes through a
    # stop-gradient (the same value: bit for bit, so the forward is unchanged)
    padding = b.compare(Op.EQ, indices, b.full(padding_idx, indices.dtype))
    padding = b.broadcast_to(b.reshape(padding, (*indices.shape, *[1] * (weight.ndim - 1))),
                             looked_up.shape)
    return b.where(padding, b.unary(Op.STOP_GRADIENT, looked_up), looked_up)


@lowering(aten.gather)
def _gather(b: Builder, x: Node, dim: int, index: Node, *, sparse_grad: bool = False) -> Node:
    if x.ndim == 0 or index.ndim == 0:
        raise Decline("gather on a 0-d tensor")
    return b.gather(x, index, dim)


@lowering(aten.index.Tensor)
def _index(b: Builder, x: Node, indices: Sequence[Node | None]) -> Node:
    indices = list(indices) + [None] * (x.ndim - len(indices))
    positions = [d for d, index in enumerate(indices) if index is not None]
    if not positions:
        return x
    if any(indices[d].dtype not in (torch.int64, torch.int32) for d in positions):
        raise Decline("boolean-mask indexing has a data-dependent shape")
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    if not adjacent:
        # eager puts the broadcast index dims first when the indexed dims are apart
        rest = [d for d in range(x.ndim) if d not in positions]
        x = b.permute(x, positions + rest)
        indices = [indices[d] for d in positions] + [None] * len(rest)
        positions = list(range(len(positions)))
    first = positions[0]
    index_nodes = b.broadcast(*(b.cast(indices[d], torch.int64) for d in positions))
    if len(positions) == 1:
        return b.take(x, index_nodes[0], first, wrap=True)
    # several adjacent index tensors: one index into the merged dims (each checked alone)
    sizes = [x.shape[d] for d in positions]
    linear, valid = None, None
    for index, size, stride in zip(index_nodes, sizes, _suffix_products(sizes)):
        wrapped = b.where(b.compare(Op.LT, index, 0), b.add(index, size), index)
        inside = b.binary(Op.BITWISE_AND, b.compare(Op.GE, wrapped, 0),
                          b.compare(Op.LT, wrapped, size))
        term = b.mul(wrapped, stride)
        linear = term if linear is None else b.add(linear, term)
        valid = inside if valid is None else b.binary(Op.BITWISE_AND, valid, inside)
    total = math.prod(sizes)
    linear = b.where(valid, linear, b.full(-1, torch.int64))
    merged = b.reshape(x, x.shape[:first] + (total,) + x.shape[positions[-1] + 1:])
    return b.take(merged, linear, first)


def _suffix_products(sizes: Sequence[int]) -> list[int]:
    return [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
