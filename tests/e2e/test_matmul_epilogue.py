"""Matmul epilogue fusion (Triton backend, EMBER_MATMUL_EPILOGUE=1): a small product read
only by one pointwise kernel is computed inside that kernel. Results match eager; the C backend
keeps the library call."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check, make, make_layout

from ember import config

TOLERANCE = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def fusion_on():
    with config.override(matmul_epilogue=True):
        yield


def library_calls(graph, backend: str, fused: int, total: int) -> None:
    """Library calls left after fusion: `total` minus the `fused` ones on Triton."""
    assert graph.library_count == (total - fused if backend == "triton" else total)


def test_a_deep_thin_mlp_fuses_every_layer(kernel_backend):
    layers = []
    for width_in, width_out in ((32, 48), (48, 48), (48, 16)):
        layers += [torch.nn.Linear(width_in, width_out), torch.nn.Tanh()]
    torch.manual_seed(0)
    model = torch.nn.Sequential(*layers).eval()
    graph = check(model.to(make(1).device), make(20, 32), kernels=3, **TOLERANCE)
    library_calls(graph, kernel_backend, fused=3, total=3)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_mm_then_pointwise_on_any_operand_layout(kernel_backend, layout):
    def fn(a, b, c):
        return torch.relu(a @ b) * c + 1

    graph = check(fn, make_layout(layout, 24, 40), make(40, 36, seed=1), make(36, seed=2),
                  **TOLERANCE)
    library_calls(graph, kernel_backend, fused=1, total=1)


def test_half_products_are_rounded_to_half_before_the_epilogue(kernel_backend):
    def fn(x, w, bias):
        return F.silu(F.linear(x, w, bias))

    check(fn, make(32, 64, dtype=torch.float16), make(48, 64, dtype=torch.float16, seed=1),
          make(48, dtype=torch.float16, seed=2), rtol=2e-3, atol=2e-3)


def test_a_product_read_at_other_positions_is_not_fused(kernel_backend):
    def fn(a, b):
        y = a @ b
        return y + y.t()  # the kernel needs y[n, m] at position (m, n): another tile's

    graph = check(fn, make(32, 40), make(40, 32, seed=1), **TOLERANCE)
    library_calls(graph, kernel_backend, fused=0, total=1)


def test_a_product_that_is_also_returned_is_not_fused(kernel_backend):
    def fn(a, b):
        y = a @ b
        return y, torch.tanh(y)

    graph = check(fn, make(32, 40), make(40, 32, seed=1), **TOLERANCE)
    library_calls(graph, kernel_backend, fused=0, total=1)


def test_large_products_stay_library_calls(kernel_backend):
    def fn(a, b):
        return torch.relu(a @ b)

    graph = check(fn, make(16, 1100), make(1100, 1000, seed=1), **TOLERANCE)
    library_calls(graph, kernel_backend, fused=0, total=1)


def test_an_operand_read_by_a_product_between_stays_alive_until_the_kernel(kernel_backend):
    # t's last library read (q) lies between the fused product and the kernel computing it:
    # t must live until that kernel, not be freed at q and its memory taken by u (Llama 4's
    # and Qwen2-MoE's backwards read freed memory so: a wrong answer, or a crash)
    def fn(x, w1, w2, c):
        t = torch.tanh(x) * 2
        p = t @ w1
        q = t.t() @ w2
        u = torch.sin(q) + 1
        v = torch.cos(u) @ w2.t()
        return torch.relu(p) * c + v.t()

    graph = check(fn, make(24, 32), make(32, 32, seed=1), make(24, 24, seed=2),
                  make(32, seed=3), **TOLERANCE)
    library_calls(graph, kernel_backend, fused=2, total=3)
