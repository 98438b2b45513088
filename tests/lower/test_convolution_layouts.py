"""A convolution's results (and its backward's) must be laid out as eager's kernel lays them
out: ember's kernels read a library result by the strides it planned. lower/layout.py answers
from torch's choice of kernel family for the operands' geometry, without running the
convolution; here each answer is compared with a real run, on the suite's device
(EMBER_TEST_DEVICE), over images and weights row-major, channels-last and permuted, grouped,
depthwise, strided, dilated and transposed convolutions in 1, 2 and 3 dims."""

import itertools
import os

import pytest
import torch

from ember.lower.layout import eager_layout
from tests.helpers import DEVICE

aten = torch.ops.aten


def _laid_out(shape, dtype, layout):
    if layout == "channels_last" and len(shape) in (4, 5):
        return torch.empty(shape, dtype=dtype).to(
            memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    if layout == "reversed":  # (no memory format at all: strides in the reverse order)
        return torch.empty(shape[::-1], dtype=dtype).permute(*range(len(shape) - 1, -1, -1))
    return torch.empty(shape, dtype=dtype)


DTYPES = [torch.float32, torch.bfloat16, torch.float64] + \
    ([torch.float16] if DEVICE == "cuda" else [])


def _cases(dtype, dims):
    images = [(2, 8, 9), (1, 16, 7), (4, 3, 16), (2, 32, 1), (2, 1, 6)]  # (1x1, 1 channel: both
    # formats at once)
    filters = [(8, 1), (16, 8), (32, "depthwise"), (4, 2)]
    for ((n, c, h), (f, groups), k, stride, dilation, x_layout, w_layout, bias,
         transposed) in itertools.product(
            images, filters, [1, 3], [1, 2], [1, 2], ["row_major", "channels_last", "reversed"],
            ["row_major", "channels_last"], [False, True], [False, True]):
        if groups == "depthwise":
            groups, f = c, max(c, f - f % c)
        if c % groups or f % groups or (transposed and (dilation > 1 or dims != 2)):
            continue
        yield ((n, c) + (h,) * dims, f, groups, k, stride, dilation, x_layout, w_layout, bias,
               transposed)


def _meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _on_device(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                   device=DEVICE).zero_()
    return value


def _same_layout(ours, eager):
    """(a size-1 dim's stride places nothing)"""
    pairs = [(o, e) for o, e in zip(ours, eager) if isinstance(e, torch.Tensor)]
    return all(o.shape == e.shape and all(a == b for n, a, b in zip(e.shape, o.stride(),
                                                                     e.stride()) if n != 1)
               for o, e in pairs)


def _check(func, args):
    try:
        with torch.no_grad():
            ran = func(*[_on_device(a) for a in args])
    except RuntimeError:  # (a combination eager refuses: nothing to compare)
        return
    metas = [_meta(a) for a in args]
    ours = eager_layout(func, tuple(metas), {}, func(*metas), torch.device(DEVICE).type)
    ran = ran if isinstance(ran, tuple) else (ran,)
    ours = ours if isinstance(ours, tuple) else (ours,)
    assert _same_layout(ours, ran), \
        f"{func}: ember {[tuple(o.stride()) for o in ours if o is not None]}, " \
        f"eager {[tuple(r.stride()) for r in ran if r is not None]}"


@pytest.fixture(autouse=True)
def one_thread():
    """(thousands of tiny convolutions: threads of two test processes on two cores spun on
    each other's, 190 s against 20 for the sweep; the answers are asked at this thread
    count too)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_convolution_results_are_laid_out_as_eager_lays_them(dtype, dims):
    cases = list(_cases(dtype, dims))
    if os.environ.get("CI") == "true":
        cases = cases[::8]  # (a fixed eighth: the whole sweep takes a minute on 2 cores)
    mismatches = []
    for case in cases:
        try:
            _check_case(dtype, *case)
        except AssertionError as error:  # (every mismatch said, not the first alone)
            mismatches.append(f"{case}: {str(error).splitlines()[0]}")
    assert not mismatches, f"{len(mismatches)} of {len(cases)}:\n" + "\n".join(mismatches[:20])


def _check_case(dtype, shape, f, groups, k, stride, dilation, x_layout, w_layout, bias,
                transposed):
    dims = len(shape) - 2
    c = shape[1]
    weight_shape = ((c, f // groups) if transposed else (f, c // groups)) + (k,) * dims
    x = _laid_out(shape, dtype, x_layout)
    weight = _laid_out(weight_shape, dtype, w_layout)
    b = torch.empty(weight_shape[1] * groups if transposed else f, dtype=dtype) \
        if bias else None
    options = [[stride] * dims, [k // 2] * dims, [dilation] * dims, transposed, [0] * dims,
               groups]
    _check(aten.convolution.default, [x, weight, b, *options])
    try:
        with torch.no_grad():
            out = aten.convolution.default(*[_on_device(a) for a in (x, weight, b)], *options)
    except RuntimeError:
        return
    if DEVICE == "cpu" and k == 1 and stride > 1 and \
            (x_layout, w_layout) != ("row_major", "row_major"):
        # (eager's own weight gradient of a strided 1x1 convolution takes the process down
        # on some CPUs — a corrupt heap or a segfault in oneDNN, torch 2.13 — where the image
        # or the weight is not row-major: passes/convolution_layout.py keeps ember from
        # making such a call)
        return
    for grad in (torch.empty_strided(out.shape, out.stride(), dtype=dtype),
                 torch.empty(out.shape, dtype=dtype)):
        _check(aten.convolution_backward.default,
               [grad, x, weight, [b.shape[0]] if bias else None, *options, [True, True, bias]])
