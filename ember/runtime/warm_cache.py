"""Warm start: a compiled graph kept in the disk cache under the captured graph it came from,
so that a new process's first call pays capture and a lookup instead of lowering, passes,
scheduling, code generation and builds.

Takes a captured FX graph with its example inputs, and the compiled graph the backend made
of it; gives the entry's key (the graph's code and attributes, the inputs' metadata, the
settings, grad and autocast modes, ember's, torch's and Python's versions, Triton's for
Triton graphs, the CPU and C compiler, the GPU), keeps what rebuilds the compiled graph —
inference or training, C or Triton kernels, whole or as compiled regions between eager
islands — (the wrapper sources, their namespaces encoded value by value, the kernel
libraries' and Triton modules' sources, constants saved by torch.save) and rebuilds it. A
graph whose wrapper holds a value that cannot be encoded (a library call on an arbitrary
Python object) is not kept: said on EMBER_LOGS=perf. An entry is trusted only after its
digest and its recorded versions check; a corrupt or foreign one is removed and the graph
compiled again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ember import config, logs, torch_internals
from ember.runtime import build, disk_cache, triton_launch
from ember.runtime.compiled import CompiledGraph, after_eager_runs
from ember.runtime.warm_records import Rejected, read_record, remove, write_record
from ember.runtime.warm_values import Decoder, Encoder, NotKept, fetch
from ember.runtime.wrappers import WrapperSource

# NOTE: a warm start imports the runtime only: what builds (partitions, autodiff's tapes) and
# what trains or runs islands is imported where a graph of that kind is kept or rebuilt.

FORMAT = "ember-warm-2"
KIND = "warm"

# what this process's warm cache did (tests count with it: a warm first call lowers and
# builds nothing)
counts = {"hits": 0, "misses": 0, "kept": 0, "not_kept": 0, "rejected": 0}


# -- the key ------------------------------------------------------------------------------
def versions(triton: bool = False) -> dict[str, str]:
    """What an entry was made by (`triton`: an entry of Triton kernels, which Triton's
    version compiles); one made by another version is foreign."""
    import ember

    found = {"format": FORMAT, "ember": f"{ember.__version__} {_ember_source()}",
             "torch": str(torch.__version__), "python": "{}.{}".format(*sys.version_info[:2])}
    if triton:
        import triton as triton_package

        found["triton"] = triton_package.__version__ + \
            (" interpreted" if triton_launch.interpreting() else "")
    return found


@functools.cache
def _ember_source() -> str:
    """A digest of ember's own source files: a change to ember (a checkout, an edit) makes
    its older entries foreign, even under the same version number (~3 ms, once)."""
    digest = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder, folders, names in os.walk(root):
        folders[:] = sorted(name for name in folders if name != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as file:
                    digest.update(os.path.relpath(path, root).encode() + b"\0" + file.read())
    return digest.hexdigest()[:16]


def machine(gpu: int | None = None) -> str:
    """What the kernels' binaries depend on: the CPU (-march=native) and the C compiler; for
    Triton kernels compiled for GPU `gpu`, that GPU's model and compute capability."""
    try:
        compiler = build.compiler_identity(build.find_compiler())
    except build.BuildError:
        compiler = "no C compiler"
    found = f"{build.cpu_identity()} {compiler}"
    if gpu is not None:
        found += f" {torch.cuda.get_device_name(gpu)} sm{torch.cuda.get_device_capability(gpu)}"
    return found


def uses_triton(example_inputs: list[Any], under: config.Settings | None = None) -> bool:
    """Are the graph's kernels Triton's (its tensors' device and EMBER_BACKEND)?"""
    devices = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    return config.kernel_backend("cuda" if "cuda" in devices else "cpu", under) == "triton"


def _gpu(example_inputs: list[Any]) -> int | None:
    """The GPU the graph's Triton kernels are compiled for, or None (CPU tensors, which only
    Triton's interpreter runs)."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.is_cuda:
            return x.device.index if x.device.index is not None else \
                torch.cuda.current_device()
    return None


def tapes_kept() -> bool:
    """autodiff/tape.py's keeping(): where nothing imported it yet, nothing set it either,
    and it is its default (a warm start does not import autodiff for it)."""
    tape = sys.modules.get("ember.autodiff.tape")
    return True if tape is None else tape.keeping()


def thread_modes() -> tuple:
    """What a graph's code depends on besides its settings and inputs: grad and autocast
    modes, deterministic algorithms, tapes (all but the third the thread's own)."""
    return (torch.is_grad_enabled(), torch_internals.autocast_state(),
            torch.are_deterministic_algorithms_enabled(), tapes_kept())


def key_of(gm: torch.fx.GraphModule, example_inputs: list[Any],
           chosen: config.Settings | None = None, modes: tuple | None = None,
           symbolic: dict | None = None) -> str:
    """The graph's key for these inputs under `chosen` settings (the process's where None)
    and `modes` (thread_modes(), this thread's where None); `symbolic`: a graph compiled for
    every shape its symbols allow (shapes.py), its placeholders as
    lower/symbolic.describe_placeholders gives them (their symbolic geometry, the symbols'
    ranges, the ShapeEnv's relations). (The example inputs' sizes are in the key too: the
    hints its decisions were made at.)"""
    settings = dataclasses.asdict(chosen if chosen is not None else config.settings)
    for name in ("logs", "dump_dir", "cache_dir", "cache_max_mb"):  # (change no code)
        settings.pop(name)
    triton = uses_triton(example_inputs, chosen)
    parts = [repr(sorted(versions(triton).items())),
             machine(_gpu(example_inputs) if triton else None), repr(sorted(settings.items())),
             # (tapes: reduce-overhead's training graphs differentiate library calls without
             # them, autodiff/tape.py)
             repr(modes if modes is not None else thread_modes()),
             gm.code]
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            parts.append(f"{node.target}: {_describe(fetch(gm, node.target))}")
        elif node.op == "call_function":  # (the code names a function, not where it lives)
            target = node.target
            parts.append(f"{getattr(target, '__module__', None)}."
                         f"{getattr(target, '__qualname__', None) or target}")
    parts.extend(_describe(value) for value in example_inputs)
    if symbolic is not None:
        parts.append(f"symbolic {symbolic!r}")
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (f"{type(value).__name__}{tuple(value.shape)}{value.stride()}"
                f"+{value.storage_offset()} {value.dtype} {value.device} "
                f"grad={value.requires_grad}")
    return f"{type(value).__name__} {value!r}"


# -- find and keep ------------------------------------------------------------------------
_unwanted = threading.local()


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Graphs compiled in this thread meanwhile neither come from the warm cache nor go into
    it (ahead-of-time compiles: their analyses read the schedule, which a rebuilt graph does
    not carry)."""
    _unwanted.depth = getattr(_unwanted, "depth", 0) + 1
    try:
        yield
    finally:
        _unwanted.depth -= 1


def is_bypassed() -> bool:
    """Is this thread inside `bypassed()`?"""
    return bool(getattr(_unwanted, "depth", 0))


class Cold:
    """A graph compiled cold (once, on stand-ins of its example inputs, in the grad mode it
    was compiled in): what a rebuilt graph hands the rare calls its compiled form gives
    away (a library call's unforeseen layout, aliased inputs, CUDA's misaligned inputs)."""

    def __init__(self, gm: torch.fx.GraphModule, stand_ins: Callable[[], list[Any]],
                 grad_enabled: bool, label: str,
                 recompile: Callable[[torch.fx.GraphModule, list[Any], str], Any]):
        self.gm = gm
        self.stand_ins = stand_ins
        self.grad_enabled = grad_enabled
        self.label = label
        self.recompile = recompile
        self.compiled: Any = None

    def __call__(self) -> Any:
        if self.compiled is None:
            logs.channel("fallbacks").info("%s: a warm-started graph needs its eager form: "
                                           "the graph is compiled again for it", self.label)
            with torch.set_grad_enabled(self.grad_enabled):
                self.compiled = self.recompile(self.gm, self.stand_ins(), f"{self.label}_cold")
        return self.compiled


class Entry:
    """One graph's place in the warm cache: `compiled` is the graph rebuilt from it, or None
    (then `keep` stores what the backend compiles)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                 recompile: Callable[[torch.fx.GraphModule, list[Any], str], Any],
                 symbolic: dict | None = None, key: str | None = None):
        """`symbolic`: a graph compiled for every shape, its placeholders described (key_of);
        `key`: the key it was kept under, where a function's entry rebuilt before capture
        knows it (its graph then has no symbolic examples to compute it from)."""
        self.gm = gm
        self.argument_count = len(example_inputs)
        self.label = label
        self.compiled: Any = None
        self.recompile = recompile
        self.kept = False
        # (a rebuilt graph falls back to the graph compiled cold: the inputs' metadata is
        # kept for that, not the inputs)
        examples = [(tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad)
                    if isinstance(x, torch.Tensor) else x for x in example_inputs]
        self.cold = Cold(gm, functools.partial(_stand_ins, examples), torch.is_grad_enabled(),
                         label, recompile)
        if is_bypassed() or not config.settings.warm_start:
            # (off, or a compile that needs its schedule: ember/aot.py)
            self.key = None
            return
        try:
            self.triton = uses_triton(example_inputs)
            self.key: str | None = key or key_of(gm, example_inputs, symbolic=symbolic)
        except Exception as error:  # noqa: BLE001 (an odd graph attribute: no warm start)
            logs.channel("perf").info("%s has no warm-start key: %s: %s", label,
                                      type(error).__name__, error)
            self.key = None
            return
        self.path = disk_cache.entry_path(KIND, self.key, ".pt")
        self.compiled = self._load()

    def _load(self) -> Any:
        start = time.perf_counter()
        try:
            record = read_record(self.path, self.key, versions(self.triton))
        except FileNotFoundError:  # (none kept: the common miss)
            counts["misses"] += 1
            return None
        except Rejected as rejected:
            problem = str(rejected)
        else:
            try:
                compiled = _rebuild(record, self)
                problem = None
            except Exception as error:  # noqa: BLE001 (never trusted: compiled again)
                problem = f"it cannot be rebuilt ({type(error).__name__}: {str(error)[:200]})"
        if problem is not None:
            counts["rejected"] += 1
            logs.channel("fallbacks").info("the warm-start entry %s fails its check (%s): the "
                                           "graph is compiled again", self.path, problem)
            remove(self.path)
            return None
        counts["hits"] += 1
        disk_cache.touch(self.path)
        if logs.enabled("perf"):
            logs.channel("perf").info("%s: warm start from the disk cache in %.1f ms (%s)",
                                      self.label, (time.perf_counter() - start) * 1e3,
                                      self.path)
        return compiled

    def keep(self, compiled: Any) -> None:
        """Store `compiled` under this entry's key, or say why it is not kept (never
        raises: the compiled graph runs either way)."""
        if self.key is None:
            return
        when_compiled(compiled, lambda: self._keep_now(compiled))

    def _keep_now(self, compiled: Any) -> None:
        try:
            self._keep(compiled)
        except Exception as error:  # noqa: BLE001
            counts["not_kept"] += 1
            logs.channel("perf").info("%s is not kept for a warm start: %s%s", self.label,
                                      "" if isinstance(error, NotKept) else
                                      f"{type(error).__name__}: ", error)

    def compiled_cold(self) -> Any:
        """The graph compiled cold (once), on stand-ins of the example inputs."""
        return self.cold()

    def _keep(self, compiled: Any) -> None:
        write_record(KIND, self.key, {"versions": versions(self.triton),
                                      **_record(compiled, self.gm)})
        if not self.kept:  # (a training graph kept again, whole, is the same record)
            self.kept = True
            counts["kept"] += 1


def when_compiled(compiled: Any, then: Callable[[], None], again: bool = True) -> None:
    """then(), once `compiled` is whole, on the keeping thread (never on the caller's path: a
    keep encodes, checks and writes a record, ~0.1 s for a ViT): at once, or (a graph whose
    kernels compile beside its first run) at the end of its first call, once they are in,
    so a graph is never kept half compiled. A training graph whose backward for every
    output is not compiled yet (it compiles once a backward runs: its calls may take none,
    as a decoding loop's) is kept with its forward alone, then (`again`) once that compile
    is done. One thread keeps them all, in the order they were asked for (a function's
    entry before capture is kept after the graph's record it names), and none while a call
    runs eagerly beside its graph's compile; `finish_keeps()` waits for them."""
    def keep_later() -> None:
        try:
            _keeping.submit(_after_eager_runs, then)
        except RuntimeError:  # (the interpreter is shutting down: keep it here, now)
            then()

    settled = getattr(compiled, "when_settled", None)
    if settled is not None:  # (a CompiledGraph whose kernels compile beside its first run)
        settled(keep_later)
        return
    pending = getattr(compiled, "pending", None)
    if pending is None:
        keep_later()
        return
    if not getattr(compiled, "backward_started", True):
        when_compiled(compiled.forward_graph, then)  # (its forward alone, now)
        if not again:
            return
    kept = _awaited[pending] = threading.Event()

    def when_done(_: Any) -> None:
        keep_later()
        kept.set()

    pending.add_done_callback(when_done)


def _after_eager_runs(then: Callable[[], None]) -> None:
    """then(), once no call runs eagerly beside its graph's compile (a keep on the keeping
    thread would slow that run: runtime/compiled.after_eager_runs)."""
    after_eager_runs()
    then()


# (a pool's worker is joined at the interpreter's exit: the keeps asked for are written)
_keeping = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ember-keep")
# keeps that wait for a graph's compile (a training graph's backward), by its future: set
# once handed to the keeping thread (weakly: a compile never started, its graph dropped,
# keeps nothing)
_awaited: weakref.WeakKeyDictionary[concurrent.futures.Future, threading.Event] = \
    weakref.WeakKeyDictionary()


def finish_keeps() -> None:
    """Wait for the keeps asked for so far (ember.reset, ember.cache_info, tests), those of
    graphs whose backward compiles on in the background included (one deferred until the
    graph's next call, not started yet, is not waited for: nor is its keep)."""
    backends = sys.modules.get("ember.backends")  # (none imported: nothing compiles)
    if backends is not None:
        backends.wait_for_background_compiles(start_deferred=False)
    for compile_done, kept in list(_awaited.items()):
        if compile_done.done():  # (its callback may still be on its way)
            kept.wait()
    _keeping.submit(lambda: None).result()


def _stand_ins(examples: list[Any]) -> list[Any]:
    return [torch.empty_strided(x[0], x[1], dtype=x[2], device=x[3]).requires_grad_(x[4])
            if isinstance(x, tuple) and len(x) == 5 and isinstance(x[2], torch.dtype) else x
            for x in examples]


# -- a compiled graph as a record, and back ------------------------------------------------
def _record(compiled: Any, gm: torch.fx.GraphModule, whole: bool = True) -> dict:
    """`compiled`, the graph `gm` compiled, as plain data (`whole`: the graph itself, not a
    region of it)."""
    from ember.runtime.partitioned import PartitionedGraph
    from ember.runtime.training import TrainingGraph

    if type(compiled) is TrainingGraph:
        return _training_record(compiled, gm)
    if type(compiled) is PartitionedGraph and whole:
        return _partitioned_record(compiled, gm)
    if type(compiled) is not CompiledGraph:
        raise NotKept(f"a {type(compiled).__name__} (graphs compiled into C or Triton kernels, "
                      f"for inference or training, whole or between eager islands, are kept)")
    if compiled.runs_eagerly:
        raise NotKept("it runs eagerly")
    encoder = Encoder(gm)
    checked, fast = compiled.wrappers
    return {
        "kind": "compiled",
        "checked": [checked.text, encoder.namespace(checked.namespace, checked.text)],
        "fast": [fast.text, encoder.namespace(fast.namespace, fast.text)],
        "libraries": encoder.libraries,
        "modules": encoder.modules,
        "tensors": encoder.tensors,
        "tensor_positions": list(compiled.tensor_positions),
        "argument_count": compiled.argument_count,
        "counts": [compiled.kernel_count, compiled.library_count, compiled.fallback_count],
        "step_count": compiled.step_count,
        "written_inputs": list(compiled.written_inputs),
    }


def _rebuild(record: dict, entry: Entry) -> Any:
    if record["kind"] == "partitioned":
        return _partitioned_graph(record, entry)
    return _rebuild_graph(record, entry.gm, entry.cold, entry.label)


def _rebuild_graph(record: dict, gm: torch.fx.GraphModule, cold: Cold, label: str) -> Any:
    if record["kind"] == "training":
        return _training_graph(record, gm, cold, label)
    if record["kind"] != "compiled":
        raise ValueError(f"a {record['kind']} record where a graph's was expected")
    return _compiled_graph(record, gm, gm.forward, label, cold)


def _compiled_graph(record: dict, gm: torch.fx.GraphModule, eager: Callable, label: str,
                    cold: Callable[[], CompiledGraph]) -> CompiledGraph:
    decoder = Decoder(gm, record["libraries"], record["tensors"], record["modules"], cold)
    wrappers = [WrapperSource(text, decoder.namespace(namespace))
                for text, namespace in (record["checked"], record["fast"])]
    kernel_count, library_count, fallback_count = record["counts"]
    compiled = CompiledGraph(wrappers[0], wrappers[1], list(record["tensor_positions"]),
                             record["argument_count"], eager, label, kernel_count,
                             library_count, list(record["written_inputs"]), fallback_count)
    compiled.step_count = record["step_count"]
    return compiled


def _training_record(graph: Any, gm: torch.fx.GraphModule) -> dict:
    """A training graph: its compiled forward and backward, and what of autodiff's split the
    autograd.Function reads (runtime/training.py)."""
    encoder = Encoder(gm)
    split = graph.split
    return {
        "kind": "training",
        "forward": _record(graph.forward_graph, gm),
        # (None: not compiled yet, compiled cold once a backward needs it)
        "backward": None if graph.pending is not None else _record(graph.backward_graph, gm),
        "specs": [encoder.value(spec) for spec in graph.specs],
        "output_tree": encoder.value(graph.output_tree),
        "extras": [encoder.value(tensor) for tensor in graph.extras],
        "tensors": encoder.tensors,
        "output_count": graph.output_count,
        "tensor_positions": list(graph.tensor_positions),
        "grad_inside": graph.grad_inside,
        "backward_inputs": [list(pair) for pair in split.backward_inputs],
        "wrt": list(split.wrt),
        "differentiable_outputs": list(split.differentiable_outputs),
        "tapes": split.tapes,
        "forward_outputs": [[encoder.value(list(node.shape)),
                             str(node.dtype).replace("torch.", "")]
                            for node in split.forward.outputs],
        "device": str(split.forward.device),
        # (a graph compiled for every shape: each symbol's input and dim)
        "symbols": [[name, list(place)] for name, place in split.forward.symbols.items()],
    }


def _training_graph(record: dict, gm: torch.fx.GraphModule, cold: Cold, label: str) -> Any:
    from ember.runtime.training import TrainingGraph

    decoder = Decoder(gm, [], record["tensors"])
    forward = _compiled_graph(record["forward"], gm, _ColdPart(cold, "forward_graph"), label,
                              lambda: cold().forward_graph)
    start_backward = None
    if record["backward"] is None:
        from ember.backends import Deferred

        deferred = Deferred(lambda: _cold_backward(cold, record, label))
        backward, start_backward = deferred.future, deferred.start
    else:
        backward = _compiled_graph(record["backward"], gm, _ColdPart(cold, "backward_graph"),
                                   f"{label}_backward", lambda: cold().backward_graph)
    outputs = [types.SimpleNamespace(shape=tuple(decoder.value(shape)),
                                      dtype=getattr(torch, dtype))
               for shape, dtype in record["forward_outputs"]]
    split = types.SimpleNamespace(  # (the fields of autodiff's Split that training.py reads)
        forward=types.SimpleNamespace(outputs=outputs, device=torch.device(record["device"]),
                                      symbols={name: tuple(place)
                                               for name, place in record["symbols"]}),
        backward_inputs=[tuple(pair) for pair in record["backward_inputs"]],
        wrt=list(record["wrt"]), differentiable_outputs=list(record["differentiable_outputs"]),
        tapes=record["tapes"])
    return TrainingGraph(forward, backward, split, [decoder.value(c) for c in record["specs"]],
                         decoder.value(record["output_tree"]), record["output_count"],
                         list(record["tensor_positions"]),
                         [decoder.value(c) for c in record["extras"]], label,
                         gm.forward, grad_inside=record["grad_inside"],
                         start_backward=start_backward)


def _cold_backward(cold: Cold, record: dict, label: str) -> Any:
    """The backward of a graph kept with its forward alone, compiled cold: it takes what the
    kept forward saves only where the cold compile splits the graph as the kept one was
    (autodiff is deterministic: another split, or a cold compile without a backward, is a
    fault of ember's, said as one, never a gradient from the wrong values)."""
    graph = cold()
    split = getattr(graph, "split", None)
    if split is None or [list(pair) for pair in split.backward_inputs] != \
            record["backward_inputs"] or len(split.forward.outputs) != \
            len(record["forward_outputs"]):
        raise RuntimeError(
            f"{label}: the graph's backward, compiled again for a graph kept for a warm start "
            f"with its forward alone, does not take what that forward saved (a fault of "
            f"ember's: please report it). Run with EMBER_WARM_START=0, or clear the cache "
            f"with `python -m ember cache --clear`.")
    return graph.backward_graph


class _ColdPart:
    """The eager form of a rebuilt training graph's forward or backward (in a graph compiled
    cold: the IR interpreter's run of it), for the calls a compiled graph gives to its eager
    form (a library call's unforeseen layout, aliased inputs): the graph compiled cold."""

    def __init__(self, cold: Cold, part: str):
        self.cold = cold
        self.part = part

    def __call__(self, *args: Any) -> Any:
        return getattr(self.cold(), self.part).eager(*args)


def _partitioned_record(graph: Any, gm: torch.fx.GraphModule) -> dict:
    """Compiled regions with eager islands between them: each region's compiled graph, and
    what finds the partition again from the FX graph alone (the islands' nodes by name, with
    their reasons; each region's example inputs): the islands are the graph's own calls,
    made again from the new process's graph, and so is the glue between the pieces."""
    from ember.codegen.glue import write_glue
    from ember.partition import region_module, split

    if graph.eager_region_count:
        raise NotKept("a region of it runs eagerly (" + "; ".join(
            graph.islands[graph.island_count:]) + "): compiled again in a new process")
    partition = graph.partition
    islands = {island.node.name: island.reason for island in partition.islands}
    again = split(gm, islands)
    if [r.key() for r in again.regions] != [r.key() for r in partition.regions]:
        raise NotKept("its islands do not give the same regions again")
    glue = write_glue(again, {**graph.eager_forms, **graph.regions}, graph.examples,
                      set(graph.regions))
    if glue.text != graph.glue_source:
        raise NotKept("the glue written again differs")
    encoder = Encoder(gm)
    regions = [[region.number, _record(graph.regions[region.number],
                                       region_module(gm, region), whole=False)]
               for region in partition.regions]
    return {
        "kind": "partitioned",
        "islands": [[name, reason] for name, reason in islands.items()],
        "regions": regions,
        "examples": [[number, [encoder.value(example) for example in examples]]
                     for number, examples in graph.examples.items()],
        "tensors": encoder.tensors,
        "notes": graph.islands[:graph.island_count],
        "written_inputs": list(graph.written_inputs),
        "glue": graph.glue_source,
    }


def _partitioned_graph(record: dict, entry: Entry) -> Any:
    from ember.codegen.glue import write_glue
    from ember.partition import describe, region_module, split
    from ember.runtime.partitioned import PartitionedGraph

    gm, label = entry.gm, entry.label
    partition = split(gm, dict(record["islands"]))
    decoder = Decoder(gm, [], record["tensors"])
    examples = {number: [decoder.value(code) for code in codes]
                for number, codes in record["examples"]}
    kept = dict(record["regions"])
    if sorted(kept) != [region.number for region in partition.regions]:
        raise ValueError("the islands give other regions")
    runs, eager = {}, {}
    for region in partition.regions:
        module = region_module(gm, region)
        name = f"{label}_region{region.number}"
        stand_ins = functools.partial(_region_stand_ins, examples[region.number])
        cold = Cold(module, stand_ins, region.grad_enabled, name, entry.recompile)
        eager[region.number] = module.forward
        runs[region.number] = _rebuild_graph(kept[region.number], module, cold, name)
    glue = write_glue(partition, {**eager, **runs}, examples, set(runs))
    if glue.text != record["glue"]:
        raise ValueError("the glue written again differs from the one kept")
    for island in partition.islands:  # (said as a cold compile says them)
        logs.channel("fallbacks").info("%s: %s runs as an eager island: %s", label,
                                       describe(island.node), island.reason)
    return PartitionedGraph(glue, label, partition, runs, eager, list(record["notes"]), [],
                            list(record["written_inputs"]), examples)


def _region_stand_ins(examples: list[Any]) -> list[Any]:
    return [example.stand_in() for example in examples]
