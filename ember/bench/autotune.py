"""mode="max-autotune" against the default mode, in one process: per workload the compile
time (first call, on an empty disk cache of its own) and the steady state under each mode (the
fastest of three rounds that take the modes in turn),
and per tuned kernel the default configuration's time against the one kept.

    python -m ember.bench.autotune                      # the CPU, quick seed shapes
    python -m ember.bench.autotune --device cuda --size full --only S2 softmax gpt2-infer

On CUDA the CUDA-graph modes are compared too (reduce-overhead against max-autotune), and
with --torch torch.compile's max-autotune (its own caches empty too; its "vs" is over ember's
max-autotune).
Numbers from a machine busy with other work move by tens of percent between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

DEFAULT_WORKLOADS = ("S1", "S2", "softmax", "layer_norm", "S4", "S5", "S3-forward")


def instantiate(name: str, size: str, device: str) -> tuple[Any, tuple, Any]:
    from ember.bench import workloads

    workload = workloads.find(name)
    if workload is None:
        raise SystemExit(f"no workload {name!r}")
    if "device" in inspect.signature(workload.build).parameters:
        fn, args = workload.instantiate(size, device)
    else:
        fn, args = workload.instantiate(size)
        if device != "cpu":
            args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
            if isinstance(fn, torch.nn.Module):
                fn = fn.to(device)
    return fn, args, workload


# (a mode of torch.compile's, compared with ember's: --torch)
TORCH = "torch.compile "
ROUNDS = 3  # steady-state rounds, the modes taken in turn; the fastest round's median kept


def compile_under(name: str, size: str, device: str, mode: str) -> dict:
    """One workload compiled under one mode: its first call on a fresh disk cache, checked."""
    import ember
    from ember import config, tuning
    from ember.bench.harness import device_sync, wait_for_ember

    fn, args, workload = instantiate(name, size, device)
    start = len(tuning.history)
    with tempfile.TemporaryDirectory(prefix="ember-autotune-") as cache, \
            config.override(cache_dir=Path(cache), warm_start=False), _grad(workload):
        chosen = None if mode == "default" else mode
        compiler = ember.compile
        if mode.startswith(TORCH):  # (torch.compile's mode, its caches in the same folder)
            import torch._dynamo

            torch._dynamo.reset()
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
            os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
            chosen = mode[len(TORCH):]
            compiler = torch.compile
        if workload.compile_model and hasattr(fn, "model_slot"):
            # (a zoo step: its model compiled, as users write torch.compile(model))
            model = fn.model_slot[0]
            compiled, fn = _with_model(fn, compiler(model, mode=chosen)), \
                _with_model(fn, model)
        else:
            compiled = compiler(fn, mode=chosen)
        sync = device_sync(fn, *args)
        began = time.perf_counter()
        result = compiled(*args)
        sync()
        first = time.perf_counter() - began
        expected = fn(*args)
        # (its kernels compile beside the first call, into the cache that ends here)
        wait_for_ember()
        result = compiled(*args)  # (checked compiled: the first call may have run eagerly)
    kernels = [{"graph": o.graph, "kernel": o.kernel, "choice": o.choice,
                "default_us": o.seconds.get("default", float("nan")) * 1e6,
                "chosen_us": o.seconds.get(o.choice, float("nan")) * 1e6,
                "candidates": len(o.seconds)} for o in tuning.history[start:]]
    return {"workload": name, "mode": mode, "first_call_s": first, "kernels": kernels,
            "agrees": _close(result, expected, workload.tolerance_at(size, device)),
            "run": (compiled, args, workload)}


def _with_model(step: Any, model: Any) -> Any:
    """`step` calling `model` (each call puts it in the step's slot first)."""
    def run(*args: Any) -> Any:
        step.model_slot[0] = model
        return step(*args)

    return run


def _grad(workload: Any) -> Any:
    return contextlib.nullcontext() if workload.grad else torch.no_grad()


def steady(found: list[dict]) -> None:
    """Each mode's steady state (ms), measured in ROUNDS rounds that take the modes in turn
    (a burst of other work on the machine then slows one round, not one mode)."""
    from ember.bench.harness import benchmark

    rounds: dict[str, list[float]] = {f["mode"]: [] for f in found}
    for _ in range(ROUNDS):
        for f in found:
            compiled, args, workload = f["run"]
            with _grad(workload):
                rounds[f["mode"]].append(benchmark(compiled, *args, min_time=0.2).median)
    for f in found:
        f["steady_ms"] = min(rounds[f["mode"]]) * 1e3
        f["rounds_ms"] = [t * 1e3 for t in rounds[f["mode"]]]
        del f["run"]


def _close(actual: Any, expected: Any, tolerance: dict) -> bool:
    from torch.utils._pytree import tree_flatten

    pairs = zip(tree_flatten(actual)[0], tree_flatten(expected)[0])
    return all(torch.allclose(a.float(), e.float(), equal_nan=True, **tolerance)
               if isinstance(a, torch.Tensor) else a == e for a, e in pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember.bench.autotune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=("full", "quick", "tiny"), default="quick")
    parser.add_argument("--only", nargs="+", default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--torch", action="store_true",
                        help="torch.compile's max-autotune too (on CUDA: minutes a model)")
    options = parser.parse_args(argv)
    import ember

    modes = ["default", "max-autotune-no-cudagraphs"]
    if options.device == "cuda":
        modes += ["reduce-overhead", "max-autotune"]
    if options.torch:
        modes += [TORCH + "max-autotune"]
    # (one throwaway compile first: imports and start-up costs are not any workload's)
    warm = torch.ones(4, device=options.device)
    ember.compile(lambda x: x + 1)(warm)
    results = []
    print(f"{'workload':<12} {'mode':<28} {'first call s':>12} {'steady ms':>10} {'vs':>6}  "
          f"kernels tuned")
    for name in options.only:
        baseline: dict[str, float] = {}
        compiled = [compile_under(name, options.size, options.device, mode) for mode in modes]
        steady(compiled)
        for found in compiled:
            mode = found["mode"]
            results.append(found)
            base = "default" if mode in ("default", "max-autotune-no-cudagraphs") \
                else "max-autotune" if mode.startswith(TORCH) else "reduce-overhead"
            baseline.setdefault(mode, found["steady_ms"])
            ratio = found["steady_ms"] / baseline.get(base, found["steady_ms"])
            changed = sum(1 for k in found["kernels"] if k["choice"] != "default")
            tuned = f"{len(found['kernels'])} ({changed} changed)" if found["kernels"] else ""
            wrong = "" if found["agrees"] else "  WRONG ANSWER"
            print(f"{name:<12} {mode:<28} {found['first_call_s']:12.3f} "
                  f"{found['steady_ms']:10.4f} {ratio:6.2f}  {tuned}{wrong}")
            for kernel in found["kernels"]:
                if kernel["choice"] != "default":
                    print(f"{'':<12}   {kernel['graph']} {kernel['kernel']}: default "
                          f"{kernel['default_us']:.1f} us -> {kernel['choice']} "
                          f"{kernel['chosen_us']:.1f} us ({kernel['candidates']} tried)")
    for mode, base in (("max-autotune-no-cudagraphs", "default"), ("max-autotune", "default"),
                       ("max-autotune", TORCH + "max-autotune")):
        ratios = [r["steady_ms"] / b["steady_ms"] for r in results for b in results
                  if r["mode"] == mode and b["mode"] == base and b["workload"] == r["workload"]]
        if ratios:
            print(f"{mode} / {base} steady state: geometric mean "
                  f"{statistics.geometric_mean(ratios):.3f} over {len(ratios)} workloads "
                  f"({', '.join(f'{x:.2f}' for x in ratios)})")
    if options.json:
        options.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["agrees"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
