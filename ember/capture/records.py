"""A capture as plain data, for a warm start before capture (ember/warm_entries.py): its
guards, input sources, scope constants, runner constants and FX graph.

Takes what a capture left (GuardSet, Sources, the K and GG of its scope, the runner's
namespace, the FX graph); gives lists [kind, ...] that torch.load(weights_only=True) reads
back, and decodes them in a new process. Objects are kept by name only: a module, class or
function resolves through sys.modules (never imported here: a module the new process has not
imported is a miss), a function also by its code's digest, and the file of a user's module
by its digest (`files`). An nn.Module whose identity guard the entry replaces (and its
__dict__) is kept as the source that reaches it again in the new process (`reached`). Any
other object without such a name (a lambda, a tensor made at import time) raises NotKept: its
entry is not kept.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import hashlib
import importlib
import os
import sys
import sysconfig
import time
import types
from typing import Any

import torch

from ember import torch_internals
from ember.capture import sources
from ember.capture.guards import GuardSet
from ember.capture.semantics import is_enum_member
from ember.capture.sources import Source
from ember.capture.symbols import Relation, SymbolRead
from ember.meta_keys import REQUIRES_GRAD
from ember.runtime import switches


class NotKept(Exception):
    """A capture (or a value of it) that an entry cannot carry."""


class Unresolved(Exception):
    """A kept name that this process does not resolve to what it named (a module not
    imported, a function whose code changed): the entry is not used."""


def code_digest(code: types.CodeType) -> str:
    """What a code object does, as a digest: its bytecode, constants (nested code too), names,
    signature, place and line table (computed once per code object: a keep digests the
    same functions' code for each guard and value that names them)."""
    known = _code_digests.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    digest = hashlib.sha256()
    _digest_code(code, digest)
    text = digest.hexdigest()
    if len(_code_digests) >= 16384:
        _code_digests.clear()
    _code_digests[id(code)] = (code, text)  # (a keep's thread and the caller's both ask)
    return text


# (by id, the code object held beside its digest: code objects compare equal across files)
_code_digests: dict[int, tuple[types.CodeType, str]] = {}


def _digest_code(code: types.CodeType, digest: Any) -> None:
    for part in (code.co_code, code.co_exceptiontable, code.co_linetable):
        digest.update(part)
        digest.update(b"\0")
    for part in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                 code.co_filename, code.co_qualname, code.co_firstlineno, code.co_flags,
                 code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount):
        digest.update(repr(part).encode() + b"\0")
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):  # (by its own digest: each code hashed once)
            digest.update(code_digest(constant).encode() + b"\0")
        else:
            digest.update(_constant_text(constant).encode() + b"\0")


def _constant_text(value: Any) -> str:
    """A code constant as text that is the same in every process (a frozenset's repr follows
    its strings' hashes, which differ per process)."""
    if isinstance(value, frozenset):
        return "frozenset(" + ", ".join(sorted(_constant_text(v) for v in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ", ".join(_constant_text(v) for v in value) + ")"
    return f"{type(value).__name__}:{value!r}"


def file_digest(path: str) -> str | None:
    """The digest of the file's bytes (read again only where its size, modification time or
    inode changed since it was last read in this process), None where it cannot be read.
    A file modified in the last seconds is read every time: two edits within one tick of
    the file system's clock leave the same modification time (as git's racy entries)."""
    try:
        status = os.stat(path)
        stamp = (status.st_mtime_ns, status.st_size, status.st_ino)
        known = _file_digests.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        with open(path, "rb") as file:
            digest = hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return None
    if time.time_ns() - status.st_mtime_ns > 2_000_000_000:
        _file_digests[path] = (stamp, digest)
    return digest


_file_digests: dict[str, tuple[tuple[int, int, int], str]] = {}
# (a path's links resolved once per process: a keep asks for the same few files' often)
_realpath = functools.lru_cache(maxsize=4096)(os.path.realpath)


def inlined_file(code: types.CodeType) -> tuple[str, str]:
    """(path, digest) of the file whose source gives `code`, checked: the file must hold
    that very code (a file edited after its module was imported would otherwise vouch for
    code this process never ran). A file last modified before this process started holds
    it (the process imported the file as it is); a newer one is compiled again and its
    code compared (a model library's files: compiling BERT's took about a second)."""
    if not os.path.isabs(code.co_filename):  # (a path relative to a folder since left)
        raise NotKept(f"it inlined {code.co_qualname}, from {code.co_filename}")
    path = _realpath(code.co_filename)
    digest = file_digest(path)
    if digest is None or not (_older_than_this_process(path) or
                              code_digest(code) in _codes_of(code.co_filename, digest)):
        raise NotKept(f"it inlined {code.co_qualname}, whose file ({code.co_filename}) does "
                      f"not hold its code now")
    return path, digest


def _older_than_this_process(path: str) -> bool:
    """Was the file last modified (its contents or its metadata) before this process
    started, by more than the clocks' resolution? False where either time is unknown."""
    started = _process_start()
    try:
        status = os.stat(path)
    except OSError:
        return False
    return started is not None and max(status.st_mtime, status.st_ctime) < started - 2.0


@functools.cache
def _process_start() -> float | None:
    """This process's start, in seconds since the epoch (Linux's /proc), or None."""
    try:
        with open("/proc/self/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as file:
            boot = next(int(line.split()[1]) for line in file if line.startswith(b"btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


@functools.lru_cache(maxsize=64)
def _codes_of(path: str, digest: str) -> frozenset[str]:
    """The digests of every code object of the file at `path` (read as `digest` says)."""
    with open(path, "rb") as file:
        source = file.read()
    found: set[str] = set()
    try:
        pending = [builtins.compile(source, path, "exec", dont_inherit=True)]
    except (SyntaxError, ValueError):
        return frozenset()
    while pending:
        code = pending.pop()
        found.add(code_digest(code))
        pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(found)


def _package_folder(module: types.ModuleType) -> str:
    return os.path.dirname(os.path.realpath(module.__file__)) + os.sep


# Code whose version the entry's key already names: torch's and ember's (their versions and
# ember's source digest), Python's own library (its version)
_PACKAGES = (_package_folder(torch), _package_folder(sys.modules["ember"]))
_STANDARD = tuple({os.path.realpath(sysconfig.get_paths()[name]) + os.sep
                   for name in ("stdlib", "platstdlib")})


def made_by_dataclasses(code: types.CodeType) -> bool:
    """A method @dataclass wrote (__init__, __eq__, ... from "<string>"): no file holds it;
    what decides it is its class's definition, whose file a record names wherever the
    capture reached the class (a guard on it, or the runner making one), and Python's
    version."""
    return code.co_filename == "<string>" and \
        code.co_qualname.startswith("__create_fn__.<locals>.")


@functools.lru_cache(maxsize=4096)
def versioned(path: str) -> bool:
    """Is the file at `path` one whose version the key names (torch's, ember's, Python's own
    library)? Not an installed package's (transformers, timm: digested like a user's file,
    so an upgraded library makes an entry stale), though a virtual environment's library
    folder, which Python's `platstdlib` names, holds their site-packages."""
    # ("<frozen _collections_abc>": a module frozen into the interpreter, its version's own)
    if path.startswith("<frozen "):
        return True
    real = _realpath(path)
    return real.startswith(_PACKAGES) or real.startswith(_STANDARD) and \
        not any(part in ("site-packages", "dist-packages") for part in real.split(os.sep))


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


class Encoder:
    """Values as plain data, by name (see the module's docstring); `files`: the user's files
    the named values come from, with their digests. `reached`: objects without a name that
    the entry finds again through a source in each new process (an nn.Module whose identity
    guard the warm entry replaces, its __dict__: ember/warm_entries.py), by id -> (object,
    source); they decode to what the source reaches for the call."""

    def __init__(self, reached: dict[int, tuple[Any, Source]] | None = None) -> None:
        self.files: dict[str, str] = {}
        self.reached = reached or {}
        self._decoder: Decoder | None = None
        self._sources: dict[Source, list] = {}

    def decoder(self) -> Decoder:
        """A decoder for what this encoder wrote, its reached objects the ones it knows (made
        once: every value encoded is decoded again to check it)."""
        if self._decoder is None:
            by_source = {source.expr(): value for value, source in self.reached.values()}
            self._decoder = Decoder(lambda source: by_source[source.expr()])
        return self._decoder

    def value(self, value: Any) -> list:
        code = self._encode(value)
        back = self.decoder().value(code)
        if not (back is value or (type(back) is type(value) and _equal(back, value))):
            raise NotKept(f"a {type(value).__name__} ({value!r:.80}) that does not survive "
                          f"being kept")
        return code

    def _encode(self, value: Any) -> list:
        kind = type(value)
        known = self.reached.get(id(value))
        if known is not None and known[0] is value:
            if isinstance(value, types.FunctionType):  # (found again, its code checked)
                return ["reached", self._source(known[1]), code_digest(value.__code__)]
            return ["reached", self._source(known[1])]
        if kind in _PLAIN:
            return ["plain", value]
        if kind in (tuple, list, set, frozenset):
            return [kind.__name__, [self._encode(v) for v in value]]
        if kind is dict:
            return ["dict", [[self._encode(k), self._encode(v)] for k, v in value.items()]]
        if kind is slice:
            return ["slice", [self._encode(v) for v in (value.start, value.stop, value.step)]]
        if kind is range:
            return ["range", [value.start, value.stop, value.step]]
        if value is Ellipsis:
            return ["ellipsis"]
        if kind is torch.Size:
            return ["torch.Size", list(value)]
        if kind is torch.device:
            return ["device", str(value)]
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            name = str(value).removeprefix("torch.")
            if getattr(torch, name, None) is value:
                return ["torch", name]
        if isinstance(value, Source):
            return self._source(value)
        if kind is Relation:  # (a "size" guard's: over symbols, some tensors' strides)
            return ["relation", value.template, list(value.symbols),
                    [self._source(source) for source in value.sources]]
        if type(value).__name__ == "_KeyRef":  # (a dict key kept as K[i]: its expression)
            return ["expression", repr(value)]
        if torch_internals.is_op_overload(value) or \
                isinstance(value, torch_internals.OpOverloadPacket):
            return ["op", str(value)]
        namespace = torch_internals.op_namespace_name(value)
        if namespace is not None:  # (torch.ops.aten)
            return ["op_namespace", namespace]
        if kind is switches.Switch:  # (a with-block's backend switch: the call that makes it)
            return ["switch", self._encode(value.factory), self._encode(list(value.args)),
                    self._encode(value.kwargs)]
        if isinstance(value, types.ModuleType):
            if sys.modules.get(value.__name__) is not value:
                raise NotKept(f"the module {value.__name__}, which sys.modules does not hold")
            return ["module", value.__name__]
        named = _name(value)
        if named is None:
            raise NotKept(f"a {type(value).__name__} without a name to find it again by "
                          f"({str(value):.80})")
        module, attribute = named
        self._file(module, value)
        if isinstance(value, types.FunctionType):
            return ["function", module, attribute, code_digest(value.__code__)]
        return ["global", module, attribute]

    def _source(self, source: Source) -> list:
        # (one list per source: a module's guards and inputs share their sources' stems,
        # and pickle writes a list it has written once as a reference to it)
        try:
            return self._sources[source]
        except (KeyError, TypeError):  # (TypeError: a source over an unhashable value)
            pass
        if getattr(sources, type(source).__name__, None) is not type(source) or \
                not dataclasses.is_dataclass(source):
            raise NotKept(f"a source of another kind ({type(source).__name__})")
        code = ["source", type(source).__name__,
                [self._encode(getattr(source, field.name))
                 for field in dataclasses.fields(source)]]
        try:
            self._sources[source] = code
        except TypeError:
            pass
        return code

    def _file(self, module_name: str, value: Any) -> None:
        """The user's file that `value` comes from, digested (torch's, ember's and Python's
        own are named by their versions)."""
        module = sys.modules.get(module_name)
        path = getattr(module, "__file__", None)
        if path is None:
            if module_name in sys.builtin_module_names or module_name.startswith("torch."):
                return  # (a C module: torch._C and its parts, builtins, _operator)
            raise NotKept(f"{getattr(value, '__qualname__', value)} comes from {module_name}, "
                          f"which has no file to check it against")
        if versioned(path):
            return
        digest = file_digest(path) if os.path.isabs(path) else None
        if digest is None:
            raise NotKept(f"the file {path} cannot be read")
        self.files[_realpath(path)] = digest

    def guards(self, guards: GuardSet) -> list:
        """The guards, each [kind, source, expected] ("size" guards: a relation over the
        symbols, whose reads `symbol_reads` keeps)."""
        encoded = []
        for guard in guards.guards.values():
            encoded.append([guard.kind, None if guard.source is None
                            else self._source(guard.source), self._encode(guard.expected)])
        # (decoded at once: what comes back must be the same guards)
        if [g.key() for g in self.decoder().guards(encoded).guards.values()] != \
                list(guards.guards):
            raise NotKept("its guards do not survive being kept")
        return encoded

    def symbol_reads(self, guards: GuardSet) -> list:
        """Where each symbol of the "size" guards is read: [name, source, kind, index]."""
        return [[name, self._source(read.source), read.kind, read.index]
                for name, read in guards.symbol_reads.items()]

    def graph(self, gm: torch.fx.GraphModule) -> list:
        """The FX graph's nodes: [op, name, target, args, kwargs, stack trace, whether its
        example value requires grad (None: not a tensor)] each. (The lowering reads that
        bit of the capture's example values: which of an attention call's operands eager
        differentiates. A graph rebuilt without it split otherwise than the kept one.)"""
        nodes = []
        for node in gm.graph.nodes:
            if node.op not in ("placeholder", "call_function", "call_method", "output"):
                raise NotKept(f"its graph has a {node.op} node ({node.name})")
            target = node.target if isinstance(node.target, str) else \
                self._encode(node.target)
            example = node.meta.get("example_value")
            nodes.append([node.op, node.name, target, self._argument(node.args),
                          self._argument(node.kwargs), node.meta.get("stack_trace"),
                          example.requires_grad if isinstance(example, torch.Tensor)
                          else None])
        return nodes

    def _argument(self, value: Any) -> list:
        if isinstance(value, torch.fx.Node):
            return ["node", value.name]
        if isinstance(value, (tuple, list)):  # (FX's immutable lists too)
            return ["tuple" if isinstance(value, tuple) else "list",
                    [self._argument(v) for v in value]]
        if isinstance(value, dict):
            return ["dict", [[self._encode(k), self._argument(v)] for k, v in value.items()]]
        return self._encode(value)


def has_name(value: Any) -> bool:
    """Can `value` be kept by name (found again through sys.modules)?"""
    return _name(value) is not None


def _name(value: Any) -> tuple[str, str] | None:
    """(module, attribute path) that finds `value` again, through sys.modules (a property
    through its class, by its getter's name: what a class-member guard expects)."""
    named = value.fget if isinstance(value, property) and value.fget is not None else value
    if isinstance(value, (staticmethod, classmethod)):  # (as its class's __dict__ holds it)
        qualname = getattr(value.__func__, "__qualname__", "")
        owner, _, attribute = qualname.rpartition(".")
        module = getattr(value.__func__, "__module__", None)
        if owner and "<" not in qualname and isinstance(module, str):
            path = f"{owner}.__dict__.{attribute}"
            try:
                if _resolve(module, path) is value:
                    return module, path
            except Unresolved:
                pass
        return None
    module = getattr(named, "__module__", None)
    objclass = getattr(value, "__objclass__", None)
    candidates = []
    for name in (getattr(named, "__qualname__", None), getattr(named, "__name__", None)):
        if isinstance(name, str) and "<" not in name:
            if isinstance(module, str):
                candidates.append((module, name))
            if objclass is not None and "." not in name:  # (a method of a C class)
                candidates.append((objclass.__module__, f"{objclass.__qualname__}.{name}"))
    qualified = getattr(value, "qualified_name", None)  # (a TorchScript function: by its
    if isinstance(qualified, str) and qualified.startswith("__torch__."):  # Python name)
        module_name, _, attribute = qualified.removeprefix("__torch__.").rpartition(".")
        candidates.append((module_name, attribute))
    if is_enum_member(value):  # (a member: by its class's name and its own)
        kind = type(value)  # (pybind11's may be named otherwise where its module holds it)
        candidates.extend((kind.__module__, f"{name}.{value.name}")
                          for name in {kind.__qualname__, kind.__name__})
    for module_name, attribute in candidates:
        try:
            found = _resolve(module_name, attribute)
        except Unresolved:
            continue
        # (a decorated function: the name finds its wrapper, which holds it as __wrapped__,
        # functools.wraps' way; transformers' models' forwards are such)
        for _ in range(_WRAPPERS_FOLLOWED + 1):
            if found is value:
                return module_name, attribute
            found = getattr(found, "__wrapped__", None)
            if found is None:
                break
            attribute += ".__wrapped__"
    if isinstance(value, type) and module == "builtins":  # (NoneType, FunctionType, ...:
        for name, member in vars(types).items():         # the interpreter's types, which
            if member is value:                           # builtins does not name)
                return "types", name
    # (a module's own singleton, such as dataclasses' _FIELD: a global of its class's module)
    home = sys.modules.get(getattr(type(value), "__module__", None) or "")
    for name, member in (vars(home).items() if home is not None else ()):
        if member is value and isinstance(name, str) and name.isidentifier():
            return home.__name__, name
    return None


_WRAPPERS_FOLLOWED = 4


def imported_module(name: str) -> types.ModuleType:
    """The module `name` as this process has it; ember's own imported now (a guard's helper,
    as capture.attributes.class_lookup, whose module a warm start has not needed yet); any
    other module not imported yet: Unresolved (importing the user's modules is not ours)."""
    module = sys.modules.get(name)
    if module is None and name.startswith("ember."):
        module = importlib.import_module(name)
    if module is None:
        raise Unresolved(f"the module {name} is not imported")
    return module


def _resolve(module_name: str, attribute: str) -> Any:
    found: Any = imported_module(module_name)
    parts = attribute.split(".")
    for at, part in enumerate(parts):
        try:  # (after "__dict__", an item of the class's own: a staticmethod as it is)
            found = found[part] if at and parts[at - 1] == "__dict__" else getattr(found, part)
        except (AttributeError, KeyError):
            raise Unresolved(f"{module_name}.{attribute} does not exist") from None
    return found


class _Expression:
    """A dict key that a source writes as an expression (K[i]): what repr gives."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Decoder:
    """Encoded values back; a name this process does not resolve to what was kept raises
    Unresolved. `reach(source)`: the object a reached value's source finds for this call
    (none given: such a value is Unresolved)."""

    def __init__(self, reach: Any = None) -> None:
        self.reach = reach
        self._sources: dict[int, tuple[list, Any]] = {}  # id(code) -> (code, source)

    def value(self, code: list) -> Any:
        kind = code[0]
        if kind == "plain":
            return code[1]
        if kind == "reached":
            if self.reach is None:
                raise Unresolved("an object reached through a source, without a call")
            source = self.value(code[1])
            found = self.reach(source)
            if len(code) > 2 and not (isinstance(found, types.FunctionType) and
                                      code_digest(found.__code__) == code[2]):
                raise Unresolved(f"{source.expr()} is not the function it was")
            return found
        if kind == "hooks_made":  # (torch's count of hook handles, in this process)
            return torch_internals.hooks_made()
        if kind in ("tuple", "list", "set", "frozenset"):
            return {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}[kind](
                self.value(c) for c in code[1])
        if kind == "dict":
            return {self.value(k): self.value(v) for k, v in code[1]}
        if kind == "slice":
            return slice(*(self.value(c) for c in code[1]))
        if kind == "range":
            return range(*code[1])
        if kind == "ellipsis":
            return Ellipsis
        if kind == "torch.Size":
            return torch.Size(code[1])
        if kind == "device":
            return torch.device(code[1])
        if kind == "torch":
            return getattr(torch, code[1])
        if kind == "source":  # (one object per list: the encoder shares a source's list)
            made = self._sources.get(id(code))
            if made is None or made[0] is not code:
                made = self._sources[id(code)] = (
                    code, getattr(sources, code[1])(*(self.value(c) for c in code[2])))
            return made[1]
        if kind == "relation":
            return Relation(code[1], tuple(code[2]),
                            tuple(self.value(source) for source in code[3]))
        if kind == "expression":
            return _Expression(code[1])
        if kind == "op":
            found: Any = torch.ops
            for part in code[1].split("."):
                found = getattr(found, part)
            return found
        if kind == "op_namespace":
            return getattr(torch.ops, code[1])
        if kind == "module":
            return imported_module(code[1])
        if kind == "function":
            function = _resolve(code[1], code[2])
            if not isinstance(function, types.FunctionType) or \
                    code_digest(function.__code__) != code[3]:
                raise Unresolved(f"{code[1]}.{code[2]} is not the function it was")
            return function
        if kind == "global":
            return _resolve(code[1], code[2])
        if kind == "switch":
            return switches.Switch(self.value(code[1]), tuple(self.value(code[2])),
                                   self.value(code[3]))
        raise ValueError(f"unknown kind {kind!r}")

    def guards(self, encoded: list, reads: list = ()) -> GuardSet:
        """The guards kept, with the symbols' reads (`reads`, of Encoder.symbol_reads)."""
        guards = GuardSet()
        for kind, source, expected in encoded:
            guards.add(kind, None if source is None else self.value(source),
                       self.value(expected))
        guards.symbol_reads = {name: SymbolRead(self.value(source), kind, index)
                               for name, source, kind, index in reads}
        return guards

    def graph(self, nodes: list) -> torch.fx.GraphModule:
        graph = torch.fx.Graph()
        made: dict[str, torch.fx.Node] = {}
        for op, name, target, args, kwargs, stack_trace, requires_grad in nodes:
            node = graph.create_node(
                op, target if isinstance(target, str) else self.value(target),
                self._argument(args, made), self._argument(kwargs, made), name=name)
            if node.name != name:
                raise ValueError(f"the graph's node {name} came back as {node.name}")
            if stack_trace is not None:
                node.meta["stack_trace"] = stack_trace
            if requires_grad is not None:
                node.meta[REQUIRES_GRAD] = requires_grad
            made[name] = node
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    def _argument(self, code: list, made: dict[str, torch.fx.Node]) -> Any:
        kind = code[0]
        if kind == "node":
            return made[code[1]]
        if kind in ("tuple", "list"):
            items = [self._argument(c, made) for c in code[1]]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            return {self.value(k): self._argument(v, made) for k, v in code[1]}
        return self.value(code)


def _equal(first: Any, second: Any) -> bool:
    try:
        return bool(first == second)
    except Exception:  # noqa: BLE001 (a value whose == is not a truth: not the same)
        return False
