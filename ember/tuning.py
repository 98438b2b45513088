"""mode="max-autotune": what every backend's tuner shares. A kernel's candidate configurations
are timed on real-size inputs, the fastest is kept, and the choice is recorded in the disk
cache (EMBER_CACHE_DIR/tune) so that a later process reads it instead of timing again.

Takes, per kernel: a key (what the kernel is, on what machine), candidates (label -> a run
of the kernel built in that configuration) and a check that each candidate agrees with the
default configuration. Gives the chosen label. Says on EMBER_LOGS=perf what was tried and
what won. It never changes what a kernel computes: a candidate that disagrees with the
default's result is dropped, and the default wins ties (within MARGIN: timings are noisy).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from ember import config, logs
from ember.runtime import disk_cache
from ember.runtime.build import BuildError

FORMAT = "ember-tune-1"
KIND = "tune"
DEFAULT = "default"
# A candidate replaces the default only when it is this much faster (a 2-core machine shared
# with other work moves a kernel's median by a few percent from one run to the next).
MARGIN = 0.05
SAMPLES = 5            # timed samples per candidate, interleaved; the median is kept
SAMPLE_SECONDS = 2e-4  # each sample repeats the kernel until it lasts about this long
# NOTE: OpenMP's worker threads spin for up to ~20 ms after a parallel region ends: a serial
# candidate timed right after a parallel one shares its cores with them (on this 2-core
# machine: ~20 ms for a 16K-element tanh kernel instead of ~8 us). So parallel candidates are
# timed after the others (`apart`), and each sample starts after a short pause.
SETTLE_SECONDS = 1e-3
SPIN_SECONDS = 0.02  # how long libgomp's workers spin at most (GOMP_SPINCOUNT's default)

# What this process's tuners did (tests count with it): kernels tuned by timing, candidate
# measurements made, choices read back from the disk cache, candidates dropped as wrong.
counts = {"tuned": 0, "timings": 0, "recorded": 0, "disagreed": 0}


@dataclasses.dataclass
class Tuned:
    """One kernel's outcome: the label kept, and each candidate's median seconds (empty
    when read from the disk cache). The bench reads these (ember/bench/autotune.py)."""

    graph: str
    kernel: str
    choice: str
    seconds: dict[str, float]
    from_cache: bool


# every outcome in this process, in order (the bench prints them)
history: list[Tuned] = []


def key(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in (FORMAT, *parts):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def choose(graph: str, kernel: str, what: str, entry_key: str,
           candidates: dict[str, Callable[[], Callable[[], None]]],
           synchronize: Callable[[], None] = lambda: None, samples: int = SAMPLES,
           margins: dict[str, float] | None = None,
           apart: frozenset[str] = frozenset(),
           timer: Callable[[Callable[[], None]], float] | None = None) -> str:
    """The label to build `kernel` with. `candidates`: label -> a function that prepares the
    candidate (its inputs, checked against the default's result) and returns its run, or
    raises Disagrees; the DEFAULT label comes first. Read from the disk cache under
    `entry_key` when an earlier process tuned it; else timed (`samples` per candidate) and
    recorded there. `margins`: what a candidate must gain over the default to replace it,
    where that is more than MARGIN (a cost its own timing cannot see); `apart`: candidates
    timed after all the others (those that leave threads spinning: see `measure`); `timer`:
    run -> seconds per run, where the wall clock around runs is not the candidates' cost (a
    GPU's kernels, shorter than their launches: `GpuTimer`)."""
    recorded = _read(entry_key)
    if recorded in candidates:
        counts["recorded"] += 1
        history.append(Tuned(graph, kernel, recorded, {}, True))
        logs.channel("perf").info("%s %s (%s): max-autotune's choice %s read from the disk "
                                  "cache (nothing timed)", graph, kernel, what, recorded)
        return recorded
    runs: dict[str, Callable[[], None]] = {}
    dropped = []
    for label, prepare in candidates.items():
        try:
            runs[label] = prepare()
        except Disagrees as error:
            counts["disagreed"] += 1
            dropped.append(f"{label} ({error})")
    with _timing:  # (a training graph's forward and backward are compiled side by side)
        seconds = measure(runs, synchronize, samples, apart, timer)
    counts["tuned"] += 1
    choice = fastest(seconds, margins)
    history.append(Tuned(graph, kernel, choice, seconds, False))
    if logs.enabled("perf"):
        tried = ", ".join(f"{label} {s * 1e6:.1f} us" for label, s in seconds.items())
        won = "the default stays" if choice == DEFAULT else \
            f"{choice} wins ({seconds[DEFAULT] / seconds[choice]:.2f}x the default's speed)"
        logs.channel("perf").info("%s %s (%s): max-autotune tried %s; %s%s", graph, kernel,
                                  what, tried, won,
                                  f"; dropped as wrong: {', '.join(dropped)}" if dropped else "")
    _write(entry_key, {"choice": choice, "seconds": seconds, "what": what})
    return choice


_timing = threading.Lock()


def guarded(graph: str, tune: Callable[[], dict], *arguments: Any) -> dict:
    """`tune(*arguments)`, or {} (every kernel as the heuristics build it) when tuning fails:
    a failure to tune never costs the graph its compiled form (said on EMBER_LOGS=perf; an
    internal error is raised under EMBER_LOGS=raise, for ember's own tests, but not the
    machine's: a compiler that fails, a file that cannot be written)."""
    try:
        return tune(*arguments)
    except Exception as error:  # noqa: BLE001
        if "raise" in config.settings.logs and not isinstance(error, (BuildError, OSError)):
            raise
        logs.channel("perf").info("%s: max-autotune could not tune its kernels (%s: %s); they "
                                  "are built as the heuristics choose", graph,
                                  type(error).__name__, error)
        return {}


class Disagrees(ValueError):
    """A candidate's result differs from the default configuration's (the message says
    where): it is never chosen."""


def fastest(seconds: dict[str, float], margins: dict[str, float] | None = None) -> str:
    """The fastest label of those that beat the default by their margin (MARGIN unless
    `margins` says otherwise); the default when none does."""
    if DEFAULT not in seconds:
        return min(seconds, key=seconds.get)
    margins = margins or {}
    winners = {label: time for label, time in seconds.items() if label == DEFAULT or
               time <= seconds[DEFAULT] * (1 - margins.get(label, MARGIN))}
    return min(winners, key=winners.get)


def measure(runs: dict[str, Callable[[], None]], synchronize: Callable[[], None],
            samples: int = SAMPLES, apart: frozenset[str] = frozenset(),
            timer: Callable[[Callable[[], None]], float] | None = None) -> dict[str, float]:
    """Median seconds per run of each candidate: `samples` samples each, the candidates taken
    in turn within each round (a burst of other work then slows them all alike). Those in
    `apart` (OpenMP-parallel ones, whose worker threads go on spinning for milliseconds after
    each region) have their rounds after the others' are done. `timer`: run -> seconds per
    run, in place of the wall clock around repeated runs."""
    order = [label for label in runs if label not in apart] + \
        [label for label in runs if label in apart]
    if timer is not None:
        timed: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(samples):
            for label in order:
                timed[label].append(timer(runs[label]))
        counts["timings"] += len(runs)
        return {label: statistics.median(values) for label, values in timed.items()}
    if apart:  # (the checks just ran the parallel candidates: let their threads go to sleep)
        time.sleep(SPIN_SECONDS)
    repeats = {}
    for label in order:
        time.sleep(SETTLE_SECONDS)
        start = time.perf_counter()
        runs[label]()
        synchronize()
        once = max(time.perf_counter() - start, 1e-7)
        repeats[label] = max(1, min(1000, int(SAMPLE_SECONDS / once)))
    found: dict[str, list[float]] = {label: [] for label in runs}
    collecting = gc.isenabled()
    gc.disable()
    try:
        for group in ([label for label in order if label not in apart],
                      [label for label in order if label in apart]):
            for _ in range(samples if group else 0):
                for label in group:
                    time.sleep(SETTLE_SECONDS)
                    start = time.perf_counter()
                    for _ in range(repeats[label]):
                        runs[label]()
                    synchronize()
                    found[label].append((time.perf_counter() - start) / repeats[label])
    finally:
        if collecting:
            gc.enable()
    counts["timings"] += len(runs)
    return {label: statistics.median(values) for label, values in found.items()}


# -- the record in the disk cache -----------------------------------------------------------
def _read(entry_key: str) -> str | None:
    path = disk_cache.entry_path(KIND, entry_key, ".json")
    try:
        data = path.read_bytes()
        recorded = path.with_suffix(".digest").read_text().strip()
    except OSError:
        return None
    if recorded != disk_cache.digest(entry_key, data):
        logs.channel("fallbacks").info("the max-autotune record %s fails its check: the "
                                       "kernel is tuned again", path)
        return None
    try:
        choice = json.loads(data)["choice"]
    except (ValueError, KeyError, TypeError):
        return None
    disk_cache.touch(path)
    return choice if isinstance(choice, str) else None


def _write(entry_key: str, record: dict) -> None:
    """Record the choice (never raises: an unwritable cache only means tuning again)."""
    data = json.dumps(record, sort_keys=True).encode()
    try:
        with disk_cache.building(KIND, entry_key, ".json") as path:
            disk_cache.write_whole(path, entry_key, data)
    except OSError as error:
        logs.channel("perf").info("max-autotune's choice is not recorded: %s", error)


# -- inputs and the check, for every backend ------------------------------------------------
def allocate(shape: tuple, strides: tuple, dtype, device, integers: int):
    """A tensor laid out by `strides`, filled for timing: floats standard normal (seeded),
    integers with `integers` (0 where they may index: always in range), booleans false."""
    import torch

    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
    if dtype.is_floating_point:
        generator = torch.Generator(device=device).manual_seed(0)
        flat = torch.randn(span, generator=generator, device=device).to(dtype)
    else:
        flat = torch.full((span,), 0 if dtype is torch.bool else integers, dtype=dtype,
                          device=device)
    return flat.as_strided(shape, strides)


def check_same(label: str, reference: list, found: list) -> None:
    """Raise Disagrees unless each of `found` equals the default's `reference` (floats
    within what another order of summation changes)."""
    import torch

    for position, (want, got) in enumerate(zip(reference, found)):
        if want.dtype.is_floating_point:
            rtol = 1e-4 if want.dtype.itemsize >= 4 else 1e-2
            finite = want[torch.isfinite(want)]
            scale = float(finite.abs().max()) if finite.numel() else 1.0
            same = torch.allclose(got.float(), want.float(), rtol=rtol,
                                  atol=rtol * max(scale, 1.0), equal_nan=True)
        else:
            same = torch.equal(got, want)
        if not same:
            raise Disagrees(f"its result {position} differs from the default's")
