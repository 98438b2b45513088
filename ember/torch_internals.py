"""The one place ember touches private torch APIs.

Everything here has a test on the installed torch version (tests/test_torch_internals.py), so a
torch upgrade that moves one of these breaks one obvious test instead of ember at large.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (re-exported)

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def is_op_overload(value: Any) -> bool:
    return isinstance(value, OpOverload)


def schema_of(func: OpOverload) -> Any:
    return func._schema


def overload_name(func: OpOverload) -> str:
    return func._overloadname


def elementwise_strides(tensors: list[torch.Tensor], shape: tuple[int, ...],
                        wrapped_scalars: bool = False) -> tuple[int, ...]:
    """The strides eager's TensorIterator gives the result of a pointwise op whose tensor
    operands are `tensors` (in argument order), broadcast to `shape`; `wrapped_scalars` says
    that Python numbers are operands too (the `other` of add, mul, ...)."""
    from torch._prims_common import (
        compute_elementwise_output_strides,
        is_non_overlapping_and_dense_or_false,
    )

    contiguous = tuple(torch.empty(shape, device="meta").stride())
    # TensorIterator's fast set-up: operands of the result's shape that all share a layout
    if tensors and not wrapped_scalars and all(tuple(t.shape) == shape for t in tensors):
        if all(t.is_contiguous() for t in tensors):
            return contiguous
        if len(shape) == 4 and all(t.is_contiguous(memory_format=torch.channels_last)
                                   for t in tensors):
            return tuple(torch.empty(shape, device="meta").to(
                memory_format=torch.channels_last).stride())
        if all(is_non_overlapping_and_dense_or_false(t) and t.stride() == tensors[0].stride()
               for t in tensors):
            return tuple(tensors[0].stride())
    operands = [t.expand(shape) for t in tensors if t.ndim]
    if not operands:
        return contiguous
    return tuple(compute_elementwise_output_strides(*operands))


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool, or a tensor whose shape or strides are symbolic."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride()))
    return False


def register_dynamo_backend(name: str, fn: Any) -> None:
    """Make `torch.compile(backend=name)` find `fn` even when the package is not installed
    with its entry point (a source checkout on sys.path)."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if name not in _COMPILER_FNS:
        register_backend(fn, name=name)
