"""Every zoo model, in each of its modes (inference, a training step, greedy decoding), run
twice on one cache in two fresh processes: whether the second process starts warm — from
the function's cache entry, before any capture (ember/warm_entries.py) — its first call's
time against the cold process's, and eager's answer checked in both.

    python -m ember.bench.zoo_warm [--size tiny] [--only gpt2 bart ...] [--modes infer ...]
        [--device cpu]

Columns: workload, then for the cold process and the warm one: the first call's seconds
(the step: a forward, a training step with AdamW, or the whole decoding loop), eager's
answer (ok), and the function entries hit / kept / not kept. A training process runs a
second step (untimed) and waits for its keeps, so the graph is kept once its backward is
compiled, as a training loop's later steps let it be.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import torch
import ember
from ember import warm_entries
from ember.bench import zoo
from ember.runtime import warm_cache

model, mode, size, device = sys.argv[1:5]
spec = zoo.find(model)
eager_step, args = zoo.instantiate(spec, mode, size, device)
with torch.set_grad_enabled(mode == "train"):
    want = eager_step(*args)
step, args = zoo.instantiate(spec, mode, size, device)
step.model_slot[0] = ember.compile(step.model)
started = time.perf_counter()
with torch.set_grad_enabled(mode == "train"):
    got = step(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    if mode == "train":
        step(*args)
if mode == "decode":
    ok = torch.equal(got, want)
else:
    ok = torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-3)
warm_cache.finish_keeps()
print(json.dumps({"seconds": seconds, "ok": bool(ok), "counts": warm_entries.counts}))
"""


def run_twice(model: str, mode: str, size: str, device: str) -> list[dict]:
    """The cold process's report and the warm one's, on one new cache."""
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="ember-zoo-warm-") as folder:
        environment = dict(os.environ, EMBER_CACHE_DIR=folder, PYTHONPATH=os.pathsep.join(
            [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
        environment.pop("EMBER_LOGS", None)
        reports = []
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", CHILD, model, mode, size, device],
                                  capture_output=True, text=True, env=environment,
                                  timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"{model} {mode} failed:\n{done.stderr[-2000:]}")
            reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return reports


def row(model: str, mode: str, reports: list[dict]) -> str:
    cells = []
    for report in reports:
        counts = report["counts"]
        cells.append(f"{report['seconds']:7.3f} ok={str(report['ok']):5} "
                     f"{counts['hits']}/{counts['kept']}/{counts['not_kept']}")
    return f"{model:<13} {mode:<6} " + "   ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="*", help="zoo model names (default: every one)")
    parser.add_argument("--modes", nargs="*", default=["infer", "train", "decode"])
    options = parser.parse_args(argv)
    from ember.bench import zoo

    print(f"{'model':<13} {'mode':<6} {'cold: first call, eager, entries hit/kept/not':<36}"
          f"   warm: the same", flush=True)
    for spec in zoo.MODELS:
        if options.only and spec.name not in options.only:
            continue
        for mode in options.modes:
            if mode in spec.modes:
                print(row(spec.name, mode, run_twice(spec.name, mode, options.size,
                                                     options.device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
