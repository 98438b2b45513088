"""Shared test machinery: compile a function with ember, run it beside eager, compare.

Every comparison also checks that ember really compiled the graph (a silent fallback to
eager would make any comparison pass) and, when asked, how many kernels it generated.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path

from ember import config
from ember.backends import backend, compile_graph
from ember.codegen.c import write_source
from ember.codegen.wrapper import write_wrapper
from ember.ir import Graph
from ember.lower import OutputSpec
from ember.runtime import disk_cache
from ember.runtime.build import build, kernel_function, load
from ember.runtime.compiled import CompiledGraph, make_function
from ember.runtime.interpreted import InterpretedGraph
from ember.schedule.fuse import schedule
from ember.schedule.layout import row_major

TOLERANCES = {
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float64: dict(rtol=1e-9, atol=1e-9),
}


class Recorder:
    """A torch.compile backend that compiles with ember and keeps what it made."""

    def __init__(self):
        self.compiled: list[Callable] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        result = backend(gm, example_inputs)
        self.compiled.append(result)
        return result


def compile_fn(fn: Callable, args: tuple, dynamo: bool = False) -> tuple[Callable, list]:
    """(callable, compiled graphs): through Dynamo, or straight from torch.fx.symbolic_trace."""
    if dynamo:
        torch._dynamo.reset()
        recorder = Recorder()
        return torch.compile(fn, backend=recorder, fullgraph=True, dynamic=False), \
            recorder.compiled
    compiled = compile_graph(torch.fx.symbolic_trace(fn), list(args))
    return compiled, [compiled]


class _Fallbacks(logging.Handler):
    """Collects what the `fallbacks` channel says, to explain a failed "ember compiled" check."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def watching_fallbacks() -> Iterator[_Fallbacks]:
    """Internal errors raise (instead of falling back) and fallback reasons are recorded."""
    handler = _Fallbacks()
    logger = logging.getLogger("ember.fallbacks")
    level = logger.level
    with config.override(logs=config.settings.logs | {"raise", "fallbacks"}):
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        try:
            yield handler
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)


def assert_close(actual: Any, expected: Any, **tolerance: Any) -> None:
    """Compare two results leaf by leaf; a failure names the leaf (its pytree path)."""
    flat_actual, _ = tree_flatten(actual)
    flat_expected, _ = tree_flatten_with_path(expected)
    assert len(flat_actual) == len(flat_expected), \
        f"{len(flat_actual)} results, eager gives {len(flat_expected)}"
    for got, (path, want) in zip(flat_actual, flat_expected):
        where = f"result{keystr(path)}"
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), f"{where}: expected a tensor, got {type(got)}"
            assert got.shape == want.shape, \
                f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
            assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
            options = dict(TOLERANCES.get(want.dtype, dict(rtol=0, atol=0)))
            options.update(tolerance)
            torch.testing.assert_close(got, want, equal_nan=True, **options,
                                       msg=lambda text, where=where: f"{where}: {text}")
        else:
            assert got == want, f"{where}: {got!r} != {want!r}"


def significant_strides(tensor: torch.Tensor) -> tuple[int | None, ...]:
    """Strides that decide where elements live: those of dims longer than 1 (of no dim at all
    when the tensor is empty). The stride of a size-1 dim is never used to address anything,
    and eager's CPU kernels and its meta kernels disagree on it (torch's own stride checks,
    torch._prims_common.check_significant_strides, ignore it too)."""
    if tensor.numel() == 0:
        return ()
    return tuple(s if n > 1 else None for n, s in zip(tensor.shape, tensor.stride()))


def sharing(outputs: Any, inputs: Any) -> set[tuple[int, int]]:
    """Which outputs share memory with which outputs or inputs: pairs (i, j) of positions in
    outputs + inputs, i an output. Aliasing is part of eager's contract (a write through one
    output is seen through the other)."""
    tensors = [t for t in tree_flatten(outputs)[0] + tree_flatten(inputs)[0]]
    outputs_count = len(tree_flatten(outputs)[0])
    pointers = [t.untyped_storage().data_ptr()
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() else None
                for t in tensors]
    return {(i, j) for i in range(outputs_count) for j in range(len(tensors))
            if i != j and pointers[i] is not None and pointers[i] == pointers[j]}


def check(fn: Callable, *args: Any, kernels: int | None = None, library: int | None = None,
          dynamo: bool = False, strides: bool = True, may_switch_to_eager: bool = False,
          **tolerance: Any) -> CompiledGraph:
    """Compile `fn`, run it and eager on copies of `args`, and compare results, strides and
    what happened to the arguments (in-place mutation). `kernels` and `library` are the exact
    numbers of generated kernels and of aten ops without a lowering rule left to run as
    library calls (all graphs; matmul and other library calls by design are not counted).
    `may_switch_to_eager` accepts a graph that its first call sent to eager (a library call
    returned a layout ember did not predict) — right answers, but no speed."""
    if DEVICE != "cpu":
        args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    with torch.no_grad(), watching_fallbacks() as fallbacks:
        compiled, graphs = compile_fn(fn, args, dynamo=dynamo)
        eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
        expected = fn(*eager_args)
        for _ in range(2):  # the first call runs the checked wrapper, the second the fast one
            got_args = copy.deepcopy(compiled_args)
            actual = compiled(*got_args)
            assert_close(actual, expected, **tolerance)
            assert_close(got_args, eager_args, **tolerance)
            assert sharing(actual, got_args) == sharing(expected, eager_args), \
                "outputs share memory with each other or the inputs unlike eager's"
            if strides:
                for got, (path, want) in zip(tree_flatten(actual)[0],
                                             tree_flatten_with_path(expected)[0]):
                    if isinstance(want, torch.Tensor):
                        assert significant_strides(got) == significant_strides(want), \
                            f"result{keystr(path)}: strides {got.stride()} != " \
                            f"eager's {want.stride()}"
    why = "; ".join(fallbacks.messages)
    assert graphs, "nothing was compiled"
    for graph in graphs:
        assert isinstance(graph, (CompiledGraph, InterpretedGraph)), \
            f"ember fell back to eager: {why}"
        if not may_switch_to_eager:
            assert not getattr(graph, "runs_eagerly", False), \
                f"{graph.label} switched to eager: {why}"
    if kernels is not None:
        assert sum(g.kernel_count for g in graphs) == kernels, \
            f"{[g.kernel_count for g in graphs]} kernels, expected {kernels}"
    if library is not None:
        assert sum(g.fallback_count for g in graphs) == library, \
            f"{[g.fallback_count for g in graphs]} calls of ops without a rule, expected " \
            f"{library}: {why}"
    return graphs[0] if len(graphs) == 1 else graphs


# -- inputs ---------------------------------------------------------------------------------
# Where the tensors tests make live: EMBER_TEST_DEVICE=cuda runs the suite on a GPU.
DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
FLOAT_SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 1.0, -1.0)
LAYOUTS = ("contiguous", "transposed", "strided", "expanded")


def make(*shape: int, dtype: torch.dtype = torch.float32, low: float | None = None,
         high: float | None = None, special: bool = False, seed: int = 0) -> torch.Tensor:
    """A deterministic random tensor; `special` plants NaN, ±inf, ±0 and halves at the front
    (float dtypes only)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return (torch.rand(shape, generator=generator, device="cpu") < 0.5).to(DEVICE)
    if dtype.is_floating_point:
        low = -3.0 if low is None else low
        high = 3.0 if high is None else high
        x = torch.rand(shape, generator=generator, dtype=torch.float64, device="cpu") * \
            (high - low) + low
        x = x.to(dtype)
        if special and x.numel():
            flat = x.view(-1)
            count = min(len(FLOAT_SPECIALS), flat.numel())
            flat[:count] = torch.tensor(FLOAT_SPECIALS[:count], dtype=dtype, device="cpu")
        return x.to(DEVICE)
    info = torch.iinfo(dtype)
    low = max(info.min, -20 if low is None else int(low))
    high = min(info.max, 20 if high is None else int(high))
    return torch.randint(low, high + 1, shape, generator=generator, dtype=dtype,
                         device="cpu").to(DEVICE)


def make_layout(layout: str, *shape: int, **options: Any) -> torch.Tensor:
    """A tensor of `shape` whose memory layout is `layout` (one of LAYOUTS): transposed (the
    last two dims swapped in memory), strided (every other element of a larger tensor, from an
    offset) or expanded (dim 0 broadcast from size 1)."""
    if layout == "contiguous" or not shape:
        return make(*shape, **options)
    if layout == "transposed":
        if len(shape) < 2:
            return make(*shape, **options).flip(0)
        swapped = (*shape[:-2], shape[-1], shape[-2])
        return make(*swapped, **options).transpose(-1, -2)
    if layout == "strided":
        wide = (*shape[:-1], 2 * shape[-1] + 1)
        return make(*wide, **options)[..., 1::2]
    if layout == "expanded":
        return make(1, *shape[1:], **options).expand(*shape)
    raise ValueError(f"unknown layout {layout!r}")


@contextlib.contextmanager
def captured_log(channel: str) -> Iterator[list[logging.LogRecord]]:
    """The records ember logs on `channel` inside the block (the channel switched on)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(f"ember.{channel}")
    handler = Collect()
    logger.addHandler(handler)
    try:
        with config.override(logs=config.settings.logs | {channel}):
            yield records
    finally:
        logger.removeHandler(handler)


def compile_ir(graph: Graph) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """Schedule, generate, build and wrap an IR graph built by hand: call(inputs) -> outputs
    (what the interpreter gives for the same graph is the answer to compare with)."""
    if not graph.output_strides:
        graph.output_strides = [row_major(node.shape) for node in graph.outputs]
    plan = schedule(graph)
    source, kernels = write_source(plan)
    functions = {}
    if kernels:
        library = load(build(source, ["-lmvec", "-lm"])[0])
        functions = {k.name: kernel_function(library, k.name, len(k.arguments), len(k.sizes))
                     for k in kernels}
    specs = [OutputSpec("node", index=i) for i in range(len(graph.outputs))]
    tree = tree_flatten(list(range(len(graph.outputs))))[1]
    wrapper = write_wrapper(plan, specs, tree, {k.name: k for k in kernels}, functions,
                            graph.device, checked=False)
    return make_function(wrapper, "<ember test wrapper>")


def check_grad(fn: Callable, *args: Any, dynamo: bool = False, seed: int = 0,
               **tolerance: Any) -> Any:
    """Compile `fn` for inputs that require grad (every float tensor argument) and compare with
    eager: the outputs, and the gradients of every float input under a fixed random cotangent
    of each float output. The graph must compile as a training graph (no eager fallback)."""
    from ember.runtime.training import TrainingGraph

    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)

    def leaves() -> tuple:
        return tuple(a.detach().clone().requires_grad_(a.dtype.is_floating_point)
                     if isinstance(a, torch.Tensor) else a for a in args)

    with watching_fallbacks() as fallbacks:
        eager_args, compiled_args = leaves(), leaves()
        compiled, graphs = compile_fn(fn, compiled_args, dynamo=dynamo)
        expected = fn(*eager_args)
        actual = compiled(*compiled_args)
        assert_close(actual, expected, **tolerance)
        outputs = [(got, want) for got, want in zip(tree_flatten(actual)[0],
                                                    tree_flatten(expected)[0])
                   if isinstance(want, torch.Tensor) and want.requires_grad]
        generator = torch.Generator().manual_seed(seed)
        cotangents = [torch.randn(want.shape, generator=generator, dtype=torch.float64,
                                   device="cpu")
                      .to(want.dtype).to(want.device) for _, want in outputs]
        inputs = [i for i, a in enumerate(args)
                  if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
        want_grads = torch.autograd.grad([w for _, w in outputs], [eager_args[i] for i in inputs],
                                         cotangents, allow_unused=True)
        got_grads = torch.autograd.grad([g for g, _ in outputs],
                                        [compiled_args[i] for i in inputs], cotangents,
                                        allow_unused=True)
    why = "; ".join(fallbacks.messages)
    for graph in graphs:
        assert isinstance(graph, TrainingGraph), f"not compiled for training: {why}"
    for position, got, want in zip(inputs, got_grads, want_grads):
        if want is None:
            assert got is None or not got.any(), f"input {position}: a gradient eager has not"
            continue
        assert got is not None, f"input {position}: no gradient (eager has one)"
        try:
            assert_close(got, want, **tolerance)
        except AssertionError as error:
            raise AssertionError(f"gradient of input {position}: {error}") from None
    return graphs[0] if len(graphs) == 1 else graphs


def rewrite_cache_record(entry: Path, change: Callable[[dict], Any]) -> None:
    """Change a kept cache record and write a digest that vouches for it (what only a foreign
    or damaged writer leaves: the digest alone cannot catch it)."""
    from ember.runtime import warm_records

    record = warm_records.loads(entry.read_bytes())
    change(record)
    data = warm_records.dumps(record)
    entry.write_bytes(data)
    entry.with_suffix(".digest").write_text(disk_cache.digest(entry.stem, data) + "\n")


def run_warm_program(project: Path, program: str, *argv: str, warm: str = "1") -> dict:
    """Run `project/program` (a user's script that prints `report <json>`) in a new process
    with ember on its path, the project's own disk cache beside it, warm start as `warm`
    says and the perf, fallbacks and recompiles channels on; its report, with what it said
    on stderr under "said"."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, PYTHONPATH=str(root),
                       EMBER_CACHE_DIR=str(project.parent / "cache"), EMBER_WARM_START=warm,
                       EMBER_LOGS="perf,fallbacks,recompiles")
    environment.pop("EMBER_BACKEND", None)
    done = subprocess.run([sys.executable, str(project / program), str(project), *argv],
                          capture_output=True, text=True, env=environment, timeout=300,
                          cwd=project.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.split("report ", 1)[1])
    report["said"] = done.stderr
    return report


def small_tiles(monkeypatch: Any, **more: Any) -> Any:
    """Triton's tiles and split thresholds scaled down (and `more` changed), so that the
    interpreter (Python per reduced pair in tl.reduce, per program) runs looped and split
    rows in seconds: the same paths as the GPU's tiles, at a few hundred elements a row.
    Returns the heuristics now in force."""
    from ember.codegen import triton_tiling

    scaled = dict(looped_rblock=64, split_min_row=256, split_target_programs=16,
                  split_max_parts=8, persistent_max=256)
    small = dataclasses.replace(triton_tiling.HEURISTICS, **{**scaled, **more})
    monkeypatch.setattr(triton_tiling, "HEURISTICS", small)
    return small
