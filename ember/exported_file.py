"""An exported program's file, and loading it: one file holds a digest, then (torch.save,
read back with weights_only) the signature, the constants, the compiled graph encoded as the
warm cache encodes it (runtime/warm_values.py), the kernels' sources and binaries, and the
graph's eager form. A file that is not one, is damaged, or comes from another format is
refused with the file's name; a binary made for another CPU or compiler is rebuilt from its
source. It must not need the model's code: nothing in the file names it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import types
from pathlib import Path
from typing import Any

import torch

from ember import config
from ember.codegen.wrapper import WrapperSource
from ember.exported import ExportedProgram, ExportError
from ember.exported_signature import InputSpec, Signature
from ember.runtime import build, disk_cache, warm_cache, warm_graphs
from ember.runtime.compiled import CompiledGraph
from ember.runtime.warm_values import Decoder, Encoder, NotKept, fetch

FORMAT = "ember-export-1"
MAGIC = b"EMBER-EXPORT\n"

# what loads did in this process (tests count with them: a binary used, or rebuilt)
counts = {"binaries_loaded": 0, "rebuilt": 0}


class ExportFileError(ValueError):
    """A file that is not an ember export, or one that is damaged or made for another
    ember."""



def _digest(payload: bytes) -> str:
    return "sha256:" + hashlib.sha256(payload).hexdigest()


# -- the file -------------------------------------------------------------------------------
def record(program: ExportedProgram, gm: torch.fx.GraphModule) -> dict:
    """What the file holds (plain data and tensors: torch.load(weights_only=True) reads it)."""
    try:
        graph = warm_graphs.as_record(program.compiled, gm)
    except NotKept as error:
        raise ExportError(f"ember.export: the compiled graph cannot be saved: {error}") \
            from None
    binaries = []
    for source, link in graph["libraries"]:
        path, _ = build.build(source, list(link))  # (the cache's: a hit, or built again)
        binaries.append(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))
    signature = program.signature
    attributes = {node.target: fetch(gm, node.target).detach()
                  for node in gm.graph.nodes if node.op == "get_attr"
                  and isinstance(fetch(gm, node.target), torch.Tensor)}
    return {
        "format": FORMAT,
        "versions": {k: v for k, v in warm_cache.versions().items() if k != "format"},
        "machine": warm_cache.machine(),
        "cpu": build.cpu_identity(),
        # each library's key in the kernel cache (CPU, compiler, flags, source)
        "keys": [build.cache_key(source, _flags() + list(link), build.find_compiler())
                 for source, link in graph["libraries"]],
        "signature": {"parameters": signature.parameters,
                      "inputs": [dataclasses.asdict(spec) for spec in signature.inputs],
                      "structure": signature.structure,
                      "graph_inputs": signature.graph_inputs,
                      "outputs": signature.outputs,
                      "result_source": signature.result_source,
                      "relations": signature.relations},
        "constants": {name: _own(tensor) for name, tensor in program.constants.items()},
        "attributes": {name: _own(tensor) for name, tensor in attributes.items()},
        "graph": graph,
        "binaries": binaries,
        "eager": _eager_record(gm),
        "graph_text": program.graph_text,
        "compiled_text": program.compiled_text,
    }


def _flags() -> list[str]:
    return list(config.settings.cflags) + ["-shared", "-fPIC"]


def _own(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor with memory of its own (torch.save writes a view's whole storage), laid out
    with the same strides (the kernels were built for them)."""
    span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) \
        if tensor.numel() else 0
    if tensor.storage_offset() or tensor.untyped_storage().nbytes() > span * tensor.itemsize:
        return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                   device=tensor.device).copy_(tensor)
    return tensor


def _eager_record(gm: torch.fx.GraphModule) -> list | None:
    """The graph's eager form — FX's generated code and the globals it names (torch's
    functions and ops) — for the calls a compiled graph hands to eager; None where a global
    cannot be named in a new process."""
    code = gm.graph.python_code(root_module="self")
    encoder = Encoder(gm)
    names = []
    for name, value in code.globals.items():
        if isinstance(value, types.ModuleType):
            names.append([name, ["module", value.__name__]])
        elif value is type(None):
            names.append([name, ["none_type"]])
        else:
            try:
                names.append([name, encoder.value(value)])
            except NotKept:
                return None
    return [code.src, names]


def write(record: dict, path: Path) -> Path:
    """`record` as one file at `path`: the magic line, the digest, the payload."""
    buffer = io.BytesIO()
    torch.save(record, buffer)
    payload = buffer.getvalue()
    path.write_bytes(MAGIC + _digest(payload).encode() + b"\n" + payload)
    return path


def load(path: str | Path) -> ExportedProgram:
    """The program saved at `path`, ready to call; its kernels' binaries loaded, or rebuilt
    from their source where they were made for another CPU or C compiler."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ExportFileError(f"ember.load: cannot read {path}: {error}") from None
    if not data.startswith(MAGIC):
        raise ExportFileError(f"ember.load: {path} is not an ember export (it does not start "
                              f"with {MAGIC!r}; save one with ember.export(...).save(path))")
    digest, _, payload = data[len(MAGIC):].partition(b"\n")
    if digest.decode(errors="replace") != _digest(payload):
        raise ExportFileError(f"ember.load: {path} is damaged: its contents do not match the "
                              f"digest written when it was saved (cut short or altered)")
    try:
        record = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as error:  # noqa: BLE001 (a file torch cannot read back)
        raise ExportFileError(f"ember.load: {path} cannot be read ({type(error).__name__}: "
                              f"{str(error)[:200]})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise ExportFileError(f"ember.load: {path} is in format {found!r}; this ember reads "
                              f"{FORMAT!r}")
    try:
        return _loaded(record, path)
    except ExportFileError:
        raise
    except Exception as error:  # noqa: BLE001 (say which file, and which versions)
        raise ExportFileError(
            f"ember.load: {path} cannot be rebuilt here ({type(error).__name__}: "
            f"{str(error)[:300]}); it was made by {record.get('versions')}, this is "
            f"{ {k: v for k, v in warm_cache.versions().items() if k != 'format'} }") from None


def _loaded(record: dict, path: Path) -> ExportedProgram:
    saved = record["signature"]
    signature = Signature(saved["parameters"], [InputSpec(**spec) for spec in saved["inputs"]],
                          saved["structure"], saved["graph_inputs"], saved["outputs"],
                          saved["result_source"], saved["relations"])
    holder = _holder(record["attributes"])
    eager = _eager(record["eager"], holder, path)
    graph = record["graph"]
    decoder = _ExportDecoder(holder, graph["libraries"], graph["tensors"], record,
                             graph.get("modules", []))
    checked, fast = (WrapperSource(text, decoder.namespace(namespace))
                     for text, namespace in (graph["checked"], graph["fast"]))
    kernels, libraries, fallbacks = graph["counts"]
    compiled = CompiledGraph(checked, fast, list(graph["tensor_positions"]),
                             graph["argument_count"], eager, f"export {path.name}", kernels,
                             libraries, list(graph["written_inputs"]), fallbacks)
    return ExportedProgram(signature, dict(record["constants"]), compiled,
                           record["graph_text"], record["compiled_text"])


def _holder(attributes: dict[str, torch.Tensor]) -> Any:
    """An object whose dotted attributes are the graph's attributes (for FX's code and the
    wrapper's ["attribute", target] values)."""
    root = types.SimpleNamespace()
    for target, tensor in attributes.items():
        node = root
        *path, last = target.split(".")
        for part in path:
            if not hasattr(node, part):
                setattr(node, part, types.SimpleNamespace())
            node = getattr(node, part)
        setattr(node, last, tensor)
    return root


def _eager(saved: list | None, holder: Any, path: Path) -> Any:
    if saved is None:
        def refuse(*args: Any) -> Any:
            raise RuntimeError(f"{path.name}: the compiled graph gave up on this call and the "
                               f"program carries no eager form")
        return refuse
    source, names = saved
    decoder = _ExportDecoder(holder, [], [], {})
    namespace = {name: importlib.import_module(code[1]) if code[0] == "module" else
                 type(None) if code[0] == "none_type" else decoder.value(code)
                 for name, code in names}
    exec(compile(source, f"<ember export {path.name}: eager form>", "exec"),  # noqa: S102
         namespace)
    forward = namespace["forward"]
    return lambda *args: forward(holder, *args)


class _ExportDecoder(Decoder):
    """The warm cache's decoder, with the kernels' libraries from the export's binaries (or
    rebuilt from their source on another CPU or compiler)."""

    def __init__(self, holder: Any, libraries: list, tensors: list, record: dict,
                 modules: list | None = None):
        super().__init__(holder, libraries, tensors, modules)
        self.record = record

    def _library(self, index: int) -> Any:
        if index not in self.loaded:
            source, link = self.libraries[index]
            if self._fits():
                library = self._binary(index, source, list(link))
                counts["binaries_loaded"] += 1
            else:  # (made for another CPU or compiler: -march=native code may not run here)
                library, _ = build.build(source, list(link))
                counts["rebuilt"] += 1
            self.loaded[index] = build.load(library)
        return self.loaded[index]

    def _fits(self) -> bool:
        """Do the saved binaries fit this machine? Built here (the same CPU and compiler, as
        the warm cache's key says), or for this CPU where no compiler could rebuild them."""
        if self.record["machine"] == warm_cache.machine():
            return True
        try:
            build.find_compiler()
            return False
        except build.BuildError:
            return self.record["cpu"] == build.cpu_identity()

    def _binary(self, index: int, source: str, link: list[str]) -> Path:
        """The saved binary, placed in the kernel cache under the key it was built with."""
        data = self.record["binaries"][index].numpy().tobytes()
        key = self.record["keys"][index]
        library = disk_cache.entry_path("c", key, ".so")
        if not disk_cache.usable(library, key):
            with disk_cache.building("c", key, ".so") as library:
                if not disk_cache.usable(library, key):  # (placed while this one waited)
                    with disk_cache.temporary(library.parent, ".so", key) as partial:
                        partial.write_bytes(data)
                        disk_cache.commit(partial, library, key)
        build.built_from[str(library)] = (source, list(link))
        return library
