"""ember.ir.dtypes: promotion must be torch's, over every pair of dtypes, ranks and scalars."""

import itertools

import pytest
import torch

from ember.ir import dtypes

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128]
SCALARS = [True, 3, 2.5, 1 + 2j]


def _tensor(dtype: torch.dtype, ndim: int) -> torch.Tensor:
    return torch.zeros((2,) * ndim, dtype=dtype)


@pytest.mark.parametrize("ndim_a, ndim_b", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_result_type_of_two_tensors_is_torchs(ndim_a, ndim_b):
    for a, b in itertools.product(DTYPES, DTYPES):
        want = torch.result_type(_tensor(a, ndim_a), _tensor(b, ndim_b))
        assert dtypes.result_type([(a, ndim_a), (b, ndim_b)]) == want, (a, ndim_a, b, ndim_b)


@pytest.mark.parametrize("ndim", [0, 1])
def test_result_type_of_a_tensor_and_a_scalar_is_torchs(ndim):
    for dtype, scalar in itertools.product(DTYPES, SCALARS):
        want = torch.result_type(_tensor(dtype, ndim), scalar)
        assert dtypes.result_type([(dtype, ndim), scalar]) == want, (dtype, ndim, scalar)
        assert dtypes.result_type([scalar, (dtype, ndim)]) == want, (scalar, dtype, ndim)


def test_scalar_dtypes_follow_the_default_dtype():
    assert dtypes.scalar_dtype(True) is torch.bool
    assert dtypes.scalar_dtype(7) is torch.int64
    assert dtypes.scalar_dtype(0.5) is torch.get_default_dtype()
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert dtypes.scalar_dtype(0.5) is torch.float64
        assert dtypes.result_type([(torch.int32, 1), 0.5]) == \
            torch.result_type(torch.zeros(2, dtype=torch.int32), 0.5)
    finally:
        torch.set_default_dtype(saved)


def test_categories_and_short_names():
    assert [dtypes.category(d) for d in (torch.bool, torch.int8, torch.float16,
                                         torch.complex64)] == [0, 1, 2, 3]
    assert dtypes.is_integral(torch.bool, include_bool=True)
    assert not dtypes.is_integral(torch.bool)
    assert [dtypes.short_name(d) for d in (torch.float32, torch.bfloat16, torch.int64,
                                           torch.bool)] == ["f32", "bf16", "i64", "b8"]
