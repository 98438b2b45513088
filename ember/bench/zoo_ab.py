"""Zoo models under several variants in one process, timed in interleaved rounds: an A/B of
ember's settings that a noisy host cannot fake (between processes and between device calls
this H200's host moved torch.compile's GPT-2 from 2.35 to 3.73 ms; inside one process, round
after round, the variants share whatever the host does).

    python3 -m ember.bench.zoo_ab efficientnet mobilenetv3 \\
        --variants eager,tc,ember,ember:convolution_layout=never [--rounds 5 --calls 20]
        [--mode infer|train] [--device cpu --size quick]

A variant `ember:name=value,...` compiles with those `ember.config` settings overridden
(the compile and the first calls run under them; what the settings change is decided then);
a name `tile.field` overrides that field of the Triton tile heuristics
(ember/codegen/triton_tiling.py's Heuristics) while the variant compiles and its kernels build,
e.g. `ember:tile.column_rblock=64,tile.split_target_programs=1024`.
Per model and variant: the median of the rounds' ms per call (each round `--calls` calls and a
device sync), the spread (min-max), the ratio to the first variant, the largest difference of
the third call's answer (once ember's kernels are built) from the first variant's, and the
first call's seconds (compile included; the caches are whatever the process and its disk
had: run on a fresh machine for a cold figure).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import ember
from ember import config
from ember.bench import zoo
from ember.bench.harness import wait_for_ember
from ember.codegen import triton_tiling as tiling


def variants_of(text: str) -> list[str]:
    """`--variants` split into variants: a comma starts a new one only before `eager`, `tc` or
    `ember` (`ember:a=1,b=2,tc` is two variants, the first with two settings)."""
    found: list[str] = []
    for part in text.split(","):
        if found and part.split(":")[0] not in ("eager", "tc", "ember"):
            found[-1] += "," + part
        else:
            found.append(part)
    return found


def _settings(variant: str, prefix: str = "") -> dict[str, Any]:
    """`ember:a=1,b=always` -> {"a": 1, "b": "always"}, typed as the setting's default: the
    `ember.config` settings, or with `prefix="tile."` the tile heuristics' fields. An ember
    variant compiles without warm starts (unless it says otherwise): another variant's entry
    of the same graph would serve it, whatever tiles or settings it names."""
    found: dict[str, Any] = {}
    if not prefix and variant.startswith("ember"):
        found["warm_start"] = False
    if ":" not in variant:
        return found
    defaults = tiling.HEURISTICS if prefix else config.settings
    fields = {field.name for field in dataclasses.fields(defaults)}
    for pair in variant.split(":", 1)[1].split(","):
        name, _, text = pair.partition("=")
        if name.startswith("tile.") != bool(prefix):
            continue
        name = name.removeprefix(prefix)
        if name not in fields:
            where = "the tile heuristics have no field" if prefix else \
                "ember.config has no setting"
            raise SystemExit(f"{variant}: {where} {name!r}")
        current = getattr(defaults, name)
        found[name] = text.lower() in ("1", "true", "on") if isinstance(current, bool) else \
            type(current)(text) if current is not None else text
    return found


@contextlib.contextmanager
def compiling_as(variant: str) -> Iterator[None]:
    """The variant's ember.config settings and tile heuristics while its graphs compile, until
    the kernels ember builds beside its first calls are built (under its tiles)."""
    default_tiles = tiling.HEURISTICS
    tiling.HEURISTICS = dataclasses.replace(default_tiles, **_settings(variant, "tile."))
    try:
        with config.override(**_settings(variant)):
            yield
            wait_for_ember()
    finally:
        tiling.HEURISTICS = default_tiles


def synchronizer(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def interleaved(runs: dict[str, Callable[[], Any]], rounds: int, calls: int,
                sync: Callable[[], None]) -> dict[str, list[float]]:
    """Each variant's ms per call in each round: `rounds` rounds, in each every variant in
    turn makes `calls` calls (under its settings) and a sync."""
    times: dict[str, list[float]] = {variant: [] for variant in runs}
    for _ in range(rounds):
        for variant, run in runs.items():
            with config.override(**_settings(variant)):
                sync()
                started = time.perf_counter()
                for _ in range(calls):
                    run()
                sync()
            times[variant].append((time.perf_counter() - started) * 1e3 / calls)
    return times


def _prepared(spec: zoo.ZooModel, variant: str, mode: str, size: str, device: str):
    """(step, args, the third call's answer, the first call's seconds) with the model
    compiled as the variant says."""
    step, args = zoo.instantiate(spec, mode, size, device)
    sync = synchronizer(device)
    with compiling_as(variant):
        if variant.startswith("ember"):
            step.model_slot[0] = ember.compile(step.model)
        elif variant == "tc":
            step.model_slot[0] = torch.compile(step.model)
        with torch.set_grad_enabled(mode == "train"):
            sync()
            started = time.perf_counter()
            step(*args)
            sync()
            seconds = time.perf_counter() - started
            step(*args)
            wait_for_ember()  # (the first calls may have run eagerly beside the compile)
            answer = step(*args)  # (every variant's third call: a training step's too)
    return step, args, answer, seconds


def _difference(a: Any, b: Any) -> float:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.float() - b.float()).abs().max().item()
    return float("nan")


def compare(name: str, variants: list[str], rounds: int, calls: int, mode: str,
            size: str, device: str) -> None:
    spec = zoo.find(name)
    prepared = {}
    for variant in variants:  # (said at once: a run cut short still tells its first calls)
        prepared[variant] = _prepared(spec, variant, mode, size, device)
        print(f"   {name} {variant}: first call {prepared[variant][3]:.2f} s", flush=True)
    reference = prepared[variants[0]][2]
    runs = {variant: functools.partial(step, *args)
            for variant, (step, args, _, _) in prepared.items()}
    with torch.set_grad_enabled(mode == "train"):
        times = interleaved(runs, rounds, calls, synchronizer(device))
    base = statistics.median(times[variants[0]])
    print(f"== {name} ({mode}, {device}, {size}): {rounds} rounds of {calls} calls",
          flush=True)
    for variant in variants:
        median = statistics.median(times[variant])
        print(f"  {variant:<40} {median:8.3f} ms  ({min(times[variant]):.3f}-"
              f"{max(times[variant]):.3f})  x{median / base:5.2f}  "
              f"diff {_difference(prepared[variant][2], reference):.3g}  "
              f"first call {prepared[variant][3]:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--variants", default="eager,tc,ember")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--mode", default="infer", choices=["infer", "train"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--size", default="full", choices=["full", "quick", "tiny"])
    options = parser.parse_args()
    for name in options.models:
        compare(name, variants_of(options.variants), options.rounds, options.calls,
                options.mode, options.size, options.device)


if __name__ == "__main__":
    main()
