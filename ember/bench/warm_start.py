"""From process start to the first result: eager, ember cold and warm, torch.compile cold and
warm, each in a fresh Python process, on the CPU seed workloads, a user's model class
(`module`, `module-train`: workloads.MODULE_WORKLOADS) and the model zoo's models
(`zoo:gpt2`, `zoo:bert:train`: ember/bench/zoo.py, at the zoo's size of the same name).

    python -m ember.bench.warm_start [--size quick] [--only S1 S5 zoo:gpt2 ...] [--repeats 1]
        [--device cuda]

Each variant runs in its own process: the time counts from just before the process is
started to the moment the first call's result is there (interpreter start, `import torch`,
`import ember`, capture, compile, run). "cold" starts on empty caches (EMBER_CACHE_DIR, and
torch.compile's TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR pointed at new folders); "warm"
is a second process on the caches the cold one left ("warm hits": graphs from ember's warm
cache; "before capture": functions whose first call started from their cache entry without
a capture, ember/warm_entries.py). The eager process (`import torch` and an eager call) is
the baseline: "extra" is a variant's time over it. The workloads' module (or the zoo's) is
loaded on its own in the child, so that eager and torch.compile never import ember.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("eager", "ember-cold", "ember-warm", "torch.compile-cold", "torch.compile-warm")

CHILD = r"""
import importlib.util, json, sys, time
begun = time.perf_counter()
variant, name, size, workloads_path, device = sys.argv[1:6]
import torch
imported_torch = time.perf_counter()
if device != "cpu":  # (the seeds build on the default device)
    torch.set_default_device(device)
if variant.startswith("ember"):
    import ember
imported = time.perf_counter()
def load(module_name, path):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
if name.startswith("zoo:"):  # (zoo:MODEL or zoo:MODEL:MODE, a model of the zoo's)
    zoo = load("zoo_models", workloads_path.replace("workloads.py", "zoo.py"))
    _, model, mode = (name.split(":") + ["infer"])[:3]
    fn, args = zoo.instantiate(zoo.find(model), mode, size, device)
    grad, mode = mode == "train", None
    if variant.startswith("ember"):
        fn.model_slot[0] = ember.compile(fn.model)
    elif variant.startswith("torch.compile"):
        fn.model_slot[0] = torch.compile(fn.model)
else:
    workloads = load("seed_workloads", workloads_path)
    workload = next(w for w in (*workloads.WORKLOADS, *workloads.MODULE_WORKLOADS)
                    if w.name == name)
    fn, args = workload.instantiate(size)
    grad = workload.grad
    if variant.startswith("ember"):
        fn = ember.compile(fn)
    elif variant.startswith("torch.compile"):
        fn = torch.compile(fn, mode=workload.mode)
called = time.perf_counter()
with torch.set_grad_enabled(grad):
    result = fn(*args)
if device != "cpu":
    torch.cuda.synchronize()
done = time.time()
parts = {"import torch": imported_torch - begun, "import ember": imported - imported_torch,
         "first call": time.perf_counter() - called}
if grad and name.startswith("zoo:"):  # (a training loop's next steps, untimed: a cold
    with torch.set_grad_enabled(grad):  # process keeps the graph whole, once its backward
        fn(*args)                       # for every output is compiled, which a loop's later
    if variant.startswith("ember"):     # steps start)
        from ember.backends import wait_for_background_compiles
        wait_for_background_compiles()
counts = {}
if variant.startswith("ember"):
    from ember import warm_entries
    from ember.runtime import warm_cache
    counts = dict(warm_cache.counts, entry_hits=warm_entries.counts["hits"])
print(json.dumps({"done": done, "warm": counts, "parts": parts}))
"""


def run_variant(variant: str, name: str, size: str, caches: Path, device: str = "cpu"
                ) -> tuple[float, dict]:
    """Seconds from process start to the first result, and ember's warm-cache counts."""
    environment = dict(os.environ, EMBER_CACHE_DIR=str(caches / "ember"),
                       TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                       TRITON_CACHE_DIR=str(caches / "triton"))
    environment.pop("EMBER_LOGS", None)
    environment.pop("PYTHONDONTWRITEBYTECODE", None)  # (see prime)
    root = Path(__file__).resolve().parents[2]
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(root), *filter(None, [environment.get("PYTHONPATH")])])
    workloads = Path(__file__).with_name("workloads.py")
    start = time.time()
    command = [sys.executable, "-c", CHILD, variant, name, size, str(workloads), device]
    done = subprocess.run(command,
                          capture_output=True, text=True, env=environment, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} on {name} failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["done"] - start, {**report["warm"], **report["parts"]}


# What any variant's process imports, read once before the timed runs: on a machine whose
# files are not yet in the OS's page cache (a fresh GPU host), the first process to import
# triton, sympy or torch._dynamo reads them from disk (seconds), and the variant that runs
# first would be charged for the disk, not for its own work.
PRIME = """
import importlib.util, sys
import torch, sympy, torch._dynamo, torch._inductor.compile_fx, ember
if sys.argv[1] != "cpu" and importlib.util.find_spec("triton") is not None:
    import triton, triton.compiler
"""


def prime(device: str) -> float:
    """Seconds an untimed process took to import what the variants import (see PRIME). It
    also writes their bytecode caches (__pycache__) where the environment said not to
    (PYTHONDONTWRITEBYTECODE, set on some CI and sandbox machines): a user's Python keeps
    them, and without them every process compiles ember's ~130 modules from source again
    (0.3 s of a 0.35 s `import ember` on such a machine, 2026-12-03)."""
    root = Path(__file__).resolve().parents[2]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", PRIME, device], capture_output=True, env=environment,
                   timeout=1800, check=False)
    return time.perf_counter() - start


def measure(names: list[str], size: str, repeats: int, device: str = "cpu"
            ) -> dict[str, dict[str, float]]:
    """name -> variant -> median seconds to the first result (cold variants on new caches
    each repeat, warm ones right after their cold one), after one untimed process has read
    the imported files into the OS's page cache (prime)."""
    print(f"  (the imports' files read once, untimed: {prime(device):.2f} s)", file=sys.stderr,
          flush=True)
    results: dict[str, dict[str, list[float]]] = {}
    for name in names:
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="ember-warm-start-") as folder:
                for variant in VARIANTS:
                    seconds, counts = run_variant(variant, name, size, Path(folder), device)
                    results.setdefault(name, {}).setdefault(variant, []).append(seconds)
                    if variant == "ember-warm":
                        results[name].setdefault("warm hits", []).append(counts.get("hits", 0))
                        results[name].setdefault("entry hits", []).append(
                            counts.get("entry_hits", 0))
                    for part in ("import torch", "import ember", "first call"):
                        results[name].setdefault(f"{variant} {part}", []).append(counts[part])
                    print(f"  {name:<14} {variant:<19} {seconds:7.2f} s  (import torch "
                          f"{counts['import torch']:.2f}, import ember "
                          f"{counts['import ember']:.2f}, first call "
                          f"{counts['first call']:.2f})", file=sys.stderr, flush=True)
    return {name: {variant: statistics.median(times) for variant, times in found.items()}
            for name, found in results.items()}


def table(results: dict[str, dict[str, float]]) -> str:
    lines = ["seconds from process start to the first result (extra: over eager's process)",
             "", f"{'workload':<14} {'eager':>6} {'ember':>6} {'warm':>6} {'t.c':>6} "
             f"{'t.c warm':>8} | {'ember/t.c':>9} {'warm/cold':>9} {'warm/t.c w':>10} "
             f"(extra times)"]
    ratios = []
    for name, r in results.items():
        eager = r["eager"]
        extra = {v: max(r[v] - eager, 1e-3) for v in VARIANTS}
        row = (extra["ember-cold"] / extra["torch.compile-cold"],
               extra["ember-warm"] / extra["ember-cold"],
               extra["ember-warm"] / extra["torch.compile-warm"])
        ratios.append(row)
        lines.append(f"{name:<14} {eager:6.2f} {r['ember-cold']:6.2f} {r['ember-warm']:6.2f} "
                     f"{r['torch.compile-cold']:6.2f} {r['torch.compile-warm']:8.2f} | "
                     f"{row[0]:9.3f} {row[1]:9.3f} {row[2]:10.3f}"
                     f"   (warm hits {r.get('warm hits', 0):.0f}, before capture "
                     f"{r.get('entry hits', 0):.0f})")
    if ratios:
        geomeans = [statistics.geometric_mean(column) for column in zip(*ratios)]
        lines.append(f"{'geomean':<14} {'':>6} {'':>6} {'':>6} {'':>6} {'':>8} | "
                     f"{geomeans[0]:9.3f} {geomeans[1]:9.3f} {geomeans[2]:10.3f}")
        lines.append("targets: ember/t.c <= 0.1, warm/cold <= 0.2, warm/t.c warm <= 0.1")
    if all("ember-cold first call" in r for r in results.values()):
        lines += ["", "inside each process (less noisy: interpreter start and import torch left "
                  "out): import ember, the first call alone, and extra = import ember + first "
                  "call - eager's first call", "",
                  f"{'workload':<14} {'import':>6} {'eager':>6} {'ember':>6} {'warm':>6} "
                  f"{'t.c':>6} {'t.c warm':>8} | {'ember/t.c':>9} {'warm/cold':>9} "
                  f"{'warm/t.c w':>10}"]
        ratios = []
        for name, r in results.items():
            extra = {v: max(r[f"{v} import ember"] + r[f"{v} first call"]
                            - r["eager first call"], 1e-3) for v in VARIANTS}
            row = (extra["ember-cold"] / extra["torch.compile-cold"],
                   extra["ember-warm"] / extra["ember-cold"],
                   extra["ember-warm"] / extra["torch.compile-warm"])
            ratios.append(row)
            calls = [r[f"{v} first call"] for v in VARIANTS]
            lines.append(f"{name:<14} {r['ember-cold import ember']:6.2f} "
                         + " ".join(f"{c:6.2f}" for c in calls[:4]) + f" {calls[4]:8.2f} | "
                         f"{row[0]:9.3f} {row[1]:9.3f} {row[2]:10.3f}")
        geomeans = [statistics.geometric_mean(column) for column in zip(*ratios)]
        lines.append(f"{'geomean':<14} {'':>6} {'':>6} {'':>6} {'':>6} {'':>6} {'':>8} | "
                     f"{geomeans[0]:9.3f} {geomeans[1]:9.3f} {geomeans[2]:10.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="quick", choices=["full", "quick", "tiny"])
    parser.add_argument("--only", nargs="*", help="workload names (default: the CPU seeds and "
                        "the module workloads)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cuda: the seeds built on the GPU")
    parser.add_argument("--json", help="write the medians to this file")
    parser.add_argument("--table", help="print the table of medians a --json run wrote")
    options = parser.parse_args(argv)
    if options.table:
        print(table(json.loads(Path(options.table).read_text())))
        return 0
    from ember.bench.workloads import MODULE_WORKLOADS, WORKLOADS

    names = options.only or [w.name for w in (*WORKLOADS, *MODULE_WORKLOADS)]
    results = measure(names, options.size, options.repeats, options.device)
    print(table(results))
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
