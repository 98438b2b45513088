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
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ember import config, logs, torch_internals
from ember.runtime import build, disk_cache, triton_launch, warm_graphs
from ember.runtime.compiled import after_eager_runs
from ember.runtime.warm_graphs import Cold
from ember.runtime.warm_records import Rejected, read_record, remove, write_record
from ember.runtime.warm_values import NotKept, fetch

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
                compiled = warm_graphs.rebuild(record, self)
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
                                      **warm_graphs.as_record(compiled, self.gm)})
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
