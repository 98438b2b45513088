"""Warm start: a compiled graph kept in the disk cache under the captured graph it came from,
so that a new process's first call pays capture and a lookup instead of lowering, passes,
scheduling, code generation and builds.

Takes a captured FX graph with its example inputs, and the compiled graph the backend made
of it; gives the entry's key (the graph's code and attributes, the inputs' metadata, the
settings, grad and autocast modes, ember's, torch's and Python's versions, the CPU and C
compiler), keeps what rebuilds the compiled graph (the wrapper sources, their namespaces
encoded value by value, the kernel libraries' sources, constants saved by torch.save) and
rebuilds it. A graph whose wrapper holds a value that cannot be encoded (a library call on an
arbitrary Python object, Triton launchers), and partitioned or training graphs, are not kept:
said on EMBER_LOGS=perf. An entry is trusted only after its digest and its recorded versions
check; a corrupt or foreign one is removed and the graph compiled again.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ember import config, logs, torch_internals
from ember.codegen.wrapper import WrapperSource
from ember.runtime import build, disk_cache
from ember.runtime.compiled import CompiledGraph

FORMAT = "ember-warm-1"
KIND = "warm"

# what this process's warm cache did (tests count with it: a warm first call lowers and
# builds nothing)
counts = {"hits": 0, "misses": 0, "kept": 0, "not_kept": 0, "rejected": 0}


class NotKept(Exception):
    """A compiled graph, or a value its wrapper holds, that an entry cannot carry."""


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
            parts.append(f"{node.target}: {_describe(_fetch(gm, node.target))}")
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


def _fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


# -- find and keep ------------------------------------------------------------------------
class Entry:
    """One graph's place in the warm cache: `compiled` is the graph rebuilt from it, or None
    (then `keep` stores what the backend compiles)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], label: str):
        self.gm = gm
        self.argument_count = len(example_inputs)
        self.label = label
        self.compiled: CompiledGraph | None = None
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
                compiled = _rebuild(record, self.gm, self.argument_count, self.label)
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

    def _keep(self, compiled: Any) -> None:
        record = _record(compiled, self.gm)
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
    if type(compiled) is not CompiledGraph:
        raise NotKept(f"a {type(compiled).__name__} (only graphs compiled whole into C "
                      f"kernels are kept)")
    if compiled.runs_eagerly:
        raise NotKept("it runs eagerly")
    encoder = _Encoder(gm)
    checked, fast = compiled.wrappers
    return {
        "versions": versions(),
        "checked": [checked.text, encoder.namespace(checked.namespace)],
        "fast": [fast.text, encoder.namespace(fast.namespace)],
        "libraries": encoder.libraries,
        "tensors": encoder.tensors,
        "tensor_positions": list(compiled.tensor_positions),
        "counts": [compiled.kernel_count, compiled.library_count, compiled.fallback_count],
        "written_inputs": list(compiled.written_inputs),
    }


def _rebuild(record: dict, gm: torch.fx.GraphModule, argument_count: int, label: str
             ) -> CompiledGraph:
    decoder = _Decoder(gm, record["libraries"], record["tensors"])
    wrappers = [WrapperSource(text, decoder.namespace(namespace))
                for text, namespace in (record["checked"], record["fast"])]
    kernel_count, library_count, fallback_count = record["counts"]
    return CompiledGraph(wrappers[0], wrappers[1], list(record["tensor_positions"]),
                         argument_count, gm.forward, label, kernel_count, library_count,
                         list(record["written_inputs"]), fallback_count)


_PLAIN = (type(None), bool, int, float, str)


class _Encoder:
    """Values of a wrapper's namespace as plain data (what torch.load(weights_only=True)
    reads back): each a list [kind, ...]. Every encoding is decoded again at once and must
    give the same value back, else the graph is not kept."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.attributes = {id(_fetch(gm, n.target)): n.target for n in gm.graph.nodes
                           if n.op == "get_attr"}
        self.libraries: list[list] = []
        self.tensors: list[torch.Tensor] = []
        self.decoder = _Decoder(gm, self.libraries, self.tensors)

    def namespace(self, namespace: dict[str, Any]) -> list[list]:
        encoded = []
        for name, value in namespace.items():
            if name == "misaligned" and type(value).__name__ == "_Lazy":
                encoded.append([name, ["unavailable"]])  # (called by CUDA wrappers only)
                continue
            try:
                encoded.append([name, self.value(value)])
            except NotKept as error:
                raise NotKept(f"its wrapper's {name} is {error}") from None
        return encoded

    def value(self, value: Any) -> list:
        code = self._encode(value)
        if code[0] in ("kernel", "tensor"):
            return code  # (found again by name, and saved whole)
        back = self.decoder.value(code)
        same = back is value or (type(back) is type(value) and not isinstance(
            value, torch.Tensor) and _equal(back, value))
        if not same:
            raise NotKept(f"{type(value).__name__} {value!r:.80}, which does not survive "
                          f"being kept")
        return code

    def _encode(self, value: Any) -> list:
        if type(value) in _PLAIN:
            return ["plain", value]
        if isinstance(value, (tuple, list)):
            return ["tuple" if isinstance(value, tuple) else "list",
                    [self._encode(v) for v in value]]
        if isinstance(value, dict) and type(value) is dict:
            return ["dict", [[self._encode(k), self._encode(v)] for k, v in value.items()]]
        if isinstance(value, slice):
            return ["slice", [self._encode(v) for v in (value.start, value.stop, value.step)]]
        if value is Ellipsis:
            return ["ellipsis"]
        if isinstance(value, torch.device):
            return ["device", str(value)]
        if isinstance(value, torch.Tensor):
            if id(value) in self.attributes:  # (fetched from the new process's graph)
                return ["attribute", self.attributes[id(value)]]
            if type(value) not in (torch.Tensor, torch.nn.Parameter) or \
                    value.device.type != "cpu":
                raise NotKept(f"a {type(value).__name__} on {value.device}")
            self.tensors.append(value.detach())
            return ["tensor", len(self.tensors) - 1]
        if isinstance(value, ctypes._CFuncPtr):
            return self._kernel(value)
        if torch_internals.is_op_overload(value) or \
                isinstance(value, torch_internals.OpOverloadPacket):
            return ["op", str(value)]
        if isinstance(value, torch_internals.TreeSpec):
            return ["treespec", torch_internals.treespec_dumps(value)]
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and \
                type(value).__module__.startswith("ember."):
            fields = [[f.name, self._encode(getattr(value, f.name))]
                      for f in dataclasses.fields(value)]
            return ["dataclass", type(value).__module__, type(value).__qualname__, fields]
        for name, known in _internal_callables().items():
            if value is known or value == known:
                return ["internal", name]
        text = str(value)
        if text.startswith("torch.") and getattr(torch, text[6:], None) is value:
            return ["torch", text[6:]]  # (a dtype, layout or memory format)
        module = getattr(value, "__module__", None)
        for attribute in (getattr(value, "__qualname__", None), getattr(value, "__name__", None)):
            if module and attribute and "<" not in attribute and \
                    _resolves(module, attribute, value):
                return ["global", module, attribute]
        raise NotKept(f"a {type(value).__name__} ({text:.80})")

    def _kernel(self, function: Any) -> list:
        path = getattr(function, "library_path", None)
        if path not in build.built_from:
            raise NotKept("a C function of a library ember did not build")
        source, link = build.built_from[path]
        entry = [source, link]
        if entry not in self.libraries:
            self.libraries.append(entry)
        return ["kernel", self.libraries.index(entry), function.__name__,
                len(function.argtypes)]


class _Decoder:
    def __init__(self, gm: torch.fx.GraphModule, libraries: list, tensors: list):
        self.gm = gm
        self.libraries = libraries
        self.tensors = tensors
        self.loaded: dict[int, ctypes.CDLL] = {}

    def namespace(self, encoded: list) -> dict[str, Any]:
        return {name: self.value(code) for name, code in encoded}

    def value(self, code: list) -> Any:
        kind = code[0]
        if kind == "plain":
            return code[1]
        if kind in ("tuple", "list"):
            items = [self.value(c) for c in code[1]]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            return {self.value(k): self.value(v) for k, v in code[1]}
        if kind == "slice":
            return slice(*(self.value(c) for c in code[1]))
        if kind == "ellipsis":
            return Ellipsis
        if kind == "device":
            return torch.device(code[1])
        if kind == "attribute":
            return _fetch(self.gm, code[1])
        if kind == "tensor":
            return self.tensors[code[1]]
        if kind == "kernel":
            return build.kernel_function(self._library(code[1]), code[2], code[3])
        if kind == "op":
            return _op(code[1])
        if kind == "treespec":
            return torch_internals.treespec_loads(code[1])
        if kind == "dataclass":
            cls = _resolve(code[1], code[2])
            return cls(**{name: self.value(c) for name, c in code[3]})
        if kind == "internal":
            return _internal_callables()[code[1]]
        if kind == "torch":
            return getattr(torch, code[1])
        if kind == "global":
            return _resolve(code[1], code[2])
        if kind == "unavailable":
            return _unavailable
        raise ValueError(f"unknown kind {kind!r}")

    def _library(self, index: int) -> ctypes.CDLL:
        if index not in self.loaded:
            source, link = self.libraries[index]
            path, _ = build.build(source, list(link))  # (a hit unless it was evicted)
            self.loaded[index] = build.load(path)
        return self.loaded[index]


def _unavailable(*args: Any) -> Any:
    raise RuntimeError("the build for misaligned inputs is not kept by a warm start")


def _internal_callables() -> dict[str, Any]:
    """Callables a wrapper's namespace holds that have no importable name of their own."""
    return {"plain_view": torch_internals.plain_view(),
            "plain_empty_cpu": torch_internals.plain_empty(torch.device("cpu"))}


def _resolve(module: str, qualname: str) -> Any:
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _resolves(module: str, qualname: str, value: Any) -> bool:
    try:
        return _resolve(module, qualname) is value
    except (ImportError, AttributeError):
        return False


def _op(text: str) -> Any:
    value: Any = torch.ops
    for part in text.split("."):
        value = getattr(value, part)
    return value


def _equal(first: Any, second: Any) -> bool:
    try:
        return bool(first == second)
    except Exception:  # noqa: BLE001 (a value whose == is not a truth: not the same)
        return False
