"""ember.codegen.triton: the Triton text of a few kernels (golden files), the tile each kind of
kernel gets, split reductions, int64 indexing, and what such kernels compute (run by Triton's
interpreter on the CPU; tests/conftest.py sets TRITON_INTERPRET=1).

Goldens live in tests/codegen/golden/*.triton; after a deliberate change to the generated code,
regenerate them with EMBER_UPDATE_GOLDEN=1 and review the diff.
"""

import dataclasses
import math
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import check, make, small_tiles, watching_fallbacks

import ember
from ember import config
from ember.codegen.triton import KernelLaunches, render
from ember.codegen.triton_module import write_module
from ember.codegen.triton_rules import TANH_SPLIT
from ember.codegen.triton_tiling import HEURISTICS
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.expr import Expr, Var
from ember.schedule.fuse import schedule

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="these tests run kernels through Triton's interpreter")
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(autouse=True)
def _triton():
    with config.override(backend="triton"):
        yield


def launches(fn, *args) -> list[KernelLaunches]:
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    return write_module(schedule(run_passes(lowered.graph)))[1]


def kernel_text(fn, *args) -> str:
    """The kernels (without the shared prelude) that ember generates for fn(*args)."""
    return "\n\n".join(k.text for launch in launches(fn, *args) for k in launch.kernels) + "\n"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("EMBER_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden {path}: run with EMBER_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; EMBER_UPDATE_GOLDEN=1 rewrites it"


GOLDENS = {
    "pointwise.triton": (lambda x, y: torch.sigmoid(x * y + 1.5).to(torch.float16),
                         (make(4, 6), make(6, seed=1))),
    "softmax_rows.triton": (lambda x: F.softmax(x, -1), (make(4, 10),)),
    "sum_dim0.triton": (lambda x: x.sum(0), (make(5, 40),)),
}


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_kernel_text_is_golden(name):
    fn, args = GOLDENS[name]
    assert_golden(name, kernel_text(fn, *args))
    check(fn, *args, kernels=1)


def test_index_expressions_render_as_python():
    i, j = Var("x", 4), Var("r0", 1 << 40)
    assert render(Expr.of(i) * 3 + 2) == "(3 * x + 2)"
    assert render(Expr.of(i) * -1) == "-x"
    assert render((Expr.of(j) + 1) // 7) == "((r0 + 1) // 7)"


# -- tiles ----------------------------------------------------------------------------------
def test_pointwise_blocks_drop_the_mask_when_the_size_divides_the_block():
    (even,) = launches(lambda x: x * 2, make(64, 64))
    (odd,) = launches(lambda x: x * 2, make(63, 65))
    assert "XBLOCK: tl.constexpr = 1024" in even.kernels[0].text
    assert "mask" not in even.kernels[0].text
    assert "xmask = x < 4095" in odd.kernels[0].text
    assert even.kernels[0].grid == (4, 1, 1) and odd.kernels[0].grid == (4, 1, 1)
    # at least 8 bytes per thread per tensor: 1024 float32 values over 4 warps of 32
    assert even.kernels[0].num_warps * 32 * 2 <= 1024


def test_short_rows_are_persistent_long_rows_loop():
    (short,) = launches(lambda x: F.softmax(x, -1), make(64, 1000))
    (long,) = launches(lambda x: F.softmax(x, -1), make(600, HEURISTICS.persistent_max + 8))
    assert "for " not in short.kernels[0].text  # the row is loaded once and reused
    assert short.kernels[0].text.count("tl.load(") == 1
    # (the sum of exp(x - max) folds in the maximum's walk, then the stores)
    assert long.kernels[0].text.count("for r") == 2
    check(lambda x: F.softmax(x, -1), make(3, HEURISTICS.persistent_max + 8), kernels=1)


def test_reductions_over_a_strided_dim_tile_across_the_contiguous_one():
    (column,) = launches(lambda x: x.sum(0), make(300, 256))
    text = column.kernels[0].text
    assert f"XBLOCK: tl.constexpr = {HEURISTICS.column_xblock}" in text
    assert f"RBLOCK: tl.constexpr = {HEURISTICS.column_rblock}" in text


def test_column_sums_that_read_a_value_per_row_still_tile_across_the_columns():
    # a layer norm's parameter gradients read each row's mean and variance (one element a
    # row, contiguous along the reduced rows): the row-long operands they scale are what
    # the tile must read coalesced
    fn = lambda g, x, mean, var: (  # noqa: E731
        g.sum(0), (g * (x - mean[:, None]) * torch.rsqrt(var[:, None] + 1e-5)).sum(0))
    args = (make(512, 96), make(512, 96, seed=1), make(512, seed=2), make(512, seed=3).abs())
    (columns,) = launches(fn, *args)
    assert f"XBLOCK: tl.constexpr = {HEURISTICS.column_xblock}" in columns.kernels[0].text
    check(fn, *args)


def test_a_row_reduction_with_several_results_per_row_walks_the_rows():
    # a loss's log-softmax statistics: the max and the sum of each contiguous row, two
    # results per row. The results are one element a row: they do not vote for a tile
    # across rows (GPT-2's 2048 x 50257 logits were read 64 rows at a time, 32 floats of each)
    fn = lambda x: (x.amax(1), torch.logsumexp(x, 1))  # noqa: E731
    (rows,) = launches(fn, make(40, HEURISTICS.persistent_max + 8))
    text = rows.kernels[0].text
    assert "XBLOCK: tl.constexpr = 1\n" in text
    assert f"RBLOCK: tl.constexpr = {HEURISTICS.looped_rblock}" in text
    check(fn, make(3, HEURISTICS.persistent_max + 8))


def test_reductions_of_one_level_share_their_loop_over_the_row():
    # a layer norm's parameter gradients: two sums over the same rows, neither reading the
    # other, folded in one walk of the rows (each its own accumulator); a sum of the row
    # less its maximum reads the maximum: a second walk
    long = HEURISTICS.persistent_max + 8
    fn = lambda x, y: (x.sum(1), (x * y).sum(1), x.amax(1))  # noqa: E731
    (rows,) = launches(fn, make(3, long), make(3, long, seed=1))
    assert rows.kernels[0].text.count("for r") == 1
    check(fn, make(3, long), make(3, long, seed=1), kernels=1)
    columns = lambda g, xhat: (g.sum(0), (g * xhat).sum(0))  # noqa: E731
    (split,) = launches(columns, make(4096, 64), make(4096, 64, seed=1))
    assert [k.text.count("for r") for k in split.kernels] == [1, 0]
    check(columns, make(4096, 64), make(4096, 64, seed=1), kernels=1)
    spread = lambda x: (x.amax(1), (x - x.amax(1, keepdim=True)).abs().sum(1))  # noqa: E731
    (two,) = launches(spread, make(3, long))
    assert two.kernels[0].text.count("for r") == 2
    check(spread, make(3, long), kernels=1)


def test_a_variance_folds_in_its_mean_s_walk(monkeypatch):
    # the sum of (x - mean)**2 as Welford's running statistics beside the mean's sum: one
    # walk of a long row, one stage of a split one (a batch norm's statistics), the rows'
    # masked tails skipped; eager's values far from zero, at inf and NaN
    long = small_tiles(monkeypatch).persistent_max + 8
    moments = lambda x: (x.mean(1), x.var(1))  # noqa: E731
    (one,) = launches(moments, make(3, long))
    assert one.kernels[0].text.count("for r") == 1
    x = make(5, long) + 1000
    x[1, 3] = math.inf
    x[2, 5] = math.nan
    x[3] = 2.5  # (no spread: a zero variance)
    check(moments, x, kernels=1)
    check(lambda x: F.layer_norm(x, x.shape[-1:]), make(4, long + 3) * 3 - 7, kernels=1)
    (split,) = launches(_batch_norm, _IMAGE)
    assert [k.name for k in split.kernels] == ["kernel0_stage1", "kernel0"]


def _batch_norm(x):
    return F.batch_norm(x, None, None, training=True)


_IMAGE = make(7, 4, 41, 63) * 2 + 30  # (rows of 18081: split, tails masked)


@pytest.mark.slow
@pytest.mark.slow_in_interpreter  # (about a minute under the interpreter)
def test_a_split_batch_norm_s_welford_statistics_are_eager_s():
    check(_batch_norm, _IMAGE, kernels=1)


def test_split_reductions_combine_partial_results(monkeypatch):
    x = make(3 * small_tiles(monkeypatch).split_min_row + 5)
    (split,) = launches(lambda x: x.sum(), x)
    assert [k.name for k in split.kernels] == ["kernel0_stage1", "kernel0"]
    assert split.kernels[0].grid[1] > 1 and split.kernels[1].grid == (1, 1, 1)
    assert len(split.workspaces) == 1
    check(lambda x: (x.sum(), x.amax(), x.argmin(), x.mean()), x)


def test_a_split_reductions_last_chunk_stops_at_the_rows_end():
    # 288 rows in chunks of whole tiles whose count divides none near the aim: the last
    # chunk reaches past the end. Those rows hold NaN here (the tensor is a view of a longer
    # one): read, they would turn the sums NaN (ViT-B/16's bias gradients over 32 x 197
    # rows, on CUDA)
    longer = make(320, 64)
    longer[288:] = float("nan")
    x = longer[:288]
    (split,) = launches(lambda x: x.sum(0), x)
    chunk = int(re.search(r"chunk = tl.program_id\(1\) \* (\d+)", split.kernels[0].text)[1])
    assert split.kernels[0].grid[1] * chunk > 288 and "r0_mask" in split.kernels[0].text
    check(lambda x: (x.sum(0), x.amax(0), x.mean(0)), x)


def test_split_reductions_run_one_stage_per_dependent_level(monkeypatch):
    # the sum of the rows less their maximum reads the maximum: a second pass over the rows;
    # the values are stored by the finishing kernel, one program per chunk
    x = make(2, 2 * small_tiles(monkeypatch).split_min_row + 3)
    fn = lambda x: x / (x - x.amax(1, keepdim=True)).abs().sum(1, keepdim=True)  # noqa: E731
    (split,) = launches(fn, x)
    assert [k.name for k in split.kernels] == ["kernel0_stage1", "kernel0_stage2", "kernel0"]
    assert split.kernels[-1].grid[1] == split.kernels[0].grid[1]
    check(fn, x, kernels=1)


def test_a_gathering_stage_finishes_each_row_once_for_the_stages_after_it(monkeypatch):
    # a later stage that runs a program per chunk loads each row's finished reductions, not
    # every chunk's partials (where that would read more than gather_stage_bytes): a stage
    # of their own finishes them, one program per row block; booleans and positions too
    x = make(2, 2 * small_tiles(monkeypatch, gather_stage_bytes=0).split_min_row + 3)
    x[1, 7] = 9.0
    fn = lambda x: x / (x - x.amax(1, keepdim=True)).abs().sum(1, keepdim=True)  # noqa: E731
    (split,) = launches(fn, x)
    assert [k.name for k in split.kernels] == ["kernel0_stage1", "kernel0_gather1",
                                               "kernel0_stage2", "kernel0_gather2", "kernel0"]
    assert [k.grid[1] for k in split.kernels][1::2] == [1, 1]
    check(fn, x, kernels=1)
    marks = lambda x: x * (x > 3).any(1, keepdim=True) + x.argmax(1, keepdim=True)  # noqa: E731
    (split,) = launches(marks, x)
    assert [k.name for k in split.kernels] == ["kernel0_stage1", "kernel0_gather1", "kernel0"]
    check(marks, x, kernels=1)


def test_offsets_past_two_to_the_31_index_in_int64():
    huge = torch.empty(3, 2 ** 30, device="meta")
    (wide,) = launches(lambda x: x * 2, huge)
    (narrow,) = launches(lambda x: x * 2, torch.empty(3, 2 ** 20, device="meta"))
    assert "tl.program_id(0).to(tl.int64)" in wide.kernels[0].text
    assert "int64" not in narrow.kernels[0].text


# -- what the kernels compute -------------------------------------------------------------
def test_ops_tl_math_cannot_build_run_as_library_calls():
    fn = lambda x: (torch.asin(x * 0.5) + 1, torch.atan2(x, x + 1), torch.erfc(x))  # noqa: E731
    graph = check(fn, make(4, 5, special=True), library=0)
    assert graph.library_count == 3


def _compiled_within_ulps(op, x: torch.Tensor, ulps: int) -> dict[torch.dtype, torch.Tensor]:
    """op compiled by ember over x in float32 and float64, within `ulps` of op in float64
    (relative to the result); the results by dtype."""
    results = {}
    for dtype in (torch.float32, torch.float64):
        value = x.to(dtype)
        got = check(lambda x: op(x), value).fast([value])
        want = op(value.double())
        ulp = torch.finfo(dtype).eps * want.abs().clamp_min(torch.finfo(dtype).tiny)
        assert float(((got.double() - want).abs() / ulp).max()) <= ulps, dtype
        results[dtype] = got
    return results


def test_tanh_within_a_few_ulps_everywhere():
    x = torch.cat([torch.linspace(-12, 12, 20001), torch.linspace(-0.6, 0.6, 20001),
                   torch.tensor([TANH_SPLIT, -TANH_SPLIT, 1e-30, -1e-30, 0.0, math.inf])])
    _compiled_within_ulps(torch.tanh, x, 4)


def test_erf_within_two_ulps_everywhere():
    # (float32: CUDA erff's polynomials, both evaluated, one selected; float64: tl.math.erf)
    from ember.codegen.triton_rules import ERF_SPLIT

    x = torch.cat([torch.linspace(-5, 5, 40001), torch.linspace(-1.1, 1.1, 20001),
                   torch.tensor([ERF_SPLIT, -ERF_SPLIT, 1e-30, -1e-30, 1e-40, 0.0, -0.0,
                                 math.inf, -math.inf, 3e38])])
    for got in _compiled_within_ulps(torch.erf, x, 2).values():
        assert torch.equal(torch.signbit(got[-5:-3]), torch.tensor([False, True]))  # ±0
    nan = torch.tensor([math.nan])
    assert torch.isnan(check(lambda x: torch.erf(x), nan).fast([nan])).all()


def test_an_index_out_of_range_raises():
    graph = check(lambda table, i: table[i], make(5, 3), torch.tensor([0, 4, 2]))
    # (the kernel's check fails; the error raised is eager's, naming index, dimension, size)
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 5"):
        graph(make(5, 3), torch.tensor([0, 5, 2]))


def test_swapping_the_module_heuristics_changes_the_tiles(monkeypatch):
    # (what python -m ember.bench.gpu --tune does between compiles)

    from ember.codegen import triton_tiling as codegen

    monkeypatch.setattr(codegen, "HEURISTICS",
                        dataclasses.replace(codegen.HEURISTICS, pointwise_block=256))
    (pointwise,) = launches(lambda x: x * 2, make(4096))
    assert "XBLOCK: tl.constexpr = 256" in pointwise.kernels[0].text


def test_long_pointwise_chains_hold_four_elements_per_thread_on_more_warps():
    # (S2's 20 erf-gelus are compute-bound: 1024 elements on 8 warps beat 8 per thread on the
    # H200 and compile in half the time; a short chain keeps 8 per thread)
    def chain(x):
        for _ in range(20):
            x = F.gelu(x * 1.01 + 0.01)
        return x

    (long,) = launches(chain, make(8192))
    (short,) = launches(lambda x: x * 2 + 1, make(8192))
    assert "XBLOCK: tl.constexpr = 1024" in long.kernels[0].text
    assert (long.kernels[0].num_warps, short.kernels[0].num_warps) == (8, 4)
    check(chain, make(8192), kernels=1)


def test_a_channels_last_result_is_walked_in_its_memory_order():
    """Consecutive x write consecutive addresses: a channels_last result is walked N, H, W, C
    (in NCHW order the 32 lanes of a warp would touch 32 lines); values checked in e2e."""
    x = make(2, 8, 6, 5).contiguous(memory_format=torch.channels_last)
    y = make(2, 8, 6, 5)
    text = kernel_text(lambda a, b: torch.relu(a * 2 + b), x, y)
    assert "tl.load(p_in0 + x," in text and "tl.store(p_out0 + x," in text
    assert "240 * (x // 240)" in text  # (the contiguous input is the one read across)
    same_order = kernel_text(lambda a: a * 2, make(2, 8, 6, 5))
    assert "tl.load(p_in0 + x," in same_order and "tl.store(p_out0 + x," in same_order


def test_a_sum_of_exp_less_the_row_maximum_folds_in_the_maximum_s_walk(monkeypatch):
    # a loss's or a softmax's statistics over long rows: the running sum rescaled as the
    # maximum grows, one walk of the row instead of two; eager's values at -inf, inf and NaN
    long = small_tiles(monkeypatch, split_min_row=1 << 20).persistent_max + 8  # (walked)
    lse = lambda x: torch.logsumexp(x, 1)  # noqa: E731
    stats = lambda x: (x.amax(1), (x - x.amax(1, keepdim=True)).exp().sum(1))  # noqa: E731
    for fn in (lse, stats, lambda x: F.log_softmax(x, 1), lambda x: F.softmax(x, 1)):
        x = make(6, long)
        x[1, :100] = -math.inf  # (-inf before the row's finite maximum)
        x[2] = -math.inf  # (eager: NaN)
        x[3, 7] = math.inf
        x[4, 9] = math.nan
        x[5, long // 2:] += 40  # (the maximum grows late: the sum rescaled)
        check(fn, x, kernels=None)
    (one,) = launches(stats, make(3, long))
    assert one.kernels[0].text.count("for r") == 1
    # (other pairs keep their own walks: a maximum and a sum of something else)
    (two,) = launches(lambda x: (x.amax(1), (x - x.amax(1, keepdim=True)).sum(1)),
                      make(3, long))
    assert two.kernels[0].text.count("for r") == 2


@pytest.mark.slow
@pytest.mark.slow_in_interpreter  # (over two minutes under the interpreter)
def test_a_batch_norm_over_rows_of_symbolic_length_folds_its_variance():
    # (a symbolic row may be as long as any: split, each chunk's length computed per call,
    # the chunks' statistics combined whatever their counts)
    fn = lambda x: F.relu(F.batch_norm(x, None, None, training=True))  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    with watching_fallbacks() as fallbacks:
        for batch in (3, 5, 9):
            x = (make(batch, 4, 37, 29) * 3 + 100).to(memory_format=torch.channels_last)
            torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-4)
    assert fallbacks.messages == []
