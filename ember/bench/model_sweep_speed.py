"""The model sweep's architectures (ember/bench/model_sweep_models.py), tiny and random, timed
under eager and under ember.compile in one process, in interleaved rounds: where does ember
cost more than eager? The sweep itself (ember/bench/model_sweep.py) judges answers and
graphs; this judges the steady state a user meets on the CPU once the compile is done.

    python3 -m ember.bench.model_sweep_speed [--only mistral swin] [--modes infer,train]
        [--rounds 5] [--calls 10] [--json out.json]

Per model and mode: ms per call of eager and of ember (the median of the rounds; each round
both variants in turn make `--calls` calls), their ratio, the spread, and the first call's
seconds. Inference is the model's forward under no_grad; training is the forward, the loss
and its backward, the gradients then set to None as a training loop's zero_grad() does (no
optimizer: the sweep's models have no step of their own; gradients accumulated from call to
call instead measure the C library's allocator: ember's backward hands every parameter's
gradient over at once, and the memory freed after their sums goes back to the OS, to be
faulted in again on the next call — MLP-Mixer 9-13k page faults a call against eager's
4-5k, 1.2x eager's time, 0.9x with zero_grad). The models
are small (two layers, hidden size 64): the figures weigh what a call costs around its
arithmetic (guards, the runner, launches) far more than the zoo's full-size models do, so a
ratio above 1 here is an overhead to find, and a model under 1 may gain less at full size.
At the end: the geometric mean of the ratios per mode and the models above 1.05.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ember.bench.model_sweep import build_case
from ember.bench.model_sweep_models import SEED, cases
from ember.bench.zoo_ab import interleaved

SLOWER = 1.05  # (a ratio above this is listed as ember costing more than eager)


def _call(model: Any, batch: dict[str, Any], forward: Callable, loss: Callable, mode: str
          ) -> None:
    torch.manual_seed(SEED)  # (a model that draws in its forward draws the same each call)
    if mode == "infer":
        forward(model, batch)
    else:
        loss(model, batch).backward()
        model.zero_grad(set_to_none=True)


def time_case(name: str, make: Callable[[], tuple], mode: str, rounds: int, calls: int
              ) -> dict[str, Any]:
    """One model in one mode, eager against ember, timed round by round."""
    import ember
    from ember.bench.harness import wait_for_ember

    found: dict[str, Any] = {"model": name, "mode": mode}
    case = build_case(make, found)
    if case is None:
        return found
    model, batch, forward, loss = case
    model.train(mode == "train")
    compiled = ember.compile(copy.deepcopy(model))
    runs = {"eager": model, "ember": compiled}
    try:
        with torch.set_grad_enabled(mode == "train"):
            started = time.perf_counter()
            _call(compiled, batch, forward, loss, mode)
            found["first_call_s"] = time.perf_counter() - started
            for _ in range(2):  # (the first calls may run eagerly beside the compile)
                _call(model, batch, forward, loss, mode)
                _call(compiled, batch, forward, loss, mode)
            wait_for_ember()
            times = interleaved({variant: functools.partial(_call, module, batch, forward,
                                                            loss, mode)
                                 for variant, module in runs.items()},
                                rounds, calls, lambda: None)
    except Exception as error:  # noqa: BLE001 (said, and the sweep goes on)
        found["status"] = f"raised: {type(error).__name__}: {str(error)[:160]}"
        return found
    for variant, samples in times.items():
        found[f"{variant}_ms"] = statistics.median(samples)
        found[f"{variant}_spread"] = (min(samples), max(samples))
    found["ratio"] = found["ember_ms"] / found["eager_ms"]
    found["status"] = "slower" if found["ratio"] > SLOWER else "ok"
    return found


def _line(found: dict[str, Any]) -> str:
    if "ratio" not in found:
        return f"  {found['model']:<34} {found['mode']:<6} {found['status']}"
    return (f"  {found['model']:<34} {found['mode']:<6} eager {found['eager_ms']:8.3f} ms  "
            f"ember {found['ember_ms']:8.3f} ms  x{found['ratio']:5.2f}  "
            f"(ember {found['ember_spread'][0]:.3f}-{found['ember_spread'][1]:.3f})  "
            f"first call {found['first_call_s']:.2f} s"
            + ("  ** slower than eager" if found["status"] == "slower" else ""))


def summary(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in results):
        ratios = [r["ratio"] for r in results if r["mode"] == mode and "ratio" in r]
        if not ratios:
            continue
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        slower = [r for r in results if r["mode"] == mode and r.get("status") == "slower"]
        lines.append(f"{mode}: {len(ratios)} models, geometric mean ember/eager "
                     f"{geomean:.2f}; above {SLOWER}: {len(slower)}"
                     + (f" ({', '.join(r['model'] for r in slower)})" if slower else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json")
    options = parser.parse_args()
    found = cases()
    names = options.only or list(found)
    unknown = [name for name in names if name not in found]
    if unknown:
        raise SystemExit(f"not in the sweep: {', '.join(unknown)}")
    results = []
    for name in names:
        for mode in options.modes.split(","):
            results.append(time_case(name, found[name], mode, options.rounds, options.calls))
            print(_line(results[-1]), flush=True)
            if options.json:
                with open(options.json, "w") as file:
                    json.dump(results, file, indent=1)
    for line in summary(results):
        print(line)


if __name__ == "__main__":
    main()
