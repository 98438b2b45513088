"""Dtype categories and torch's type promotion, reproduced exactly.

`result_type` follows c10's ResultTypeState: tensors with dimensions outrank zero-dim tensors,
which outrank Python scalars, unless a lower-priority participant belongs to a higher category
(bool < integer < floating < complex). Tests compare it with torch.result_type.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ember.ir.sizes import Size

FLOATING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INTEGRAL = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
COMPLEX = frozenset({torch.complex32, torch.complex64, torch.complex128})
# Dtypes that ember's kernels compute on; anything else becomes a library call.
SUPPORTED = FLOATING | INTEGRAL | {torch.bool}
REDUCED_FLOAT = frozenset({torch.float16, torch.bfloat16})


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOATING


def is_integral(dtype: torch.dtype, include_bool: bool = False) -> bool:
    return dtype in INTEGRAL or (include_bool and dtype is torch.bool)


def category(dtype: torch.dtype | None) -> int:
    if dtype is None:
        return -1
    if dtype is torch.bool:
        return 0
    if dtype in COMPLEX:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _promote(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    if a is None:
        return b
    if b is None:
        return a
    return torch.promote_types(a, b)


def _to_complex(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(
        dtype, torch.complex64)


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    """c10's combine_categories: `higher` is the higher-priority group's type."""
    if higher in COMPLEX:
        return higher
    if lower in COMPLEX:
        return _to_complex(higher) if higher is not None and higher.is_floating_point else lower
    if higher is not None and higher.is_floating_point:
        return higher
    if higher is torch.bool or (lower is not None and lower.is_floating_point):
        return _promote(higher, lower)
    return higher if higher is not None else lower


def scalar_dtype(value: bool | int | float | complex) -> torch.dtype:
    """The dtype a Python scalar takes part in promotion with."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, (int, Size)):  # (a symbolic size is an int)
        return torch.int64
    if isinstance(value, float):
        return torch.get_default_dtype()
    if isinstance(value, complex):
        return _to_complex(torch.get_default_dtype())
    raise TypeError(f"not a Python scalar: {value!r}")


def result_type(operands: Iterable[tuple[torch.dtype, int] | bool | int | float]) -> torch.dtype:
    """Promote operands given as (dtype, ndim) for tensors or Python scalars."""
    dim_result = zero_result = wrapped_result = None
    for operand in operands:
        if isinstance(operand, tuple):
            dtype, ndim = operand
            if ndim > 0:
                dim_result = _promote(dim_result, dtype)
            else:
                zero_result = _promote(zero_result, dtype)
        else:
            wrapped_result = _promote(wrapped_result, scalar_dtype(operand))
    result = _combine(dim_result, _combine(zero_result, wrapped_result))
    assert result is not None, "result_type of no operands"
    return result


def short_name(dtype: torch.dtype) -> str:
    """f32, bf16, i64, b8 ... as the printer writes them."""
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


_SHORT = {
    torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
    torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
    torch.int64: "i64", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}
