"""mode="max-autotune" on the Triton backend: per kernel (a matmul with its epilogue
included), the tiles of ember/codegen/triton_candidates.py — block sizes, warps, stages —
timed on real-size inputs on the GPU.

Takes a plan (after matmul epilogue fusion); gives each kernel's chosen Tiling by name, for
write_module. The candidates of every kernel not already in the disk cache go into one
module, compiled together (Triton's compiles run side by side), each checked against the
default's result on the same inputs, then timed (ember/tuning.py). Under TRITON_INTERPRET=1
the candidates run in Triton's interpreter: their answers are checked as on a GPU, their
timings mean nothing. Symbolic graphs are not tuned.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from ember import logs, torch_internals, tuning
from ember.codegen.triton import KernelLaunches, TritonKernelWriter
from ember.codegen.triton_candidates import candidate_tilings
from ember.codegen.triton_module import write_kernel
from ember.codegen.triton_rules import prelude
from ember.codegen.triton_tiling import Tiling, choose_tiling
from ember.runtime import triton_launch
from ember.schedule.plan import Buffer, Kernel, Plan


def candidates(kernel: Kernel, plan: Plan) -> dict[str, Tiling]:
    """The default tile first, then the others (ember/codegen/triton_candidates.py)."""
    first = TritonKernelWriter(kernel, plan, None)
    first.write()
    default = choose_tiling(first)
    return {tuning.DEFAULT: default, **candidate_tilings(first, default)}


def machine(device_index: int | None) -> str:
    import triton

    if device_index is None:
        return f"triton {triton.__version__} interpreter"
    return f"triton {triton.__version__} {torch.cuda.get_device_name(device_index)} " \
           f"{torch.cuda.get_device_capability(device_index)}"


def choose(plan: Plan, label: str, device_index: int | None, dependent_launch: bool
           ) -> dict[str, Tiling]:
    """Each kernel's tuned tile (those whose default stays are left out); `device_index`
    None: the interpreter's run."""
    if plan.graph.symbols:
        logs.channel("perf").info("%s: max-autotune leaves a graph with symbolic sizes as the "
                                  "heuristics build it (its sizes change per call)", label)
        return {}
    work = []
    for kernel in plan.kernels:
        written: dict[str, tuple[KernelLaunches, Tiling]] = {}
        for name, tiling in candidates(kernel, plan).items():
            launches = write_kernel(kernel, plan, tiling, dependent_launch=dependent_launch)
            text = _text(launches)
            if all(text != _text(other) for other, _ in written.values()):
                written[name] = (launches, tiling)
        if len(written) > 1:
            work.append((kernel, written))
    renamed = {}  # (kernel, candidate) -> its launches, each Triton kernel renamed
    for kernel, written in work:
        for index, (name, (launches, _)) in enumerate(written.items()):
            renamed[(kernel.name, name)] = [
                dataclasses.replace(k, name=f"{k.name}__{index}",
                                    text=k.text.replace(f"def {k.name}(",
                                                        f"def {k.name}__{index}(", 1))
                for k in launches.kernels]
    compiled = functools.cache(lambda: _compile(renamed, device_index))
    chosen = {}
    for kernel, written in work:
        key = tuning.key("triton", machine(device_index),
                         *(f"{name}\n{_text(launches, kernel.name)}"
                           for name, (launches, _) in written.items()))
        what = _describe(kernel)
        runs = _Runs(kernel, written, device_index,
                     lambda name, k=kernel: compiled()[(k.name, name)])
        choice = tuning.choose(label, kernel.name, what, key,
                               {name: functools.partial(runs.prepare, name) for name in written},
                               runs.synchronize, 1 if device_index is None else tuning.SAMPLES,
                               timer=None if device_index is None else GpuTimer(device_index))
        if choice != tuning.DEFAULT:
            chosen[kernel.name] = written[choice][1]
    return chosen


class GpuTimer:
    """A candidate's seconds per run on the GPU alone. Timing the host's clock around
    launches measures the launches when the kernels are shorter (most are: 5-40 us): so a
    spinning kernel holds the stream while `repeats` runs are queued behind it, and CUDA
    events around the queued runs time what the GPU spent on them, back to back (as in a
    replayed CUDA graph)."""

    BUDGET = 5e-4            # seconds of GPU work per sample
    CLOCK = 2.5e9            # cycles a second, at least the GPU's (a longer spin costs only time)

    def __init__(self, device_index: int):
        self.device_index = device_index
        self.plans: dict[Callable, tuple[int, float]] = {}  # run -> (repeats, launch seconds)

    def __call__(self, run: Callable[[], None]) -> float:
        if run not in self.plans:
            self.plans[run] = self._plan(run)
        repeats, launch = self.plans[run]
        return self._time(run, repeats, launch)

    def _plan(self, run: Callable[[], None]) -> tuple[int, float]:
        torch.cuda.synchronize(self.device_index)
        start = time.perf_counter()
        for _ in range(10):
            run()
        launch = (time.perf_counter() - start) / 10
        once = self._time(run, 10, launch)
        return max(10, min(1000, int(self.BUDGET / max(once, 1e-7)))), launch

    def _time(self, run: Callable[[], None], repeats: int, launch: float) -> float:
        with torch.cuda.device(self.device_index):
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch_internals.cuda_spin(int((repeats * launch * 2 + 5e-5) * self.CLOCK))
            begin.record()
            for _ in range(repeats):
                run()
            end.record()
            end.synchronize()
        return begin.elapsed_time(end) / 1e3 / repeats


def _text(launches: KernelLaunches, name: str | None = None) -> str:
    text = "\n".join(k.text for k in launches.kernels)
    return text.replace(name, "KERNEL") if name else text


def _describe(kernel: Kernel) -> str:
    if kernel.matmul is not None:
        return f"matmul {list(kernel.matmul.a.shape)}x{list(kernel.matmul.b.shape)} " \
               f"with its epilogue"
    return f"{'reduction' if kernel.axes else 'pointwise'} {list(kernel.shape)}"


def _compile(renamed: dict, device_index: int | None) -> dict:
    kernels = [k for launches in renamed.values() for k in launches]
    text = "\n\n\n".join([prelude().rstrip(), *(k.text for k in kernels)]) + "\n"
    module = triton_launch.load_module(text)
    if device_index is None:
        functions = triton_launch.interpreted_kernels(module, kernels)
    else:
        functions = triton_launch.compile_kernels(module, kernels, [[True] * len(k.arguments)
                                                                    for k in kernels],
                                                  device_index)
    by_name = dict(zip((k.name for k in kernels), zip(kernels, functions)))
    return {key: [by_name[k.name] for k in launches] for key, launches in renamed.items()}


class _Runs:
    """One kernel's candidates on shared real-size inputs: each checked against the
    default's result, then handed to the timer."""

    def __init__(self, kernel: Kernel, written: dict, device_index: int | None,
                 compiled: Callable[[str], list]):
        self.device = torch.device("cpu") if device_index is None else \
            torch.device("cuda", device_index)
        self.device_index = device_index
        self.compiled = compiled
        default = written[tuning.DEFAULT][0]
        integers = 0 if any(k.checks for k in default.kernels) else 1
        self.tensors: dict[Any, torch.Tensor] = {}
        for launches, _ in written.values():
            for buffer in launches.arguments:
                if buffer not in self.tensors:
                    self.tensors[buffer] = tuning.allocate(buffer.shape, buffer.strides,
                                                           buffer.dtype, self.device, integers)
        self.pristine = {b: t.clone() for b, t in self.tensors.items()}
        self.workspaces = {name: {id(space): torch.zeros(space.shape, dtype=space.dtype,
                                                         device=self.device)
                                  for space in launches.workspaces}
                           for name, (launches, _) in written.items()}
        self.stored = list(dict.fromkeys(item.buffer.root() for item in kernel.stores))
        self.reference: list[torch.Tensor] | None = None

    def synchronize(self) -> None:
        if self.device_index is not None:
            torch.cuda.synchronize(self.device_index)

    def prepare(self, name: str) -> Callable[[], None]:
        calls = []
        for kernel, function in self.compiled(name):
            arguments = [self.workspaces[name][id(b)] if not isinstance(b, Buffer)
                         else self.tensors[b] for b in kernel.arguments]
            calls.append(self._call(function, arguments))

        def run() -> None:
            for call in calls:
                call()

        for buffer, tensor in self.tensors.items():  # (a kernel may write what it reads)
            tensor.copy_(self.pristine[buffer])
        run()
        self.synchronize()
        results = [self.tensors[b].clone() for b in self.stored]
        if self.reference is None:
            self.reference = results
        else:
            tuning.check_same(name, self.reference, results)
        return run

    def _call(self, function: Any, arguments: list[torch.Tensor]) -> Callable[[], None]:
        if isinstance(function, triton_launch.DeviceLaunch):
            launcher, *fixed = function.prefix()
            stream = torch_internals.current_raw_stream(self.device_index)
            gx, gy, gz = function.grid
            return lambda: launcher(gx, gy, gz, stream, *fixed, *arguments)
        return lambda: function(*arguments)
