"""Static against dynamic kernels (issue 18, stage 4), checked and timed on one device.

1. Steady state: each workload compiled by ember per shape (dynamic=False) and once for a
   family of shapes (one dim marked dynamic, first compiled at another size so that nothing
   of the timed size is baked in), timed in alternation; each result is also compared with
   eager's. The table says which form the dynamic compile took: "symbolic" (one build serves
   every size) or "per shape" with the reason (what the symbolic path does not cover; a
   symbolic row length, whose rows' stride is a symbol, is symbolic on both backends).
2. A shape sweep: a small MLP block called once at each of N sequence lengths, first calls
   included, total wall time: eager, ember (default: automatic dynamic), ember dynamic=True,
   torch.compile(dynamic=True).

    python -m ember.bench.dynamic_triton --device cuda            # the H200 run
    python -m ember.bench.dynamic_triton --device cpu --quick     # C kernels, tiny sizes
    TRITON_INTERPRET=1 python -m ember.bench.dynamic_triton --device cpu --backend triton --quick

Every variant runs in its own try: a failure is a row of the table, never the end of the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.bench.harness import benchmark, device_sync
from ember.bench.workloads import gelu_ish, softmax_last


@dataclasses.dataclass
class Row:
    workload: str
    shape: str
    symbolic: str      # which dim is marked dynamic
    form: str = ""     # what the dynamic compile became
    static_us: float | None = None
    dynamic_us: float | None = None
    error: str = ""    # a failure, or values that differ from eager's
    static_device_us: float | None = None   # the device's busy time per call (CUDA)
    dynamic_device_us: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.static_us and self.dynamic_us:
            return self.dynamic_us / self.static_us
        return None


def form_of(compiled: Any) -> str:
    """What ember made of a dynamic compile: "symbolic" or "per shape (reason)"."""
    forward = getattr(compiled, "_compiled_forward", compiled)
    records = getattr(forward, "records", [])
    if not records:
        return "not compiled"
    graph = records[0].compiled
    reason = getattr(graph, "reason", None)
    if type(graph).__name__ == "ShapeSpecialized":
        return f"per shape ({reason})"
    if reason:
        return f"eager ({reason})"
    return "symbolic" if forward.entries[0].captured.symbolic else "static"


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}"


def steady_row(name: str, function: Callable, shape: tuple[int, ...], dim: int,
               device: str, rounds: int, min_time: float) -> Row:
    row = Row(name, "x".join(map(str, shape)), f"dim {dim}")
    try:
        x = torch.randn(*shape, device=device)
        other_shape = list(shape)
        other_shape[dim] += 3
        other = torch.randn(*other_shape, device=device)
        static = ember.compile(function, dynamic=False)
        dynamic = ember.compile(function)
        ember.mark_dynamic(other, dim)
        dynamic(other)
        expected = function(x)
        for compiled in (static, dynamic):
            torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
        row.form = form_of(dynamic)
        times: dict[str, list[float]] = {"static": [], "dynamic": []}
        for _ in range(rounds):
            for label, compiled in (("static", static), ("dynamic", dynamic)):
                timing = benchmark(compiled, x, repeat=5, min_time=min_time)
                times[label].append(timing.median)
        row.static_us = statistics.median(times["static"]) * 1e6
        row.dynamic_us = statistics.median(times["dynamic"]) * 1e6
        if device == "cuda":
            row.static_device_us = device_us(static, x)
            row.dynamic_device_us = device_us(dynamic, x)
    except Exception as error:  # noqa: BLE001 (a row of the table, not the end of the run)
        row.error = _short(error)
        traceback.print_exc()
    return row


def device_us(compiled: Callable, x: torch.Tensor, calls: int = 50) -> float:
    """The device's busy time per call (kernels and copies): what a call costs the GPU,
    apart from the host's wrapper and the launch latency."""
    from ember.bench.gpu import device_kernels

    return sum(time for time, _, _ in device_kernels(compiled, (x,), calls)) / calls


def mlp_block(width: int, device: str) -> Callable:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                torch.nn.Linear(2 * width, width)).to(device)

    def block(x: torch.Tensor) -> torch.Tensor:
        return F.softmax(model(x) + x, -1)

    return block


def sweep(lengths: list[int], width: int, device: str, variants: list[str]) -> list[dict]:
    """Total seconds of one call at each length (first calls, compiles included)."""
    block = mlp_block(width, device)
    inputs = [torch.randn(n, width, device=device) for n in lengths]
    with torch.no_grad():
        expected = [block(x) for x in inputs]
    results = []
    for variant in variants:
        result: dict[str, Any] = {"variant": variant}
        try:
            if variant == "torch.compile dynamic=True":
                torch._dynamo.reset()
                compiled = torch.compile(block, dynamic=True)
            elif variant == "eager":
                compiled = block
            elif variant in ("ember", "ember dynamic=True"):
                compiled = ember.compile(block, dynamic=True if "True" in variant else None)
            else:
                raise ValueError(f"unknown variant {variant!r}")
            sync = device_sync(inputs[0])
            with torch.no_grad():
                sync()
                started = time.perf_counter()
                outputs = []
                for x in inputs:
                    outputs.append(compiled(x))
                sync()
                result["total_s"] = time.perf_counter() - started
                for got, want in zip(outputs, expected):
                    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
            if variant.startswith("ember"):
                result["captures"] = len(getattr(compiled, "records", []))
                result["form"] = form_of(compiled)
        except Exception as error:  # noqa: BLE001 (a row of the table)
            result["error"] = _short(error)
            traceback.print_exc()
        results.append(result)
    return results


def print_steady(rows: list[Row]) -> None:
    print(f"{'workload':<14} {'shape':<12} {'symbol':<6} {'static us':>10} {'dynamic us':>11} "
          f"{'ratio':>6} {'device us (static/dynamic)':>27}  form / error")

    def shown(value: float | None) -> str:
        return f"{value:.1f}" if value is not None else "-"

    for row in rows:
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        busy = f"{shown(row.static_device_us)} / {shown(row.dynamic_device_us)}"
        print(f"{row.workload:<14} {row.shape:<12} {row.symbolic:<6} {shown(row.static_us):>10} "
              f"{shown(row.dynamic_us):>11} {ratio:>6} {busy:>27}  {row.error or row.form}")


def print_sweep(results: list[dict], count: int) -> None:
    print(f"\nshape sweep: {count} sequence lengths, one call each, compiles included")
    torch_total = next((r.get("total_s") for r in results
                        if r["variant"].startswith("torch.compile")), None)
    for r in results:
        total = r.get("total_s")
        versus = f"  {total / torch_total:.2f}x torch.compile" if total and torch_total else ""
        shown = f"{total:.3f} s" if total is not None else "-"
        extra = r.get("error") or (f"captures {r['captures']}, {r['form']}"
                                   if "captures" in r else "")
        print(f"  {r['variant']:<26} {shown:>10}{versus}  {extra}")


def workloads(rows: int, lengths: list[int]) -> list[tuple[str, Callable, tuple, int]]:
    """(name, function, shape, symbolic dim): softmax and S1 over [rows, n], with the row
    count symbolic and with n symbolic."""
    found = []
    for n in lengths:
        for name, function in (("softmax", softmax_last), ("S1 gelu_ish", gelu_ish)):
            found.append((name, function, (rows, n), 0))
            found.append((name, function, (rows, n), 1))
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default=None, help="EMBER_BACKEND for the run (c|triton)")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--lengths", default="256,1000,1024,4096,5000",
                        help="row lengths n of the steady-state shapes [rows, n]")
    parser.add_argument("--sweep", type=int, default=50, help="sequence lengths in the sweep")
    parser.add_argument("--width", type=int, default=256, help="the sweep's hidden size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check, not a bench)")
    parser.add_argument("--variants", default="eager,ember,ember dynamic=True,"
                                              "torch.compile dynamic=True")
    parser.add_argument("--json", default=None, help="also write the results here")
    options = parser.parse_args(argv)
    if options.quick:
        options.rows, options.lengths, options.sweep, options.width = 8, "16,33", 4, 16
        options.rounds, options.min_time = 1, 0.01
    lengths = [int(n) for n in options.lengths.split(",")]
    settings = {"backend": options.backend} if options.backend else {}
    step = max(1, (2048 - 64) // max(1, options.sweep - 1)) if not options.quick else 3
    sweep_lengths = [64 + i * step + (i % 3) for i in range(options.sweep)]
    if options.quick:
        sweep_lengths = [5 + 3 * i for i in range(options.sweep)]
    print(f"device {options.device}, torch {torch.__version__}, ember backend "
          f"{options.backend or ('triton' if options.device == 'cuda' else 'c')}")
    with config.override(**settings):
        rows = [steady_row(name, function, shape, dim, options.device, options.rounds,
                           options.min_time)
                for name, function, shape, dim in workloads(options.rows, lengths)]
        print_steady(rows)
        results = sweep(sweep_lengths, options.width, options.device,
                        [v.strip() for v in options.variants.split(",") if v.strip()])
        print_sweep(results, len(sweep_lengths))
    report = {"steady": [dataclasses.asdict(r) | {"ratio": r.ratio} for r in rows],
              "sweep": results, "sweep_lengths": sweep_lengths, "device": options.device}
    if options.json:
        with open(options.json, "w") as file:
            json.dump(report, file, indent=1)
    return report


if __name__ == "__main__":
    main()
