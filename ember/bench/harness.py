"""Timing primitives: steady-state `benchmark`, cold `first_call` in a fresh process, break-even.

`benchmark` times a callable in this process (warm-up, device sync, many samples, median and
quartiles). `first_call` starts `trial.py` in a fresh interpreter with empty compiler caches and
reads back what it measured. Nothing here knows about particular workloads or reports.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ember.partition import ISLAND_SAYS

# A sample shorter than this is dominated by timer resolution and loop overhead, so fast
# functions are timed in batches of calls whose total reaches it.
SAMPLE_TARGET_S = 2e-4
IMPORT_LIMIT_S = 300.0


@dataclasses.dataclass
class Timing:
    """Seconds per call, one value per sample; each sample averages `number` calls."""

    samples: list[float]
    number: int = 1

    @property
    def calls(self) -> int:
        return len(self.samples) * self.number

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def q1(self) -> float:
        return _quantile(self.samples, 0.25)

    @property
    def q3(self) -> float:
        return _quantile(self.samples, 0.75)

    @property
    def minimum(self) -> float:
        return min(self.samples)

    @property
    def maximum(self) -> float:
        return max(self.samples)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median: 0.02 means the middle half of the
        samples lies within 2% of the median's size."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else 0.0

    def __str__(self) -> str:
        return (f"{format_ms(self.median)} ms/call (IQR {format_ms(self.q1)}-"
                f"{format_ms(self.q3)} ms, {self.calls} calls)")

    def to_json(self) -> dict[str, Any]:
        return dict(median_s=self.median, q1_s=self.q1, q3_s=self.q3, min_s=self.minimum,
                    max_s=self.maximum, calls=self.calls, number=self.number,
                    samples_s=list(self.samples))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timing:
        return cls(samples=list(data["samples_s"]), number=int(data["number"]))


def _quantile(values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), exact for one sample."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def format_ms(seconds: float) -> str:
    """Milliseconds with about three significant digits and no exponent: 0.152, 12.3, 490."""
    value = seconds * 1e3
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def tensors_in(value: Any) -> list[Any]:
    """The tensors in nested args (lists, tuples, dicts) and in a module's parameters/buffers."""
    import torch

    found: list[Any] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, torch.nn.Module):
            found.extend(item.parameters())
            found.extend(item.buffers())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return found


def device_sync(*values: Any) -> Callable[[], None]:
    """The call that waits for queued device work touching `values`: torch.cuda.synchronize
    when any tensor lives on a CUDA device, else a no-op (so CPU-only torch never touches
    torch.cuda)."""
    import torch

    if any(t.device.type == "cuda" for t in tensors_in(list(values))):
        return torch.cuda.synchronize
    return lambda: None


def wait_for_ember() -> None:
    """Before a steady state: ember's compiles beside the first calls done (kernels in, the
    backwards deferred to a graph's next call started: calls meanwhile run eagerly) and its
    warm-start keeps written. A keep is Python on a thread of its own: timed beside it, calls
    that release the GIL wait up to a switch interval to take it back (a small GPT-2's
    decoding ran 3-5x slower for its first runs after the compile)."""
    backends = sys.modules.get("ember.backends")
    if backends is not None:
        backends.wait_for_background_compiles()
    warm_cache = sys.modules.get("ember.runtime.warm_cache")
    if warm_cache is not None:
        warm_cache.finish_keeps()


def benchmark(fn: Callable[..., Any], *args: Any, desc: str | None = None, warmup: int = 2,
              repeat: int = 20, min_time: float = 0.5, max_time: float = 20.0,
              warmup_time: float | None = None) -> Timing:
    """Steady-state time per call of `fn(*args)`: untimed calls, at least `warmup` of them
    and `warmup_time` seconds (default: 0.4 s, or `min_time` where shorter), then samples
    until at least `repeat` samples and `min_time` seconds (stopping at `max_time` once 3
    samples exist). Each sample ends with a device sync, so it is latency, launch overhead
    included. With `desc`, prints `desc: 0.15 ms/call`. Ember's work beside the first calls
    is waited for first (wait_for_ember).
    NOTE: the first calls that fill fresh memory are slower for a while after a process
    starts (a 64 MB output of layer_norm: 70-79 ms for its first three calls, then 8 ms, on
    this VM's host): two warm-up calls left them in the samples."""
    wait_for_ember()
    if warmup_time is None:
        warmup_time = min(0.4, min_time)
    sync = device_sync(fn, *args)
    started = time.perf_counter()
    calls = 0
    while calls < max(1, warmup) or time.perf_counter() - started < warmup_time:
        fn(*args)
        sync()
        calls += 1
    per_call = (time.perf_counter() - started) / calls
    number = max(1, math.ceil(SAMPLE_TARGET_S / per_call)) if per_call > 0 else 1000
    samples: list[float] = []
    gc.collect()
    # NOTE: a collection inside a sample would charge the garbage of earlier calls to it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        begun = time.perf_counter()
        while True:
            start = time.perf_counter()
            for _ in range(number):
                fn(*args)
                sync()
            end = time.perf_counter()
            samples.append((end - start) / number)
            elapsed = end - begun
            if len(samples) >= repeat and elapsed >= min_time:
                break
            if elapsed >= max_time and len(samples) >= min(3, repeat):
                break
    finally:
        if collecting:
            gc.enable()
    timing = Timing(samples, number)
    if desc is not None:
        print(f"{desc}: {format_ms(timing.median)} ms/call")
    return timing


def break_even(first_call_s: float, steady_s: float, eager_s: float) -> int | None:
    """The smallest call count n with first + (n-1)*steady <= n*eager: how many calls until
    compiling has paid for itself. None ("never") when the compiled steady state is not
    faster than eager (even if its first call were); 1 when the first call is no slower than an
    eager call."""
    if steady_s >= eager_s:
        return None
    if first_call_s <= eager_s:
        return 1
    n = max(1, math.ceil((first_call_s - steady_s) / (eager_s - steady_s)))
    # Floating-point rounding can leave ceil one off either way: settle on the exact inequality.
    while n > 1 and first_call_s + (n - 2) * steady_s <= (n - 1) * eager_s:
        n -= 1
    while first_call_s + (n - 1) * steady_s > n * eager_s:
        n += 1
    return n


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


@dataclasses.dataclass
class TimingOptions:
    warmup: int = 2
    repeat: int = 20
    min_time: float = 0.5
    max_time: float = 20.0


@dataclasses.dataclass
class Trial:
    """What a fresh process measured for one workload and one variant. `process_order` 0 means
    the workload ran first in its process (a cold process); later ones share a warm process
    with the workloads before them (their disk caches are still empty)."""

    workload: str
    variant: str
    size: str
    description: str | None = None
    process_order: int = 0
    first_call_s: float | None = None
    second_call_s: float | None = None
    # ember: from its first call's start to the end of its first compiled run (calls that
    # come while kernels still compile run eagerly, EMBER_EAGER_FIRST): what a first call
    # that returns at eager's pace leaves behind it
    compiled_after_s: float | None = None
    first_call_warm_cache_s: float | None = None
    import_torch_s: float | None = None
    import_ember_s: float | None = None
    build_s: float | None = None
    threads: int | None = None
    steady: Timing | None = None
    check: dict[str, Any] | None = None
    graphs: int | None = None
    kernels: int | None = None
    fallbacks: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None
    work: dict[str, float] | None = None  # bytes and flops of one call (the eager trial)
    # the zoo's ember trial: what ember.explain made of each call of the model (zoo.py), or
    # why explaining failed
    capture: list[dict[str, Any]] | str | None = None
    tokens_per_call: int | None = None  # a decoding loop's tokens made per call (tokens/s)

    @property
    def ok(self) -> bool:
        return self.error is None and (self.check is None or bool(self.check.get("ok")))

    def summary(self) -> str:
        """One line for the terminal: `first call 0.21 s, 0.15 ms/call (IQR 2%), matches eager`."""
        if self.error is not None:
            return f"ERROR {self.error.splitlines()[0][:300]}"
        parts = []
        if self.first_call_s is not None:
            parts.append(f"first call {self.first_call_s:.2f} s")
            if self.compiled_after_s is not None and \
                    self.compiled_after_s > self.first_call_s + 0.05:
                parts[-1] += f" (compiled after {self.compiled_after_s:.2f} s)"
        if self.steady is not None:
            parts.append(f"{format_ms(self.steady.median)} ms/call (IQR {self.steady.spread:.0%})")
        if self.kernels is not None:
            parts.append(f"{self.kernels} kernels in {self.graphs} graphs")
        if self.check is not None:
            parts.append("matches eager" if self.check.get("ok") else
                         f"FAIL {self.check.get('message')}")
        islands = [m for m in self.fallbacks if ISLAND_SAYS in m]
        others = [m for m in self.fallbacks if ISLAND_SAYS not in m]
        if others:
            parts.append(f"fell back to eager: {others[0]}")
        if islands:  # (the graph compiled around them)
            parts.append(f"{len(islands)} eager islands: {islands[0]}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["steady"] = self.steady.to_json() if self.steady else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trial:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        if values.get("steady"):
            values["steady"] = Timing.from_json(values["steady"])
        return cls(**values)


Progress = Callable[[str | None, str], None]


def child_environment(threads: int | None = None) -> dict[str, str]:
    """Ours, with ember's fallback channel on (so the child can report fallbacks), this ember
    first on the path (the child runs trial.py as a script, to time `import ember`) and, when
    given, the thread count of every OpenMP runtime (torch's, ember's and Inductor's kernels)."""
    import ember

    environ = dict(os.environ)
    # (a user's Python keeps modules' bytecode: the import times a child reports are not
    # compiles from source, where this machine's environment says to write none)
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if threads is not None:
        environ["OMP_NUM_THREADS"] = environ["MKL_NUM_THREADS"] = str(threads)
    channels = [c for c in environ.get("EMBER_LOGS", "").split(",") if c.strip()]
    environ["EMBER_LOGS"] = ",".join([*channels, "fallbacks"])
    root = str(Path(ember.__file__).resolve().parent.parent)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, environ.get("PYTHONPATH")) if p)
    return environ


def run_trials(workloads: list[str], variant: str, *, size: str = "full",
               timing: TimingOptions | None = None, check: bool = False,
               cache_root: Path | None = None, timeout: float = 600.0,
               threads: int | None = None, device: str | None = None,
               on_progress: Progress | None = None, logs: Path | None = None) -> list[Trial]:
    """Measure `variant` on each workload, in order, in one fresh Python process: the first call
    (capture and compile; every workload gets empty caches of its own under `cache_root`, so
    they are cold unless an earlier run filled that root), then with `timing` the steady state,
    and with `check` the outputs against eager. When the process dies or a workload runs past
    `timeout` seconds, that workload's Trial says so and the rest go on in a new process.
    `threads` sets OMP_NUM_THREADS for the process; `device` goes to builders that take one
    (the zoo's: "cuda"). `logs`: a folder that keeps each process's stderr
    (`<variant>-<n>.txt`: EMBER_LOGS's channels, where set). Failures come back in
    `Trial.error`, never as exceptions; every finished workload is announced as a
    `done: <summary>` progress line."""
    on_progress = on_progress or (lambda workload, line: None)
    results: dict[str, Trial] = {}
    pending = list(workloads)
    with tempfile.TemporaryDirectory(prefix="ember-trial-") as scratch_name:
        scratch = Path(scratch_name)
        caches = cache_root if cache_root is not None else scratch / "caches"
        attempt = 0
        while pending:
            attempt += 1
            result_path = scratch / f"results{attempt}.jsonl"
            log_path = scratch / f"stderr{attempt}.txt"
            command = [sys.executable, "-P", str(Path(__file__).with_name("trial.py")),
                       "--variant", variant, "--size", size, "--cache-root", str(caches),
                       "--result", str(result_path), "--workloads", *pending]
            if timing is not None:
                command += ["--timing", json.dumps(dataclasses.asdict(timing))]
            if check:
                command.append("--check")
            if device is not None:
                command += ["--device", device]
            with open(log_path, "w") as log:
                current, status = _run_child(command, child_environment(threads), log,
                                             timeout, on_progress)
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log_path, logs / f"{variant}-{attempt}.txt")
            if result_path.exists():
                for line in result_path.read_text().splitlines():
                    trial = Trial.from_json(json.loads(line))
                    results[trial.workload] = trial
            pending = [w for w in pending if w not in results]
            if pending:
                # The process stopped early: blame the workload it was running (or the first
                # one it never reported), then start over with the others.
                culprit = current if current in pending else pending[0]
                why = "ran past the time limit" if status is None else f"exited ({status})"
                results[culprit] = Trial(culprit, variant, size, error=(
                    f"the measuring process {why}: {_tail(log_path)}"))
                on_progress(culprit, "done: " + results[culprit].summary())
                pending.remove(culprit)
    return [results[w] for w in workloads]


def first_call(workload: str, variant: str = "ember", *, size: str = "full",
               timeout: float = 600.0) -> Trial:
    """The first call of `variant` on `workload` (a name from workloads.py or
    `file.py:builder`) in a fresh process with cold caches. `Trial.first_call_s` is the call
    alone; importing torch and ember is in `import_torch_s` / `import_ember_s`."""
    return run_trials([workload], variant, size=size, timeout=timeout)[0]


def _run_child(command: list[str], environ: dict[str, str], log: Any, timeout: float,
               on_progress: Progress) -> tuple[str | None, int | None]:
    """Run the child, passing each `workload<TAB>text` line of its stdout to `on_progress` as it
    comes, and (None, "") about once a second (so a terminal can show elapsed time). Returns
    the workload it was on last and its exit status, None when one ran past `timeout`."""
    # Its own session, so that a timeout also stops what it started (compile workers).
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                               env=environ, bufsize=1, start_new_session=True)
    try:
        return _follow(process, timeout, on_progress)
    except BaseException:  # Ctrl-C no longer reaches the child's session: pass it on
        _stop(process)
        raise


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _follow(process: subprocess.Popen, timeout: float,
            on_progress: Progress) -> tuple[str | None, int | None]:
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    current: str | None = None
    # Imports come before any workload and get a limit of their own: a busy machine must not
    # turn a slow `import torch` into a blamed workload.
    deadline = time.monotonic() + max(timeout, IMPORT_LIMIT_S)
    while True:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            line = ""
        if line is None:
            break
        workload, tab, text = line.partition("\t")
        if tab and workload != current:
            limit = max(timeout, IMPORT_LIMIT_S) if workload == "-" else timeout
            current, deadline = workload, time.monotonic() + limit
        on_progress(workload if tab else None, text)
        if time.monotonic() > deadline:
            _stop(process)
            reader.join(timeout=5)
            return current, None
    return current, process.wait()


def _tail(path: Path, lines: int = 6) -> str:
    """The last lines of a child's stderr on one line (a report cell, a list item)."""
    text = path.read_text(errors="replace") if path.exists() else ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " / ".join(kept)[-1000:] if kept else "(no output)"
