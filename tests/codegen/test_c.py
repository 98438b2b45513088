"""ember.codegen.c: the C text of a few kernels (golden files) and what such kernels compute.

Goldens live in tests/codegen/golden/; after a deliberate change to the generated code,
regenerate them with EMBER_UPDATE_GOLDEN=1 and review the diff.
"""

import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import check

from ember import config
from ember.codegen.c import render, write_source
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.expr import Expr, Var
from ember.schedule.fuse import schedule

GOLDEN = Path(__file__).parent / "golden"


def kernel_text(fn, *args) -> str:
    """The kernels (without the shared prelude) that ember generates for fn(*args)."""
    with config.override(parallel_threshold=32768):
        lowered = trace(torch.fx.symbolic_trace(fn), list(args))
        plan = schedule(run_passes(lowered.graph))
        _, kernels = write_source(plan)
    return "\n\n".join(kernel.text for kernel in kernels) + "\n"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("EMBER_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden {path}: run with EMBER_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; EMBER_UPDATE_GOLDEN=1 rewrites it"


GOLDENS = {
    "pointwise.c": (lambda x, y: torch.sigmoid(x * y + 1.5).to(torch.float16),
                    (torch.randn(4, 6), torch.randn(6))),
    "softmax_rows.c": (lambda x: F.softmax(x, -1), (torch.randn(4, 10),)),
    "sum_dim0.c": (lambda x: x.sum(0), (torch.randn(5, 12),)),
}


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_kernel_text_is_golden(name):
    fn, args = GOLDENS[name]
    assert_golden(name, kernel_text(fn, *args))
    check(fn, *args, kernels=1)


def test_the_source_file_holds_the_prelude_vector_math_and_every_kernel():
    lowered = trace(torch.fx.symbolic_trace(lambda x: (x.exp().sum(1).t(), x + 1)),
                    [torch.randn(3, 4, 5)])
    plan = schedule(run_passes(lowered.graph))
    source, kernels = write_source(plan)
    assert source.startswith("#include <math.h>")
    assert "#pragma omp declare simd notinbranch\nfloat expf(float);" in source
    assert [k.name for k in kernels] == [f"kernel{i}" for i in range(len(kernels))]
    for kernel in kernels:
        assert f"int {kernel.name}(" in source


def test_large_kernels_run_in_parallel():
    lowered = trace(torch.fx.symbolic_trace(lambda x: torch.tanh(x) * 2), [torch.randn(50, 40)])
    plan = schedule(run_passes(lowered.graph))
    with config.override(parallel_threshold=1000):
        parallel = write_source(plan)[0]
    with config.override(parallel_threshold=10 ** 9):
        serial = write_source(plan)[0]
    assert "#pragma omp parallel for" in parallel and "#pragma omp parallel" not in serial


def test_index_expressions_render_as_c():
    i, j = Var("i0", 4), Var("j1", 1 << 40)
    assert render(Expr.of(i) * 3 + 2) == "(3*i0 + 2)"
    assert render(Expr.of(i) * -1) == "-i0"
    assert render((Expr.of(j) + 1) // 7) == "((j1 + 1) / 7)"
    assert render(Expr.of(j) * (1 << 33)) == "INT64_C(8589934592)*j1"


@pytest.mark.parametrize("length", [4097, 10240], ids=["ragged", "whole_blocks"])
def test_a_long_row_sum_adds_float_blocks_into_a_double_total(length):
    # (a double accumulator in the vector loop halved its lanes: a vocabulary's log-sum-exp
    # ran 1.6x slower; blocks of 1024 in float, folded in double, keep eager's accuracy)
    def fn(x):
        return torch.logsumexp(x, dim=-1), x.sum(-1)

    x = torch.randn(6, length, generator=torch.Generator().manual_seed(0)) + 100.0
    text = kernel_text(fn, x)
    assert len(re.findall(r"float acc\w*_block = 0;", text)) == 2 and "double acc" in text
    check(fn, x, rtol=1e-6, atol=1e-6)
    short = kernel_text(fn, torch.randn(6, 1000))
    assert "_block" not in short and "double" not in short


def test_a_channels_last_kernel_walks_memory_in_order():
    """A per-channel scale and shift of a channels-last image (batch norm in eval): the loops
    run over positions, then channels, so the vectorized loop reads and writes consecutive
    floats (in NCHW order it would stride by the channel count)."""
    def fn(x, scale, shift):
        return torch.relu(x * scale[:, None, None] + shift[:, None, None])

    x = torch.randn(2, 8, 5, 6).to(memory_format=torch.channels_last)
    args = (x, torch.randn(8), torch.randn(8))
    text = kernel_text(fn, *args)
    assert "for (int64_t i0 = 0; i0 < 60; i0++)" in text  # (n, h, w): one loop
    assert "for (int64_t i1 = 0; i1 < 8; i1++)" in text   # c, innermost
    assert "[(8*i0 + i1)]" in text
    check(fn, *args, kernels=1)


def test_a_costly_per_channel_value_is_computed_once_per_channel():
    """A batch norm in eval over a channels-last image: its scale, w / sqrt(var + eps), is
    one value per channel, and the channel loop is the innermost: it is computed into a table
    before the loops (a square root and a division per pixel otherwise), the pixel loop
    reads the table; answers eager's."""
    def fn(x, mean, var, w, b):
        return torch.relu(F.batch_norm(x, mean, var, w, b, training=False))

    x = torch.randn(2, 8, 5, 6).to(memory_format=torch.channels_last)
    args = (x, torch.randn(8), torch.rand(8) + 0.5, torch.randn(8), torch.randn(8))
    text = kernel_text(fn, *args)
    tables = re.findall(r"float (t\d+)\[8\];", text)
    assert tables
    loops = text.index("for (int64_t i0 = 0; i0 < 60; i0++)")
    assert "sqrtf(" in text and text.rindex("sqrtf(") < loops
    assert all(f"{table}[i1]" in text[loops:] for table in tables)
    check(fn, *args, kernels=1)


def test_a_cheap_or_row_major_per_channel_value_is_not_tabled():
    # (a multiply and an add per pixel cost what a table's load does; in NCHW order the
    # channel loop is outside the pixels', where the value is computed once anyway)
    def cheap(x, scale, shift):
        return torch.relu(x * scale[:, None, None] + shift[:, None, None])

    def costly(x, scale):
        return x / scale[:, None, None].exp()

    image = torch.randn(2, 8, 5, 6)
    assert "[8];" not in kernel_text(cheap, image.to(memory_format=torch.channels_last),
                                     torch.randn(8), torch.randn(8))
    text = kernel_text(costly, image, torch.randn(8))
    assert "[8];" not in text and "expf(" in text
    check(costly, image, torch.randn(8), kernels=1)


def test_a_layer_norm_across_a_row_major_image_s_channels_tables_its_statistics():
    """ConvNeXt's layer norm over the channels of a row-major image (permuted channels-last):
    its reductions walk the image along its pixels (column mode, the lanes contiguous, the
    channels' stride ignored where only the weights stream along them), and the mean and
    1 / sqrt(var + eps) of each pixel are computed once into tables of the block's lanes:
    the variance's loop and the normalizing loop over the channels read the one mean table;
    answers eager's."""
    def fn(x, w, b):
        return F.layer_norm(x.permute(0, 2, 3, 1), x.shape[1:2], w, b)

    args = (torch.randn(2, 48, 8, 8), torch.randn(48), torch.randn(48))
    text = kernel_text(fn, *args)
    assert "lanes" in text
    tables = re.findall(r"float (t\d+)\[\d+\];", text)
    assert len(tables) == 2
    last = text.rindex("for (int64_t j")
    assert "sqrtf(" in text and text.rindex("sqrtf(") < last
    assert all(f"{table}[l" in text[last:] for table in tables)
    # (the mean's table: filled, read by the variance's loop and by the normalizing loop)
    assert sorted(text.count(f"{table}[l") for table in tables) == [2, 3]
    check(fn, *args, kernels=1)


def test_a_pad_along_the_vectorized_loop_cuts_the_loop_where_its_test_changes():
    """A pad along the innermost dim (as a split's or a narrow's gradient reads its piece):
    the loop over that dim is cut at the pad's edges and each piece reads with the test
    written as the constant it is there. Under the test a load is conditional, and gcc
    vectorized no loop whose conditional load fed a vector math call or was strided."""
    def fn(x):
        return torch.erf(F.pad(x, (3, 5))) * 2

    x = torch.randn(8, 37)
    text = kernel_text(fn, x)
    for first, end in ((0, 3), (3, 40), (40, 45)):
        assert f"for (int64_t i1 = {first}; i1 < {end}; i1++)" in text, text
    assert ">= 0 &&" not in text, text  # (no test left in any piece)
    check(fn, x, kernels=1)


def test_a_load_sixteen_or_more_elements_apart_from_lane_to_lane_is_a_gather():
    """A transposed operand read along its rows: its lanes lie 64 floats apart. gcc 12
    leaves a simd loop holding such a load scalar from 16 floats apart (8 apart it vectorizes
    the load itself); through an index it cannot take for affine, it gathers. A load 2 apart
    stays as it is."""
    def transposed(x, y):
        return torch.sin(x.t()) * y

    x, y = torch.randn(20, 64), torch.randn(64, 20)  # (the result laid out as y)
    text = kernel_text(transposed, x, y)
    assert "ember_gathered(" in text, text
    check(transposed, x, y, kernels=1)

    def every_other(x):
        return torch.sin(x[:, ::2]) + 1

    text = kernel_text(every_other, x)
    assert "ember_gathered(" not in text, text
    check(every_other, x, kernels=1)


def test_a_cat_along_the_vectorized_loop_cuts_the_loop_at_its_pieces():
    """RoPE's rotate_half, a cat of the two halves of the innermost dim: each half of the loop
    reads its piece with no select and no clamp left to the compiler (its bounds are the
    piece's), so its loads are contiguous; one loop over both gathered through the clamps."""
    def rope(q, cos, sin):
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin

    q, cos, sin = torch.randn(2, 3, 5, 64), torch.randn(5, 64), torch.randn(5, 64)
    text = kernel_text(rope, q, cos, sin)
    for first, end in ((0, 32), (32, 64)):
        assert f"for (int64_t i3 = {first}; i3 < {end}; i3++)" in text, text
    assert "(i3 < 32)" not in text, text
    check(rope, q, cos, sin, kernels=1)
