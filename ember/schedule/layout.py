"""Strides of views: when a chain of view nodes over a buffer is itself a strided tensor.

Used to hand a view to a library call (or return it) as an alias of an existing buffer instead
of copying it, exactly as eager would pass a view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.ir.graph import Node, row_major
from ember.ir.ops import Op

if TYPE_CHECKING:
    from ember.schedule.plan import Buffer

Geometry = tuple[tuple[int, ...], tuple[int, ...], int]  # shape, strides, offset


def _reshape_strides(shape, strides, new_shape) -> tuple[int, ...] | None:
    """torch's computeStride: the strides of a reshape that is a view, or None."""
    if not shape:
        return (1,) * len(new_shape)
    if 0 in shape:
        return tuple(strides) if tuple(shape) == tuple(new_shape) else row_major(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1]
    tensor_numel, view_numel = 1, 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and
                             strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel, view_numel = 1, 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def view_geometry(node: Node, base: Node, geometry: Geometry) -> Geometry | None:
    """Shape, strides and offset of `node` (a chain of views over `base`) when `base` lives
    in memory with `geometry`; None when the chain is not a strided view."""
    chain = []
    while node is not base:
        if node.kind.value != "view":
            return None
        chain.append(node)
        node = node.inputs[0]
    shape, strides, offset = geometry
    for view in reversed(chain):
        a = view.attrs
        if view.op is Op.PERMUTE:
            shape = tuple(shape[p] for p in a["perm"])
            strides = tuple(strides[p] for p in a["perm"])
        elif view.op is Op.EXPAND:
            strides = tuple(0 if n != m else s for n, m, s in zip(shape, view.shape, strides))
            shape = view.shape
        elif view.op is Op.SLICE:
            dim = a["dim"]
            offset += a["start"] * strides[dim]
            strides = strides[:dim] + (strides[dim] * a["step"],) + strides[dim + 1:]
            shape = view.shape
        elif view.op is Op.SQUEEZE:
            keep = [d for d in range(len(shape)) if d not in a["dims"]]
            shape, strides = view.shape, tuple(strides[d] for d in keep)
        elif view.op is Op.UNSQUEEZE:
            dim = a["dim"]
            inner = strides[dim] * shape[dim] if dim < len(shape) else 1
            shape, strides = view.shape, strides[:dim] + (inner,) + strides[dim:]
        elif view.op is Op.RESHAPE:
            new = _reshape_strides(shape, strides, view.shape)
            if new is None:
                return None
            shape, strides = view.shape, new
        elif view.op is Op.AS_STRIDED:
            if strides != row_major(shape):
                return None
            shape, strides = view.shape, tuple(a["strides"])
            offset += a["offset"]
        else:
            return None
    return shape, strides, offset


def lies_as(buffer: Buffer, wanted: tuple | None) -> bool:
    """Do `buffer`'s elements lie where `wanted` strides put them (dims of size 0 or 1 place
    nothing: any stride will do)? False where either layout is not known."""
    shape, strides = buffer.shape, buffer.strides
    return strides is not None and wanted is not None and len(wanted) == len(shape) and all(
        n in (0, 1) or s == t for n, s, t in zip(shape, strides, wanted))


def dense_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int] | None:
    """The dims of a dense layout (a permutation of row-major: channels-last, say) from the
    outermost to the innermost, or None when the layout has gaps, overlaps or broadcasts."""
    if any(type(n) is not int or type(s) is not int for n, s in zip(shape, strides)):
        return None
    order = sorted(range(len(shape)), key=lambda d: (-strides[d] if shape[d] != 1 else 0, d))
    order = [d for d in order if shape[d] != 1] + [d for d in order if shape[d] == 1]
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return order


def strides_in_order(shape: tuple[int, ...], order: list[int]) -> tuple[int, ...]:
    """Dense strides for `shape` with its dims laid out in `order` (outermost first)."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)
