"""Reductions and normalisations against eager: every dim (negative too), keepdim, dtypes,
layouts, empty and 0-d tensors, NaN propagation and kernel counts."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import LAYOUTS, check, make, make_layout

DIMS = [0, 1, 2, -1, -2, (0, 2), (-1, -3), (0, 1, 2), (1, -1)]


def float_reductions(dim, keepdim):
    return lambda x: {
        "sum": x.sum(dim, keepdim), "mean": x.mean(dim, keepdim),
        "amax": x.amax(dim, keepdim), "amin": x.amin(dim, keepdim),
        "var": x.var(dim, keepdim=keepdim), "std": x.std(dim, keepdim=keepdim),
        "var0": torch.var(x, dim, correction=0, keepdim=keepdim),
        "logsumexp": torch.logsumexp(x, dim, keepdim),
        "norm": torch.linalg.vector_norm(x, 2, dim, keepdim),
        "norm1": torch.linalg.vector_norm(x, 1, dim, keepdim),
        "norm_inf": torch.linalg.vector_norm(x, math.inf, dim, keepdim),
        "norm3": torch.linalg.vector_norm(x, 3, dim, keepdim),
        "any": (x > 1).any(dim, keepdim) if isinstance(dim, int) else (x > 1).any(dim),
        "all": (x > -2).all(dim, keepdim) if isinstance(dim, int) else (x > -2).all(dim),
        "count_nonzero": torch.count_nonzero(x > 0, dim),
        "nansum": torch.nansum(x.masked_fill(x > 2, math.nan), dim, keepdim),
    }


@pytest.mark.parametrize("keepdim", (False, True))
@pytest.mark.parametrize("dim", DIMS, ids=str)
def test_reductions_over_every_dim(dim, keepdim):
    check(float_reductions(dim, keepdim), make(3, 4, 5), library=0)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_reductions_of_strided_inputs(layout):
    fn = float_reductions((0, 2), False)
    check(lambda x: {**fn(x), **float_reductions(-1, True)(x)}, make_layout(layout, 3, 4, 6),
          library=0)


def test_full_reductions():
    def fn(x):
        return {"sum": x.sum(), "mean": x.mean(), "prod": (x / 2).prod(), "max": x.max(),
                "min": x.min(), "amax": x.amax(), "var": x.var(), "std": x.std(),
                "norm": x.norm(), "argmax": x.argmax(), "argmin": x.argmin(),
                "argmax_keep": x.argmax(keepdim=True), "any": (x > 2.9).any(),
                "all": (x < 2.9).all(), "count_nonzero": torch.count_nonzero(x > 0),
                "var_mean": torch.var_mean(x), "std_mean": torch.std_mean(x, correction=0),
                "logsumexp": torch.logsumexp(x, (0, 1)), "trace": torch.trace(x),
                "trace_t": torch.trace(x.t()[:3]), "aminmax": torch.aminmax(x),
                "aminmax_dim": torch.aminmax(x, dim=-1, keepdim=True),
                "nansum": torch.nansum(x.masked_fill(x > 1, math.nan))}

    check(fn, make(7, 9), library=0)


def test_reductions_of_a_tensor_the_graph_fills_with_a_constant():
    # (the reduction's operand folds to a constant: a boolean literal in the Triton kernel)
    def fn(x, y):
        filled = x.fill_(2)
        return filled, torch.any(x), torch.all(y.zero_()), (y + 1).sum()

    x = make(3)
    check(fn, x, make(4, 5, seed=1))


@pytest.mark.slow_in_interpreter  # (minutes under the interpreter)
def test_large_reductions_accumulate_accurately():
    # beyond one SIMD-friendly chunk and the parallel threshold, many rows
    x = make(600, 700) + 1.0
    check(lambda x: (x.sum(), x.sum(0), x.sum(1), x.mean(), x.var(1), x.amax(0),
                     (1 + x * 1e-3).prod(0)), x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64, torch.uint8, torch.int8,
                                   torch.bool), ids=str)
def test_integer_reductions(dtype):
    x = make(4, 5, 6, dtype=dtype, low=-3, high=6)

    def fn(x):
        result = {"sum": x.sum(), "sum_dim": x.sum(1), "sum_keep": x.sum((0, 2), True),
                  "sum_f64": x.sum(-1, dtype=torch.float64), "prod": x.prod(2),
                  "prod_all": x.prod(), "mean_f32": x.mean(1, dtype=torch.float32),
                  "mean_all_f64": x.mean(dtype=torch.float64), "amax": x.amax(0),
                  "amin": x.amin((1, 2)), "max": x.max(), "min": x.min(),
                  "max_dim": x.max(1), "min_dim": x.min(-1, True), "any": x.any(1),
                  "all": x.all(), "count_nonzero": torch.count_nonzero(x, (0, 1)),
                  "nansum": torch.nansum(x, 1), "aminmax": torch.aminmax(x, dim=0)}
        if dtype is not torch.bool:  # eager has no argmax or trace of bools
            result.update(argmax=x.argmax(0), argmin=x.argmin(), trace=torch.trace(x[0]))
        return result

    check(fn, x, library=0)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float64), ids=str)
def test_float_reductions_in_other_dtypes(dtype):
    x = make(6, 50, dtype=dtype, special=False)
    fn = float_reductions(-1, False)

    def both(x):
        return {**fn(x), "sum_f32": x.sum(0, dtype=torch.float32), "prod": x.prod(0),
                "softmax": F.softmax(x, -1), "log_softmax": F.log_softmax(x, 0),
                "softmax_f32": F.softmax(x, -1, dtype=torch.float32),
                "max_dim": x.max(1), "argmin": x.argmin(0)}

    check(both, x, library=0)


def test_nan_propagates_through_max_min_and_arg():
    x = make(5, 6)
    x[1, 2] = math.nan
    x[3, 0] = math.nan
    x[3, 4] = math.nan
    x[4] = math.nan
    x[0, 1] = math.inf
    x[2, 3] = -math.inf

    def fn(x):
        return {"amax0": x.amax(0), "amax1": x.amax(1), "amin": x.amin(1), "max": x.max(),
                "min": x.min(), "max_dim": x.max(1), "min_dim": x.min(0),
                "argmax0": x.argmax(0), "argmax1": x.argmax(1), "argmin1": x.argmin(1),
                "argmax": x.argmax(), "sum": x.sum(1), "norm_inf": x.norm(math.inf, 1),
                "logsumexp": torch.logsumexp(x, 1), "softmax": F.softmax(x, 1)}

    check(fn, x, library=0)


def test_ties_pick_the_first_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, -1.0, -1.0, 5.0]])
    check(lambda x: (x.argmax(1), x.argmin(1), x.max(1), x.min(0), x.argmax(0), x.argmax()),
          x, library=0)


def test_infinities_in_logsumexp_and_softmax():
    x = torch.tensor([[-math.inf, -math.inf, -math.inf], [math.inf, 1.0, 2.0],
                      [-math.inf, 0.0, 1.0], [math.inf, math.inf, 0.0]])
    check(lambda x: (torch.logsumexp(x, 1), torch.logsumexp(x, 0, True), F.softmax(x, 1),
                     F.log_softmax(x, 1), F.softmax(x, 0)), x, library=0)


@pytest.mark.filterwarnings("ignore:var\\(\\)|std\\(\\):UserWarning")
def test_empty_tensors():
    empty_rows, empty_cols = make(0, 5), make(4, 0)

    def fn(a, b):
        return {"sum_rows": a.sum(0), "sum_cols": b.sum(1), "sum_keep": b.sum(0, True),
                "sum_all": a.sum(), "prod_all": b.prod(), "prod_cols": b.prod(1),
                "mean_cols": b.mean(1), "mean_all": a.mean(), "amax_kept": a.amax(1),
                "any": b.any(1), "all": a.all(0), "count_nonzero": torch.count_nonzero(b, 1),
                "var": b.var(1), "norm": a.norm(dim=0), "softmax": F.softmax(a, 1),
                "log_softmax": F.log_softmax(b, 0), "logsumexp_kept": torch.logsumexp(a, 1)}

    check(fn, empty_rows, empty_cols, library=0)


@pytest.mark.filterwarnings("ignore:var\\(\\)|std\\(\\):UserWarning")
def test_zero_dim_and_size_one():
    def fn(s, x):
        return {"sum": s.sum(), "sum0": s.sum(0), "mean": s.mean(-1, True), "max": s.max(),
                "amax": s.amax(0), "argmax": s.argmax(), "argmax0": s.argmax(0),
                "max_dim": s.max(0), "softmax": F.softmax(s, 0), "var": s.var(correction=0),
                "one_sum": x.sum(1), "one_max": x.max(1), "one_argmin": x.argmin(0),
                "one_var": x.var(0), "one_softmax": F.softmax(x, 0), "one_logsumexp":
                torch.logsumexp(x, (0, 2))}

    check(fn, torch.tensor(1.5), make(1, 5, 1), library=0)


@pytest.mark.parametrize("dim", (0, 1, 2, -1, -3))
def test_softmax_over_every_dim(dim):
    x = make(3, 4, 5, low=-20, high=20, special=True)
    check(lambda x: (F.softmax(x, dim), F.log_softmax(x, dim),
                     F.softmax(x, dim, dtype=torch.float64)), x, library=0)


def test_softmax_of_strided_inputs():
    for layout in LAYOUTS[1:]:
        x = make_layout(layout, 6, 7)
        check(lambda x: (F.softmax(x, -1), F.log_softmax(x, 0)), x, library=0)


def test_softmax_last_dim_fuses():
    compiled = check(lambda x: F.softmax(x, -1), make(32, 100), library=0)
    assert compiled.kernel_count <= 2
    compiled = check(lambda x: F.log_softmax(x, -1), make(32, 100), library=0)
    assert compiled.kernel_count <= 2


@pytest.mark.filterwarnings("ignore:var\\(\\)|std\\(\\):UserWarning")
def test_var_std_corrections():
    x = make(4, 6)

    def fn(x):
        return {"unbiased_false": torch.var(x, 1, unbiased=False),
                "correction2": torch.var(x, 0, correction=2),
                "std_correction0": torch.std(x, (0, 1), correction=0),
                "var_mean": torch.var_mean(x, 1, keepdim=True),
                "std_mean": torch.std_mean(x, -1),
                "too_few": torch.var(x[:1], 0), "std_one": torch.std(x[:, :1], 1)}

    check(fn, x, library=0)


def test_vector_norms():
    x = make(5, 6, special=False)

    def fn(x):
        return {str(order): torch.linalg.vector_norm(x, order, 1)
                for order in (0, 1, 2, 3, 0.5, math.inf, -math.inf)} | {
            "fro": torch.norm(x), "dim_keep": torch.linalg.vector_norm(x, 2, 0, True),
            "normalize": F.normalize(x, dim=1), "f64": torch.linalg.vector_norm(
                x, 2, dtype=torch.float64)}

    check(fn, x, library=0)


def test_reduction_chain_fuses_with_pointwise():
    # a pointwise producer, a row reduction and a pointwise consumer: one kernel
    compiled = check(lambda x: (x * 2 + 1).sum(-1, keepdim=True) * 3, make(32, 64), library=0)
    assert compiled.kernel_count == 1


def test_a_reduction_returned_and_read_by_an_epilogue_in_another_dtype():
    # (the returned sum is a view of the kernel's own reduction buffer: the writer took it
    # for a value loaded from elsewhere and recursed without end; explore seed 1723)
    check(lambda x: (torch.sum(x, dim=0), x + torch.sum(x, dim=0).to(torch.float64)),
          make(2, 9))


def test_large_reduced_float_reductions():
    # long rows of half values: eager accumulates in float, and so must ember
    x = make(4, 9000, dtype=torch.float16)
    check(lambda x: (x.sum(1), x.mean(), x.float().sum(0).sum(), F.softmax(x, 1).amax(1),
                     x.bfloat16().sum(1), torch.linalg.vector_norm(x, 2, 1)), x,
          rtol=5e-3, atol=5e-3, library=0)


@pytest.mark.slow_in_interpreter  # (minutes under the interpreter)
def test_softmax_over_size_one_and_long_rows():
    check(lambda x, y: (F.softmax(x, 1), F.log_softmax(x, 1), F.softmax(y, 0), F.softmax(y, 1)),
          make(5, 1), make(3, 50000, low=-30, high=30), library=0)


@pytest.mark.slow_in_interpreter  # (minutes under the interpreter)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_reduced_float_statistics_do_not_overflow(dtype):
    # 400000 elements: the element count and the sum pass float16's 65504; eager computes
    # mean, var and std in float32 and rounds once
    x = make(4, 100000, dtype=dtype, low=0.5, high=1.5)
    check(lambda x: (x.mean(), x.mean(1), x.var(1), x.std(), torch.var_mean(x, 1),
                     torch.std_mean(x, 0), F.layer_norm(x, (100000,)).amax()), x,
          rtol=5e-3, atol=5e-3, library=0)


def test_empty_extents_read_nothing():
    # (found by the property tests: loads hoisted out of loops that never run read past the
    # end of a gathered index, and the bounds check said "index out of range")
    def summed(x):
        picked = x[torch.tensor([0], dtype=torch.int64)]
        return torch.neg(x), picked[1::1].add_(2).sum(), picked[1:].prod(dim=0)

    def pointwise(x):
        picked = x[torch.tensor([0], dtype=torch.int64)]
        return picked[1::1] * 2 + 1, picked[1:].sum(dim=1), torch.neg(x)

    check(summed, make(1, 3))
    check(pointwise, make(1, 3))
