"""python -m ember.bench.vectorization: gcc's word on which simd loops of a kernels.c stayed
scalar, one entry per such loop, none for the loops it vectorized."""

import shutil

import pytest

from ember.bench.vectorization import scalar_loops

SOURCE = """#include <stdint.h>
extern float opaque(float);
int kernel0(float* restrict a_in0, float* restrict a_out0) {
    #pragma omp simd
    for (int64_t i0 = 0; i0 < 1024; i0++) {
        a_out0[i0] = a_in0[i0] * 2.0f;
    }
    return 0;
}

int kernel1(float* restrict a_in0, float* restrict a_out0) {
    #pragma omp simd
    for (int64_t i0 = 0; i0 < 1024; i0++) {
        a_out0[i0] = opaque(a_in0[i0]);
    }
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc's vectorizer report")
def test_only_the_loop_gcc_left_scalar_is_listed(tmp_path, monkeypatch):
    from ember import config

    source = tmp_path / "kernels.c"
    source.write_text(SOURCE)
    with config.override(cc="gcc"):
        loops = scalar_loops(source)
    assert [(loop.line, loop.kernel.split("(")[0]) for loop in loops] == [(13, "int kernel1")]
    assert loops[0].reasons and not loops[0].unprofitable
