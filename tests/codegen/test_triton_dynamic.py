"""Triton kernels over symbolic sizes (issue 18, stage 4), run by Triton's interpreter on the
CPU: the kernels take the graph's symbols as int arguments, mask every tail whose length a
symbol decides, and have their grids computed per call; each kind of kernel is compared with
eager at several sizes (not multiples of the tile, 1, and rows long enough to split) with
exact counts of builds (one Triton module per compile, said on EMBER_LOGS=kernels)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import small_tiles
from torch import nn

import ember
from ember import config
from ember.codegen import wrapper
from ember.codegen.triton_module import write_module
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="these tests run kernels through Triton's interpreter")


@pytest.fixture(autouse=True)
def _triton():
    with config.override(backend="triton"):
        yield


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def symbolic_launches(fn, x, **mark):
    """The Triton kernels ember writes for fn(x) with dim 0 of x a symbol."""
    found = []

    def keep(gm, example_inputs):
        found.append((gm, example_inputs))
        return gm.forward

    keep.serves_any_shape = True
    ember.mark_dynamic(x, 0, **mark)
    ember.compile(fn, backend=keep)(x)
    gm, example_inputs = found[0]
    lowered = trace(gm, example_inputs, symbolic=True)
    return write_module(schedule(run_passes(lowered.graph)))[1]


def texts(launches) -> str:
    return "\n\n".join(k.text for launch in launches for k in launch.kernels)


def s1(x):
    return 0.5 * x * (1 + torch.tanh(0.8 * (x + 0.04 * x ** 3)))


# -- the kernels' text ----------------------------------------------------------------------
def test_a_pointwise_kernel_takes_its_size_and_masks_the_tail():
    (launch,) = symbolic_launches(s1, t(4, 6))
    (kernel,) = launch.kernels
    assert "def kernel0(p_in0, p_out0, s0):" in kernel.text
    assert kernel.sizes == ["s0"] and kernel.signature["s0"] == "i32"
    assert "xmask = x < 6*s0" in kernel.text
    assert kernel.grid == ("((6*s0 + 1023) // 1024)", 1, 1)


def test_a_symbolic_extent_the_block_divides_needs_no_mask():
    (launch,) = symbolic_launches(s1, t(4, 1024))
    (kernel,) = launch.kernels
    assert "mask" not in kernel.text and kernel.grid == ("s0", 1, 1)


def test_a_row_of_symbolic_length_loops_with_a_masked_tail():
    # (one row, which may be long: split into chunks, each looped over, the tail masked)
    (launch,) = symbolic_launches(lambda x: F.softmax(x, 0), t(40))
    *partials, final = launch.kernels
    assert len(partials) == 2  # the max, then the sum of exponentials
    assert "for r0_offset in range(0, chunk_length, RBLOCK):" in partials[0].text
    assert "r0_mask = r0 < s0" in partials[0].text
    assert "for r" in final.text and "mask=r" in final.text  # (the stores, row by row)


def test_a_row_bounded_by_its_mark_is_held_whole():
    (launch,) = symbolic_launches(lambda x: F.softmax(x, 0), t(40), max=500)
    text = texts([launch])
    assert "for " not in text and "RBLOCK: tl.constexpr = 512" in text
    assert "rmask = r < s0" in text


def test_a_long_symbolic_row_splits_into_chunks_sized_per_call():
    (launch,) = symbolic_launches(lambda x: x.sum(), t(4, 768))
    first, final = launch.kernels
    assert first.grid[1] > 1 and final.grid == (1, 1, 1)
    assert "chunk_length = ((768*s0 + " in first.text
    assert "for r0_offset in range(0, chunk_length, RBLOCK):" in first.text
    assert "r0_mask = r0 < 768*s0" in first.text


# -- what they compute, and how often they are built ------------------------------------------
CASES = {
    # name: (function, example of width w (batch b first), sizes of the symbolic dim 0,
    #        builds: one per key met, with the small tiles below: the class of the symbolic
    #        rows' lengths (64, 128, 256, or longer ones walked in steps) and, where the
    #        kernels of those rows hold 4096 elements or more, the symbol's divisibility)
    "pointwise": (s1, lambda b: t(b, 24, seed=b), [2, 3, 1000], 1),
    "softmax_rows": (lambda x: F.softmax(x, -1), lambda b: t(b, 48, seed=b), [2, 5, 130], 1),
    "layer_norm": (nn.LayerNorm(32), lambda b: t(b, 32, seed=b), [2, 9, 70], 1),
    "softmax_symbolic_row": (lambda x: F.softmax(x, 0), lambda b: t(b, seed=b),
                             [3, 1000, 5000], 3),  # 64; walked; walked, 8 | 5000
    "sum_dim0_split": (lambda x: x.sum(0), lambda b: t(b, 40, seed=b), [2, 33, 3000],
                       2),  # 64, 64; walked, 8 | 3000
    "argmax_dim0_split": (lambda x: (x.argmax(0), x.amax(0), x.argmin(0)),
                          lambda b: t(b, 6, seed=b), [2, 7, 3000], 2),
    "mean_var_dim0": (lambda x: (x.mean(0), x.var(0)), lambda b: t(b, 40, seed=b),
                      [2, 33, 3000], 2),
    "sum_all_split": (lambda x: (x.sum(), x.amax()), lambda b: t(b, 64, seed=b),
                      [2, 37, 1500], 3),  # 128; walked; walked, 4 | 1500
    "walked_rows_multiple_of_16": (lambda x: F.softmax(x, 0), lambda b: t(b, seed=b),
                                   [1000, 5000, 4096, 2000], 3),  # (1000 and 2000: too few
    # elements for their divisibility to count; 8 | 5000, 16 | 4096)
    "linear_tanh": (nn.Sequential(nn.Linear(16, 32), nn.Tanh()), lambda b: t(b, 16, seed=b),
                    [2, 17, 40], 1),
    "mlp": (nn.Sequential(nn.Linear(24, 32), nn.GELU(), nn.Linear(32, 8)),
            lambda b: t(b, 24, seed=b), [2, 5, 33], 1),
}


# (var's Welford combine runs in Python per pair of a 64 x 64 tile under the interpreter:
# 25 s a call at any size; CI's slice of the slow tests, the GPU's run and -m slow run it)
SLOW = {"mean_var_dim0"}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.slow, pytest.mark.slow_in_interpreter]
                 if name in SLOW else []) for name in sorted(CASES)])
def test_one_build_serves_every_size_of_a_class(name, builds, monkeypatch):
    small_tiles(monkeypatch, aligned_elements=4096)
    fn, make, sizes, count = CASES[name]
    compiled = ember.compile(fn)
    with torch.no_grad():
        for b in sizes:
            x = make(b)
            ember.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-4)
    forward = getattr(compiled, "_compiled_forward", compiled)
    assert len(forward.records) == 1 and forward.entries[0].captured.symbolic
    assert len(builds()) == count, builds()


def test_rows_of_symbolic_length_are_held_whole_per_class(builds):
    # softmax over a symbolic row: each build holds rows of one power-of-two class whole
    # (as the static kernel would), made on the first call of that class; the first build is
    # the first call's
    fn = lambda x: F.softmax(x, -1) * 2  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    for n in [20, 30, 17, 25, 300, 260, 32, 20]:
        x = t(3, n, seed=n)
        torch.testing.assert_close(compiled(x), fn(x))
    made = builds()
    # (64: the shortest class; 512; too few elements for the divisibility to count)
    assert len(compiled.records) == 1 and len(made) == 2, made
    graph = compiled.records[0].compiled
    assert "row_key = (row_class(s1), ((min(s1 & -s1, 16),) if s0*s1 >= 1048576 else " \
        "(1,)))\n    if row_key != (64, (1,)): return rows(row_key, args)" in \
        graph.wrapper_source, graph.wrapper_source
    texts = [Path(sys.modules[line.rsplit("(", 1)[1].rstrip(")")].__file__).read_text()
             .split("\ndef kernel0(")[1] for line in made]
    for text, rblock in zip(texts, (64, 512)):
        assert "for " not in text and f"RBLOCK: tl.constexpr = {rblock}\n" in text
        assert "rmask = r < s1" in text


def test_size_one_is_an_entry_of_its_own(builds):
    fn = lambda x: F.softmax(x, -1) * 2  # noqa: E731
    compiled = ember.compile(fn)
    for b in [3, 1, 17, 1, 2]:
        x = t(b, 20, seed=b)
        ember.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(compiled.records) == 2 and len(builds()) == 2, builds()


def test_automatic_dynamic_on_triton_builds_twice(builds):
    compiled = ember.compile(s1)
    for b in range(2, 14):
        x = t(b, 16, seed=b)
        torch.testing.assert_close(compiled(x), s1(x))
    assert len(compiled.records) == 2 and len(builds()) == 2, builds()


def test_torch_compile_dynamic_true_on_triton_builds_once(builds):
    model = nn.Sequential(nn.Linear(16, 16), nn.Softmax(-1))
    compiled = torch.compile(model, backend="ember", dynamic=True)
    with torch.no_grad():
        for b in [3, 4, 9, 30]:
            x = t(b, 16, seed=b)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(builds()) == 1, builds()


@pytest.mark.slow  # (20-30 s of Triton's interpreter; a CI slice)
def test_calls_whose_offsets_may_pass_int32_run_the_int64_build(builds, monkeypatch):
    # the limit lowered so that small calls cross it: the same graph, int64 indices, built on
    # the first call that needs it
    monkeypatch.setattr(wrapper, "INT32_SAFE", 3000)
    fn = lambda x: (x.sum(0), torch.exp(x) * 2)  # noqa: E731
    compiled = ember.compile(fn)
    for b in [2, 40, 3, 60]:  # (the reach: the input, the outputs, the iteration spaces)
        x = t(b, 24, seed=b)
        ember.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), fn(x))
    made = builds()
    assert len(made) == 2 and len(compiled.records) == 1, made
    graph = compiled.records[0].compiled
    assert "return wide(args)" in graph.wrapper_source
    narrow, wide = (sys.modules[line.rsplit("(", 1)[1].rstrip(")")] for line in made)
    assert "int64" not in Path(narrow.__file__).read_text()
    assert "tl.program_id(0).to(tl.int64)" in Path(wide.__file__).read_text()
    assert "s0: i64" in Path(wide.__file__).read_text()


# -- the GPU's launch path, without a GPU ---------------------------------------------------
class _Launcher:
    """Stands in for a compiled kernel's C launcher: records each launch."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self):
        self.calls = []

    def launch(self, gx, gy, gz, stream, *rest):
        self.calls.append(((gx, gy, gz), rest[-3:]))


@pytest.mark.parametrize("compiling", [False, True], ids=["compiled", "still_compiling"])
def test_compiled_kernels_are_launched_on_grids_computed_per_call(compiling):
    # the wrapper a CUDA graph gets, run on CPU tensors with the launcher stood in for;
    # `compiling`: a first run's wrapper, written while the kernels still compiled
    import concurrent.futures
    from types import SimpleNamespace

    from ember.runtime.compiled import make_function
    from ember.runtime.triton_launch import DeviceLaunch, PendingLaunch

    found = []

    def keep(gm, example_inputs):
        found.append((gm, example_inputs))
        return gm.forward

    keep.serves_any_shape = True
    x = t(4, 6)
    ember.mark_dynamic(x, 0)
    ember.compile(s1, backend=keep)(x)
    lowered = trace(*found[0], symbolic=True)
    plan = schedule(run_passes(lowered.graph))
    _, launches = write_module(plan)
    launcher = _Launcher()
    compiled = SimpleNamespace(run=launcher, function=None, packed_metadata=None)
    functions = {k.name: DeviceLaunch(compiled, k.grid) for ls in launches for k in ls.kernels}
    if compiling:
        loaded = {name: concurrent.futures.Future() for name in functions}
        for name, launch in functions.items():
            loaded[name].set_result(launch)
        functions = {name: PendingLaunch(loaded[name], launch.grid)
                     for name, launch in functions.items()}
    source = wrapper.write_wrapper(plan, lowered.outputs, lowered.output_tree,
                                   {launch.name: launch for launch in launches}, functions,
                                   torch.device("cuda", 0), checked=False,
                                   check_alignment=False, check_reach=True)
    # (the reach: the input's and the output's spans, and the iteration space)
    assert "if 18*s0 >= 1073741824: return wide(args)" in source.text, source.text
    source.namespace.update(current_stream=lambda index: 7, current_device=lambda: 0,
                            plain_empty=lambda size, stride, dtype: torch.empty_strided(
                                size, stride, dtype=dtype),
                            wide=lambda args: "wide")
    call = make_function(source, "<test wrapper>")
    for rows in (5, 1000):
        x = t(rows, 6)
        (out,) = call([x])
        assert out.shape == (rows, 6)
        grid, arguments = launcher.calls[-1]
        assert grid == (-(-6 * rows // 1024), 1, 1) and arguments[-1] == rows
        assert arguments[0] is x
    # (sizes whose offsets may pass int32: the int64 build; an expanded row costs no memory)
    assert call([torch.zeros(1, 6).expand(2 ** 30 // 18 + 1, 6)]) == "wide"
    assert len(launcher.calls) == 2


# -- the compiler, not only the interpreter --------------------------------------------------
COMPILE_SCRIPT = r'''
import json, torch, triton, ember
from torch import nn
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ember import config
from ember.codegen.triton_module import write_module
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.runtime import triton_launch
from ember.schedule.fuse import schedule

cases = [(lambda x: 0.5 * x * (1 + torch.tanh(x)), torch.randn(4, 6)),
         (lambda x: (x.mean(0), x.var(0), x.argmax(0)), torch.randn(5, 40)),
         (lambda x: torch.softmax(x, 0), torch.randn(40))]
compiled = []
for wide in (False, True):
    for fn, x in cases:
        found = []
        def keep(gm, example_inputs):
            found.append((gm, example_inputs))
            return gm.forward
        keep.serves_any_shape = True
        ember.mark_dynamic(x, 0)
        ember.compile(fn, backend=keep)(x)
        with config.override(backend="triton"):
            lowered = trace(*found[0], symbolic=True)
            text, launches = write_module(schedule(run_passes(lowered.graph)), wide=wide)
        module = triton_launch.load_module(text)
        for kernel in (k for launch in launches for k in launch.kernels):
            source = ASTSource(getattr(module, kernel.name), kernel.signature, {}, {})
            binary = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": kernel.num_warps})
            compiled.append([kernel.name, sorted(kernel.signature.items()),
                             len(binary.asm["cubin"])])
print(json.dumps(compiled))
'''


def test_symbolic_kernels_compile_for_the_gpu():
    # Triton's compiler (no GPU needed up to the cubin) on what the interpreter runs above:
    # run-time scalars as loop bounds, chunk lengths and fill values, i32 and i64 sizes
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True,
                         text=True, env=env, timeout=600)
    if "nvidia" in run.stderr and "No such file" in run.stderr:
        pytest.skip("this Triton has no CUDA backend")
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = json.loads(run.stdout.strip().splitlines()[-1])
    # (the splits: the moments' one stage, the variance folded in the mean's walk as
    # Welford's statistics, and its finish; the softmax's two stages and its finish)
    assert len(compiled) == 2 * (1 + 2 + 3)
    assert all(size > 0 for _, _, size in compiled)
    signatures = [dict(signature) for _, signature, _ in compiled]
    assert [s["s0"] for s in signatures] == ["i32"] * 6 + ["i64"] * 6


def test_another_class_s_build_takes_the_graph_s_constants_once(builds):
    # (a constant tensor is an extra argument the compiled graph's wrapper appends; the
    # build for another row class is handed the arguments with it)
    fn = lambda x: F.softmax(x, -1) * torch.tensor(2.0)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    for n in (20, 300, 20):
        x = t(3, n, seed=n)
        torch.testing.assert_close(compiled(x), fn(x))
    graph = compiled.records[0].compiled
    assert len(builds()) == 2 and not graph.runs_eagerly, builds()
    assert "args = (*args, extra" in graph.wrapper_source


def test_the_first_build_without_a_calls_sizes_is_the_guess():
    # (each symbol at its guess, GUESS or within its range: the rows' and the kernels' sizes)
    from ember.codegen.triton_sizes import RowClasses
    from ember.ir.sizes import GUESS, symbol

    rows, n = symbol("s0"), symbol("s1", 2, 100)
    classes = RowClasses.of([(n, rows * n), (None, rows)])
    assert classes.names() == {"s0", "s1"}
    assert classes.guessed() == classes.key({"s0": GUESS, "s1": 100}) == (128, (1,))
    assert classes.key({"s0": 2 ** 14, "s1": 96}) == (128, (16,))  # (2^20 elements: aligned)
