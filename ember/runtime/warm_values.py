"""A compiled graph's wrapper namespace as plain data, and back (for runtime/warm_graphs.py).

Takes the values a generated wrapper's namespace holds (kernels, aten ops, dtypes, devices,
torch's and ember's functions, constants, graph attributes, pytree specs, ember's
dataclasses); gives each as a list [kind, ...] that torch.load(weights_only=True) reads back,
and decodes it in a new process. Every encoding is decoded again at once and must give the
same value back; a value it cannot carry raises NotKept: such a graph is not kept.

A C kernel is kept as its library's source (found again in the kernel cache); a Triton kernel
as what compiles it (its module's source, its name, argument types, alignment, options and
target: runtime/triton_launch.CompileSource), compiled again in the new process, where
Triton's own cache has the binary; the values a compiled kernel's launch takes that only its
process knows (the launcher, the kernel's handle) as parts of that kernel, never by value.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
from typing import Any

import torch

from ember import torch_internals
from ember.ir.sizes import Size
from ember.runtime import build, c_launcher, triton_launch
from ember.runtime.wrappers import BuildNotKept


class NotKept(Exception):
    """A compiled graph, or a value its wrapper holds, that an entry cannot carry."""


def fetch(module: torch.nn.Module, target: str) -> Any:
    """A graph attribute (`layer.weight`) of `module`."""
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


_PLAIN = (type(None), bool, int, float, str)


class Encoder:
    """Values of a wrapper's namespace as plain data (what torch.load(weights_only=True)
    reads back): each a list [kind, ...]. Every encoding is decoded again at once and must
    give the same value back, else the graph is not kept."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.attributes = {id(fetch(gm, n.target)): n.target for n in gm.graph.nodes
                           if n.op == "get_attr"}
        self.libraries: list[list] = []
        self.tensors: list[list] = []   # [tensor on the CPU, its device]
        self.modules: list[str] = []    # Triton modules' sources
        self.decoder = Decoder(gm, self.libraries, self.tensors, self.modules)
        # (a part of a compiled Triton kernel's launch, ["triton_part", kernel, position])
        self.parts: list[tuple[Any, list]] = []

    def namespace(self, namespace: dict[str, Any], text: str) -> list[list]:
        """`namespace` of the wrapper `text`, encoded name by name."""
        self.parts = []
        for name, value in namespace.items():
            if isinstance(value, triton_launch.DeviceLaunch):
                # (its launcher and handle, and any other part of the launch that the text
                # names, are found again in the kernel compiled in the new process)
                for position, part in enumerate(value.prefix()):
                    if position < 2 or type(part) not in (type(None), bool, int):
                        self.parts.append((part, ["triton_part", name, position]))
        encoded = []
        for name, value in namespace.items():
            if name in _OTHER_BUILDS and type(value).__name__ in ("_Lazy", "_Builds"):
                # (a CUDA wrapper sends inputs that are not 16-byte aligned, a symbolic one
                # sizes past int32 or rows of another class, to another build: in a new
                # process, the graph's cold compile's; a C wrapper never calls them)
                encoded.append([name, ["cold_build", name] if f"{name}(" in text
                                else ["unavailable"]])
                continue
            try:
                encoded.append([name, self.value(value)])
            except NotKept as error:
                raise NotKept(f"its wrapper's {name} is {error}") from None
        return encoded

    def value(self, value: Any) -> list:
        code = self._encode(value)
        if code[0] == "triton_device":
            # (not compiled again here: what compiles it must come back as it was; the new
            # process compares Triton's hash of what it compiles with the kept one)
            text, source, grid = self.decoder.launch_source(code)
            if (dataclasses.replace(source, module=value.source.module), text, grid) != \
                    (value.source, triton_launch.module_texts[value.source.module],
                     value.grid):
                raise NotKept(f"a Triton kernel ({value.source.name}) whose source does not "
                              f"survive being kept")
            return code
        if code[0] in ("kernel", "tensor", "triton_part"):
            # (found again by name, saved whole, or a part of a kernel checked when rebuilt)
            return code
        back = self.decoder.value(code)
        same = back is value or (type(back) is type(value) and not isinstance(
            value, torch.Tensor) and _equal(back, value))
        if not same:
            raise NotKept(f"{type(value).__name__} {value!r:.80}, which does not survive "
                          f"being kept")
        return code

    def _encode(self, value: Any) -> list:
        for part, code in self.parts:
            # (the same object; or an equal one, as each reading of a bound method makes)
            if value is part or (type(part) not in _PLAIN and type(value) is type(part)
                                 and _equal(value, part)):
                return code
        if type(value) in _PLAIN:
            return ["plain", value]
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):  # (a NamedTuple:
            kind = type(value)                                # ir/library.Slot, not a tuple)
            if not kind.__module__.startswith("ember."):
                raise NotKept(f"a {kind.__qualname__} (a named tuple of another library)")
            return ["namedtuple", kind.__module__, kind.__qualname__,
                    [self._encode(v) for v in value]]
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
        if isinstance(value, Size):  # (a symbolic size: its terms, symbols as dataclasses)
            return ["size", [[self._encode(monomial), coefficient]
                             for monomial, coefficient in value.terms]]
        if isinstance(value, torch.Tensor):
            if id(value) in self.attributes:  # (fetched from the new process's graph)
                return ["attribute", self.attributes[id(value)]]
            if type(value) not in (torch.Tensor, torch.nn.Parameter) or \
                    value.device.type not in ("cpu", "cuda"):
                raise NotKept(f"a {type(value).__name__} on {value.device}")
            self.tensors.append([value.detach().cpu(), str(value.device)])
            return ["tensor", len(self.tensors) - 1]
        if isinstance(value, ctypes._CFuncPtr):
            return self._kernel(value)
        if c_launcher.is_kernel(value):  # (its ctypes function names it)
            return self._kernel(value.function, value.releases_gil)
        if isinstance(value, triton_launch.InterpretedLaunch):
            return ["triton_interpreted", self._module(value.module), value.name,
                    self._encode(value.grid), value.checks, value.function]
        if isinstance(value, triton_launch.DeviceLaunch):
            return self._device_launch(value)
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

    def _kernel(self, function: Any, releases_gil: bool = True) -> list:
        path = getattr(function, "library_path", None)
        if path not in build.built_from:
            raise NotKept("a C function of a library ember did not build")
        source, link = build.built_from[path]
        entry = [source, link]
        if entry not in self.libraries:
            self.libraries.append(entry)
        return ["kernel", self.libraries.index(entry), function.__name__,
                len(function.argtypes), releases_gil]

    def _module(self, name: str) -> int:
        text = triton_launch.module_texts.get(name)
        if text is None:
            raise NotKept(f"a Triton kernel of a module ember did not load ({name})")
        if text not in self.modules:
            self.modules.append(text)
        return self.modules.index(text)

    def _device_launch(self, launch: Any) -> list:
        source = launch.source
        if source is None:
            raise NotKept("a compiled Triton kernel whose source ember did not keep")
        parts, self.parts = self.parts, []  # (its own parts by value: compared when rebuilt)
        try:
            options = [[key, self._encode(value)] for key, value in source.options]
            return ["triton_device", self._module(source.module), source.name,
                    [list(pair) for pair in source.signature], list(source.aligned), options,
                    list(source.target), source.device_index, self._encode(launch.grid),
                    getattr(launch.compiled, "hash", None),
                    self._encode(tuple(launch.prefix()[2:]))]
        finally:
            self.parts = parts


class Decoder:
    """Encoded values back (`cold`: the graph compiled cold, for the calls a rebuilt wrapper
    sends to its other builds: CUDA's misaligned inputs, a symbolic graph's int64 indices and
    row classes; None for a loaded export, whose other builds then say they are missing)."""

    def __init__(self, gm: torch.fx.GraphModule, libraries: list, tensors: list,
                 modules: list | None = None, cold: Any = None):
        self.gm = gm
        self.libraries = libraries
        self.tensors = tensors
        self.modules = modules if modules is not None else []
        self.cold = cold
        self.loaded: dict[int, ctypes.CDLL] = {}
        self.placed: dict[int, torch.Tensor] = {}
        self.rebuilt: dict[tuple, Any] = {}  # (module source, CompileSource) → DeviceLaunch

    def namespace(self, encoded: list) -> dict[str, Any]:
        namespace = {name: self.value(code) for name, code in encoded
                     if code[0] != "triton_part"}
        for name, code in encoded:  # (parts of kernels rebuilt above)
            if code[0] == "triton_part":
                launch = namespace[code[1]]
                if not isinstance(launch, triton_launch.DeviceLaunch):
                    raise ValueError(f"{name} is a part of {code[1]}, not a Triton kernel")
                namespace[name] = launch.prefix()[code[2]]
        return namespace

    def value(self, code: list) -> Any:
        kind = code[0]
        if kind == "plain":
            return code[1]
        if kind in ("tuple", "list"):
            items = [self.value(c) for c in code[1]]
            return tuple(items) if kind == "tuple" else items
        if kind == "namedtuple":
            return _resolve(code[1], code[2])(*(self.value(c) for c in code[3]))
        if kind == "dict":
            return {self.value(k): self.value(v) for k, v in code[1]}
        if kind == "slice":
            return slice(*(self.value(c) for c in code[1]))
        if kind == "ellipsis":
            return Ellipsis
        if kind == "device":
            return torch.device(code[1])
        if kind == "size":
            return Size(tuple((self.value(monomial), coefficient)
                              for monomial, coefficient in code[1]))
        if kind == "attribute":
            return fetch(self.gm, code[1])
        if kind == "tensor":
            if code[1] not in self.placed:
                tensor, device = self.tensors[code[1]]
                self.placed[code[1]] = tensor if device == "cpu" else tensor.to(device)
            return self.placed[code[1]]
        if kind == "kernel":
            # (the launcher where the disk cache has it: a warm start waits for no build)
            return build.kernel_function(self._library(code[1]), code[2], code[3],
                                         release_gil=code[4], wait=False)
        if kind == "triton_interpreted":
            module = triton_launch.load_module(self.modules[code[1]])
            function = code[5] if len(code) > 5 else ""
            return triton_launch.InterpretedLaunch(getattr(module, function or code[2]),
                                                   self.value(code[3]), code[2], code[4],
                                                   module.__name__, function)
        if kind == "triton_device":
            return self._device_launch(code)
        if kind in ("cold_build", "cold_misaligned"):
            name = code[1] if kind == "cold_build" else "misaligned"
            if self.cold is None:  # (a loaded export: no graph to compile again)
                return _Unavailable(name)
            return _ColdBuild(self.cold, name)
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

    def launch_source(self, code: list) -> tuple[str, Any, tuple]:
        """A compiled Triton kernel's code → its module's source, what compiles it (its
        module's name left empty: load_module names it) and its grid."""
        _, module, name, signature, aligned, options, target, device_index, grid = code[:9]
        source = triton_launch.CompileSource(
            "", name, tuple(tuple(pair) for pair in signature), tuple(aligned),
            tuple((key, self.value(value)) for key, value in options), tuple(target),
            device_index)
        return self.modules[module], source, self.value(grid)

    def _device_launch(self, code: list) -> Any:
        digest, rest = code[9:]
        text, source, grid = self.launch_source(code)
        known = self.rebuilt.get((text, source))  # (kernels launched as one binary)
        if known is None:
            launch = self.rebuilt[(text, source)] = \
                triton_launch.rebuild_launch(text, source, grid)
        else:
            launch = triton_launch.DeviceLaunch(known.compiled, grid, known.source)
        if launch.compiled.hash != digest:
            raise ValueError(f"Triton compiled {launch.source.name} to "
                             f"{launch.compiled.hash}, not {digest}")
        if tuple(launch.prefix()[2:]) != self.value(rest):
            raise ValueError(f"{launch.source.name} rebuilt here launches with other metadata")
        return launch

    def _library(self, index: int) -> ctypes.CDLL:
        if index not in self.loaded:
            source, link = self.libraries[index]
            path, _ = build.build(source, list(link))  # (a hit unless it was evicted)
            self.loaded[index] = build.load(path)
        return self.loaded[index]


# The builds a wrapper may send a call to (ember/compile_plan.py: inputs not 16-byte aligned,
# offsets past int32, rows of another class)
_OTHER_BUILDS = ("misaligned", "wide", "rows")


def _unavailable(*args: Any) -> Any:
    raise RuntimeError("a wrapper's other build is not kept by a warm start")


class _Unavailable:
    """A loaded export's other build (its file keeps the first build only): a call that
    needs it says so."""

    WHAT = {"misaligned": "inputs that are not 16-byte aligned",
            "wide": "sizes whose offsets pass int32",
            "rows": "rows of another length class than the example's"}

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args: Any) -> Any:
        raise BuildNotKept(
            f"the exported program keeps the build for its example's sizes only, and a call "
            f"needs the one for {self.WHAT.get(self.name, self.name)}")


class _ColdBuild:
    """A rebuilt wrapper's other build (`name` in its namespace): the one of the graph
    compiled cold (once, on the first call that needs it: `cold()` gives that compiled
    graph)."""

    def __init__(self, cold: Any, name: str):
        self.cold = cold
        self.name = name

    def __call__(self, *args: Any) -> Any:
        return self.cold().wrappers[1].namespace[self.name](*args)


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
    """Equal values; ember's dataclasses that compare by identity (eq=False: autodiff's
    TapedCall, two of which never merge) field by field, as their encoding keeps them; a
    named tuple is never equal to a plain one (`fill` tells a Slot from a tuple)."""
    if type(first) is not type(second) and (hasattr(type(first), "_fields") or
                                            hasattr(type(second), "_fields")):
        return False
    if dataclasses.is_dataclass(first) and not isinstance(first, type) and \
            type(first) is type(second) and type(first).__eq__ is object.__eq__:
        return all(_equal(getattr(first, f.name), getattr(second, f.name))
                   for f in dataclasses.fields(first))
    if type(first) in (tuple, list) and type(second) is type(first):
        return len(first) == len(second) and all(_equal(a, b) for a, b in zip(first, second))
    if type(first) is dict and type(second) is dict:
        return first.keys() == second.keys() and all(_equal(v, second[k])
                                                     for k, v in first.items())
    try:
        return bool(first == second)
    except Exception:  # noqa: BLE001 (a value whose == is not a truth: not the same)
        return False
