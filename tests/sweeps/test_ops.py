"""Tensor-op semantics, eager against ember.compile (tests/sweeps/harness.py compares outputs,
exceptions, prints, warnings, gradients, and here also each output's strides and aliasing):
dtypes and promotion, integer division / remainder / shifts / overflow, nan and -0.0 edges,
special functions at their edges; layouts (transposed, strided, expanded, as_strided,
channels_last inputs; the strides and aliasing of outputs; in-place ops on views of inputs;
out=; index_put / scatter / masked ops / advanced indexing); zero-size and 0-d tensors;
reductions (multi-dim, strided dims, > 32768 elements where the C kernels use OpenMP threads,
float16 accumulation, ties in arg-reductions, median/mode/kthvalue, norms); random numbers under
manual_seed; gradients at the edges. A subset runs again through the Triton backend (under the
interpreter on the CPU).

A case's Spec.extra "post" (post(out, args)) runs eagerly after each call, e.g. to mutate a
returned view and then look at the input.

(PYTEST_DONT_REWRITE: the cases are user code; their asserts stay Python's.)
"""

import math

import pytest
import torch
import torch.nn.functional as F
from sweeps.harness import Spec, call, cases, check_case, params

CASES: dict = {}
case = cases(CASES)


def R(*shape, dtype=torch.float32, lo=-3, hi=3):
    """deterministic-ish small inputs (the harness seeds before each make())"""
    if dtype.is_floating_point:
        return torch.randn(*shape).to(dtype)
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    return torch.randint(lo, hi, shape).to(dtype)


def arg_state(*idx, call_no=0):
    """the (mutated) arguments of call `call_no`, cloned, with their strides"""

    def state(spec):
        args = spec.calls[call_no][0]
        out = {}
        for i in idx:
            a = args[i]
            out[f"arg{i}"] = a.detach().clone()
            out[f"arg{i}.stride"] = str(a.stride())
        return out

    return state


def next_draw(spec):
    return {"next rand": torch.rand(3)}


# =============================================================================================
# A. dtypes and promotion, integer arithmetic
def int8_overflow_fn(x, y):
    return x + 100, x * 3, x - y, -x, x * y, x + torch.tensor(200, dtype=torch.uint8)


@case
def int8_overflow_wraparound():
    x = torch.tensor([100, -100, 127, -128, 5, 0, 1], dtype=torch.int8)
    y = torch.tensor([-100, 100, -1, 1, 7, 0, -128], dtype=torch.int8)
    return Spec(int8_overflow_fn, [call(x, y)])


def uint8_fn(a, b):
    return a - b, a + b, a * 2, b - 1, (a - b) // 3, -a, a.sum(), a.to(torch.int8)


@case
def uint8_sub_wrap():
    a = torch.tensor([0, 1, 200, 255, 7], dtype=torch.uint8)
    b = torch.tensor([1, 2, 100, 255, 250], dtype=torch.uint8)
    return Spec(uint8_fn, [call(a, b)])


def promo_fn(i32, i64, f16, b, s64):
    return (
        i32 * 2.5,
        i64 + s64,
        f16 + s64,
        i32 + torch.tensor(3, dtype=torch.int64),
        i32 + i64,
        f16 * torch.tensor(3.0),
        b + b,
        b * 3,
        b + 1.5,
        i32 + b,
        f16 + i64,
        torch.tensor(2) ** f16,
    )


@case
def promotion_scalars_and_0d():
    return Spec(
        promo_fn,
        [
            call(
                torch.tensor([1, -2, 3], dtype=torch.int32),
                torch.tensor([4, 5, -6]),
                torch.tensor([0.5, 1.5, -2.25], dtype=torch.float16),
                torch.tensor([True, False, True]),
                torch.tensor(1.5, dtype=torch.float64),
            )
        ],
    )


def int_floordiv_fn(x, y):
    return (
        x // y,
        torch.div(x, y, rounding_mode="floor"),
        torch.div(x, y, rounding_mode="trunc"),
        x // 3,
        x // -3,
        torch.div(x, -4, rounding_mode="trunc"),
        torch.floor_divide(x, y),
        -7 // y,
    )


@case
def int_floordiv_negatives():
    x = torch.tensor([-7, 7, -6, 6, -1, 0, -9, 9], dtype=torch.int64)
    y = torch.tensor([2, -2, 4, -4, 3, 5, -3, 3], dtype=torch.int64)
    return Spec(
        int_floordiv_fn,
        [
            call(x, y),
            call(x.to(torch.int32), y.to(torch.int32)),
            call(x.to(torch.int8), y.to(torch.int8)),
        ],
    )


def float_floordiv_fn(x, y):
    return (
        x // y,
        torch.div(x, y, rounding_mode="trunc"),
        x // 0.0,
        x // -2.5,
        torch.div(x, y, rounding_mode="floor"),
    )


@case
def float_floordiv_negatives_zero():
    x = torch.tensor([-7.5, 7.5, -0.5, 0.5, 0.0, -0.0, 3.0, float("inf"), float("nan")])
    y = torch.tensor([2.0, -2.0, 1.0, -1.0, 3.0, 3.0, 0.0, 2.0, 1.0])
    return Spec(float_floordiv_fn, [call(x, y), call(x.double(), y.double())])


def rem_fmod_fn(x, y):
    return (
        torch.remainder(x, y),
        torch.fmod(x, y),
        x % y,
        x % 3,
        x % -3,
        torch.fmod(x, -3),
        torch.remainder(-5, y),
    )


@case
def remainder_fmod_negatives():
    xi = torch.tensor([-7, 7, -6, 6, -1, 0, -9, 9])
    yi = torch.tensor([2, -2, 4, -4, 3, 5, -3, 3])
    xf = torch.tensor([-7.5, 7.5, -0.5, 0.5, -0.0, 5.0, 1e10, -3.0])
    yf = torch.tensor([2.0, -2.0, 1.0, -1.0, 3.0, float("inf"), 3.0, 0.0])
    return Spec(rem_fmod_fn, [call(xi, yi), call(xf, yf)])


def int_div_zero_fn(x, y):
    return x // y


@case
def int_floordiv_by_zero_raises():
    return Spec(int_div_zero_fn, [call(torch.tensor([5, -5]), torch.tensor([0, 1]))])


def int_rem_zero_fn(x, y):
    return x % y


@case
def int_remainder_by_zero_raises():
    return Spec(int_rem_zero_fn, [call(torch.tensor([5, -5]), torch.tensor([0, 1]))])


def bitwise_fn(x, y):
    return (
        x & y,
        x | y,
        x ^ y,
        ~x,
        x << 3,
        x >> 1,
        x << y.abs(),
        x >> y.abs(),
        x & 0xF,
        torch.bitwise_left_shift(x, 2),
        x >> 40,
        x << 40,
    )


@case
def bitwise_and_shifts():
    x = torch.tensor([-8, 7, 255, -1, 0, 12345, -(2**31)], dtype=torch.int32)
    y = torch.tensor([3, -5, 33, 1, 31, 2, 1], dtype=torch.int32)
    return Spec(bitwise_fn, [call(x, y), call(x.long(), y.long())])


def shift_int8_fn(x):
    return x << 1, x >> 1, x << 7, x >> 9, (x.to(torch.uint8) >> 1)


@case
def shift_int8_uint8():
    return Spec(shift_int8_fn, [call(torch.tensor([-128, -1, 1, 64, 127, 3], dtype=torch.int8))])


def bool_bitwise_fn(a, b):
    return (
        ~a,
        a ^ b,
        a & b,
        a | b,
        a.logical_xor(b),
        (a < b),
        a.int() - b.int(),
        a.sum(),
        (a * b).dtype == torch.bool,
    )


@case
def bool_bitwise_ops():
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    return Spec(bool_bitwise_fn, [call(a, b)])


def compare_sum_fn(x, y):
    gt = x > 0
    return (
        gt.sum(),
        (x == y).sum(1),
        (x >= y).float().mean(),
        gt.any(),
        (x != x).sum(),
        gt.cumsum(0),
        gt.long().prod(),
    )


@case
def compare_bool_sum():
    x = torch.tensor([[1.0, -1.0, float("nan")], [0.0, 2.0, 2.0]])
    return Spec(
        compare_sum_fn, [call(x, torch.tensor([[1.0, 0.0, float("nan")], [0.0, 2.0, 3.0]]))]
    )


def abs_intmin_fn(x8, x32, x64):
    return x8.abs(), x32.abs(), x64.abs(), -x8, torch.neg(x32), x8.sign(), x32 * -1


@case
def abs_of_int_min():
    return Spec(
        abs_intmin_fn,
        [
            call(
                torch.tensor([-128, -5, 127], dtype=torch.int8),
                torch.tensor([-(2**31), -5, 2**31 - 1], dtype=torch.int32),
                torch.tensor([-(2**63), -5, 2**63 - 1], dtype=torch.int64),
            )
        ],
    )


def pow_int_fn(x, f):
    return (
        x**2,
        x**0,
        2 ** x.abs(),
        x.pow(3),
        torch.pow(x, x.abs()),
        f**-1,
        f**0.5,
        f**0,
        f**3,
        0.0**f,
        x**2.0,
    )


@case
def pow_integer_exponents():
    x = torch.tensor([-3, -1, 0, 2, 5, 40])
    f = torch.tensor([-8.0, -0.0, 0.0, 2.0, float("inf"), float("-inf"), float("nan")])
    return Spec(pow_int_fn, [call(x, f)])


def pow_neg_int_fn(x):
    return x**-1


@case
def pow_int_negative_exponent_raises():
    return Spec(pow_neg_int_fn, [call(torch.tensor([1, 2, 3]))])


def true_div_fn(a, b):
    return a / b, torch.true_divide(a, b), a / 2, 7 / a, torch.div(a, b), a.float() / b


@case
def true_divide_ints():
    return Spec(
        true_div_fn,
        [
            call(torch.tensor([7, -7, 1, 0]), torch.tensor([2, 2, 0, 0])),
            call(
                torch.tensor([7, -7, 1, 0], dtype=torch.int8),
                torch.tensor([2, 2, 0, 0], dtype=torch.int16),
            ),
        ],
    )


def mean_int_fn(x):
    return x.mean()


@case
def mean_of_int_raises():
    return Spec(mean_int_fn, [call(torch.tensor([1, 2, 4]))])


def sum_dtypes_fn(b, u8, i8, i32, f16):
    return (
        b.sum(),
        u8.sum(),
        i8.sum(0),
        i32.sum(dtype=torch.int32),
        i32.prod(),
        u8.prod(),
        f16.sum(),
        i8.sum(dtype=torch.float32),
        b.sum(0, keepdim=True),
        f16.sum(dtype=torch.float32),
        torch.sum(b, dim=(0, 1)),
    )


@case
def sum_result_dtypes():
    return Spec(
        sum_dtypes_fn,
        [
            call(
                R(3, 4, dtype=torch.bool),
                torch.tensor([[200, 100], [255, 1]], dtype=torch.uint8),
                torch.tensor([[100, 100, -128], [100, 100, -1]], dtype=torch.int8),
                torch.tensor([2**20, 2**20, 3], dtype=torch.int32),
                torch.tensor([60000.0, 60000.0, 1.0], dtype=torch.float16),
            )
        ],
    )


def cumsum_dtype_fn(i8, b, f):
    return (
        i8.cumsum(0),
        b.cumsum(0),
        i8.cumprod(0),
        f.cumsum(0, dtype=torch.float64),
        f.cumprod(1),
        i8.cumsum(0, dtype=torch.int8),
        torch.cumsum(f, -1),
    )


@case
def cumsum_cumprod_dtypes():
    return Spec(
        cumsum_dtype_fn,
        [
            call(
                torch.tensor([100, 100, -128, 50], dtype=torch.int8),
                torch.tensor([True, True, False, True]),
                R(3, 4),
            )
        ],
    )


def argmax_ties_fn(x):
    return (
        x.argmax(),
        x.argmin(),
        x.argmax(1),
        x.argmin(0),
        x.argmax(1, keepdim=True),
        torch.argmax(x, dim=-1),
    )


@case
def argmax_argmin_ties_and_nan():
    x = torch.tensor(
        [[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0], [0.0, float("nan"), 5.0, float("nan")]]
    )
    return Spec(
        argmax_ties_fn, [call(x), call(torch.tensor([[1, 3, 3, 0], [2, 2, -1, -1], [0, 0, 0, 0]]))]
    )


def max_dim_fn(x):
    v, i = x.max(1)
    mv, mi = x.min(0, keepdim=True)
    r = torch.max(x, dim=-1)
    return v, i, mv, mi, r.values, r.indices, x.max(), x.min(), torch.aminmax(x, dim=1)


@case
def max_min_dim_ties_nan():
    x = torch.tensor(
        [[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0], [0.0, float("nan"), 5.0, float("nan")]]
    )
    return Spec(
        max_dim_fn,
        [
            call(x),
            call(torch.tensor([[1, 3, 3, 0], [2, 2, -1, -1], [0, 0, 0, 0]], dtype=torch.int16)),
        ],
    )


def sort_fn(x):
    s = torch.sort(x, stable=True)
    d = torch.sort(x, dim=0, descending=True, stable=True)
    t = torch.topk(x, 2, dim=1)
    ts = torch.topk(x, 2, dim=1, largest=False)
    return (
        s.values,
        s.indices,
        d.values,
        d.indices,
        t.values,
        ts.values,
        torch.argsort(x, dim=1, stable=True),
        torch.msort(x),
    )


@case
def sort_topk_stable_ties():
    x = torch.tensor(
        [[3.0, 1.0, 3.0, 1.0, 2.0], [0.0, -0.0, float("nan"), 0.0, -1.0], [5.0, 5.0, 5.0, 5.0, 5.0]]
    )
    return Spec(sort_fn, [call(x)])


def unique_fn(x):
    u, inv, cnt = torch.unique(x, return_inverse=True, return_counts=True)
    uc = torch.unique_consecutive(x)
    return u, inv, cnt, uc, torch.unique(x, sorted=True, dim=None)


@case
def unique_and_consecutive():
    return Spec(
        unique_fn,
        [call(torch.tensor([3, 1, 1, 2, 3, 3, 0])), call(torch.tensor([[1.0, 1.0], [0.0, -0.0]]))],
    )


def clamp_fn(x, lo, hi):
    return (
        x.clamp(min=1.0, max=0.0),
        torch.clamp(x, lo, hi),
        x.clamp(max=-1.0),
        x.clamp_min(0.5),
        torch.clamp(x, min=hi, max=lo),
    )


@case
def clamp_min_greater_than_max():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0, float("nan")])
    return Spec(
        clamp_fn,
        [
            call(
                x,
                torch.tensor([0.0, 0.0, 1.0, 1.0, 3.0, 0.0]),
                torch.tensor([1.0, -1.0, 0.0, 2.0, 1.0, 1.0]),
            )
        ],
    )


def clamp_int_fn(x):
    return (
        x.clamp(0, 5),
        x.clamp(min=0.5),
        x.clamp(max=2),
        torch.clamp(x, -1, 1).dtype == x.dtype,
        x.clamp(min=-1.5, max=1.5),
    )


@case
def clamp_int_with_float_bounds():
    return Spec(
        clamp_int_fn,
        [
            call(torch.tensor([-3, 0, 1, 3, 7])),
            call(torch.tensor([-3, 0, 1, 3, 7], dtype=torch.uint8)),
        ],
    )


def where_fn(c, xi, xf16, xf, s64):
    return (
        torch.where(c, xi, 1.5),
        torch.where(c, 1, 0),
        torch.where(c, xf16, 2.0),
        torch.where(c, xf, s64),
        torch.where(c, xi, xf16),
        torch.where(c, xf, -xf),
        torch.where(c, 1.0, xi),
        torch.where(c, True, False),
        torch.where(c, xi, torch.tensor(2.5, dtype=torch.float64)),
    )


@case
def where_scalar_promotion():
    c = torch.tensor([True, False, True, False])
    return Spec(
        where_fn,
        [
            call(
                c,
                torch.tensor([1, 2, 3, 4], dtype=torch.int32),
                torch.tensor([0.5, 1.5, 2.5, 3.5], dtype=torch.float16),
                R(4),
                torch.tensor(7.0, dtype=torch.float64),
            )
        ],
    )


def lerp_addc_fn(a, b, w, t1, t2):
    return (
        torch.lerp(a, b, 0.3),
        torch.lerp(a, b, 0.9),
        torch.lerp(a, b, w),
        a.lerp(b, 1.0),
        torch.addcmul(a, t1, t2, value=-0.5),
        torch.addcdiv(a, t1, t2, value=2),
        torch.addcdiv(a, t1, t2),
    )


@case
def lerp_addcmul_addcdiv():
    return Spec(
        lerp_addc_fn,
        [
            call(
                R(7),
                R(7),
                torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.5, -0.5]),
                R(7),
                torch.tensor([1.0, -1.0, 0.0, 2.0, 0.5, -0.0, 3.0]),
            )
        ],
    )


def f16_overflow_fn(x):
    return (
        x * 1000,
        x.exp(),
        x + 65504,
        x.sum(),
        (x * 1e4).sum(),
        x.to(torch.float16) / 0,
        x.double().half(),
    )


@case
def float16_overflow_inf():
    return Spec(
        f16_overflow_fn, [call(torch.tensor([1.0, 70.0, -70.0, 12.0, 0.001], dtype=torch.float16))]
    )


def bf16_fn(a, b, h):
    return (
        a + b,
        a * b,
        a + h,
        a.float() + 1e-3,
        (a + 1e-3),
        a.sum(),
        a.to(torch.float16),
        a / 3,
        torch.tensor(1.0) + a,
    )


@case
def bfloat16_rounding_mixed():
    a = torch.tensor([1.0, 1.00390625, 256.0, 3.0, -0.1], dtype=torch.bfloat16)
    b = torch.tensor([0.001, 0.0078125, 1.0, 1.0 / 3, 0.2], dtype=torch.bfloat16)
    return Spec(bf16_fn, [call(a, b, torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5], dtype=torch.float16))])


def nan_to_num_fn(x, h):
    return (
        torch.nan_to_num(x),
        torch.nan_to_num(x, nan=1.0, posinf=2.0),
        torch.nan_to_num(x, neginf=-7.0),
        torch.nan_to_num(h),
        torch.nan_to_num(x.double()),
        torch.nan_to_num(torch.tensor([1, 2])),
    )


@case
def nan_to_num_defaults():
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 1.5])
    return Spec(nan_to_num_fn, [call(x, x.half())])


def nan_prop_fn(x, y):
    return (
        x.max(),
        x.min(),
        torch.maximum(x, y),
        torch.minimum(x, y),
        torch.fmax(x, y),
        torch.fmin(x, y),
        x.amax(),
        x.amin(0),
        x.clamp(0.0, 1.0),
        torch.clamp(y, min=x),
        x.max(0).values,
        torch.max(x, y),
        y.clamp(min=float("nan")),
        x.nanmean() if False else x.logsumexp(0),
    )


@case
def nan_propagation_max_min():
    x = torch.tensor([1.0, float("nan"), -2.0, 3.0, float("nan")])
    y = torch.tensor([float("nan"), 0.0, 5.0, float("nan"), float("nan")])
    return Spec(nan_prop_fn, [call(x, y)])


def neg_zero_fn(x):
    return (
        torch.copysign(torch.ones_like(x), x),
        torch.signbit(x),
        1 / x,
        x * 1,
        x + 0.0,
        x.abs(),
        x.sign(),
        -x,
        torch.copysign(x, torch.tensor(-1.0)),
        x * -1,
        torch.sqrt(x),
        x.neg().relu(),
        torch.atan2(x, torch.tensor(-1.0)),
    )


@case
def negative_zero_sign():
    return Spec(neg_zero_fn, [call(torch.tensor([-0.0, 0.0, -1.0, 1.0, float("-inf")]))])


def finite_fn(x):
    return (
        x.isinf(),
        x.isnan(),
        x.isfinite(),
        x.isposinf(),
        x.isneginf(),
        torch.isreal(x) if False else x.isfinite().all(),
        (~x.isnan()).sum(),
    )


@case
def isinf_isnan_isfinite():
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -1e38 * 10, 3.0])
    return Spec(finite_fn, [call(x), call(x.half()), call(torch.tensor([1, 2, 3]))])


def special_fn(x, p):
    return (
        torch.log1p(x),
        torch.expm1(x),
        torch.erfinv(p),
        torch.lgamma(x),
        torch.digamma(x),
        torch.special.xlogy(x, x),
        torch.sinc(x),
        torch.logit(p, eps=1e-6),
        torch.logit(p),
        torch.special.erfcx(x),
        torch.special.i0(x),
        torch.special.ndtri(p),
        torch.special.log_ndtr(x),
        torch.special.entr(p),
        torch.xlogy(torch.zeros_like(x), x),
    )


@case
def special_functions_at_edges():
    x = torch.tensor([-2.0, -1.0, -0.0, 0.0, 1e-8, 1.0, 50.0, float("inf")])
    p = torch.tensor([-1.0, 0.0, 1e-7, 0.5, 1.0, 1.5, -0.5, float("nan")])
    return Spec(special_fn, [call(x, p)])


def softplus_fn(x):
    return (
        F.softplus(x),
        F.softplus(x, beta=2.0, threshold=5.0),
        F.softplus(x, beta=-1.0),
        torch.sigmoid(x),
        F.logsigmoid(x),
        F.softplus(x, beta=0.5, threshold=1.0),
        F.silu(x),
        F.mish(x),
        F.elu(x, alpha=0.5),
        F.celu(x, 2.0),
        F.hardtanh(x, -2, 2),
        F.softsign(x),
        F.gelu(x, approximate="tanh"),
    )


@case
def sigmoid_softplus_threshold_beta():
    return Spec(
        softplus_fn,
        [call(torch.tensor([-100.0, -20.0, -1.0, 0.0, 2.4, 2.6, 10.0, 21.0, 100.0, float("inf")]))],
        grad=False,
    )


def lse_fn(x):
    return torch.logsumexp(x, 1), torch.logsumexp(x, 0, keepdim=True), torch.logsumexp(x, (0, 1))


@case
def logsumexp_neginf_rows():
    ni = float("-inf")
    x = torch.tensor(
        [[ni, ni, ni], [ni, 1.0, 2.0], [float("inf"), 1.0, 0.0], [float("nan"), 1.0, 0.0]]
    )
    return Spec(lse_fn, [call(x)])


def softmax_neginf_fn(x):
    return (
        x.softmax(-1),
        x.log_softmax(-1),
        F.softmax(x, 0),
        torch.softmax(x.half(), -1),
        torch.softmax(x, -1, dtype=torch.float64),
    )


@case
def softmax_all_neginf_rows():
    ni = float("-inf")
    return Spec(
        softmax_neginf_fn,
        [call(torch.tensor([[ni, ni, ni], [ni, 0.0, 1.0], [float("inf"), 0.0, 1.0]]))],
    )


def log_softmax_large_fn(x):
    return (
        F.log_softmax(x, 1),
        F.softmax(x, 1),
        F.log_softmax(x.half(), 1),
        F.log_softmax(x.bfloat16(), 1),
        F.log_softmax(x.half(), 1, dtype=torch.float32),
    )


@case
def log_softmax_large_values():
    return Spec(
        log_softmax_large_fn,
        [call(torch.tensor([[1e4, 0.0, -1e4], [88.0, 89.0, 90.0], [1e30, 1e30, 1e30]]))],
    )


def var_fn(x, one):
    return (
        x.var(1, correction=0),
        x.var(1),
        x.std(0, correction=2),
        x.var(),
        x.std(unbiased=False),
        one.var(0),
        one.std(),
        torch.var_mean(x, 1, correction=0),
        torch.std_mean(one, 0),
        x.var(1, correction=5),
    )


@case
def var_std_corrections_single_element():
    return Spec(var_fn, [call(R(3, 4), R(1, 5))])


# =============================================================================================
# B. layout, views, in-place, indexing
def t_plus_one_fn(x):
    return x.t() + 1, x.t() * x.t(), x.t().exp(), x.t() + x.sum(), x.t().contiguous(), x.t().relu()


@case
def transposed_input_output_strides():
    return Spec(t_plus_one_fn, [call(R(4, 4)), call(R(3, 4).t())])


def channels_last_fn(x, y):
    return (
        x + 1,
        x * y,
        F.relu(x),
        x.sum(1, keepdim=True),
        x + y.contiguous(),
        torch.sigmoid(x).contiguous(),
        x.clone(),
        torch.empty_like(x).fill_(1),
    )


@case
def channels_last_layout_kept():
    x = R(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    y = R(2, 3, 4, 5)
    return Spec(channels_last_fn, [call(x, y)])


def permuted_fn(x, y):
    return (
        x + y,
        x.permute(0, 2, 3, 1) * 2,
        (x * y).sum((1, 3)),
        x.permute(3, 2, 1, 0).reshape(-1)[:7],
    )


@case
def permuted_4d_inputs():
    x = R(2, 5, 3, 4).permute(0, 2, 1, 3)
    return Spec(permuted_fn, [call(x, R(2, 3, 5, 4))])


def sliced_step_fn(x):
    return x * 2, x.sum(0), x + x.flip(0), x.cumsum(1)


@case
def sliced_with_steps_input():
    return Spec(
        sliced_step_fn,
        [call(R(7, 10)[::2, 1::3]), call(R(9, 8)[1::4, ::-1] if False else R(9, 8)[1::4, 2:])],
    )


def expanded_input_fn(x, y):
    return x + y, x * 2, x.sum(0), x.contiguous(), (x + 1).stride()


@case
def expanded_stride0_input():
    return Spec(
        expanded_input_fn,
        [call(R(1, 5).expand(4, 5), R(4, 5)), call(R(4, 1).expand(4, 5), R(4, 5))],
    )


def as_strided_in_fn(x):
    y = x.as_strided((3, 3), (1, 1))
    return y * 2, y.sum(1), y + y.t(), torch.as_strided(x, (2, 2), (3, 1), 1).exp()


@case
def as_strided_overlapping():
    return Spec(as_strided_in_fn, [call(R(9))], grad=True)


def as_strided_input_fn(x):
    return x + 1, x.sum(), x * x


@case
def as_strided_overlapping_as_input():
    return Spec(as_strided_input_fn, [call(torch.arange(10.0).as_strided((4, 3), (2, 1)))])


def return_views_fn(x):
    return (
        x[1:],
        x.view(-1),
        x.transpose(0, 1),
        x[:, 1],
        x.unsqueeze(0),
        x.reshape(2, 6),
        x.detach(),
        x[...],
    )


def mutate_views_post(out, args):
    for i, v in enumerate(out):
        v.add_(10**i)
    return args[0].clone()


@case
def returned_views_alias_input():
    return Spec(
        return_views_fn, [call(torch.arange(12.0).reshape(3, 4))], extra={"post": mutate_views_post}
    )


def return_input_fn(x, y):
    return x, y.view_as(y), x + 0


def mutate_first_post(out, args):
    out[0].mul_(3)
    out[1].add_(1)
    return args[0].clone(), args[1].clone()


@case
def returned_input_itself():
    return Spec(
        return_input_fn, [call(torch.ones(3), torch.ones(2))], extra={"post": mutate_first_post}
    )


def view_mutation_fn(x):
    x[:, 0].mul_(2)
    x.diagonal().add_(1)
    x[1].fill_(-1)
    x[::2, 1:].sub_(0.5)
    return x.sum()


@case
def inplace_on_views_of_input():
    return Spec(view_mutation_fn, [call(torch.arange(16.0).reshape(4, 4))], state=arg_state(0))


def view_mutation_nc_fn(x):
    x.mul_(2)
    x[0] += 1
    return x


@case
def inplace_on_noncontiguous_input():
    base = torch.arange(24.0).reshape(4, 6)
    return Spec(
        view_mutation_nc_fn,
        [call(base.t()[1:, ::2])],
        state=lambda s: {"base": s.calls[0][0][0]._base.clone()},
    )


def t_inplace_fn(x):
    x.t_()
    x.add_(1)
    return x[0]


@case
def t_underscore_metadata_mutation():
    return Spec(t_inplace_fn, [call(torch.arange(6.0).reshape(2, 3))], state=arg_state(0))


def unsqueeze_inplace_fn(x):
    x.unsqueeze_(0)
    x.squeeze_(-1)
    return x.shape, x * 2


@case
def unsqueeze_squeeze_underscore_on_input():
    return Spec(
        unsqueeze_inplace_fn,
        [call(torch.ones(3, 1))],
        state=lambda s: {"shape": str(s.calls[0][0][0].shape)},
    )


def chained_inplace_fn(x):
    y = x.add_(1).mul_(2).clamp_(max=5.0)
    return y


@case
def chained_inplace_returns_input():
    return Spec(chained_inplace_fn, [call(torch.arange(5.0))], state=arg_state(0))


def inplace_expanded_fn(x):
    y = x.expand(3, 4)
    y.add_(1)
    return y


@case
def inplace_on_expanded_raises():
    return Spec(inplace_expanded_fn, [call(torch.zeros(1, 4))], state=arg_state(0))


def inplace_expanded_input_fn(x):
    x.mul_(2)
    return x


@case
def inplace_on_expanded_input_raises():
    return Spec(inplace_expanded_input_fn, [call(torch.ones(1, 4).expand(3, 4))])


def out_arg_fn(x, y, z, w):
    torch.add(x, y, out=z)
    torch.sum(x, 0, out=w)
    torch.mul(x, 2, out=x)
    return z, w


@case
def out_arguments_with_resize():
    return Spec(
        out_arg_fn,
        [call(R(2, 3), R(2, 3), torch.empty(2, 3), torch.empty(5))],
        state=arg_state(0, 2, 3),
    )


def out_dtype_fn(x, z):
    torch.add(x, 1, out=z)
    return z


@case
def out_argument_dtype_cast():
    return Spec(
        out_dtype_fn,
        [
            call(torch.tensor([1.7, -2.5]), torch.zeros(2, dtype=torch.int64)),
            call(torch.tensor([1, 2]), torch.zeros(2, dtype=torch.float64)),
        ],
        state=arg_state(1),
    )


def resize_fn(x):
    y = torch.zeros(2)
    y.resize_(2, 3)
    y.fill_(1.0)
    x.resize_(2, 2)
    return y, x.clone()


@case
def resize_underscore():
    return Spec(resize_fn, [call(torch.arange(6.0))], state=arg_state(0))


def copy_bcast_fn(z, row, xi):
    z.copy_(row)
    z[0].copy_(xi)
    return z * 1


@case
def copy_broadcast_and_dtype():
    return Spec(
        copy_bcast_fn,
        [call(torch.zeros(3, 4), torch.tensor([1, 2, 3, 4]), torch.tensor([1.9, -1.9, 2.5, -2.5]))],
        state=arg_state(0),
    )


def copy_to_int_fn(z, x):
    z.copy_(x)
    return z


@case
def copy_float_to_int_truncates():
    return Spec(
        copy_to_int_fn,
        [
            call(torch.zeros(5, dtype=torch.int32), torch.tensor([1.9, -1.9, 2.5, -2.5, 1e10])),
            call(torch.zeros(4, dtype=torch.uint8), torch.tensor([-1.0, 255.9, 3.5, 300.0])),
        ],
        state=arg_state(0),
    )


def index_put_fn(x, idx, v):
    x.index_put_((idx,), v, accumulate=True)
    y = torch.zeros(5).index_put((idx,), v, accumulate=True)
    return x, y


@case
def index_put_accumulate_duplicates():
    return Spec(
        index_put_fn,
        [
            call(
                torch.zeros(5),
                torch.tensor([0, 2, 0, 0, -1]),
                torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]),
            )
        ],
        state=arg_state(0),
    )


def index_put_2d_fn(x, i, j, v):
    x[i, j] += v
    x.index_put_((i, j), torch.tensor(1.0), accumulate=True)
    return x


@case
def index_put_2d_augassign_dups():
    return Spec(
        index_put_2d_fn,
        [
            call(
                torch.zeros(3, 3),
                torch.tensor([0, 1, 0]),
                torch.tensor([2, 2, 2]),
                torch.tensor([1.0, 2.0, 3.0]),
            )
        ],
        state=arg_state(0),
    )


def scatter_fn(x, idx, src):
    return (
        x.scatter(1, idx, src),
        x.scatter_add(1, idx, src),
        x.scatter_reduce(1, idx, src, "sum", include_self=False),
        x.scatter_reduce(1, idx, src, "prod"),
        x.scatter_reduce(1, idx, src, "amax", include_self=False),
        x.scatter_reduce(1, idx, src, "mean"),
        x.scatter_reduce(1, idx, src, "mean", include_self=False),
        x.scatter(1, idx, 9.0),
        x.scatter_reduce(1, idx, src, "amin"),
    )


@case
def scatter_reduce_include_self():
    idx = torch.tensor([[0, 0, 2], [1, 1, 1]])
    return Spec(
        scatter_fn, [call(torch.ones(2, 4), idx, torch.tensor([[2.0, 3.0, 4.0], [-1.0, 5.0, 7.0]]))]
    )


def gather_fn(x, i0, i1):
    return (
        torch.gather(x, 0, i0),
        x.gather(1, i1),
        x.gather(-1, i1[:, :1]),
        torch.take_along_dim(x, i1, 1),
    )


@case
def gather_dims():
    return Spec(
        gather_fn,
        [
            call(
                R(3, 4),
                torch.tensor([[2, 0, 1, 1], [0, 0, 0, 2]]),
                torch.tensor([[3, 3], [0, 1], [2, 0]]),
            )
        ],
    )


def gather_oob_fn(x, i):
    return x.gather(0, i)


@case
def gather_out_of_bounds_raises():
    return Spec(gather_oob_fn, [call(R(4), torch.tensor([0, 4]))])


def masked_fn(x, m, s):
    return (
        x.masked_fill(m, torch.tensor(-1.5)),
        x.masked_fill(m, 2),
        x.masked_scatter(m, s),
        x.masked_select(m),
        x.masked_fill(~m, float("-inf")).softmax(-1),
        torch.masked_select(x, m[0]),
    )


@case
def masked_fill_scatter_select():
    m = torch.tensor([[True, False, True], [False, False, True]])
    return Spec(
        masked_fn,
        [
            call(R(2, 3), m, torch.arange(6.0)),
            call(torch.tensor([[1, 2, 3], [4, 5, 6]]), m, torch.arange(6)),
        ],
    )


def bool_mask_assign_fn(x, v):
    x[x > 0] = 0
    x[x < -1] = v[: int((x < -1).sum())] if False else -1.0
    x[torch.tensor([True, False, True, False, True, False])] *= 2
    return x


@case
def bool_mask_assignment():
    return Spec(bool_mask_assign_fn, [call(R(6), torch.arange(6.0))], state=arg_state(0))


def bool_mask_tensor_values_fn(x, m, v):
    x[m] = v
    return x, x[m], x[~m].sum()


@case
def bool_mask_assign_tensor_values():
    return Spec(
        bool_mask_tensor_values_fn,
        [
            call(
                torch.zeros(2, 3),
                torch.tensor([[True, False, True], [False, True, False]]),
                torch.tensor([1.0, 2.0, 3.0]),
            )
        ],
        state=arg_state(0),
    )


def adv_index_fn(x, i, j):
    return (
        x[[0, 2]],
        x[:, [1, 0]],
        x[i, None, ...],
        x[..., j],
        x[i, j],
        x[[-1]],
        x[1:, j],
        x[i, :, j],
        x[None, i, 1],
        x[i[:, None], j],
        x[[0, 1], [0, 1], [0, 1]],
        x[0, [1, 2], 1:],
    )


@case
def advanced_indexing_mixtures():
    return Spec(adv_index_fn, [call(R(3, 4, 5), torch.tensor([2, 0, -1]), torch.tensor([1, 3, 0]))])


def adv_index_set_fn(x, i, v):
    x[i, 1:] = v
    x[[0, 1], [1, 2]] += 1
    x[..., -1] = torch.tensor([7.0, 8.0, 9.0])
    x[i[:1], :, None] = 5.0
    return x


@case
def advanced_index_assignment():
    return Spec(
        adv_index_set_fn,
        [call(torch.zeros(3, 4), torch.tensor([2, 0]), torch.tensor([1.0, 2.0, 3.0]))],
        state=arg_state(0),
    )


def take_put_fn(x, i, v):
    t = torch.take(x, i)
    x.put_(i, v, accumulate=True)
    y = torch.zeros(6).put(torch.tensor([5, -6]), torch.tensor([1.0, 2.0]))
    return t, y


@case
def take_and_put():
    return Spec(
        take_put_fn,
        [
            call(
                torch.arange(12.0).reshape(3, 4),
                torch.tensor([0, -1, 5, 5]),
                torch.tensor([1.0, 1.0, 2.0, 3.0]),
            )
        ],
        state=arg_state(0),
    )


def index_ops_fn(x, i, src):
    return (
        x.index_select(1, i),
        x.index_copy(0, torch.tensor([2, 0]), src),
        x.index_fill(1, i, -1.0),
        x.index_add(0, torch.tensor([1, 1]), src, alpha=2),
        torch.index_select(x, 0, torch.tensor([-1]) + 3),
        x.index_reduce(0, torch.tensor([0, 0]), src, "amax", include_self=False),
    )


@case
def index_select_copy_fill_add():
    return Spec(index_ops_fn, [call(R(3, 4), torch.tensor([3, 0, 3]), R(2, 4))])


def narrow_split_fn(x):
    a = x.narrow(1, 2, 3)
    u = x.unbind(0)
    s = x.split([2, 3, 2], 1)
    c = x.chunk(3, 1)
    ts = x.tensor_split(3, 1)
    return a, u, s, c, ts, x.split(3, 1), torch.narrow(x, -1, -3, 2), len(x.chunk(4, 1))


@case
def narrow_unbind_split_chunk_uneven():
    return Spec(narrow_split_fn, [call(R(2, 7))])


def cat_mixed_fn(a, b, e, h):
    return (
        torch.cat([a, b]),
        torch.cat([a, e]),
        torch.cat([e, b.float()]),
        torch.stack([a, b]),
        torch.cat([h, a]),
        torch.cat([a, torch.empty(0, 3)]),
        torch.cat([b.bool(), b]),
        torch.stack([a, h], 1),
        torch.cat([e, e]),
    )


@case
def cat_stack_mixed_dtypes_and_empty():
    return Spec(
        cat_mixed_fn,
        [
            call(
                torch.tensor([[1, 2, 3]], dtype=torch.int32),
                torch.tensor([[1.5, 2.5, 3.5]], dtype=torch.float16),
                torch.empty(0),
                torch.tensor([[True, False, True]]),
            )
        ],
    )


def flip_roll_fn(x):
    return (
        x.flip(0),
        x.flip(-1, 0),
        x.roll(1),
        x.roll(-2, 1),
        x.roll((1, -1), (0, 1)),
        x.rot90(),
        x.rot90(-1),
        x.rot90(2, (1, 0)),
        x.rot90(3),
        x.roll(7, 0),
        torch.fliplr(x),
        torch.flipud(x),
    )


@case
def flip_roll_rot90():
    return Spec(
        flip_roll_fn,
        [call(torch.arange(12.0).reshape(3, 4)), call(torch.arange(12.0).reshape(4, 3).t())],
    )


def tril_fn(x, b):
    return (
        x.tril(),
        x.tril(-1),
        x.triu(2),
        x.triu(-5),
        x.tril(10),
        b.triu(1),
        torch.tril(b, -1),
        x.t().triu(),
    )


@case
def tril_triu_offsets():
    return Spec(
        tril_fn, [call(torch.arange(1.0, 16.0).reshape(3, 5), torch.arange(1, 25).reshape(2, 3, 4))]
    )


def repeat_fn(x, r):
    return (
        x.repeat(2, 1, 1),
        x.repeat_interleave(2),
        x.repeat_interleave(2, 0),
        x.repeat_interleave(r, 1),
        torch.repeat_interleave(torch.tensor([2, 0, 1])),
        x.tile((2,)),
        x.expand(2, 2, 3).contiguous(),
    )


@case
def repeat_and_repeat_interleave():
    return Spec(repeat_fn, [call(torch.arange(6.0).reshape(2, 3), torch.tensor([1, 0, 3]))])


def unfold_fn(x, im):
    return (
        x.unfold(0, 3, 2),
        x.unfold(0, 2, 5),
        F.unfold(im, 2, stride=1),
        F.fold(F.unfold(im, 2), (3, 4), 2),
    )


@case
def unfold_windows():
    return Spec(unfold_fn, [call(torch.arange(9.0), R(1, 2, 3, 4))])


def pad_fn(x):
    return (
        F.pad(x, (1, 2), value=-1.0),
        F.pad(x, (2, 1), mode="reflect"),
        F.pad(x, (1, 3), mode="replicate"),
        F.pad(x, (2, 2), mode="circular"),
        F.pad(x, (-1, 1)),
        F.pad(x, (0, 0, 1, 0)),
        F.pad(x, (1, 1, 1, 1), mode="reflect") if False else F.pad(x, (0, 0, 0, 0, 1, 1)),
    )


@case
def pad_modes():
    return Spec(pad_fn, [call(torch.arange(12.0).reshape(1, 3, 4))])


def pad2d_fn(x):
    return (
        F.pad(x, (1, 1, 2, 0), mode="reflect"),
        F.pad(x, (1, 0, 0, 2), mode="replicate"),
        F.pad(x, (1, 2, 2, 1), mode="circular"),
    )


@case
def pad_modes_2d():
    return Spec(pad2d_fn, [call(torch.arange(24.0).reshape(1, 2, 3, 4))])


def einsum_fn(a, b, sq, bt):
    return (
        torch.einsum("ij,jk->ik", a, b),
        torch.einsum("ii->i", sq),
        torch.einsum("ii", sq),
        torch.einsum("bij,bjk->bik", bt, bt.transpose(1, 2)),
        torch.einsum("i,j->ij", a[0], b[:, 0]),
        torch.einsum("...ij->...ji", bt),
        torch.einsum("ij->", a),
        torch.einsum("ij,ij->i", a, a),
        torch.einsum("bij->jb", bt),
        torch.einsum("ij,kj->ik", a, a),
    )


@case
def einsum_forms():
    return Spec(einsum_fn, [call(R(3, 4), R(4, 2), R(3, 3), R(2, 3, 4))])


def matmul_1d_fn(v3, v4, m34, b234, b4):
    return (
        torch.matmul(v3, m34),
        torch.matmul(m34, v4),
        v4 @ v4,
        b234 @ v4,
        v3 @ b234,
        b4 @ m34.t(),
        torch.matmul(torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2))
        if False
        else torch.matmul(b4, torch.ones(5, 4, 2)),
    )


@case
def matmul_1d_and_broadcast():
    return Spec(matmul_1d_fn, [call(R(3), R(4), R(3, 4), R(2, 3, 4), R(2, 1, 3, 4))])


def matmul_int_fn(a, b):
    return a @ b, torch.mm(a, b), torch.bmm(a[None], b[None]), a @ b[:, 0], torch.dot(a[0], b[:, 0])


@case
def matmul_of_int_tensors():
    return Spec(
        matmul_int_fn,
        [call(torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[1, -1], [2, 0], [3, 7]]))],
    )


def blas_fn(m, v, b1, b2, inp):
    return (
        torch.mv(m, v),
        torch.dot(v, v),
        torch.outer(v, v[:2]),
        torch.baddbmm(inp, b1, b2, alpha=0.5, beta=2.0),
        torch.addmm(inp[0], b1[0], b2[0], beta=0.0),
        torch.addmv(v[:3], m, v, alpha=-1.0),
        torch.addr(inp[0, :, :2], v[:3], v[:2]),
        torch.baddbmm(inp, b1, b2, beta=0),
    )


@case
def mv_dot_outer_baddbmm_alpha_beta():
    inp = torch.full((2, 3, 2), float("nan"))
    inp[1] = 1.0
    return Spec(blas_fn, [call(R(3, 4), R(4), R(2, 3, 4), R(2, 4, 2), inp)])


# =============================================================================================
# C. zero-size and 0-d tensors
def empty_red_fn(x):
    return (
        x.sum(1),
        x.prod(1),
        x.mean(1),
        x.sum(),
        x.prod(),
        torch.logsumexp(x, 1),
        x.all(1),
        x.any(1),
        x.cumsum(1),
        x.norm(dim=1),
        x.count_nonzero(1),
        x.var(1),
    )


@case
def reductions_over_empty_dims():
    return Spec(empty_red_fn, [call(torch.zeros(3, 0))])


def empty_amax_fn(x):
    return x.amax(1)


@case
def amax_over_empty_raises():
    return Spec(empty_amax_fn, [call(torch.zeros(3, 0))])


def empty_max_fn(x):
    return x.max()


@case
def max_of_empty_raises():
    return Spec(empty_max_fn, [call(torch.zeros(0))])


def empty_argmax_fn(x):
    return x.argmax(1)


@case
def argmax_over_empty_raises():
    return Spec(empty_argmax_fn, [call(torch.zeros(3, 0))])


def zero_size_fn(x, a, b):
    return (
        x + 1,
        x.t() * 2,
        torch.cat([x, x]),
        a @ b,
        x.sum(0),
        x.reshape(3, 0, 1),
        torch.softmax(x, 0),
        x.unsqueeze(1).expand(0, 2, 3),
    )


@case
def zero_size_elementwise_matmul():
    return Spec(zero_size_fn, [call(torch.zeros(0, 3), R(3, 0), R(0, 4))])


def zero_d_fn(s, t, x):
    return (
        s + t,
        s * x,
        (s > 0),
        s.exp(),
        s.sum(),
        s.reshape(1),
        x.sum() + s,
        s.item() * x,
        torch.stack([s, t]),
        s[None],
        s.clone(),
    )


@case
def zero_d_inputs_and_outputs():
    return Spec(
        zero_d_fn,
        [
            call(torch.tensor(2.5), torch.tensor(-1.0), R(3)),
            call(torch.tensor(-0.5), torch.tensor(4.0), R(3)),
        ],
    )


def item_mix_fn(x):
    m = x.max().item()
    n = int(x.argmax())
    s = float(x.sum())
    return x / m + n, s * 2, math.exp(m) * x, x.tolist()[0] + s


@case
def item_and_python_math_mixing():
    return Spec(item_mix_fn, [call(torch.tensor([1.0, 3.0, 2.0])), call(torch.tensor([5.0, 1.0]))])


def zero_d_int_fn(n, x):
    return x * n, x[n], x[: n + 1], n + 1, torch.arange(3) * n, x.roll(1) + n


@case
def zero_d_int_tensor_as_index_and_scalar():
    return Spec(zero_d_int_fn, [call(torch.tensor(1), R(4)), call(torch.tensor(2), R(4))])


# =============================================================================================
# D. reductions
def multi_dim_fn(x):
    return (
        x.sum((0, 2)),
        x.sum((0, 2), keepdim=True),
        x.mean((-1, -3)),
        x.amax((1, 2)),
        x.sum(dim=None) if False else x.sum(),
        x.prod(-2),
        x.std((0, 1)),
        x.mean(-1, keepdim=True),
        x.logsumexp((0, 1)),
        x.amin(-1, True),
        x.sum([]),
    )


@case
def reduce_multi_negative_dims():
    return Spec(multi_dim_fn, [call(R(2, 3, 4)), call(R(2, 3, 4).transpose(0, 2))])


def strided_dim_fn(x):
    return (
        x.sum(0),
        x.max(0).values,
        x.argmax(0),
        x.mean(1),
        x.var(0),
        x.cumsum(0),
        x.softmax(0),
        x.norm(dim=0),
    )


@case
def reduce_over_strided_dim():
    return Spec(strided_dim_fn, [call(R(33, 7)), call(R(7, 33).t()), call(R(40, 1023)[::3, ::2])])


def large_sum_fn(x):
    return (
        x.sum(),
        x.mean(),
        x.var(),
        x.sum(0),
        x.abs().max(),
        x.norm(),
        x.softmax(0).sum(),
        x.cumsum(0)[-1],
        x.square().sum(),
        x.logsumexp(0),
    )


@case
def large_reduction_f32_openmp():
    return Spec(large_sum_fn, [call(R(40001)), call(R(70000) + 100.0)])


def large_2d_fn(x):
    return x.sum(1), x.sum(0), x.mean(), x.amax(1), x.argmax(1), x.softmax(1)[:, :3], x * 2 + 1


@case
def large_2d_reductions_odd_sizes():
    return Spec(
        large_2d_fn, [call(R(33, 1023)), call(R(1023, 33)), call(R(7, 5000)), call(R(1, 40000))]
    )


def f16_sum_fn(x):
    return (
        x.sum(),
        x.mean(),
        x.cumsum(0)[-1],
        x.sum(dtype=torch.float16),
        (x * x).sum(),
        x.view(200, -1).sum(1)[:3],
        x.norm(),
    )


@case
def float16_large_sum_accumulates_in_f32():
    return Spec(
        f16_sum_fn,
        [
            call(torch.full((40000,), 0.1, dtype=torch.float16)),
            call(torch.full((40000,), 0.1, dtype=torch.bfloat16)),
        ],
    )


def f16_small_sum_fn(x):
    return x.sum(), x.mean(0), x.var(0), x.softmax(0), x.logsumexp(0), x.std()


@case
def float16_small_reductions():
    return Spec(
        f16_small_sum_fn,
        [call(torch.full((1023,), 0.1, dtype=torch.float16) + torch.linspace(0, 1, 1023).half())],
    )


def prod_fn(x, i):
    return x.prod(), x.cumprod(0)[-1], i.prod(), i.cumprod(0)[-1], x.double().prod(), i.int().prod()


@case
def prod_of_many_elements():
    return Spec(
        prod_fn,
        [
            call(1 + torch.randn(1000) * 0.01, torch.full((70,), 2)),
            call(torch.full((40000,), 1.0001), torch.full((33,), -3)),
        ],
    )


def all_any_fn(x, u, i):
    return (
        x.all(),
        x.any(1),
        u.all(),
        u.any(0),
        i.all(1),
        torch.all(x, dim=0, keepdim=True),
        i.any(),
        x.bool().all(),
    )


@case
def all_any_on_non_bool():
    return Spec(
        all_any_fn,
        [
            call(
                torch.tensor([[1.0, float("nan")], [0.0, -0.0]]),
                torch.tensor([[3, 0], [255, 1]], dtype=torch.uint8),
                torch.tensor([[1, -1], [0, 2]]),
            )
        ],
    )


def norm_fn(x):
    return (
        torch.linalg.vector_norm(x, 0),
        torch.linalg.vector_norm(x, 1),
        x.norm(2),
        torch.linalg.vector_norm(x, float("inf")),
        torch.linalg.vector_norm(x, float("-inf")),
        torch.norm(x, "fro"),
        x.norm(p=3, dim=1),
        torch.linalg.vector_norm(x, 0.5, dim=0),
        torch.linalg.matrix_norm(x),
        torch.linalg.vector_norm(x.half(), 2),
        torch.linalg.norm(x, dim=1),
    )


@case
def norms_orders():
    return Spec(
        norm_fn, [call(torch.tensor([[3.0, -4.0, 0.0], [0.0, 0.0, -1.0]])), call(torch.zeros(2, 3))]
    )


def cummax_fn(x):
    a = x.cummax(0)
    b = x.cummin(1)
    return a.values, a.indices, b.values, b.indices, torch.logcumsumexp(x, 1)


@case
def cummax_cummin_ties_logcumsumexp():
    ni = float("-inf")
    return Spec(
        cummax_fn,
        [
            call(
                torch.tensor(
                    [
                        [1.0, 1.0, ni, 2.0],
                        [1.0, 3.0, ni, 2.0],
                        [1.0, float("nan"), ni, 0.0],
                        [ni, ni, ni, ni],
                    ]
                )
            )
        ],
    )


def median_fn(x):
    m = x.median(1)
    md = x.mode(1)
    k = x.kthvalue(2, 1)
    return (
        x.median(),
        m.values,
        m.indices,
        md.values,
        md.indices,
        k.values,
        k.indices,
        x.nanmedian(),
        torch.quantile(x, 0.5, dim=1),
    )


@case
def median_mode_kthvalue():
    return Spec(
        median_fn,
        [call(torch.tensor([[3.0, 1.0, 2.0, 4.0], [5.0, 5.0, 1.0, 1.0], [2.0, 2.0, 2.0, 7.0]]))],
    )


def median_nan_fn(x):
    return x.median(), x.nanmedian(), x.median(0).values, x.nanmedian(0).values


@case
def median_with_nan():
    return Spec(median_nan_fn, [call(torch.tensor([[1.0, float("nan")], [3.0, 2.0], [0.0, 5.0]]))])


def nanmean_fn(x):
    return (
        x.nansum(),
        x.nanmean(),
        x.nanmean(1),
        x.nansum(0),
        torch.nansum(x.half()),
        x.nanmean(1, keepdim=True),
    )


@case
def nanmean_nansum():
    nan = float("nan")
    return Spec(
        nanmean_fn,
        [call(torch.tensor([[nan, 1.0, 2.0], [nan, nan, nan], [0.0, -1.0, float("inf")]]))],
    )


def argmax_large_fn(x):
    return x.argmax(), x.argmin(), x.max(0), x.amax(0), x.view(-1, 5).argmax(0)


@case
def argmax_large_ties_openmp():
    x = torch.zeros(40000)
    x[[100, 25000, 39999]] = 5.0
    x[[7, 30001]] = -5.0
    return Spec(argmax_large_fn, [call(x)])


def max_large_nan_fn(x):
    return x.amax(), x.max(), x.argmax(), x.min(), x.sum(), x.nansum(), x.isnan().any()


@case
def max_large_with_nan_openmp():
    x = torch.randn(50000)
    x[49999] = float("nan")
    y = torch.randn(50000)
    y[3] = float("nan")
    return Spec(max_large_nan_fn, [call(x), call(y)])


def odd_size_fn(x):
    return (
        x * 2 + 1,
        x.exp().sum(),
        x.cumsum(0),
        x.sort().values,
        torch.where(x > 0, x, -x),
        x.reshape(-1, 1) + x,
    )


@case
def elementwise_odd_sizes():
    return Spec(odd_size_fn, [call(R(1)), call(R(7)), call(R(33)), call(R(1023))])


def large_inplace_fn(x, y):
    x.mul_(y).add_(1)
    x[::2] = 0
    return x.sum()


@case
def large_inplace_strided_openmp():
    return Spec(large_inplace_fn, [call(R(40002), R(40002))], state=arg_state(0))


def large_int_fn(x):
    return x.sum(), x // 7, x % 7, x.max(), (x > 0).sum(), x.cumsum(0)[-1], x.to(torch.int8).sum()


@case
def large_int_reductions_openmp():
    return Spec(
        large_int_fn,
        [
            call(torch.randint(-1000, 1000, (40000,))),
            call(torch.randint(-100, 100, (33000,), dtype=torch.int32)),
        ],
    )


def bincount_hist_fn(x, w):
    return (
        torch.bincount(x),
        torch.bincount(x, w, minlength=8),
        torch.histc(w, 4, 0, 1),
        torch.searchsorted(torch.tensor([0.1, 0.5, 0.9]), w),
    )


@case
def bincount_histc_searchsorted():
    return Spec(
        bincount_hist_fn,
        [call(torch.tensor([0, 1, 1, 3, 5]), torch.tensor([0.5, 0.1, 1.0, 0.9, 0.25]))],
    )


# =============================================================================================
# E. random numbers
def rand_inside_seed_fn(x):
    torch.manual_seed(0)
    return x + torch.rand(5), torch.randn(2, 3)


@case
def rand_seed_inside_function():
    return Spec(rand_inside_seed_fn, [call(R(5)), call(R(5))], state=next_draw)


def rand_outside_seed_fn(x):
    return x + torch.rand(5), torch.randn_like(x), torch.rand(40000).mean()


@case
def rand_global_generator_stream():
    return Spec(rand_outside_seed_fn, [call(R(5)), call(R(5))], state=next_draw)


def dropout_fn(x):
    return (
        F.dropout(x, 0.5, training=True),
        F.dropout(x, 0.0, training=True),
        F.dropout(x, 1.0, training=True),
        F.dropout(x, 0.3, training=False),
    )


@case
def dropout_train_values():
    return Spec(dropout_fn, [call(R(64)), call(R(40000))], state=next_draw)


def bernoulli_fn(p):
    return (
        torch.bernoulli(p),
        torch.randint(0, 10, (6,)),
        torch.randperm(7),
        torch.multinomial(p + 0.1, 3),
        torch.rand(3, dtype=torch.float64),
        torch.normal(0.0, 1.0, (3,)),
        torch.empty(4).uniform_(-1, 1),
    )


@case
def bernoulli_randint_randperm_multinomial():
    return Spec(bernoulli_fn, [call(torch.tensor([0.0, 0.5, 1.0, 0.25]))], state=next_draw)


def rand_generator_fn(x, g):
    return x + torch.rand(4, generator=g)


@case
def rand_explicit_generator():
    g = torch.Generator().manual_seed(7)
    return Spec(
        rand_generator_fn,
        [call(R(4), g), call(R(4), g)],
        state=lambda s: {"g next": torch.rand(2, generator=g)},
    )


# =============================================================================================
# F. gradients at the edges
def grad_where_fn(x, m):
    return (
        torch.where(m, x * 2, x.exp()),
        x.masked_fill(m, 0.0) * x,
        torch.where(x > 0, x.log(), torch.zeros_like(x)),
    )


@case
def grad_where_masked_fill_log_nan_branch():
    return Spec(
        grad_where_fn,
        [
            call(
                torch.tensor([1.0, -1.0, 0.0, 2.0], requires_grad=True),
                torch.tensor([True, False, True, False]),
            )
        ],
        grad=True,
    )


def grad_max_ties_fn(x):
    return (
        x.max(),
        x.amax(1),
        x.max(1).values,
        x.min(),
        torch.maximum(x, x.flip(1)),
        x.amin(0),
        x.logsumexp(1),
    )


@case
def grad_max_with_ties():
    return Spec(
        grad_max_ties_fn,
        [call(torch.tensor([[1.0, 3.0, 3.0], [3.0, 0.0, 3.0]], requires_grad=True))],
        grad=True,
    )


def grad_norm_zero_fn(x, z):
    return (
        x.norm(),
        z.norm(),
        z.norm(dim=1),
        torch.linalg.vector_norm(z, 1),
        torch.linalg.vector_norm(z, float("inf")),
        (z * x).norm(p=3),
    )


@case
def grad_norm_at_zero():
    return Spec(
        grad_norm_zero_fn,
        [
            call(
                torch.tensor([[3.0, 4.0], [0.0, 1.0]], requires_grad=True),
                torch.zeros(2, 2, requires_grad=True),
            )
        ],
        grad=True,
    )


def grad_abs_fn(x):
    return (
        x.abs(),
        x.relu(),
        x.sign() * x,
        F.leaky_relu(x, 0.1),
        x.clamp(0.0, 1.0),
        F.hardtanh(x),
        x.clamp(min=0.0),
    )


@case
def grad_abs_relu_clamp_at_kinks():
    return Spec(
        grad_abs_fn,
        [call(torch.tensor([-1.0, -0.0, 0.0, 1.0, 0.5, -1.0], requires_grad=True))],
        grad=True,
    )


def grad_sqrt_fn(x):
    return (
        x.sqrt(),
        x.sqrt() * 0,
        x.rsqrt(),
        x.pow(0.5),
        x**2,
        torch.pow(0.0, x) if False else x.log(),
    )


@case
def grad_sqrt_pow_at_zero():
    return Spec(grad_sqrt_fn, [call(torch.tensor([0.0, 1.0, 4.0], requires_grad=True))], grad=True)


def grad_pow_fn(x, e):
    return torch.pow(x, e), x**0, torch.pow(2.0, x), x**3.0, torch.pow(x, 0.0)


@case
def grad_pow_tensor_exponent():
    return Spec(
        grad_pow_fn,
        [
            call(
                torch.tensor([0.0, -1.0, 2.0], requires_grad=True),
                torch.tensor([0.0, 2.0, 0.5], requires_grad=True),
            )
        ],
        grad=True,
    )


def grad_index_put_fn(x, v, idx):
    y = x * 1
    y = y.index_put((idx,), v, accumulate=True)
    z = x.index_put((idx[:2],), v[:2])
    return y, z, x[idx] * 2


@case
def grad_index_put_accumulate():
    return Spec(
        grad_index_put_fn,
        [
            call(
                torch.ones(4, requires_grad=True),
                torch.tensor([1.0, 2.0, 3.0], requires_grad=True),
                torch.tensor([1, 3, 1]),
            )
        ],
        grad=True,
    )


def grad_expand_fn(x):
    return (
        x.expand(3, 4) * torch.arange(12.0).reshape(3, 4),
        x.as_strided((3, 2), (1, 1)),
        x.repeat(2, 2),
    )


@case
def grad_expand_and_overlapping_as_strided():
    return Spec(
        grad_expand_fn, [call(torch.tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True))], grad=True
    )


def grad_leaf_view_inplace_fn(x):
    x[0].mul_(2)
    return x


@case
def grad_inplace_on_leaf_view_raises():
    return Spec(grad_leaf_view_inplace_fn, [call(torch.ones(2, 2, requires_grad=True))], grad=True)


def grad_leaf_inplace_fn(x):
    x.add_(1)
    return x


@case
def grad_inplace_on_leaf_raises():
    return Spec(grad_leaf_inplace_fn, [call(torch.ones(3, requires_grad=True))], grad=True)


def grad_nonleaf_inplace_fn(x):
    y = x * 1
    y[:, 0].mul_(2)
    y.sin_()
    z = x.clone()
    z.diagonal().zero_()
    y[1] = z[0] * 3
    return y, z


@case
def grad_inplace_on_nonleaf_views():
    return Spec(grad_nonleaf_inplace_fn, [call(R(2, 2).requires_grad_())], grad=True)


def grad_inplace_saved_fn(x):
    y = x.exp()
    y.add_(1)
    return y


@case
def grad_inplace_on_saved_output():
    # exp saves its output; y.add_ modifies it -> eager raises at backward
    return Spec(grad_inplace_saved_fn, [call(R(3).requires_grad_())], grad=True)


def grad_gather_fn(x, i):
    return (
        x.gather(1, i),
        x.scatter(1, i[:, :1], 0.0),
        x.scatter_add(1, i, x.detach()),
        x.index_select(0, i[1]),
    )


@case
def grad_gather_scatter_duplicates():
    return Spec(
        grad_gather_fn,
        [call(R(2, 3).requires_grad_(), torch.tensor([[0, 0, 2], [1, 1, 1]]))],
        grad=True,
    )


def grad_std_fn(x, one):
    return one.std(), one.var(0), x.std(1), x.var(0, correction=0)


@case
def grad_std_single_element():
    return Spec(grad_std_fn, [call(R(2, 3).requires_grad_(), R(1).requires_grad_())], grad=True)


def grad_lse_fn(x):
    return x.logsumexp(1), x.softmax(1), x.log_softmax(1)


@case
def grad_logsumexp_softmax_neginf():
    ni = float("-inf")
    return Spec(
        grad_lse_fn,
        [call(torch.tensor([[ni, 0.0, 1.0], [ni, ni, 2.0]], requires_grad=True))],
        grad=True,
    )


def grad_cumprod_fn(x):
    return x.cumprod(0), x.cumsum(0), x.prod(), torch.logcumsumexp(x, 0)


@case
def grad_cumprod_prod_with_zeros():
    return Spec(
        grad_cumprod_fn,
        [
            call(torch.tensor([2.0, 0.0, 3.0, 0.0, 4.0], requires_grad=True)),
            call(torch.tensor([2.0, 0.0, 3.0, 5.0], requires_grad=True)),
        ],
        grad=True,
    )


def grad_sort_fn(x):
    return (
        x.sort(stable=True).values,
        x.topk(2).values,
        x.median(),
        x.kthvalue(2).values,
        x.cummax(0).values,
    )


@case
def grad_sort_topk_median_ties():
    return Spec(
        grad_sort_fn, [call(torch.tensor([3.0, 1.0, 3.0, 2.0, 1.0], requires_grad=True))], grad=True
    )


def grad_masked_select_fn(x, m):
    return x[m], x.masked_select(m) * 2, x[x > 0].sum()


@case
def grad_bool_mask_select():
    return Spec(
        grad_masked_select_fn,
        [
            call(
                torch.tensor([1.0, -2.0, 3.0, 0.0], requires_grad=True),
                torch.tensor([True, False, True, True]),
            )
        ],
        grad=True,
    )


def grad_f16_fn(x):
    return (x.half() * 3).sum().float(), x.bfloat16().exp().float(), (x.double() ** 2).float()


@case
def grad_through_dtype_casts():
    return Spec(grad_f16_fn, [call(R(5).requires_grad_())], grad=True)


def grad_matmul_1d_fn(v, m, b):
    return (
        v @ m,
        m @ v[:3] if False else (m.t() @ v),
        torch.baddbmm(b, m[None], m.t()[None], beta=0.5, alpha=2.0),
        torch.outer(v, v),
    )


@case
def grad_matmul_1d_baddbmm():
    return Spec(
        grad_matmul_1d_fn,
        [call(R(3).requires_grad_(), R(3, 4).requires_grad_(), R(1, 3, 3).requires_grad_())],
        grad=True,
    )


def grad_large_fn(x):
    return x.sum(), x.softmax(0), x.norm(), x.amax()


@case
def grad_large_reductions_openmp():
    x = torch.randn(40000)
    x[5] = x[40] = 10.0
    return Spec(grad_large_fn, [call(x.requires_grad_())], grad=True)


def grad_mse_huber_fn(x, y):
    return (
        F.mse_loss(x, y),
        F.smooth_l1_loss(x, y, beta=0.5),
        F.huber_loss(x, y, delta=1.0),
        F.l1_loss(x, y, reduction="sum"),
    )


@case
def grad_losses_at_equal_points():
    return Spec(
        grad_mse_huber_fn,
        [
            call(
                torch.tensor([0.0, 1.0, 2.0, 0.5], requires_grad=True),
                torch.tensor([0.0, 1.5, 0.0, 0.5]),
            )
        ],
        grad=True,
    )


# =============================================================================================
# The cases run again through the Triton backend (its interpreter on the CPU). Left out: the
# reductions of OpenMP sizes (large_2d_reductions_odd_sizes, argmax_large_ties_openmp,
# max_large_with_nan_openmp, large_reduction_f32_openmp): 0.5-4 minutes each under the
# interpreter; tests/e2e/test_reductions.py runs Triton's large reductions.
TRITON_SUBSET = [
    "int8_overflow_wraparound",
    "uint8_sub_wrap",
    "promotion_scalars_and_0d",
    "int_floordiv_negatives",
    "float_floordiv_negatives_zero",
    "remainder_fmod_negatives",
    "bitwise_and_shifts",
    "shift_int8_uint8",
    "abs_of_int_min",
    "pow_integer_exponents",
    "true_divide_ints",
    "sum_result_dtypes",
    "cumsum_cumprod_dtypes",
    "argmax_argmin_ties_and_nan",
    "max_min_dim_ties_nan",
    "clamp_min_greater_than_max",
    "clamp_int_with_float_bounds",
    "where_scalar_promotion",
    "float16_overflow_inf",
    "bfloat16_rounding_mixed",
    "nan_to_num_defaults",
    "nan_propagation_max_min",
    "negative_zero_sign",
    "special_functions_at_edges",
    "sigmoid_softplus_threshold_beta",
    "logsumexp_neginf_rows",
    "softmax_all_neginf_rows",
    "log_softmax_large_values",
    "var_std_corrections_single_element",
    "transposed_input_output_strides",
    "channels_last_layout_kept",
    "inplace_on_views_of_input",
    "copy_float_to_int_truncates",
    "index_put_accumulate_duplicates",
    "scatter_reduce_include_self",
    "advanced_indexing_mixtures",
    "reductions_over_empty_dims",
    "reduce_over_strided_dim",
    "float16_large_sum_accumulates_in_f32",
    "all_any_on_non_bool",
    "norms_orders",
    "elementwise_odd_sizes",
    "large_int_reductions_openmp",
    "dropout_train_values",
    "prod_of_many_elements",
    "float16_small_reductions",
    "cummax_cummin_ties_logcumsumexp",
    "gather_dims",
    "sliced_with_steps_input",
    "expanded_stride0_input",
    "inplace_on_expanded_input_raises",
]


# known wrong answers and errors today (case name -> reason); FALLBACK/RECOMP rows that must stay
# so (name -> (status, reason)); heavy cases (CI runs a slice of them)
HALF_IN_FLOAT32 = ("float16/bfloat16 chains are computed in float32 and rounded once (by design, "
                   "as torch.compile): eager rounds (and overflows) at every op")
XFAIL: dict = {
    "float16_overflow_inf": HALF_IN_FLOAT32,
    "grad_through_dtype_casts": HALF_IN_FLOAT32,
    "out_arguments_with_resize": (
        "out= resized: the warning comes from torch's Python reference, whose text differs from "
        "eager's C++ one (torch.Size([5]) and a literal '{str(shape)}')"),
    "grad_inplace_on_saved_output": (
        "an in-place op on a tensor saved for backward: ember gives the true gradient where eager "
        "raises (no version counter check)"),
}
PARTLY: dict = {}
# (over 0.3 s a case on 2 cores)
SLOW: set = {
    "large_reduction_f32_openmp", "large_2d_reductions_odd_sizes",
    "advanced_indexing_mixtures", "einsum_forms", "elementwise_odd_sizes", "flip_roll_rot90",
    "grad_large_reductions_openmp", "int_floordiv_negatives", "item_and_python_math_mixing",
    "large_int_reductions_openmp", "masked_fill_scatter_select", "pad_modes_2d",
    "reduce_over_strided_dim", "repeat_and_repeat_interleave", "tril_triu_offsets"
}


@pytest.mark.parametrize("name", params(CASES, XFAIL, SLOW))
def test_op(name):
    check_case(CASES[name], layout=True, partly=PARTLY.get(name))


TRITON_XFAIL: dict = {
    "float16_overflow_inf": HALF_IN_FLOAT32,
}
TRITON_SLOW: set = {
    "advanced_indexing_mixtures", "all_any_on_non_bool", "argmax_argmin_ties_and_nan",
    "bitwise_and_shifts", "dropout_train_values", "elementwise_odd_sizes",
    "float16_large_sum_accumulates_in_f32", "float16_small_reductions",
    "float_floordiv_negatives_zero", "inplace_on_views_of_input", "int8_overflow_wraparound",
    "int_floordiv_negatives", "large_int_reductions_openmp", "max_min_dim_ties_nan",
    "norms_orders", "prod_of_many_elements", "reduce_over_strided_dim"
}


@pytest.mark.parametrize(
    "name", params({n: CASES[n] for n in TRITON_SUBSET}, TRITON_XFAIL, TRITON_SLOW)
)
def test_op_triton(name):
    from ember import config

    with config.override(backend="triton"):
        check_case(CASES[name], layout=True, partly=PARTLY.get(name))
