import triton
import triton.language as tl


@triton.jit
def ember_max_nan(a, b):
    """maximum that propagates NaN, as eager's max does"""
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def ember_min_nan(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def ember_mul(a, b):
    return a * b


@triton.jit
def ember_argmax_combine(av, ai, bv, bi):
    """(value, index) pairs: the larger value wins, NaN beats everything, ties go to the first"""
    a_nan = av != av
    b_nan = bv != bv
    tie = (bv == av) | (a_nan & b_nan)
    take = ((bv > av) & (av == av)) | (b_nan & (av == av)) | (tie & (bi < ai))
    return tl.where(take, bv, av), tl.where(take, bi, ai)


@triton.jit
def ember_argmin_combine(av, ai, bv, bi):
    a_nan = av != av
    b_nan = bv != bv
    tie = (bv == av) | (a_nan & b_nan)
    take = ((bv < av) & (av == av)) | (b_nan & (av == av)) | (tie & (bi < ai))
    return tl.where(take, bv, av), tl.where(take, bi, ai)


@triton.jit
def ember_floordiv(a, b):
    """Python's a // b for floats, as torch computes it"""
    m = a % b
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1.0, d)
    f = tl.floor(d)
    f = tl.where(d - f > 0.5, f + 1.0, f)
    zero = 0.0 * (a / b)
    return tl.where(b == 0, a / b, tl.where(d != 0, f, zero))


@triton.jit
def ember_remainder(a, b):
    """Python's a % b (the divisor's sign) for floats and integers"""
    m = a % b
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@triton.jit
def ember_floordiv_int(a, b):
    q = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def ember_round_half_even(x, big):
    """torch.round: halves go to the even neighbour; |x| >= big is already an integer"""
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0
    r = tl.where((r - x == 0.5) & odd, r - 1.0, r)
    return tl.where(tl.abs(x) >= big, x, r)


@triton.jit
def ember_round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even; NaN stays NaN), still in float32:
    written out because the interpreter's conversion truncates"""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def ember_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def ember_tanh_f32(x):
    a = tl.abs(x)
    s = x * x
    p = 0.0024681936
    p = p * s + -0.0084761195
    p = p * s + 0.021802662
    p = p * s + -0.05396252
    p = p * s + 0.13333312
    p = p * s + -0.33333334
    near = x + x * s * p
    far = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    far = tl.where(x < 0, -far, far)
    return tl.where(a < 0.55, near, far)


@triton.jit
def ember_erf_f32(x):
    t = tl.abs(x)
    s = x * x
    q = 1.6425845387857407e-05 * t + -0.0004680210549850017
    q = q * t + 0.0052647641859948635
    q = q * t + -0.034303076565265656
    q = q * t + 0.1532936990261078
    q = q * t + 0.9163130521774292
    q = q * t + 0.6282998323440552
    far = 1.0 - tl.math.exp2(q * -t - t)
    far = tl.where(x < 0, -far, far)
    p = 8.483494457323104e-05 * s + -0.0008213091641664505
    p = p * s + 0.005213488824665546
    p = p * s + -0.026868773624300957
    p = p * s + 0.11284004896879196
    p = p * s + -0.37612664699554443
    p = p * s + 0.12837915122509003
    return tl.where(t >= 1.002959966659546, far, p * x + x)


@triton.jit
def ember_expm1_f64(x):
    """exp(x) - 1 without cancellation: (u - 1) * x / log(u) with u = exp(x) (Kahan)"""
    u = tl.exp(x)
    um1 = u - 1.0
    r = um1 * x / tl.log(u)
    r = tl.where(u == float("inf"), u, r)
    r = tl.where(um1 == -1.0, -1.0, r)
    return tl.where(u == 1.0, x, r)


@triton.jit
def ember_expm1_f32(x):
    return ember_expm1_f64(x.to(tl.float64)).to(tl.float32)


@triton.jit
def ember_log1p_f64(x):
    """log(1 + x) without cancellation: log(u) * x / (u - 1) with u = 1 + x (Kahan)"""
    u = 1.0 + x
    r = tl.log(u) * x / (u - 1.0)
    r = tl.where(u == float("inf"), u, r)
    return tl.where(u == 1.0, x, r)


@triton.jit
def ember_log1p_f32(x):
    return ember_log1p_f64(x.to(tl.float64)).to(tl.float32)


@triton.jit
def ember_tanh_f64(x):
    a = tl.abs(x)
    e = ember_expm1_f64(-2.0 * a)
    t = -e / (e + 2.0)
    return tl.where(x < 0, -t, t)


@triton.jit
def ember_pow(a, b):
    """a ** b for floats (computed in float64): eager's special cases, negative bases with
    integer exponents"""
    a64 = a.to(tl.float64)
    b64 = b.to(tl.float64)
    magnitude = tl.exp2(b64 * tl.log2(tl.abs(a64)))
    integral = tl.floor(b64) == b64
    odd = integral & ((b64 - 2.0 * tl.floor(b64 * 0.5)) != 0)
    r = tl.where((a64 < 0) & odd, -magnitude, magnitude)
    finite_negative = (a64 < 0) & (a64 != float("-inf"))
    r = tl.where(finite_negative & (integral == 0) & (tl.abs(b64) != float("inf")),
                 float("nan"), r)
    r = tl.where((tl.abs(a64) == 1.0) & (tl.abs(b64) == float("inf")), 1.0, r)
    r = tl.where((b64 == 0) | (a64 == 1.0), 1.0, r)
    return r.to(a.dtype)


@triton.jit
def ember_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, ember_erf_f32(x), mask=i < n)


@triton.jit
def libdevice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, tl.math.erf(x), mask=i < n)
