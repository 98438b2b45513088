"""Ember's caller of generated C kernels (ember/runtime/c_launcher.py): a kernel called through
it does what its ctypes function does, argument for argument; where it does not serve,
ctypes does."""

from __future__ import annotations

import ctypes

import pytest
import torch

import ember
from ember import config
from ember.runtime import build, c_launcher

MANY = ", ".join(f"int64_t a{i}" for i in range(65))
SOURCE = """
#include <stdint.h>
int scale(float* restrict in, float* restrict out, int64_t n, int64_t factor) {
    for (int64_t i = 0; i < n; i++) out[i] = in[i] * (float)factor;
    return n > 100;
}
""" + f"int many({MANY}) {{ return (int)(a0 + a63 + a64); }}\n"


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    with config.override(cache_dir=tmp_path_factory.mktemp("cache")):
        path, _ = build.build(SOURCE, [])
        yield build.load(path)


def launcher_or_skip():
    module = c_launcher.launcher()
    if module is None:
        pytest.skip("the launcher cannot be built here (said on EMBER_LOGS=perf)")
    return module


def test_a_kernel_through_the_launcher_computes_what_ctypes_does(library):
    module = launcher_or_skip()
    for release in (False, True):
        kernel = build.kernel_function(library, "scale", 2, 2, release_gil=release)
        assert type(kernel) is module.Kernel and kernel.releases_gil is release
        assert kernel.__name__ == "scale" and kernel.arity == 4
        x = torch.arange(8, dtype=torch.float32)
        out = torch.zeros(8)
        assert kernel(x.data_ptr(), out.data_ptr(), 5, 3) == 0
        torch.testing.assert_close(out, torch.tensor([0., 3, 6, 9, 12, 0, 0, 0]))
        assert kernel(x.data_ptr(), out.data_ptr(), 0, 3) == 0
        big = torch.ones(200)
        assert kernel(big.data_ptr(), big.data_ptr(), 200, 2) == 1  # (the status comes back)
        torch.testing.assert_close(big, torch.full((200,), 2.0))


def test_a_kernel_refuses_what_ctypes_would_refuse(library):
    launcher_or_skip()
    kernel = build.kernel_function(library, "scale", 2, 2)
    x = torch.zeros(4)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        kernel(x.data_ptr(), x.data_ptr(), 4)
    with pytest.raises(TypeError, match="an int was expected"):
        kernel(x.data_ptr(), x.data_ptr(), 4, "2")
    with pytest.raises(TypeError, match="keyword"):
        kernel(x.data_ptr(), x.data_ptr(), 4, factor=2)
    assert kernel(None, None, 0, 1) == 0  # (NULL, as ctypes' c_void_p takes None)


def test_a_kernel_of_more_arguments_than_the_launcher_takes_stays_ctypes(library):
    module = launcher_or_skip()
    kernel = build.kernel_function(library, "many", 65)
    assert module.MAX_ARGUMENTS == 64 and isinstance(kernel, ctypes._CFuncPtr)
    assert kernel(*range(65)) == 63 + 64


def test_switched_off_kernels_are_ctypes_functions(library):
    with config.override(c_launcher=False):
        kernel = build.kernel_function(library, "scale", 2, 2)
    assert isinstance(kernel, ctypes._CFuncPtr)


def test_a_compiled_graph_calls_its_kernels_through_the_launcher():
    module = launcher_or_skip()

    def fn(x, y):
        return torch.tanh(x) * y + 1, (x - y).softmax(-1)

    x, y = torch.randn(16, 33), torch.randn(33)
    compiled = ember.compile(fn)
    for _ in range(3):  # (the first call may run eagerly while its kernels build)
        got = compiled(x, y)
    for a, b in zip(got, fn(x, y)):
        torch.testing.assert_close(a, b)
    graph = compiled.records[0].compiled
    kernels = [value for name, value in graph.fast.__globals__.items()
               if name.startswith("kernel")]
    assert kernels and all(type(k) is module.Kernel for k in kernels)
