"""Triton reductions at sizes that make the tiling loop over a row or split it into chunks,
against eager (forward values and gradients), run by Triton's interpreter.

The sizes sit just past the thresholds of ember/codegen/triton_tiling.py (HEURISTICS): rows
longer than `persistent_max` are looped in `looped_rblock` steps; rows of at least
`split_min_row` elements with fewer than `split_target_programs` programs are split into
chunks whose last one reaches past the row's end (the mask `reach > rnumel` in
triton_reductions.open_row); reductions over a strided dim tile `column_xblock` columns by
`column_rblock` rows. Most sizes are no multiple of a tile (every tile has a masked edge);
two are whole tiles in chunks that overrun. Every input is the front of a longer tensor
whose rest is NaN, so a read past the reduced extent shows. Each case first checks that the
tiling is the one it is named for, so a change of the heuristics cannot quietly turn the
sweep into one of persistent rows.

CI runs the sums at the two overrunning split sizes and one looped row, and the max-like
reductions (amax, argmax, softmax: a tl.reduce with ember's NaN-propagating combine, seconds
to a minute per case under the interpreter) at one shape each; `pytest -m slow` runs them all
(8 to 16 minutes on 2 cores).
"""

import os

import pytest
import torch
import torch.nn.functional as F
from helpers import check, check_grad, make

from ember import config
from ember.codegen.triton_module import write_module
from ember.codegen.triton_tiling import HEURISTICS
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="these tests run kernels through Triton's interpreter")

H = HEURISTICS
LOOPED_ROW = H.persistent_max + 8        # past the longest persistent row, not a multiple of
SPLIT_ROW = H.split_min_row + 16         # the looped RBLOCK; long enough to be split
SPLIT_COLUMN = 2 * H.split_min_row // H.column_xblock + 44  # column tiles split (556 rows)
# whole tiles, but chunks that reach past the row's end (the split reductions' bug: no mask,
# as no tile is partial): 9 RBLOCKs of 2048 in 5 chunks of 4096; 9 column tiles in 5 chunks
# of 2 (no chunk count near the aim divides 9). One row, and one tile of 32 columns (its
# edge masked; 576 x 32 elements, just enough to split): the interpreter's time is the
# programs' and their tiles'.
WHOLE_TILES_ROW = 9 * H.looped_rblock
WHOLE_TILES_COLUMN = 9 * H.column_rblock

# (shape, reduced dim, the tiling its reductions get)
CASES = {
    "rows_persistent": ((5, 1000), -1, "persistent"),
    "rows_looped": ((3, LOOPED_ROW), -1, "looped"),
    "rows_split": ((3, SPLIT_ROW), -1, "split"),
    "rows_split_in_whole_tiles": ((1, WHOLE_TILES_ROW), -1, "split"),
    "columns_persistent": ((20, 70), 0, "persistent"),
    "columns_looped": ((100, 70), 0, "looped"),
    "columns_split": ((SPLIT_COLUMN, 70), 0, "split"),
    "columns_split_in_whole_tiles": ((WHOLE_TILES_COLUMN, 30), 0, "split"),
    "narrow_columns_split": ((SPLIT_ROW, 3), 0, "split"),
    "middle_looped": ((3, 100, 40), 1, "looped"),
    "middle_split": ((3, SPLIT_COLUMN, 40), 1, "split"),
    "narrow_middle_looped": ((2, LOOPED_ROW, 3), 1, "looped"),
}
# The cases CI runs: the sums at the splits whose chunks overrun the row (rows and columns),
# the others once each (the six split sums took 240 s of the suite's 24 minutes on 2 cores,
# 2026-12-06; by 2026-12-07 the looped sum 13 s more, its row is the other families', and
# the looped extremes 17 s, tests/codegen/test_triton.py's argmax and amax cases beside them;
# CI's slice of the slow cases runs some of the rest).
IN_CI = {"sums": {"rows_split_in_whole_tiles", "columns_split_in_whole_tiles"},
         "sum_gradients": {"rows_looped"},
         "extremes": set(), "normalizations": {"rows_looped"}}
# the tolerances of a sum of ~16,000 float32 terms in another order (eager's gradients of
# log_softmax differ from float64's by as much as ember's do)
LONG = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def _triton():
    with config.override(backend="triton"):
        yield


def tilings(fn, x: torch.Tensor) -> set[str]:
    """How the kernels of fn(x) that reduce are tiled."""
    lowered = trace(torch.fx.symbolic_trace(fn), [x])
    found = set()
    for launch in write_module(schedule(run_passes(lowered.graph)))[1]:
        text = launch.kernels[0].text
        if len(launch.kernels) > 1:
            found.add("split")
        elif "for r" in text:
            found.add("looped")
        elif "RBLOCK" in text:
            found.add("persistent")
    return found


def sums(dim):
    return lambda x: (x.sum(dim), x.mean(dim), x.var(dim))


def extremes(dim):
    return lambda x: (x.amax(dim), x.amin(dim), x.argmax(dim))


def normalizations(dim):
    if dim == -1:
        return lambda x: (F.softmax(x, dim), F.log_softmax(x, dim),
                          F.layer_norm(x, x.shape[-1:]))
    return lambda x: (F.softmax(x, dim), F.log_softmax(x, dim))


def beyond_nan(shape: tuple[int, ...], dim: int, seed: int = 0) -> torch.Tensor:
    """make(*shape), as the front of a tensor longer along `dim` whose rest is NaN: a kernel
    that reads past the reduced extent turns its results NaN."""
    longer = list(shape)
    longer[dim] += shape[dim] // 2 + 64
    x = make(*longer, seed=seed)
    x.narrow(dim, shape[dim], longer[dim] - shape[dim]).fill_(float("nan"))
    return x.narrow(dim, 0, shape[dim])


def cases(family: str):
    """The cases' parameters; those outside IN_CI[family] are slow, and skipped by CI (minutes
    each under the interpreter: tests/conftest.py, slow_in_interpreter)."""
    slow = [pytest.mark.slow, pytest.mark.slow_in_interpreter]
    return [pytest.param(shape, dim, tiling, id=name,
                         marks=[] if name in IN_CI[family] else slow)
            for name, (shape, dim, tiling) in CASES.items()]


@pytest.mark.parametrize(("shape", "dim", "tiling"), cases("sums"))
def test_sums_match_eager(shape, dim, tiling):
    x = beyond_nan(shape, dim)
    assert tilings(sums(dim), x) == {tiling}
    check(sums(dim), x, **LONG)


@pytest.mark.parametrize(("shape", "dim", "tiling"), cases("sum_gradients"))
def test_sum_gradients_match_eager(shape, dim, tiling):
    check_grad(sums(dim), beyond_nan(shape, dim), **LONG)


@pytest.mark.parametrize(("shape", "dim", "tiling"), cases("extremes"))
def test_extremes_match_eager(shape, dim, tiling):
    # (ties broken as eager's argmax breaks them: the first; planted at both ends of a row)
    x = beyond_nan(shape, dim)
    x.select(dim, 0).fill_(5.0)
    x.select(dim, -1).fill_(5.0)
    assert tilings(extremes(dim), x) == {tiling}
    check(extremes(dim), x)
    check_grad(lambda x: extremes(dim)(x)[:2], make(*shape))


@pytest.mark.parametrize(("shape", "dim", "tiling"), cases("normalizations"))
def test_normalizations_match_eager(shape, dim, tiling):
    x = beyond_nan(shape, dim)
    assert tiling in tilings(normalizations(dim), x)
    check(normalizations(dim), x, **LONG)
    check_grad(normalizations(dim), x, **LONG)
