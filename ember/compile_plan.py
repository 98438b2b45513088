"""A scheduled plan's compiled form: its kernels generated and built (C, or Triton compiled
for the GPU or interpreted), the Python wrapper that allocates and launches them, and the
CompiledGraph that runs it (ember/backends.py lists the stages before it). A symbolic plan
on Triton has other builds made on demand: int64 indices for sizes past int32, one per class
of its rows' lengths (ember/codegen/triton_sizes.py), and, on CUDA, one for inputs that are
not 16-byte aligned.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ember import config, logs, tuning
from ember.codegen.c import write_source
from ember.codegen.triton import Workspace, row_length
from ember.codegen.triton_module import readers, reads_product_elsewhere, write_module
from ember.codegen.triton_rules import TRITON_LIBRARY_OPS
from ember.codegen.triton_sizes import RowClasses
from ember.codegen.triton_tiling import row_class
from ember.codegen.wrapper import write_wrapper
from ember.config import kernel_backend  # noqa: F401  (re-exported: backends, api)
from ember.ir.graph import Graph
from ember.lower import Unsupported
from ember.lower.tracer import OutputSpec
from ember.passes.library_ops import calls_for
from ember.runtime import c_launcher, library_warmup, triton_launch, tune_c, tune_triton
from ember.runtime.build import PendingFunction, build, is_built, kernel_function, load
from ember.runtime.compiled import CompiledGraph, make_function
from ember.runtime.interpreted import InterpretedGraph
from ember.schedule.epilogue import fuse_matmul_epilogues
from ember.schedule.fuse import schedule
from ember.schedule.plan import Buffer, LibraryCall, Plan


def compile_ir(graph: Graph, outputs: list[OutputSpec], output_tree: Any,
               extras: list[torch.Tensor], tensor_positions: list[int], argument_count: int,
               eager: Callable, label: str, dump: Any, clock: Any,
               fallback_count: int = 0, sizes: dict[str, int] | None = None,
               eager_first: bool = False, kernels_later: bool = False
               ) -> CompiledGraph | InterpretedGraph:
    """schedule → codegen → build → wrapper, for an IR graph after its passes. `extras` are
    tensors appended to the arguments (graph attributes, constants); `eager` runs the graph
    when its compiled form gives up; `sizes`: a symbolic graph's symbols in the call it is
    compiled for (its first build serves that call's row classes); `eager_first`: calls
    that come while the kernels still compile run `eager` beside them (where `eager` is the
    graph as eager runs it, not the IR interpreted); `kernels_later`: its C library may
    build beside its first calls all the same (a training graph's forward, whose
    TrainingGraph runs them eagerly meanwhile), its own calls waiting for it."""
    device = graph.device
    chosen = kernel_backend(device.type)
    if chosen == "interp":
        return InterpretedGraph(graph, outputs, output_tree, extras, tensor_positions, label)
    if chosen == "c" and device.type != "cpu":
        raise Unsupported(f"EMBER_BACKEND=c compiles for the CPU; these tensors are on {device}")
    if chosen == "triton" and device.type == "cpu" and not triton_launch.interpreting():
        raise Unsupported("EMBER_BACKEND=triton on CPU tensors needs TRITON_INTERPRET=1")
    if chosen == "triton":
        calls = calls_for(TRITON_LIBRARY_OPS)(graph)
        if calls:
            logs.dump(dump, "ir_triton_library_calls.txt", lambda: str(graph))
    plan = schedule(graph)
    clock("schedule")
    logs.dump(dump, "schedule.txt", plan.describe)
    # (a symbolic plan's reductions over rows of symbolic length: one build per class of
    # their lengths, chosen per call; see ember/codegen/triton_sizes.py)
    classes = RowClasses.of((row_length(k), math.prod(k.shape)) for k in plan.kernels) \
        if chosen == "triton" and plan.graph.symbols else None
    key = None
    if classes is not None:
        key = classes.key(sizes) if sizes and classes.names() <= set(sizes) \
            else classes.guessed()
    known: dict = {}  # (kernels compiled by one build, reused by the others)
    loaded = None  # (each kernel's, where they compile beside the first run: compiled_later)
    if chosen == "triton":
        sources, first_build, misaligned = _triton_kernels(
            plan, label, dump, build=classes.build(key) if classes else None, known=known)
        if _compiles_later(dump):
            kernels = [kernel for source in sources.values() for kernel in source.kernels]
            loaded = {kernel.name: concurrent.futures.Future() for kernel in kernels}
            functions = {kernel.name: triton_launch.PendingLaunch(loaded[kernel.name],
                                                                  kernel.grid)
                         for kernel in kernels}
        else:
            functions = first_build()
    else:
        sources, c_build, c_source = _c_kernels(plan, label, dump)
        misaligned = None
        if sources and (eager_first or kernels_later) and \
                _compiles_later(dump, triton=False) and \
                not is_built(c_source, C_LINK):
            # (the compiler runs in its own process: the calls meanwhile run eagerly)
            loaded = {name: concurrent.futures.Future() for name in sources}
            functions = {name: PendingFunction(loaded[name]) for name in sources}
            first_build = c_build
        else:
            functions = c_build()
    clock("kernels")

    def settled() -> None:
        """Other builds wait for the first's kernels: they reuse them (`known`)."""
        if wrappers_later is not None:
            wrappers_later.result()

    def wrap(functions: dict[str, Any], checked: bool, fallback: Callable | None,
             wide: Callable | None = None, kernels: dict[str, Any] = sources,
             key: tuple | None = key, called_by_wrapper: bool = True):
        """A wrapper's source; `called_by_wrapper`: one of the other builds, which the
        compiled graph's own wrapper calls with the extras already appended to the
        arguments (else the wrapper appends them)."""
        wrapper = write_wrapper(plan, outputs, output_tree, kernels, functions,
                                device, checked, check_alignment=fallback is not None,
                                check_reach=wide is not None,
                                rows=(classes.key_text(), key) if key is not None else None)
        wrapper.namespace["misaligned"] = fallback
        wrapper.namespace["wide"] = wide
        if key is not None:
            wrapper.namespace.update(rows=by_rows, row_class=row_class)
        for position, tensor in enumerate(extras, start=len(tensor_positions)):
            wrapper.namespace[f"extra{position}"] = tensor
        if extras and not called_by_wrapper:
            wrapper.text = wrapper.text.replace(
                "def call(args):\n",
                "def call(args):\n    args = (*args, "
                + ", ".join(f"extra{p}" for p in range(len(tensor_positions),
                                                       len(tensor_positions) + len(extras)))
                + ",)\n", 1)
        return wrapper

    wide = None
    if chosen == "triton" and plan.graph.symbols:
        def wide_build() -> Callable:
            """Calls whose sizes take an offset past int32 run kernels with int64 indices."""
            settled()
            wide_sources, wide_build, _ = _triton_kernels(plan, label, dump, wide=True)
            return make_function(wrap(wide_build(), False, None, None, wide_sources, None),
                                 f"<ember wrapper {label} (int64 indices)>")

        wide = _Lazy(wide_build)
    by_rows = None
    if classes is not None:
        def rows_build(key: tuple) -> Callable:
            """The build for calls whose rows are of other classes (made on the first)."""
            logs.channel("perf").info("%s: kernels for row classes %s (%s)", label, key,
                                      classes.key_text())
            settled()
            built_sources, built_build, unaligned = _triton_kernels(
                plan, label, dump, build=classes.build(key), known=known, first=False)
            built = built_build()
            # (called by the first build's wrapper once it has checked the reach and found
            # the key: these check neither)
            fallback = _Lazy(lambda: make_function(
                wrap(unaligned(), False, None, None, built_sources, None),
                f"<ember wrapper {label} (rows {key}, misaligned inputs)>"))
            return make_function(wrap(built, False, fallback, None, built_sources, None),
                                 f"<ember wrapper {label} (rows {key})>")

        by_rows = _Builds(rows_build)
    # misaligned inputs take a build that does not assume 16-byte alignment (made on demand;
    # it checks the reach and the row classes too: its kernels are the first build's)
    def misaligned_wrapper() -> Callable:
        settled()
        return make_function(wrap(misaligned(), False, None, wide),
                             f"<ember wrapper {label} (misaligned inputs)>")

    fallback = _Lazy(misaligned_wrapper)

    def wrappers_of(functions: dict[str, Any]) -> list[Any]:
        """The checked wrapper (a first call's) and the fast one (every later call's)."""
        wrappers = [wrap(functions, checked, fallback, wide, called_by_wrapper=False)
                    for checked in (True, False)]
        logs.dump(dump, "wrapper.py", wrappers[1].text)
        logs.show_code(label, "wrapper (Python that launches the kernels)", wrappers[1].text)
        return wrappers

    wrappers_later = None
    if loaded is None:
        checked, fast = wrappers_of(functions)
    else:  # (the first run's wrapper waits for each kernel; both are written once compiled)
        checked, fast = wrap(functions, True, fallback, wide, called_by_wrapper=False), None
        # (where the calls meanwhile run eagerly, its convolutions' first uses are made too)
        warming = library_warmup.start(plan, device, label) \
            if eager_first or kernels_later else None
        wrappers_later = _background.submit(compiled_later, first_build, loaded, wrappers_of,
                                            label, warming)
    clock("wrapper")
    clock.report()
    library_calls = sum(1 for step in plan.steps if isinstance(step, LibraryCall))
    written = [index for index, _ in graph.writebacks]
    compiled = CompiledGraph(checked, fast, tensor_positions, argument_count,
                             eager, label, len(sources), library_calls, written,
                             fallback_count, later=wrappers_later,
                             eager_first=eager_first)
    if wrappers_later is not None:
        _waited_for(wrappers_later)
    # (what ahead-of-time analysis reads: ember/aot.py)
    compiled.plan = plan
    compiled.step_count = len(plan.steps)
    compiled.kernel_texts = {name: source.text if hasattr(source, "text") else
                             "\n\n".join(kernel.text for kernel in source.kernels)
                             for name, source in sources.items()}
    compiled.workspace_bytes = {
        name: sum(math.prod(space.shape) * space.dtype.itemsize for space in source.workspaces)
        for name, source in sources.items() if getattr(source, "workspaces", None)}
    return compiled


# Kernels compiled beside a graph's first run (compiled_later): a few threads, each waiting on
# the compile workers most of its time.
_background = concurrent.futures.ThreadPoolExecutor(4, "ember-kernels")
# graphs' kernels still compiling, each as a future set once the graph's own callbacks on
# them have run (its keep asked): what backends.wait_for_background_compiles waits for too,
# since the calls that come meanwhile run eagerly
kernels_compiling: set[concurrent.futures.Future] = set()


def _waited_for(later: concurrent.futures.Future) -> None:
    """Count `later` among kernels_compiling until its callbacks so far have run (callbacks
    run in the order they were added: the CompiledGraph's first)."""
    settled: concurrent.futures.Future = concurrent.futures.Future()
    kernels_compiling.add(settled)
    settled.add_done_callback(kernels_compiling.discard)
    later.add_done_callback(lambda _: settled.set_result(None))


def _compiles_later(dump: Any, triton: bool = True) -> bool:
    """Do a graph's kernels compile beside its first run (Triton's always, C's where calls
    run eagerly meanwhile)? Not where the code is shown or dumped: what is said about a
    compile is said before it returns."""
    return config.settings.kernels_later and dump is None and \
        not logs.enabled("output_code") and not (triton and triton_launch.interpreting())


def compiled_later(first_build: Callable[..., dict[str, Any]],
                   loaded: dict[str, concurrent.futures.Future],
                   wrappers_of: Callable[[dict[str, Any]], list[Any]], label: str,
                   warming: concurrent.futures.Future | None = None) -> list[Any]:
    """The first build's kernels compiled and loaded, each kernel's future in `loaded` settled
    as soon as it is (the first run's launches wait for them), then its wrappers written with
    them, once the convolutions `warming` runs on stand-ins are done (runtime/library_warmup:
    the calls meanwhile run eagerly)."""
    start = time.perf_counter()
    try:
        built = first_build(lambda name, launch: loaded[name].set_result(launch))
    except BaseException as error:
        for future in loaded.values():
            if not future.done():
                future.set_exception(error)
        raise
    for name, future in loaded.items():  # (each was told already: none may wait forever)
        if not future.done():
            future.set_result(built[name])
    if warming is not None:
        warming.result()  # (never raises)
    logs.channel("perf").info("%s: kernels compiled and loaded %.1f ms after their compile "
                              "began (the first calls meanwhile)", label,
                              (time.perf_counter() - start) * 1e3)
    return wrappers_of(built)


C_LINK = ["-lmvec", "-lm"]


def _c_kernels(plan: Plan, label: str, dump: Any
               ) -> tuple[dict[str, Any], Callable[..., dict[str, Any]], str]:
    """One C file for the plan: its kernels by name, a function that builds it with the C
    compiler, loads it and gives its kernels' functions by name, and the source."""
    tunings = tuning.guarded(label, tune_c.choose, plan, label) \
        if config.settings.max_autotune else None
    source, kernels = write_source(plan, tunings)
    c_launcher.start()  # (built beside the kernels, where the disk cache lacks it)
    logs.dump(dump, "kernels.c", source)
    logs.show_code(label, "C kernels", source)

    def built(ready: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
        """(`ready`: compiled_later's, for a build whose kernels load one by one)"""
        if not kernels:
            return {}
        path, cached = build(source, C_LINK)
        library = load(path)
        logs.channel("kernels").info("%s: %d kernels, %s %s", label, len(kernels),
                                     "cache hit" if cached else "built", path)
        return {k.name: kernel_function(library, k.same_as or k.name, len(k.arguments),
                                        len(k.sizes), "omp parallel" in k.text)
                for k in kernels}

    return {k.name: k for k in kernels}, built, source


def _triton_kernels(plan: Plan, label: str, dump: Any, wide: bool = False,
                    build: tuple[dict, dict[str, int]] | None = None,
                    known: dict | None = None, first: bool = True):
    """One Triton module for the plan: its kernels' sources, a function that compiles them
    for the GPU (or interprets them) and gives them by name (telling `ready(name, launch)` of
    each as soon as it is loaded), and one that compiles the build for misaligned inputs.
    `wide`: a symbolic plan's build with int64 indices (made on the first call that needs
    it: its inputs' alignment is not assumed either). `build`: the row classes it serves and
    the divisibility promised of the symbols (RowClasses.build); `known`: kernels compiled by the
    plan's other builds, by what they compile to; `first`: the plan's first build (the one
    that fuses matmul epilogues into the plan)."""
    rows, divisible = build or (None, {})
    first = first and not wide
    fused = first and config.settings.matmul_epilogue and \
        fuse_matmul_epilogues(plan, readers, reads_product_elsewhere)
    if fused:
        logs.dump(dump, "schedule_fused.txt", plan.describe)
    device_index = None
    if not triton_launch.interpreting():
        device_index = plan.graph.device.index
        if device_index is None:
            device_index = torch.cuda.current_device()
    dependent = device_index is not None and config.settings.dependent_launch and \
        triton_launch.dependent_launch_supported(device_index)
    tilings = tuning.guarded(label, tune_triton.choose, plan, label, device_index,
                             dependent) if config.settings.max_autotune else None
    text, launches = write_module(plan, dependent, wide, tilings, rows)
    if first or wide:
        logs.dump(dump, "kernels_int64.py" if wide else "kernels.py", text)
    logs.show_code(label, "Triton kernels" + (" (int64 indices)" if wide else ""), text)
    sources = {launch.name: launch for launch in launches}
    kernels = [kernel for launch in launches for kernel in launch.kernels]
    if device_index is None:
        module = triton_launch.load_module(text)
        logs.channel("kernels").info("%s: %d Triton kernels, interpreted (%s)", label,
                                     len(kernels), module.__name__)
        launches = triton_launch.interpreted_kernels(module, kernels)
        interpreted = {k.name: f for k, f in zip(kernels, launches)}
        return sources, lambda ready=None: interpreted, None
    inputs = set(plan.inputs)

    # (a symbol's divisibility promised to the kernels of rows of symbolic length)
    sized = [[divisible.get(name, 1) if launch.row is not None and
              not isinstance(launch.row, int) else 1 for name in k.sizes]
             for launch in launches for k in launch.kernels]

    # (imported where the kernels compile, beside the first run: importing the module waits
    # for Triton's own import, which warm_up's thread may still run)
    module_of = functools.cache(lambda: triton_launch.load_module(text))

    def compiled(assume_inputs_aligned: bool, ready: Callable | None = None) -> dict[str, Any]:
        module = module_of()
        aligned = [[_known_aligned(b, inputs, assume_inputs_aligned) for b in k.arguments]
                   + promised for k, promised in zip(kernels, sized)]
        start = time.perf_counter()
        launches = triton_launch.compile_kernels(module, kernels, aligned, device_index,
                                                 known, ready)
        logs.channel("kernels").info("%s: %d Triton kernels in %.3f s", label, len(kernels),
                                     time.perf_counter() - start)
        return {k.name: f for k, f in zip(kernels, launches)}

    if wide:
        return sources, lambda ready=None: compiled(False), None
    return sources, lambda ready=None: compiled(True, ready), lambda: compiled(False)


def _known_aligned(buffer: Buffer | Workspace, inputs: set[Buffer], assume_inputs: bool) -> bool:
    """May the kernel assume this argument's data is 16-byte aligned? Ember allocates temps and
    outputs (the caching allocator aligns them); inputs are checked by the wrapper on each
    call; a library result that views its operands may start anywhere."""
    if buffer in inputs:
        return assume_inputs
    if isinstance(buffer, Workspace):
        return True  # allocated by the wrapper
    if buffer.role == "library":
        return False
    return True


class _Builds:
    """Builds made on demand, one per key: `rows(key, args)` runs the build for `key`."""

    def __init__(self, make: Callable[[tuple], Callable]):
        self.make = make
        self.built: dict[tuple, Callable] = {}

    def __call__(self, key: tuple, args: Any) -> Any:
        function = self.built.get(key)
        if function is None:
            function = self.built[key] = self.make(key)
        return function(args)


class _Lazy:
    """A function built on its first call."""

    def __init__(self, make: Callable[[], Callable]):
        self.make = make
        self.function: Callable | None = None

    def __call__(self, *args: Any) -> Any:
        if self.function is None:
            self.function = self.make()
        return self.function(*args)
