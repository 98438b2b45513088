"""The strides eager's TensorIterator gives a pointwise op's result, from its operands.

Meta kernels usually agree with eager, but not always (size-1 dims, Python decompositions that
reorder operands), and the result's layout is observable: ember reproduces TensorIterator's
choice, step by step as aten/src/ATen/TensorIterator.cpp makes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ember.ir.graph import row_major


def non_overlapping_and_dense(tensor: torch.Tensor) -> bool:
    dims = sorted((d for d in range(tensor.ndim) if tensor.shape[d] != 1),
                  key=lambda d: tensor.stride(d))
    step = 1
    for d in dims:
        if tensor.stride(d) != step:
            return False
        step *= tensor.shape[d]
    return True


def like_strides(tensor: torch.Tensor) -> tuple[int, ...]:
    """Strides of empty_like(tensor): its own when it is non-overlapping and dense."""
    if non_overlapping_and_dense(tensor):
        return tuple(tensor.stride())
    return elementwise_strides([tensor], tuple(tensor.shape), wrapped_scalars=True)


def elementwise_strides(tensors: Sequence[torch.Tensor], shape: Sequence[int],
                        wrapped_scalars: bool = False) -> tuple[int, ...]:
    """Strides of the result of a TensorIterator op over `tensors` (in argument order) broadcast
    to `shape`; `wrapped_scalars`: Python numbers are operands too (`x * 2`)."""
    shape = tuple(shape)
    ndim = len(shape)
    # fast set-up: operands of the result's shape that all share one layout
    if tensors and not wrapped_scalars and all(tuple(t.shape) == shape for t in tensors):
        if all(t.is_contiguous() for t in tensors):
            return row_major(shape)
        if ndim == 4 and all(t.is_contiguous(memory_format=torch.channels_last)
                             for t in tensors):
            return tuple(torch.empty(shape, device="meta")
                         .to(memory_format=torch.channels_last).stride())
        if all(non_overlapping_and_dense(t) and t.stride() == tensors[0].stride()
               for t in tensors):
            return tuple(tensors[0].stride())
    if ndim <= 1:
        return row_major(shape)
    # reorder_dimensions: broadcast dims (stride 0) never decide; equal strides put the
    # smaller dim first; ambiguous pairs keep their order
    operand_strides = []
    for tensor in tensors:
        lead = ndim - tensor.ndim
        operand_strides.append([0] * lead + [
            0 if tensor.shape[d] == 1 and shape[lead + d] != 1 else tensor.stride(d)
            for d in range(tensor.ndim)])

    def should_swap(dim0: int, dim1: int) -> int:
        for strides in operand_strides:
            stride0, stride1 = strides[dim0], strides[dim1]
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 != stride1:
                return -1 if stride0 < stride1 else 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))  # perm[0] is the fastest-moving dim
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    strides, step = [0] * ndim, 1
    for d in perm:
        strides[d] = step
        step *= shape[d]
    return tuple(strides)
