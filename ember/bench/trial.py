"""A fresh interpreter's measurements: timed imports, then per workload (each with empty
compiler caches) build, first call, steady state and check. harness.run_trials runs this file as
a script; progress goes to stdout as `workload<TAB>text`, results to --result as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", nargs="+", required=True)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--size", default="full")
    parser.add_argument("--cache-root", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--timing", type=json.loads, default=None,
                        help="keyword arguments of harness.benchmark; absent: no steady state")
    parser.add_argument("--check", action="store_true", help="compare outputs with eager")
    parser.add_argument("--device", default=None, help="for builders that take one (the zoo's)")
    return parser.parse_args(argv)


class Reporter:
    """Progress lines for the parent on the real stdout. Everything else written to stdout
    (the user's prints, a compiler's chatter) goes to stderr, which the parent keeps as a log."""

    def __init__(self) -> None:
        self.stream: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.workload = "-"

    def __call__(self, text: str) -> None:
        self.stream.write(f"{self.workload}\t{text}\n")


class _Collect(logging.Handler):
    """What ran eagerly (info and warnings; the debug lines name library calls, which are
    compiled code's own calls, not fallbacks)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# torch's CPU functions that MKL's vector math computes (aten/src/ATen/cpu/vml.h's
# IMPLEMENT_VML_MKL list), for float32 and float64
MKL_VECTOR_MATH = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log",
                   "log10", "log2", "sin", "sqrt", "tan", "tanh", "trunc")


def settle_vector_math() -> None:
    """Call each of torch's MKL vector-math functions once, on this thread alone (8 elements:
    below torch's parallel grain), before any workload runs.
    NOTE: a process's first call of such a function that torch splits over OpenMP threads
    (a 64 x 64 tanh: 2048 elements a thread) computed the worker thread's part, in about one
    fresh process in 40 here, with an error near 5e-5 instead of an ulp (torch 2.13, MKL
    2024.2: a race in MKL's first-call set-up; a first call on one thread avoids it). The
    check compares the first calls' outputs with eager's made later: S1 run eagerly, as ember
    runs it without a C compiler, was then 111 elements off eager's own later answer."""
    import torch

    for dtype in (torch.float32, torch.float64):
        x = torch.full((8,), 0.5, dtype=dtype)
        for name in MKL_VECTOR_MATH:
            getattr(torch, name)(x)


def cold_caches(root: Path, workload: str) -> Path:
    """Point every compiler's disk cache at a folder of this workload's own: empty on a first
    run, warm when a later run is given the same root."""
    folder = root / re.sub(r"[^A-Za-z0-9_.-]", "_", workload)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    os.environ["EMBER_CACHE_DIR"] = str(folder / "ember")
    return folder / "ember"


def measure(name: str, options: argparse.Namespace, result: dict[str, Any],
            progress: Reporter) -> None:
    import torch

    from ember import config, logs
    from ember.bench import roofline, variants, workloads

    torch.compiler.reset()
    fallbacks = _Collect()
    logs.channel("fallbacks").addHandler(fallbacks)
    compiles = variants.Compiles()
    workload = None
    try:
        with config.override(cache_dir=cold_caches(options.cache_root, name)):
            result["stage"] = "build"
            progress("building the workload")
            workload = workloads.resolve(name)
            start = time.perf_counter()
            fn, args = workload.instantiate(options.size, options.device)
            result["build_s"] = time.perf_counter() - start
            result["description"] = workloads.describe(fn, args)
            result["tokens_per_call"] = getattr(fn, "tokens", None)
            with torch.set_grad_enabled(workload.grad):
                runnable, compiles = variants.prepare(options.variant, fn, workload)
                outputs = run_measured(runnable, args, options, result, progress)
                if options.variant == "eager" and not workload.compile_model:
                    # the work a call does, for the roofline (of the seeds: a model's step
                    # is no single roofline point)
                    progress("counting bytes and flops")
                    work = roofline.count_work(runnable, args)
                    result["work"] = {"bytes": work.bytes, "flops": work.flops}
            if options.check:
                result["stage"] = "check"
                progress("checking against eager")
                reference, reference_args = workload.instantiate(options.size, options.device)
                with torch.set_grad_enabled(workload.grad):
                    expected = [_detached(reference(*reference_args)) for _ in outputs]
                result["check"] = compare(outputs, expected,
                                          workload.tolerance_at(options.size, options.device))
                if not result["check"]["ok"] and workload.compile_model:
                    progress("judging by float64")
                    float64_judge(result["check"], workload, options, outputs, expected)
        result["graphs"], result["kernels"] = compiles.graphs, compiles.kernels
        del result["stage"]
    finally:
        logs.channel("fallbacks").removeHandler(fallbacks)
        ran_eagerly = [f"{compiles.eager_graphs} of {compiles.graphs} graphs ran eagerly"]
        result["fallbacks"] = (ran_eagerly if compiles.eager_graphs else []) + fallbacks.messages
        if workload is not None and workload.compile_model and options.variant == "ember":
            progress("explaining the capture")
            result["capture"] = explain_capture(workload, options.size, options.device)


def explain_capture(workload: Any, size: str, device: str | None
                    ) -> list[dict[str, Any]] | str:
    """ember.explain on a fresh instance's model calls (zoo.explain_capture): after the timed
    calls, so that it warms nothing they measure; also after a failure, to say where the
    capture broke. A failure of its own is returned as its message."""
    from ember.bench import zoo

    try:
        step, _ = workload.instantiate(size, device)
        return zoo.explain_capture(step)
    except Exception as error:
        traceback.print_exc()
        return _failure(error, "explain")


def run_measured(runnable: Any, args: tuple[Any, ...], options: argparse.Namespace,
                 result: dict[str, Any], progress: Reporter) -> list[Any]:
    """The first and second calls, timed one by one, then the steady state; gives their
    outputs and, for ember, that of a call after its background compiles (the first calls
    may run eagerly while kernels compile; then the checked wrapper, then the fast one)."""
    from ember.bench import harness

    sync = harness.device_sync(runnable, *args)
    outputs = []
    began = time.perf_counter()
    for stage in ("first call", "second call"):
        result["stage"] = stage
        if stage == "first call":
            progress("first call" + ("" if options.variant == "eager" else
                                     " (capture + compile)"))
        start = time.perf_counter()
        output = runnable(*args)
        sync()
        result[stage.replace(" ", "_") + "_s"] = time.perf_counter() - start
        outputs.append(_detached(output))
    if options.variant.startswith("ember"):
        # (compiles run on beside its first calls, which meanwhile run eagerly: a call
        # after them is checked too, the compiled code's answer)
        from ember.backends import wait_for_background_compiles

        wait_for_background_compiles()
        outputs.append(_detached(runnable(*args)))
        sync()  # (the first compiled run included: its library calls' first uses)
        result["compiled_after_s"] = time.perf_counter() - began
    if options.timing is not None:
        result["stage"] = "steady state"
        progress("timing the steady state")
        result["steady"] = harness.benchmark(runnable, *args, **options.timing).to_json()
    return outputs


def _detached(value: Any) -> Any:
    """A copy that later calls cannot change (outputs may alias state the function updates)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=str) for leaf in _leaves(value[key])]
    return [value]


def compare(actual: Any, expected: Any, tolerance: dict[str, float]) -> dict[str, Any]:
    """{"ok", "message", "max_abs_error"}: `actual` against eager's `expected`, leaf by leaf,
    with torch.testing.assert_close at the workload's tolerance."""
    import torch

    got, want = _leaves(actual), _leaves(expected)
    if len(got) != len(want):
        return dict(ok=False, message=f"{len(got)} outputs, eager gives {len(want)}",
                    max_abs_error=None)
    worst = 0.0
    for position, (a, e) in enumerate(zip(got, want)):
        if not isinstance(e, torch.Tensor):
            if a != e:
                return dict(ok=False, message=f"output {position}: {a!r} != eager's {e!r}",
                            max_abs_error=None)
            continue
        if isinstance(a, torch.Tensor) and a.shape == e.shape and e.numel():
            if e.dtype.is_floating_point or e.dtype.is_complex:
                difference = (a.double() - e.double()).abs().nan_to_num(nan=0.0)
                worst = max(worst, float(difference.max()))
        try:
            torch.testing.assert_close(a, e, equal_nan=True, **tolerance)
        except AssertionError as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return dict(ok=False, message=f"output {position}: " + " ".join(lines[:4]),
                        max_abs_error=worst)
    return dict(ok=True, message="matches eager", max_abs_error=worst)


def float64_judge(check: dict[str, Any], workload: Any, options: Any, outputs: list[Any],
                  expected: list[Any]) -> None:
    """Where a model's answer differs from eager's past the tolerance, float64 judges: the
    same model and inputs in float64, called as often. A random model can be ill-conditioned
    enough (MobileNetV3's bf16 logits on the H200: torch.compile's check failed as well) that
    rounding alone moves its answer; the compiled one passes where it is no farther from
    float64's than eager's is (twice, plus the tolerance). `check` gains both errors."""
    import torch

    try:
        reference, arguments = workload.instantiate(options.size, options.device)
        model = getattr(reference, "model", None)
        if model is None:
            return
        model.double()

        def wide(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value.double()
            if isinstance(value, (list, tuple)):
                return type(value)(wide(v) for v in value)
            if isinstance(value, dict):
                return {k: wide(v) for k, v in value.items()}
            return value

        arguments = wide(arguments)
        with torch.set_grad_enabled(workload.grad):
            exact = [_detached(reference(*arguments)) for _ in outputs]
    except Exception as error:  # noqa: BLE001 (the judge is an extra: say why it could not)
        check["float64"] = f"no float64 answer: {type(error).__name__}: {error}"[:200]
        return

    def error(answer: list[Any]) -> float:
        worst = 0.0
        for a, e in zip(_leaves(answer), _leaves(exact)):
            if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and \
                    a.shape == e.shape and e.is_floating_point() and e.numel():
                worst = max(worst, float((a.double() - e).abs().nan_to_num(nan=0.0).max()))
        return worst

    tolerance = workload.tolerance_at(options.size, options.device).get("atol", 0.0)
    compiled_error, eager_error = error(outputs), error(expected)
    check.update(compiled_error_vs_float64=compiled_error, eager_error_vs_float64=eager_error)
    if compiled_error <= 2 * eager_error + tolerance:
        check["ok"] = True
        check["message"] = (f"float64 judges: as close to its answer as eager ({compiled_error:.2g}"
                            f" against eager's {eager_error:.2g}); eager's own check: "
                            + check["message"])


def _failure(error: BaseException, stage: str) -> str:
    last = traceback.extract_tb(error.__traceback__)[-1]
    return (f"{stage} failed: {type(error).__name__}: {error} "
            f"({Path(last.filename).name}:{last.lineno})")


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    progress = Reporter()  # "-": the imports belong to no workload (nor to its time limit)
    cold_caches(options.cache_root, options.workloads[0])  # before torch reads the variables
    progress("importing torch")
    start = time.perf_counter()
    import torch
    import torch._dynamo  # noqa: F401  (every compiled variant needs it: not its first call)
    imports = {"import_torch_s": time.perf_counter() - start}
    start = time.perf_counter()
    import ember  # noqa: F401  (registers the backend)
    imports["import_ember_s"] = time.perf_counter() - start
    from ember.bench.harness import Trial

    settle_vector_math()  # (after the imports' clock, before any workload's)
    status = 0
    with open(options.result, "a") as results:
        for order, name in enumerate(options.workloads):
            progress.workload = name
            result: dict[str, Any] = dict(workload=name, variant=options.variant,
                                          size=options.size, process_order=order)
            if order == 0:
                result.update(imports)
            try:
                measure(name, options, result, progress)
            except Exception as error:
                result["error"] = _failure(error, result.pop("stage", "setup"))
                traceback.print_exc()
                status = 1
            result["threads"] = torch.get_num_threads()
            results.write(json.dumps(result) + "\n")
            results.flush()
            progress("done: " + Trial.from_json(result).summary())
    return status


if __name__ == "__main__":
    raise SystemExit(main())
