"""Generated wrappers at run time: a wrapper's source with its namespace (WrapperSource),
and the helpers and errors its code calls (ember/codegen/wrapper.py writes them). A warm
start rebuilds wrappers from here without importing the code generators.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


class LayoutMismatch(RuntimeError):
    """A library call returned strides other than eager's (checked on the first call)."""


class BuildNotKept(RuntimeError):
    """A call needs another build of the graph than the one kept (a loaded export keeps the
    first only): raised before the wrapper runs anything; eager answers that call."""


class KernelsNotBuilt(RuntimeError):
    """The graph's kernels, compiled while its first run went on, failed to compile: raised
    by the first launch that waits for one (the graph then runs eagerly)."""

    @classmethod
    def because(cls, error: Exception) -> KernelsNotBuilt:
        return cls(f"its kernels did not compile ({type(error).__name__}: {error})")


class KernelIndexError(IndexError, RuntimeError):
    """An index out of range in a generated kernel. Eager raises IndexError for some ops
    (embedding, x[index]) and RuntimeError for others (gather, take, index_select): this is
    both, so either `except` catches it."""


def same_layout(tensor: torch.Tensor | None, strides: tuple[int, ...]) -> bool:
    """Do `tensor`'s elements lie where eager's strides put them (size-1 dims aside)? A
    result the op left undefined (None: _native_multi_head_attention's weights where none
    were asked, which its meta kernel gives as an empty tensor) has no layout to differ:
    passed on as eager's None."""
    if tensor is None:
        return True
    return all(n <= 1 or s == t for n, s, t in zip(tensor.shape, tensor.stride(), strides))


def relaid(tensor: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """A copy of `tensor` laid out by `strides` (a library call's operand as eager passes it).
    NOTE: a stride 0 where the size passes 1 is eager's expand (multi-query attention's one
    key head repeated over the query heads): its elements along that dim are one element, so
    the copy holds one slice and is expanded — a copy into overlapping memory raises."""
    repeated = [d for d, (n, s) in enumerate(zip(tensor.shape, strides)) if s == 0 and n > 1]
    source = tensor
    for dim in repeated:
        source = source.narrow(dim, 0, 1)
    copy = torch.empty_strided(source.shape, strides, dtype=tensor.dtype, device=tensor.device)
    copy.copy_(source)
    return copy.expand(tensor.shape) if repeated else copy


def shares_memory(result: torch.Tensor, *operands: torch.Tensor) -> bool:
    """Does a library call's result lie in an operand's memory (an op that returns views
    without saying so in its schema: ember would free or reuse that memory under it)?"""
    if not isinstance(result, torch.Tensor) or not result.numel():
        return False
    storage = result.untyped_storage().data_ptr()
    return any(isinstance(t, torch.Tensor) and t.numel() and
               t.untyped_storage().data_ptr() == storage for t in operands)


def raise_index_error(kernel: str) -> None:
    raise KernelIndexError(
        f"index out of range in ember kernel {kernel}: an indexing op (take, gather, "
        f"embedding, x[index]) read a position outside the tensor, as eager would refuse to")


@dataclasses.dataclass(frozen=True)
class EmptyOn:
    """Uninitialized memory on `device` (a CUDA wrapper's allocation when the current device
    is another): a value, not a closure, so a warm-start entry can keep it."""

    device: torch.device

    def __call__(self, size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(size, stride, dtype=dtype, device=self.device)


@dataclasses.dataclass
class WrapperSource:
    text: str
    namespace: dict[str, Any]
