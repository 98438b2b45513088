"""The GPU benchmark: one command on a machine with an NVIDIA GPU.

    python -m ember.bench.gpu [--out ember-bench-gpu] [--only S1,S5] [--quick]

For S1, S2, S4, S5 (../shared/ANCHORS.md), softmax and layer_norm over 8192x8192: eager,
torch.compile and ember (and mode="reduce-overhead" for S4 and S5), each in a fresh process
with empty compiler caches:

- first call: capture + compile + run, cold caches (Triton's, Inductor's and ember's);
- steady state: the median time of a call followed by a device sync (latency, launch and
  Python overhead included), as ANCHORS.md measures;
- kernel time: ten calls recorded as one CUDA graph and replayed, per call (launch gaps gone)
  and, for the bandwidth-bound workloads, the bytes they must move over that time against a
  measured device-to-device copy;
- a check against eager.

Tile variants of ember's kernels are timed alongside (--tune). The table is printed last; the
full results go to OUT/results.json and OUT/report.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKLOADS = ("S1", "S2", "softmax", "layer_norm", "S3", "S4", "S5")
TRAINING = ("S3",)  # a whole training step (forward, backward, SGD update)
# (label, how: eager | inductor | ember, torch.compile mode)
VARIANTS = {
    "eager": ("eager", None),
    "torch.compile": ("inductor", None),
    "ember": ("ember", None),
    "torch.compile ro": ("inductor", "reduce-overhead"),
    "ember ro": ("ember", "reduce-overhead"),
    "ember-model": ("ember-model", None),  # a training step whose model alone ember compiles
}
REDUCE_OVERHEAD = ("S3", "S4", "S5")
# bytes each bandwidth-bound workload must move at least (inputs read, outputs written)
SQUARE = {"S1": 4000, "S2": 4096, "softmax": 8192, "layer_norm": 8192}


# -- the workloads, on the GPU ---------------------------------------------------------------
def build(name: str, quick: bool) -> tuple[Any, tuple]:
    import torch
    import torch.nn.functional as F

    from ember.bench import workloads

    torch.manual_seed(0)
    side = SQUARE.get(name, 0) // (4 if quick else 1)
    if name == "S1":
        return workloads.gelu_ish, (torch.randn(side, side, device="cuda"),)
    if name == "S2":
        return workloads.gelu_chain20, (torch.randn(side, side, device="cuda"),)
    if name == "softmax":
        return workloads.softmax_last, (torch.randn(side, side, device="cuda"),)
    if name == "layer_norm":
        return (lambda x, w, b: F.layer_norm(x, w.shape, w, b)), (
            torch.randn(side, side, device="cuda"), torch.randn(side, device="cuda"),
            torch.randn(side, device="cuda"))
    if name == "S3":
        step, (x,) = workloads.build_s3_step(128 if quick else 512, 256 if quick else 1024)
        step.model_slot[0].cuda()  # (in place: the step's optimizer holds the same Parameters)
        return step, (x.cuda(),)
    if name == "S4":
        layers = []
        for _ in range(60):
            layers += [torch.nn.Linear(256, 256), torch.nn.Tanh()]
        return torch.nn.Sequential(*layers).cuda().eval(), (torch.randn(64, 256, device="cuda"),)
    if name == "S5":
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.SiLU(), torch.nn.Linear(4096, 4096),
            torch.nn.SiLU(), torch.nn.Linear(4096, 1024)).cuda().eval()
        return model, (torch.randn(16, 1024, device="cuda"),)
    raise ValueError(name)


def minimum_bytes(name: str, args: tuple) -> int | None:
    if name not in SQUARE:
        return None
    return 2 * sum(a.numel() * a.element_size() for a in args if a.dim() == 2)


def _model_compiled(step: Any, compile_model: Any) -> Any:
    step.model_slot[0] = compile_model(step.model_slot[0])
    return step


# -- one process: one workload, one variant ----------------------------------------------------
def child(name: str, variant: str, quick: bool, tune: bool) -> dict[str, Any]:
    import torch

    how, mode = VARIANTS[variant]
    result: dict[str, Any] = dict(workload=name, variant=variant)
    fn, args = build(name, quick)
    reference_fn, _ = build(name, quick)
    training = name in TRAINING
    with torch.set_grad_enabled(training):
        expected = reference_fn(*args)
        torch.cuda.synchronize()
        if how == "eager":
            compiled = fn
        elif how == "inductor":
            # a training step: torch.compile(model), as users do (the optimizer stays eager)
            compiled = _model_compiled(fn, lambda m: torch.compile(m, mode=mode)) \
                if training else torch.compile(fn, mode=mode)
        elif how == "ember-model":
            import ember

            compiled = _model_compiled(fn, lambda m: ember.compile(m, mode=mode))
        else:
            import ember

            compiled = ember.compile(fn, mode=mode)  # a training step: the whole step
        start = time.perf_counter()
        output = compiled(*args)
        torch.cuda.synchronize()
        result["first_call_s"] = time.perf_counter() - start
        if not training:  # (a training step's second loss follows an update)
            output = compiled(*args)
            torch.cuda.synchronize()
        difference = (output.detach().double() - expected.detach().double()).abs()
        result["max_abs_error"] = float(difference.max())
        result["ok"] = bool(torch.allclose(output, expected, rtol=1e-3, atol=1e-3))
        result["steady_ms"], result["steady_p10_ms"], result["steady_p90_ms"] = \
            latency(compiled, args)
        if mode is None and not training:
            kernel_ms = replay_time(compiled, args)
            result["kernel_ms"] = kernel_ms
            bytes_moved = minimum_bytes(name, args)
            if bytes_moved and kernel_ms:
                result["kernel_tb_s"] = bytes_moved / (kernel_ms * 1e-3) / 1e12
        if how == "ember" and not training:
            result["breakdown"] = breakdown(compiled, fn, args)
        if training:
            try:
                result["breakdown"] = step_breakdown(compiled, args)
            except Exception as error:  # (the profiler is a side show: keep the timings)
                result["breakdown"] = f"profiler failed: {error!r}"
        if tune and how == "ember" and mode is None and name in ("S1", "S2", "softmax",
                                                                 "layer_norm", "S4"):
            result["tiles"] = tile_variants(fn, args, name)  # (resets ember)
    return result


def breakdown(compiled: Any, fn: Any, args: tuple) -> dict[str, float]:
    """Where an ember call's time goes (medians, ms): the guard alone, the compiled graph
    alone (no guard, no argument binding) and, under reduce-overhead, the replay alone."""
    import torch

    target = getattr(compiled, "_compiled_forward", compiled)
    bound = (fn, *args) if isinstance(fn, torch.nn.Module) else args
    entry, record = target.entries[0], target.records[-1]
    arguments = target.binder(*bound)
    result = {"guard_ms": _median_ms(lambda: entry.guard(arguments))}
    graph = record.compiled
    tensors = _graph_inputs(entry, target, arguments)
    if graph is not None and tensors is not None:
        result["graph_ms"] = _median_ms(lambda: (graph(*tensors), torch.cuda.synchronize()))
        result["graph_profile"] = _profile(lambda: graph(*tensors))
    if record.cuda_graph is not None and record.cuda_graph.graph is not None:
        replay = record.cuda_graph.graph.replay
        result["replay_ms"] = _median_ms(lambda: (replay(), torch.cuda.synchronize()))
    return result


def step_breakdown(step: Any, args: tuple, calls: int = 10) -> dict[str, Any]:
    """Where a training step's time goes: the GPU's busy time per step (kernels and copies, from
    torch.profiler), the kernels per step, the heaviest kernels, and the host functions the
    step spends its own time in (cProfile)."""
    kernels = device_kernels(step, args, calls)
    return dict(
        device_busy_ms=sum(t for t, _, _ in kernels) / calls / 1e3,
        device_ops_per_step=sum(n for _, n, _ in kernels) / calls,
        heaviest=[f"{k[:70]}: {t / calls:.1f} us x{n / calls:g}" for t, n, k in kernels[:10]],
        host_profile=_profile(lambda: step(*args)))


def device_kernels(fn: Any, args: tuple, calls: int = 10) -> list[tuple[float, int, str]]:
    """The device's work over `calls` calls of fn(*args) (torch.profiler): (microseconds,
    count, name) of each kernel or copy, heaviest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    return sorted(((e.self_device_time_total, e.count, e.key) for e in trace.key_averages()
                   if e.device_type.name == "CUDA"), reverse=True)


def _graph_inputs(entry: Any, target: Any, arguments: dict) -> list | None:
    """The graph's inputs, fetched through their sources as the runner does."""
    captured = entry.captured
    if captured is None:
        return None
    scope = dict(captured.scope, L=arguments, C=target.function.__closure__ or ())
    return [source.evaluate(scope) for source in captured.input_sources]


def _profile(fn: Any, calls: int = 20) -> list[str]:
    """The functions a call spends its own time in (µs per call), heaviest first."""
    import cProfile
    import pstats

    import torch

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:8]
    return [f"{(function[2] if function[0] == '~' else function[2] + ' ' + Path(function[0]).name)}"
            f": {row[2] / calls * 1e6:.1f} us in {row[1] // calls} calls" for function, row in rows]


def _median_ms(fn: Any, calls: int = 100) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def latency(fn: Any, args: tuple, calls: int = 200) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile of (call + device sync), in ms."""
    import torch

    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[len(samples) // 10], samples[-len(samples) // 10]


def replay_time(fn: Any, args: tuple, per_graph: int = 10) -> float | None:
    """Device time per call, in ms: `per_graph` calls recorded as one CUDA graph, replayed."""
    import torch

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_graph):
                fn(*args)
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / per_graph)
        return statistics.median(times)
    except Exception as error:  # noqa: BLE001 (a variant that cannot be recorded has no figure)
        print(f"replay timing failed: {error}", file=sys.stderr)
        return None


def tile_variants(fn: Any, args: tuple, name: str) -> list[dict[str, Any]]:
    """ember's kernel time under other tile choices (HEURISTICS), to check the defaults."""
    import ember
    from ember import config
    from ember.codegen import triton_tiling as codegen

    default = codegen.HEURISTICS
    fuse = name == "S4"  # its Linear+Tanh layers: matmul epilogue fusion under several tiles
    if fuse:
        choices = [dict(matmul_block_m=m, matmul_block_n=n, matmul_block_k=k, matmul_warps=w,
                        matmul_stages=s, matmul_precision="tf32x3")
                   for m, n, k, w, s in ((16, 16, 64, 2, 1), (16, 16, 64, 2, 2),
                                         (16, 16, 64, 2, 3), (16, 16, 32, 2, 3),
                                         (16, 16, 32, 1, 4), (16, 16, 128, 2, 1),
                                         (16, 16, 128, 2, 2), (16, 16, 256, 2, 1),
                                         (16, 16, 256, 4, 1), (16, 32, 64, 2, 3),
                                         (16, 16, 64, 1, 3), (32, 16, 64, 2, 2))]
    elif name in ("S1", "S2"):
        choices = [dict(pointwise_block=b, pointwise_warps=w)
                   for b, w in ((256, 4), (512, 4), (512, 8), (1024, 4), (1024, 8), (2048, 4),
                                (2048, 8), (4096, 8), (4096, 16))]
    else:
        choices = [dict(persistent_max=8192), dict(persistent_max=4096, looped_rblock=2048),
                   dict(persistent_max=4096, looped_rblock=4096),
                   dict(persistent_max=8192, persistent_elements=8192),
                   dict(persistent_max=4096, looped_rblock=1024)]
    results = []
    try:
        for choice in choices:
            codegen.HEURISTICS = dataclasses.replace(default, **choice)
            ember.reset()
            compiled = ember.compile(fn)
            with config.override(matmul_epilogue=fuse):
                compiled(*args)
            kernel_ms = replay_time(compiled, args)
            bytes_moved = minimum_bytes(name, args)
            results.append(dict(choice, kernel_ms=kernel_ms,
                                tb_s=bytes_moved / (kernel_ms * 1e-3) / 1e12
                                if kernel_ms and bytes_moved else None))
    finally:
        codegen.HEURISTICS = default
    return results


def copy_bandwidth() -> dict[str, float]:
    """The memory ceiling kernels are compared with: a 1 GiB device-to-device copy (bytes read
    + written per second), replayed from a CUDA graph, done three ways (cudaMemcpy through
    copy_, torch's elementwise kernel, a plain Triton copy kernel); the best is the ceiling."""
    import torch

    source = torch.randn(256 * 2 ** 20, device="cuda")
    target = torch.empty_like(source)
    ways = {"memcpy": lambda a, b: b.copy_(a),
            "elementwise": lambda a, b: torch.add(a, 0.0, out=b),
            "triton": _triton_copy()}
    result = {}
    for name, fn in ways.items():
        if fn is None:
            continue
        ms = replay_time(fn, (source, target))
        if ms:
            result[f"{name}_tb_s"] = 2 * source.numel() * 4 / (ms * 1e-3) / 1e12
    result["copy_tb_s"] = max(result.values())
    return result


def _triton_copy():
    """A plain Triton copy kernel (4096 elements per program, 16 bytes per access)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def copy_kernel(source, target, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(target + offsets, tl.load(source + offsets, mask=mask), mask=mask)

    def copy(a, b):
        copy_kernel[(triton.cdiv(a.numel(), 4096),)](a, b, a.numel(), BLOCK=4096, num_warps=8)

    return copy


# -- the parent: a fresh process per (workload, variant) ---------------------------------------
def run_child(name: str, variant: str, options: argparse.Namespace, root: Path) -> dict:
    caches = root / f"{name}-{variant.replace(' ', '_').replace('.', '_')}"
    environment = dict(os.environ, TRITON_CACHE_DIR=str(caches / "triton"),
                       TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                       EMBER_CACHE_DIR=str(caches / "ember"))
    environment.pop("TRITON_INTERPRET", None)
    command = [sys.executable, "-m", "ember.bench.gpu", "--child", name, variant]
    if options.quick:
        command.append("--quick")
    if options.tune:
        command.append("--tune")
    started = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True,
                          timeout=options.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return dict(workload=name, variant=variant, error=" | ".join(tail),
                    wall_s=time.perf_counter() - started)
    result = json.loads(lines[-1])
    result["wall_s"] = time.perf_counter() - started
    return result


def table(results: list[dict], ceiling: dict[str, float]) -> str:
    rows = ["| workload | variant | first call s | steady ms (p10-p90) | kernel ms | kernel TB/s "
            "(% of copy) | check |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['workload']} | {r['variant']} | error: {r['error'][:120]} "
                        f"| | | | |")
            continue
        bandwidth = ""
        if r.get("kernel_tb_s"):
            share = 100 * r["kernel_tb_s"] / ceiling["copy_tb_s"]
            bandwidth = f"{r['kernel_tb_s']:.2f} ({share:.0f}%)"
        kernel = f"{r['kernel_ms']:.4f}" if r.get("kernel_ms") else ""
        rows.append(f"| {r['workload']} | {r['variant']} | {r['first_call_s']:.2f} | "
                    f"{r['steady_ms']:.4f} ({r['steady_p10_ms']:.3f}-{r['steady_p90_ms']:.3f}) "
                    f"| {kernel} | {bandwidth} | "
                    f"{'ok' if r['ok'] else 'MISMATCH'} {r['max_abs_error']:.1e} |")
    return "\n".join(rows)


def ratios(results: list[dict]) -> str:
    """ember / torch.compile per workload: steady state and first call."""
    by = {(r["workload"], r["variant"]): r for r in results if "error" not in r}
    lines = []
    for name in dict.fromkeys(r["workload"] for r in results):
        pairs = [("ember", "torch.compile")]
        if name in TRAINING:
            pairs.append(("ember-model", "torch.compile"))
        if name in REDUCE_OVERHEAD:
            pairs.append(("ember ro", "torch.compile ro"))
        for ours, theirs in pairs:
            a, b, eager = by.get((name, ours)), by.get((name, theirs)), by.get((name, "eager"))
            if a and b:
                lines.append(f"- {name} {ours}: steady {a['steady_ms'] / b['steady_ms']:.2f}x "
                             f"{theirs}'s"
                             + (f", {a['steady_ms'] / eager['steady_ms']:.2f}x eager's"
                                if eager else "")
                             + f"; first call {a['first_call_s'] / b['first_call_s']:.2f}x")
    return "\n".join(lines)


def parent(options: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("python -m ember.bench.gpu needs a CUDA device (and triton); this torch sees "
              "none. On the CPU: python -m ember bench", file=sys.stderr)
        return 2

    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    names = options.only.split(",") if options.only else list(WORKLOADS)
    machine = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                   python=sys.version.split()[0])
    try:
        import triton

        machine["triton"] = triton.__version__
    except ImportError:
        pass
    ceiling = copy_bandwidth()
    print(f"{machine}; device copy {ceiling['copy_tb_s']:.2f} TB/s", flush=True)
    results: list[dict] = []
    text = summary = ""
    with tempfile.TemporaryDirectory(prefix="ember-gpu-bench-") as root:
        for name in names:
            variants = ["eager", "torch.compile", "ember"]
            if name in TRAINING:
                variants.append("ember-model")
            if name in REDUCE_OVERHEAD:
                variants += ["torch.compile ro", "ember ro"]
            if options.variants:
                variants = [v for v in variants if v in options.variants.split(",")]
            for variant in variants:
                result = run_child(name, variant, options, Path(root))
                results.append(result)
                print(json.dumps(result), flush=True)
                text, summary = write_report(out, machine, ceiling, results)  # (so far)
    print(text)
    print(summary)
    return 0


def write_report(out: Path, machine: dict, ceiling: dict, results: list[dict]
                 ) -> tuple[str, str]:
    text = table(results, ceiling)
    summary = ratios(results)
    (out / "results.json").write_text(json.dumps(dict(machine=machine, ceiling=ceiling,
                                                      results=results), indent=1))
    (out / "report.md").write_text(f"# GPU benchmark\n\n{machine}\n\nDevice copy: "
                                   f"{ceiling['copy_tb_s']:.2f} TB/s\n\n{text}\n\n{summary}\n")
    return text, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="ember-bench-gpu")
    parser.add_argument("--only", default="", help="comma-separated workloads")
    parser.add_argument("--quick", action="store_true", help="a quarter of each side")
    parser.add_argument("--variants", default="",
                        help="comma-separated variants (eager, torch.compile, ember, ...)")
    parser.add_argument("--tune", action="store_true", help="time ember's tile variants too")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "VARIANT"),
                        help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print(json.dumps(child(*options.child, options.quick, options.tune)), flush=True)
        return 0
    return parent(options)


if __name__ == "__main__":
    raise SystemExit(main())
