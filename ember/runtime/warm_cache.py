"""Warm start: a compiled graph kept in the disk cache under the captured graph it came from,
so that a new process's first call pays capture and a lookup instead of lowering, passes,
scheduling, code generation and builds.

Takes a captured FX graph with its example inputs, and the compiled graph the backend made
of it; gives the entry's key (the graph's code and attributes, the inputs' metadata, the
settings, grad and autocast modes, ember's, torch's and Python's versions, the CPU and C
compiler), keeps what rebuilds the compiled graph — inference or training — (the wrapper
sources, their namespaces encoded value by value, the kernel libraries' sources, constants
saved by torch.save) and rebuilds it. A graph whose wrapper holds a value that cannot be
encoded (a library call on an arbitrary Python object, Triton launchers), and partitioned
graphs, are not kept: said on EMBER_LOGS=perf. An entry is trusted only after its digest and
its recorded versions check; a corrupt or foreign one is removed and the graph compiled
again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ember import config, logs, torch_internals
from ember.codegen.wrapper import WrapperSource
from ember.runtime import build, disk_cache
from ember.runtime.compiled import CompiledGraph
from ember.runtime.training import TrainingGraph
from ember.runtime.warm_values import Decoder, Encoder, NotKept, fetch

FORMAT = "ember-warm-1"
KIND = "warm"

# what this process's warm cache did (tests count with it: a warm first call lowers and
# builds nothing)
counts = {"hits": 0, "misses": 0, "kept": 0, "not_kept": 0, "rejected": 0}


# -- the key ------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    """What an entry was made by; one made by another version is foreign."""
    import ember

    return {"format": FORMAT, "ember": f"{ember.__version__} {_ember_source()}",
            "torch": str(torch.__version__), "python": "{}.{}".format(*sys.version_info[:2])}


@functools.cache
def _ember_source() -> str:
    """A digest of ember's own source files: a change to ember (a checkout, an edit) makes
    its older entries foreign, even under the same version number (~5 ms, once)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def machine() -> str:
    """What the kernels' binaries depend on: the CPU (-march=native) and the C compiler."""
    try:
        compiler = build.compiler_identity(build.find_compiler())
    except build.BuildError:
        compiler = "no C compiler"
    return f"{build.cpu_identity()} {compiler}"


def key_of(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> str:
    settings = dataclasses.asdict(config.settings)
    for name in ("logs", "dump_dir", "cache_dir", "cache_max_mb"):  # (change no code)
        settings.pop(name)
    parts = [repr(sorted(versions().items())), machine(), repr(sorted(settings.items())),
             repr((torch.is_grad_enabled(), torch_internals.autocast_state(),
                   torch.are_deterministic_algorithms_enabled())),
             gm.code]
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            parts.append(f"{node.target}: {_describe(fetch(gm, node.target))}")
        elif node.op == "call_function":  # (the code names a function, not where it lives)
            target = node.target
            parts.append(f"{getattr(target, '__module__', None)}."
                         f"{getattr(target, '__qualname__', None) or target}")
    parts.extend(_describe(value) for value in example_inputs)
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


class Entry:
    """One graph's place in the warm cache: `compiled` is the graph rebuilt from it, or None
    (then `keep` stores what the backend compiles)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                 recompile: Callable[[torch.fx.GraphModule, list[Any], str], Any]):
        self.gm = gm
        self.argument_count = len(example_inputs)
        self.label = label
        self.compiled: Any = None
        # (a rebuilt training graph's forward and backward fall back to the graph compiled
        # cold: the inputs' metadata is kept for that, not the inputs)
        self.recompile = recompile
        self.examples = [(tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad)
                         if isinstance(x, torch.Tensor) else x for x in example_inputs]
        self.grad_enabled = torch.is_grad_enabled()
        self.cold: Any = None
        if getattr(_unwanted, "depth", 0) or not config.settings.warm_start:
            # (off, or a compile that needs its schedule: ember/aot.py)
            self.key = None
            return
        try:
            self.key: str | None = key_of(gm, example_inputs)
        except Exception as error:  # noqa: BLE001 (an odd graph attribute: no warm start)
            logs.channel("perf").info("%s has no warm-start key: %s: %s", label,
                                      type(error).__name__, error)
            self.key = None
            return
        self.path = disk_cache.entry_path(KIND, self.key, ".pt")
        self.compiled = self._load()

    def _load(self) -> CompiledGraph | None:
        start = time.perf_counter()
        try:
            data = self.path.read_bytes()
        except OSError:  # (none kept: the common miss)
            counts["misses"] += 1
            return None
        problem = _problem(data, self.path, self.key)
        record = None
        if problem is None:
            try:
                record = torch.load(io.BytesIO(data), weights_only=True)
                problem = _foreign(record)
            except Exception as error:  # noqa: BLE001 (a digest-valid entry torch cannot read)
                problem = f"it cannot be read ({type(error).__name__}: {str(error)[:200]})"
        if problem is None:
            try:
                compiled = _rebuild(record, self)
            except Exception as error:  # noqa: BLE001 (never trusted: compiled again)
                problem = f"it cannot be rebuilt ({type(error).__name__}: {str(error)[:200]})"
        if problem is not None:
            counts["rejected"] += 1
            logs.channel("fallbacks").info("the warm-start entry %s fails its check (%s): the "
                                           "graph is compiled again", self.path, problem)
            _remove(self.path)
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
        try:
            self._keep(compiled)
        except Exception as error:  # noqa: BLE001
            counts["not_kept"] += 1
            logs.channel("perf").info("%s is not kept for a warm start: %s%s", self.label,
                                      "" if isinstance(error, NotKept) else
                                      f"{type(error).__name__}: ", error)

    def compiled_cold(self) -> Any:
        """The graph compiled cold (once), on stand-ins of the example inputs."""
        if self.cold is None:
            logs.channel("fallbacks").info("%s: a warm-started graph needs its eager form: the "
                                           "graph is compiled again for it", self.label)
            examples = [torch.empty_strided(x[0], x[1], dtype=x[2], device=x[3])
                        .requires_grad_(x[4]) if isinstance(x, tuple) and len(x) == 5 and
                        isinstance(x[2], torch.dtype) else x for x in self.examples]
            with torch.set_grad_enabled(self.grad_enabled):
                self.cold = self.recompile(self.gm, examples, f"{self.label}_cold")
        return self.cold

    def _keep(self, compiled: Any) -> None:
        record = {"versions": versions(), **_record(compiled, self.gm)}
        buffer = io.BytesIO()
        torch.save(record, buffer)
        data = buffer.getvalue()
        try:
            with disk_cache.building(KIND, self.key, ".pt") as path:
                with disk_cache.temporary(path.parent, ".digest") as partial:
                    partial.write_text(disk_cache.digest(self.key, data) + "\n")
                    os.replace(partial, path.with_suffix(".digest"))
                with disk_cache.temporary(path.parent, ".pt") as partial:
                    partial.write_bytes(data)
                    os.replace(partial, path)
        except disk_cache.CacheUnusable as error:
            raise NotKept(str(error)) from None
        counts["kept"] += 1
        disk_cache.enforce_cap(keep=path)


def _problem(data: bytes, path: Path, key: str) -> str | None:
    try:
        recorded = path.with_suffix(".digest").read_text().strip()
    except OSError as error:
        return f"its digest cannot be read ({error})"
    if recorded != disk_cache.digest(key, data):
        return "its contents do not match the digest written when it was kept (cut short, " \
               "overwritten, or kept under another key)"
    return None


def _foreign(record: Any) -> str | None:
    if not isinstance(record, dict) or record.get("versions") != versions():
        found = record.get("versions") if isinstance(record, dict) else type(record).__name__
        return f"it was made by {found}, not {versions()}"
    return None


def _remove(path: Path) -> None:
    for stale in (path, path.with_suffix(".digest")):
        try:
            stale.unlink()
        except OSError:
            pass


# -- a compiled graph as a record, and back ------------------------------------------------
def _record(compiled: Any, gm: torch.fx.GraphModule) -> dict:
    if type(compiled) is TrainingGraph:
        return _training_record(compiled, gm)
    if type(compiled) is not CompiledGraph:
        raise NotKept(f"a {type(compiled).__name__} (graphs compiled whole into C kernels, "
                      f"for inference or training, are kept)")
    if compiled.runs_eagerly:
        raise NotKept("it runs eagerly")
    encoder = Encoder(gm)
    checked, fast = compiled.wrappers
    return {
        "kind": "compiled",
        "checked": [checked.text, encoder.namespace(checked.namespace)],
        "fast": [fast.text, encoder.namespace(fast.namespace)],
        "libraries": encoder.libraries,
        "tensors": encoder.tensors,
        "tensor_positions": list(compiled.tensor_positions),
        "argument_count": compiled.argument_count,
        "counts": [compiled.kernel_count, compiled.library_count, compiled.fallback_count],
        "written_inputs": list(compiled.written_inputs),
    }


def _rebuild(record: dict, entry: Entry) -> Any:
    if record["kind"] == "training":
        return _training_graph(record, entry)
    return _compiled_graph(record, entry, entry.gm.forward, entry.label)


def _compiled_graph(record: dict, entry: Entry, eager: Callable, label: str) -> CompiledGraph:
    decoder = Decoder(entry.gm, record["libraries"], record["tensors"])
    wrappers = [WrapperSource(text, decoder.namespace(namespace))
                for text, namespace in (record["checked"], record["fast"])]
    kernel_count, library_count, fallback_count = record["counts"]
    return CompiledGraph(wrappers[0], wrappers[1], list(record["tensor_positions"]),
                         record["argument_count"], eager, label, kernel_count,
                         library_count, list(record["written_inputs"]), fallback_count)


def _training_record(graph: TrainingGraph, gm: torch.fx.GraphModule) -> dict:
    """A training graph: its compiled forward and backward, and what of autodiff's split the
    autograd.Function reads (runtime/training.py)."""
    encoder = Encoder(gm)
    split = graph.split
    return {
        "kind": "training",
        "forward": _record(graph.forward_graph, gm),
        "backward": _record(graph.backward_graph, gm),
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
        "forward_outputs": [[list(node.shape), str(node.dtype).replace("torch.", "")]
                            for node in split.forward.outputs],
        "device": str(split.forward.device),
    }


def _training_graph(record: dict, entry: Entry) -> TrainingGraph:
    decoder = Decoder(entry.gm, [], record["tensors"])
    forward = _compiled_graph(record["forward"], entry, _ColdPart(entry, "forward_graph"),
                              entry.label)
    backward = _compiled_graph(record["backward"], entry, _ColdPart(entry, "backward_graph"),
                               f"{entry.label}_backward")
    outputs = [types.SimpleNamespace(shape=tuple(shape), dtype=getattr(torch, dtype))
               for shape, dtype in record["forward_outputs"]]
    split = types.SimpleNamespace(  # (the fields of autodiff's Split that training.py reads)
        # (no symbols: graphs compiled for every shape are not kept warm, shapes.py)
        forward=types.SimpleNamespace(outputs=outputs, device=torch.device(record["device"]),
                                      symbols={}),
        backward_inputs=[tuple(pair) for pair in record["backward_inputs"]],
        wrt=list(record["wrt"]), differentiable_outputs=list(record["differentiable_outputs"]),
        tapes=record["tapes"])
    return TrainingGraph(forward, backward, split, [decoder.value(c) for c in record["specs"]],
                         decoder.value(record["output_tree"]), record["output_count"],
                         list(record["tensor_positions"]),
                         [decoder.value(c) for c in record["extras"]], entry.label,
                         entry.gm.forward, grad_inside=record["grad_inside"])


class _ColdPart:
    """The eager form of a rebuilt training graph's forward or backward (in a graph compiled
    cold: the IR interpreter's run of it), for the calls a compiled graph gives to its eager
    form (a library call's unforeseen layout, aliased inputs): the graph compiled cold."""

    def __init__(self, entry: Entry, part: str):
        self.entry = entry
        self.part = part

    def __call__(self, *args: Any) -> Any:
        return getattr(self.entry.compiled_cold(), self.part).eager(*args)
