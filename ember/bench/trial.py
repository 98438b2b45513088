"""One measurement in a fresh interpreter: imports, build, first call, steady state, check.

harness.run_trial starts this file as a script (`python -P trial.py ...`, empty compiler caches),
so that importing torch and ember can be timed apart from the first call. It prints progress
lines on stdout and writes what it measured as JSON to --result; it reports errors, never raises.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import traceback
from pathlib import Path
from typing import Any


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--size", default="full")
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--timing", type=json.loads, default=None,
                        help="keyword arguments of harness.benchmark; absent: no steady state")
    parser.add_argument("--check", action="store_true", help="compare outputs with eager")
    return parser.parse_args(argv)


def progress(text: str) -> None:
    print(text, flush=True)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def measure(options: argparse.Namespace, result: dict[str, Any]) -> None:
    result["stage"] = "import"
    progress("importing torch")
    start = time.perf_counter()
    import torch
    import torch._dynamo  # noqa: F401  (every compiled variant needs it; not its first call)
    result["import_torch_s"] = time.perf_counter() - start
    start = time.perf_counter()
    import ember  # noqa: F401  (registers the backend)
    result["import_ember_s"] = time.perf_counter() - start

    from ember import logs
    from ember.bench import harness, variants, workloads

    fallbacks = _Collect()
    logs.channel("fallbacks").addHandler(fallbacks)
    result["stage"] = "build"
    progress("building the workload")
    workload = workloads.resolve(options.workload)
    start = time.perf_counter()
    fn, args = workload.instantiate(options.size)
    result["build_s"] = time.perf_counter() - start
    result["description"] = workloads.describe(fn, args)

    with torch.set_grad_enabled(workload.grad):
        runnable, compiles = variants.prepare(options.variant, fn, workload)
        sync = harness.device_sync(fn, *args)
        result["stage"] = "first call"
        progress("first call" + ("" if options.variant == "eager" else " (capture + compile)"))
        start = time.perf_counter()
        first = runnable(*args)
        sync()
        result["first_call_s"] = time.perf_counter() - start
        first = _detached(first)
        result["stage"] = "second call"
        start = time.perf_counter()
        second = runnable(*args)
        sync()
        result["second_call_s"] = time.perf_counter() - start
        second = _detached(second)
        if options.timing is not None:
            result["stage"] = "steady state"
            progress("timing the steady state")
            result["steady"] = harness.benchmark(runnable, *args, **options.timing).to_json()
        if options.check:
            result["stage"] = "check"
            progress("checking against eager")
            reference, reference_args = workload.instantiate(options.size)
            expected = [_detached(reference(*reference_args)) for _ in range(2)]
            result["check"] = compare([first, second], expected, workload.tolerance)
    result["graphs"], result["kernels"] = compiles.graphs, compiles.kernels
    result["fallbacks"] = fallbacks.messages
    if compiles.eager_graphs:
        result["fallbacks"].insert(
            0, f"{compiles.eager_graphs} of {compiles.graphs} graphs ran eagerly")
    del result["stage"]


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
            lines = [line for line in str(error).splitlines() if line.strip()]
            return dict(ok=False, message=f"output {position}: " + " ".join(lines[:4]),
                        max_abs_error=worst)
    return dict(ok=True, message="matches eager", max_abs_error=worst)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    result: dict[str, Any] = dict(workload=options.workload, variant=options.variant,
                                  size=options.size)
    status = 0
    try:
        measure(options, result)
    except Exception as error:
        stage = result.pop("stage", "?")
        last = traceback.extract_tb(error.__traceback__)[-1]
        result["error"] = (f"{stage} failed: {type(error).__name__}: {error} "
                           f"({Path(last.filename).name}:{last.lineno})")
        traceback.print_exc()
        status = 1
    options.result.write_text(json.dumps(result))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
