"""mode="max-autotune" on the C backend: per kernel, the OpenMP thread count (serial, half
the cores, all of them: a small kernel often loses to its parallel region's start) and, for
a reduction in column mode, the lanes per block, timed on real-size inputs.

Takes a plan; gives each kernel's chosen configuration (codegen/c.CTuning) by name, for
write_source. Every candidate of every kernel that is not already in the disk cache is built
in one C file (one compiler run), checked against the default's result on the same inputs,
and timed (ember/tuning.py). Symbolic graphs are not tuned (their sizes change per call).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Callable

import torch

from ember import config, logs, tuning
from ember.codegen.c import CKernelWriter, CTuning, KernelSource, write_kernel
from ember.codegen.c_loops import plan_groups
from ember.codegen.c_rules import INCLUDES, PRELUDE, vector_math_declarations
from ember.runtime import build
from ember.schedule.plan import Kernel, Plan

PARALLEL_MARGIN = 0.25
COLUMN_WIDTHS = (64, 1024)  # besides the default (c_loops.COLUMN_WIDTH)


def cores() -> int:
    """The threads an OpenMP parallel region gets by default here."""
    text = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    return build.usable_cores()


def candidates(kernel: Kernel, plan: Plan) -> dict[str, CTuning | None]:
    """A kernel's candidate configurations (at most 5), the default (None) first: the thread
    counts the heuristics did not pick, and other column widths where it has column mode."""
    first = CKernelWriter(kernel, plan)
    first.write()
    found: dict[str, CTuning | None] = {tuning.DEFAULT: None}
    count = cores()
    # (whether the default runs in parallel is the second writing's decision: it weighs the
    # costly calls the first one counted)
    parallel = "omp parallel" in write_kernel(kernel, plan).text
    # (those the default does not already run: serial, or parallel on every core)
    others = {1, count // 2} - {count} if parallel else {count // 2, count} - {0, 1}
    for threads in sorted(others):
        found["serial" if threads == 1 else f"threads={threads}"] = CTuning(threads=threads)
    if plan_groups(first)[2] is not None:
        for width in COLUMN_WIDTHS:
            found[f"column={width}"] = CTuning(column=width)
    return found


def _renamed(source: KernelSource, name: str) -> str:
    return re.sub(rf"\b{re.escape(source.name)}\b", name, source.text)


def choose(plan: Plan, label: str) -> dict[str, CTuning]:
    """Each kernel's tuned configuration (those whose default stays are left out)."""
    if plan.graph.symbols:
        logs.channel("perf").info("%s: max-autotune leaves a graph with symbolic sizes as the "
                                  "heuristics build it (its sizes change per call)", label)
        return {}
    machine = " ".join([build.cpu_identity(), build.compiler_identity(build.find_compiler()),
                        " ".join(config.settings.cflags), f"{cores()} threads"])
    work = []
    for kernel in plan.kernels:
        sources = {}
        for name, option in candidates(kernel, plan).items():
            source = write_kernel(kernel, plan, option)
            if all(source.text != other.text for other, _ in sources.values()):
                sources[name] = (source, option)
        if len(sources) > 1 and _timeable(sources[tuning.DEFAULT][0]):
            work.append((kernel, sources))
    if not work and plan.kernels:
        count = len(plan.kernels)
        logs.channel("perf").info("%s: max-autotune has no other configuration to try for its "
                                  "%d kernel%s on %d thread%s (built as the heuristics "
                                  "choose)", label, count, "s" * (count != 1), cores(),
                                  "s" * (cores() != 1))
    # every kernel's candidates in one library, built the first time one is needed
    renamed = {(kernel.name, name): f"{kernel.name}__{index}"
               for kernel, sources in work for index, name in enumerate(sources)}
    library = functools.cache(lambda: _library(work, renamed))
    chosen = {}
    for kernel, sources in work:
        default = sources[tuning.DEFAULT][0]
        key = tuning.key("c", machine, *(f"{name}\n{_renamed(source, 'KERNEL')}"
                                         for name, (source, _) in sources.items()))
        what = f"{'reduction' if kernel.axes else 'pointwise'} {list(kernel.shape)}"
        runs = _Runs(kernel, default, sources, lambda name, k=kernel: getattr(
            library(), renamed[(k.name, name)]))
        # a parallel region where the default has none must gain more than the timing's
        # noise: its cost in a graph (threads woken after other work, MKL's own OpenMP
        # threads beside ember's) is not in a loop that keeps its threads busy
        margins = {name: PARALLEL_MARGIN for name, (_, option) in sources.items()
                   if option is not None and option.threads > 1 and
                   "omp parallel" not in default.text}
        choice = tuning.choose(label, kernel.name, what, key,
                               {name: functools.partial(runs.prepare, name) for name in sources},
                               margins=margins, apart=frozenset(
                                   name for name, (source, _) in sources.items()
                                   if "omp parallel" in source.text))
        if choice != tuning.DEFAULT:
            chosen[kernel.name] = sources[choice][1]
    return chosen


def _timeable(source: KernelSource) -> bool:
    """Can the kernel run on made-up inputs? Not when an integer division meets indices
    (the indices must be 0 to stay in range, and a 0 divisor would trap)."""
    return not (source.checks and "_int(" in source.text)


def _library(work: list, renamed: dict) -> object:
    texts = [_renamed(source, renamed[(kernel.name, name)])
             for kernel, sources in work for name, (source, _) in sources.items()]
    text = "\n\n".join([INCLUDES.strip(), vector_math_declarations(), PRELUDE.strip(),
                        *texts]) + "\n"
    path, _ = build.build(text, ["-lmvec", "-lm"])
    return build.load(path)


class _Runs:
    """One kernel's candidates on shared real-size inputs: each checked against the
    default's result, then handed to the timer."""

    def __init__(self, kernel: Kernel, default: KernelSource, sources: dict,
                 function: Callable[[str], Callable]):
        self.sources = sources
        self.function = function
        integers = 0 if default.checks else 1
        roots = {b for source, _ in sources.values() for b in source.arguments}
        self.tensors = {b: tuning.allocate(b.shape, b.strides, b.dtype, "cpu", integers)
                        for b in roots}
        self.pristine = {b: t.clone() for b, t in self.tensors.items()}
        self.stored = list(dict.fromkeys(item.buffer.root() for item in kernel.stores))
        self.reference: list[torch.Tensor] | None = None

    def prepare(self, name: str) -> Callable[[], None]:
        source, _ = self.sources[name]
        function = self.function(name)
        function.argtypes = [ctypes.c_void_p] * len(source.arguments)
        function.restype = ctypes.c_int
        pointers = [self.tensors[b].data_ptr() for b in source.arguments]
        for buffer, tensor in self.tensors.items():  # (a kernel may write what it reads)
            tensor.copy_(self.pristine[buffer])
        function(*pointers)
        results = [self.tensors[b].clone() for b in self.stored]
        if self.reference is None:
            self.reference = results
        else:
            tuning.check_same(name, self.reference, results)
        return lambda: function(*pointers)
