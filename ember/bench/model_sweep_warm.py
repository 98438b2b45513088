"""The model sweep's architectures (ember/bench/model_sweep_models.py), each run twice on one
cache in two fresh processes: does the second process start from the function's kept entry,
before any capture (ember/warm_entries.py), with eager's answer — and where not, why (what
the first process said on EMBER_LOGS=perf when it did not keep the entry, or why the second
captured again). Beyond the zoo's models (ember/bench/zoo_warm.py), this is how a warm start
meets models nobody wrote a test for.

    python -m ember.bench.model_sweep_warm [--only mistral swin] [--modes infer train]
        [--json out.json]

One call per process, float32 on the CPU; a training process calls its loss's backward too,
then a second step (untimed, unchecked), and waits for the keeps: a training graph is kept
with its forward once its kernels are in, and again whole once its backward for every
output is compiled, which the second step starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import copy, json, sys
import torch
import ember
from ember import warm_entries
from ember.bench.model_sweep_models import SEED, cases
from ember.runtime import warm_cache

name, mode = sys.argv[1:3]
model, batch, forward, loss = cases()[name]()
model.train(mode == "train")
run = forward if mode == "infer" else loss
reference = copy.deepcopy(model)

def answer(model):
    torch.manual_seed(SEED)
    with torch.set_grad_enabled(mode == "train"):
        output = run(model, batch)
        if mode == "train":
            output.backward()
    return output.detach()

want = answer(reference)
compiled = ember.compile(model)
got = answer(compiled)
scale = max(1.0, want.abs().max().item())
difference = (got - want).abs().max().item() / scale
if mode == "train":  # (a second step starts the backward's compile for every output,
    answer(compiled)  # deferred until then: the graph is kept once it is done)
warm_cache.finish_keeps()
print(json.dumps({"difference": difference, "counts": warm_entries.counts}))
"""

# what a process says when it does not keep an entry, or does not use one
_SAID = re.compile(r"(no warm start before capture: .*?\)$|the warm-start entry .*?: captured$|"
                   r"is not kept for a warm start: .*$|fails its check.*$)", re.MULTILINE)


def run_twice(name: str, mode: str) -> dict:
    """The two processes' reports: difference from eager, entry counts, what they said."""
    root = Path(__file__).resolve().parents[2]
    found: dict = {"model": name, "mode": mode}
    with tempfile.TemporaryDirectory(prefix="ember-sweep-warm-") as folder:
        environment = dict(os.environ, EMBER_CACHE_DIR=folder,
                           EMBER_LOGS="perf,recompiles,fallbacks",
                           PYTHONPATH=os.pathsep.join(
                               [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
        for process in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-c", CHILD, name, mode],
                                  capture_output=True, text=True, env=environment,
                                  timeout=900)
            if done.returncode != 0:
                found[process] = {"failed": done.stderr.strip().splitlines()[-1:]}
                return found
            report = json.loads(done.stdout.strip().splitlines()[-1])
            report["said"] = sorted(set(_SAID.findall(done.stderr)))[:3]
            found[process] = report
    return found


def line(found: dict) -> str:
    head = f"{found['model']:<22} {found['mode']:<6}"
    for process in ("cold", "warm"):
        report = found.get(process)
        if report is None:
            continue
        if "failed" in report:
            return f"{head} {process} failed: {report['failed']}"
    cold, warm = found["cold"], found["warm"]
    started = warm["counts"]["hits"] > 0 and warm["counts"]["misses"] == 0
    state = "warm" if started else "CAPTURED"
    ok = max(cold["difference"], warm["difference"]) <= 1e-3
    said = "; ".join(cold["said"] + warm["said"])[:300]
    return (f"{head} {state:<8} {'ok' if ok else 'DIFFERENT':<9} kept {cold['counts']['kept']}"
            f" not {cold['counts']['not_kept']} | hits {warm['counts']['hits']} misses "
            f"{warm['counts']['misses']} refused {warm['counts']['refused']}  {said}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--modes", nargs="*", default=["infer"])
    parser.add_argument("--json")
    options = parser.parse_args(argv)
    from ember.bench.model_sweep_models import cases

    results = []
    for name in cases():
        if options.only and name not in options.only:
            continue
        for mode in options.modes:
            results.append(run_twice(name, mode))
            print(line(results[-1]), flush=True)
    warm = sum(1 for r in results if "warm" in r and "counts" in r["warm"]
               and r["warm"]["counts"]["hits"] and not r["warm"]["counts"]["misses"])
    print(f"{warm} of {len(results)} start warm before capture")
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
