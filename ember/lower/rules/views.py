"""View aten ops: each becomes a chain of IR view nodes (index maps, never copies).

The tracer reads the chain back to re-derive the view after its base is written, and inverts
it (ember/lower/mutation.py) to write through the view.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.lower.builder import Builder, normalize_dim
from ember.lower.registry import aten, lowering


def infer_size(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = list(shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


@lowering(aten.view.default, aten._unsafe_view, aten._reshape_alias, aten.reshape)
def _view(b: Builder, x: Node, size: Sequence[int], *strides) -> Node:
    return b.reshape(x, infer_size(size, x.numel))


@lowering(aten.alias, aten.detach)
def _alias(b: Builder, x: Node) -> Node:
    return x


@lowering(aten.t)
def _t(b: Builder, x: Node) -> Node:
    return x if x.ndim < 2 else b.transpose(x, 0, 1)


@lowering(aten.transpose.int)
def _transpose(b: Builder, x: Node, dim0: int, dim1: int) -> Node:
    return b.transpose(x, dim0, dim1)


@lowering(aten.permute)
def _permute(b: Builder, x: Node, dims: Sequence[int]) -> Node:
    return b.permute(x, dims)


@lowering(aten.expand)
def _expand(b: Builder, x: Node, size: Sequence[int], *, implicit: bool = False) -> Node:
    lead = len(size) - x.ndim
    shape = tuple(x.shape[d - lead] if (n == -1 and d >= lead) else n for d, n in enumerate(size))
    if lead:
        x = b.reshape(x, (1,) * lead + x.shape)
    return b.expand(x, shape)


@lowering(aten.slice.Tensor)
def _slice(b: Builder, x: Node, dim: int = 0, start=None, end=None, step: int = 1) -> Node:
    return b.slice(x, dim, start, end, step)


@lowering(aten.select.int)
def _select(b: Builder, x: Node, dim: int, index: int) -> Node:
    dim = normalize_dim(dim, x.ndim)
    index = index + x.shape[dim] if index < 0 else index
    return b.squeeze(b.slice(x, dim, index, index + 1), (dim,))


@lowering(aten.narrow)
def _narrow(b: Builder, x: Node, dim: int, start: int, length: int) -> Node:
    dim = normalize_dim(dim, x.ndim)
    start = start + x.shape[dim] if start < 0 else start
    return b.slice(x, dim, start, start + length)


@lowering(aten.squeeze.default)
def _squeeze_all(b: Builder, x: Node) -> Node:
    return b.squeeze(x, [d for d, n in enumerate(x.shape) if n == 1])


@lowering(aten.squeeze.dim)
def _squeeze_dim(b: Builder, x: Node, dim: int) -> Node:
    return b.squeeze(x, [normalize_dim(dim, x.ndim)]) if x.ndim else x


@lowering(aten.squeeze.dims)
def _squeeze_dims(b: Builder, x: Node, dim: Sequence[int]) -> Node:
    return b.squeeze(x, [normalize_dim(d, x.ndim) for d in dim]) if x.ndim else x


@lowering(aten.unsqueeze)
def _unsqueeze(b: Builder, x: Node, dim: int) -> Node:
    return b.unsqueeze(x, dim)


@lowering(aten.diagonal)
def _diagonal(b: Builder, x: Node, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Node:
    dim1, dim2 = normalize_dim(dim1, x.ndim), normalize_dim(dim2, x.ndim)
    rest = [d for d in range(x.ndim) if d not in (dim1, dim2)]
    moved = b.permute(x, rest + [dim1, dim2])
    rows, cols = x.shape[dim1], x.shape[dim2]
    count = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
    start = offset if offset >= 0 else -offset * cols
    flat = b.reshape(moved, moved.shape[:-2] + (rows * cols,))
    if count == 0:
        return b.slice(flat, -1, 0, 0)
    return b.slice(flat, -1, start, start + (count - 1) * (cols + 1) + 1, cols + 1)


@lowering(aten.unfold)
def _unfold(b: Builder, x: Node, dimension: int, size: int, step: int) -> Node:
    if x.ndim == 0:
        return b.reshape(x, (1,))
    dim = normalize_dim(dimension, x.ndim)
    strides = [math.prod(x.shape[d + 1:]) for d in range(x.ndim)]
    count = (x.shape[dim] - size) // step + 1
    shape = x.shape[:dim] + (count,) + x.shape[dim + 1:] + (size,)
    new_strides = strides[:dim] + [strides[dim] * step] + strides[dim + 1:] + [strides[dim]]
    return b.graph.add(Op.AS_STRIDED, (x,), shape=shape, strides=tuple(new_strides), offset=0)


@lowering(aten.split.Tensor, aten.unsafe_split.Tensor)
def _split(b: Builder, x: Node, split_size: int, dim: int = 0) -> list[Node]:
    dim = normalize_dim(dim, x.ndim)
    size = x.shape[dim]
    if split_size == 0:
        return [x]
    starts = range(0, max(size, 1), split_size)
    return [b.slice(x, dim, start, min(start + split_size, size)) for start in starts]


@lowering(aten.split_with_sizes, aten.unsafe_split_with_sizes)
def _split_with_sizes(b: Builder, x: Node, split_sizes: Sequence[int], dim: int = 0) -> list:
    dim = normalize_dim(dim, x.ndim)
    pieces, start = [], 0
    for length in split_sizes:
        pieces.append(b.slice(x, dim, start, start + length))
        start += length
    return pieces


@lowering(aten.unbind.int)
def _unbind(b: Builder, x: Node, dim: int = 0) -> list[Node]:
    dim = normalize_dim(dim, x.ndim)
    return [_select(b, x, dim, index) for index in range(x.shape[dim])]
