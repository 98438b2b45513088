"""Guards: the checks that say a cached capture is still valid for a new call.

Each guard is a predicate on one source (or on global state). A cache entry's guards compile
into one flat Python function, cheapest checks first, that reads each source once. When no
entry's guards pass, `first_failure` names the guard that failed — the recompile reason users
see on EMBER_LOGS=recompiles ("L['x'].shape[0] changed 4 -> 8"). Symbolic sizes leave
"size" guards: relations over symbols s0, s1, ... read from the inputs (`2 <= s0`,
`s0 == s1`), said on failure as "L['x'].size()[0] = 1 breaks 2 <= s0".
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import torch

from ember import torch_internals
from ember.capture.sources import AttrSource, EntrySource, ItemSource, Source

# Cheapest first: identity and type checks, then values, then tensors.
_ORDER = {"global": 0, "id": 1, "type": 2, "equals": 3, "outcome": 3, "length": 4, "at_least": 4,
          "keys": 5, "tensor": 6, "same": 7, "size": 8}


@dataclasses.dataclass(frozen=True)
class Guard:
    kind: str
    source: Source | None
    expected: Any

    def key(self) -> tuple:
        if self.kind == "same":
            return (self.kind, self.source.expr(), self.expected.expr())
        if self.kind in ("at_least", "outcome"):
            return (self.kind, self.source.expr(), repr(self.expected))
        return (self.kind, self.source.expr() if self.source else repr(self.expected))


def tensor_signature(tensor: torch.Tensor) -> tuple:
    return (type(tensor), tensor.dtype, tensor.device, tuple(tensor.shape),
            tuple(tensor.stride()), tensor.requires_grad)


class GuardSet:
    def __init__(self):
        self.guards: dict[tuple, Guard] = {}
        # where each symbol of the "size" guards is read (symbols.SymbolRead by name)
        self.symbol_reads: dict[str, Any] = {}
        # a symbolic capture's symbols.Shapes: its relations are read again once the backend
        # has run (a symbolic lowering may have guarded more)
        self.shapes: Any = None

    def add_size_relations(self) -> None:
        """Every relation the capture's symbols must keep, as "size" guards (again: those
        already there are kept once)."""
        if self.shapes is None:
            return
        for relation in self.shapes.relations():
            self.add("size", None, relation)
        self.symbol_reads = self.shapes.reads

    def add(self, kind: str, source: Source | None, expected: Any) -> None:
        guard = Guard(kind, source, expected)
        self.guards.setdefault(guard.key(), guard)

    def only(self, kinds: set[str]) -> GuardSet:
        """The guards of these kinds alone."""
        kept = GuardSet()
        kept.guards = {key: g for key, g in self.guards.items() if g.kind in kinds}
        kept.symbol_reads = self.symbol_reads
        return kept

    def ordered(self) -> list[Guard]:
        return sorted(self.guards.values(), key=lambda g: (_ORDER[g.kind], _depth(g.source)))

    def __len__(self) -> int:
        return len(self.guards)


def _depth(source: Source | None) -> int:
    depth = 0
    while isinstance(source, (AttrSource, ItemSource, EntrySource)):
        source = source.base
        depth += 1
    return depth


class _Writer:
    def __init__(self, constant_prefix: str = "k", symbol_reads: dict[str, Any] | None = None):
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = {"torch": torch}
        self.variables: dict[str, str] = {}
        self.constant_prefix = constant_prefix
        self.symbol_reads = symbol_reads or {}
        self.symbols: set[str] = set()

    def symbol(self, name: str) -> str:
        """A size symbol, read into a variable of its own name (once)."""
        if name not in self.symbols:
            read = self.symbol_reads[name]
            self.lines.append(f"{name} = {read.code(self.variable(read.source))}")
            self.symbols.add(name)
        return name

    def constant(self, value: Any) -> str:
        name = f"{self.constant_prefix}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def variable(self, source: Source) -> str:
        expr = source.expr()
        if expr in self.variables:
            return self.variables[expr]
        # (what it reads from, through the variables: each source read once a call)
        text = source.over(self.variable)
        name = f"v{len(self.variables)}"
        self.lines.append(f"{name} = {text}")
        self.variables[expr] = name
        return name


def guard_condition(guard: Guard, writer: _Writer) -> str:
    """A boolean expression that is True when the guard holds (sources read into vars)."""
    kind, expected = guard.kind, guard.expected
    if kind == "global":
        name, value = expected
        if name == "grad_mode":
            return f"torch.is_grad_enabled() is {value}"
        if name == "inference_mode":
            return f"torch.is_inference_mode_enabled() is {value}"
        if name == "default_dtype":
            return f"torch.get_default_dtype() is {writer.constant(value)}"
        if name == "autocast":  # (off, the common case: one C call per call)
            if value is None:
                return f"not {writer.constant(torch_internals.any_autocast)}()"
            return f"{writer.constant(torch_internals.autocast_state)}() == " \
                   f"{writer.constant(value)}"
        raise AssertionError(name)
    if kind == "size":  # (a relation over symbols, symbols.Relation)
        for name in expected.symbols:
            writer.symbol(name)
        return expected.template.format(*(writer.variable(s) for s in expected.sources))
    v = writer.variable(guard.source)
    if kind == "id":
        return f"{v} is {writer.constant(expected)}"
    if kind == "type":
        return f"type({v}) is {writer.constant(expected)}"
    if kind == "equals":
        if expected is None or isinstance(expected, bool):
            return f"{v} is {expected!r}"
        # (a literal where repr gives one; an IntEnum's or a NaN's repr is no Python)
        literal = repr(expected) if type(expected) in (int, str, bytes) or (
            type(expected) is float and math.isfinite(expected)) else writer.constant(expected)
        return f"(type({v}) is {writer.constant(type(expected))} and {v} == {literal})"
    if kind == "length":
        return f"len({v}) == {expected}"
    if kind == "at_least":
        return f"{v} >= {expected}"
    if kind == "outcome":  # (form, constant, the number on the left, answer)
        form, other, left, outcome = expected
        if form == "bool":
            return f"bool({v}) is {outcome}"
        if form in ("isfinite", "isnan", "isinf"):
            return f"{writer.constant(getattr(math, form))}({v}) is {outcome}"
        c = writer.variable(other) if isinstance(other, Source) else writer.constant(other)
        return f"({v} {form} {c}) is {outcome}" if left else f"({c} {form} {v}) is {outcome}"
    if kind == "same":  # two paths reach one object
        return f"{v} is {writer.variable(expected)}"
    if kind == "keys":
        if all(type(key) in (int, str) for key in expected):
            return f"list({v}.keys()) == {list(expected)!r}"
        return f"list({v}.keys()) == {writer.constant(list(expected))}"  # (keys with no literal)
    if kind == "tensor":
        kind_, dtype, device, shape, strides, requires_grad = expected
        if None in shape or None in strides:  # (symbolic sizes: the "size" guards say more)
            sizes = " and ".join([f"{v}.dim() == {len(shape)}", *(
                f"{v}.shape[{d}] == {n}" for d, n in enumerate(shape) if n is not None), *(
                f"{v}.stride()[{d}] == {n}" for d, n in enumerate(strides) if n is not None)])
        else:
            sizes = f"{v}.shape == {shape!r} and {v}.stride() == {strides!r}"
        return (f"(type({v}) is {writer.constant(kind_)} and {v}.dtype is "
                f"{writer.constant(dtype)} and {v}.device == {writer.constant(device)} and "
                f"{sizes} and {v}.requires_grad is {requires_grad})")
    raise AssertionError(kind)


def compile_guards(guards: GuardSet, scope: dict[str, Any],
                   arguments: dict[str, Any] | None = None) -> tuple[Callable[..., bool], str]:
    """One flat function guard(L) -> bool, and its source text. `scope` binds the names
    sources use besides L (G, GG, C, K): they are fixed for a cache entry. Given the call's
    `arguments`, the tensor guards whose tensors they reach become one C++ check of all of
    them (torch_internals.tensor_checker) instead of six Python comparisons each."""
    text, namespace = guard_source(guards, scope, arguments)
    return _compiled_guard(text, namespace), text


def guard_source(guards: GuardSet, scope: dict[str, Any],
                 arguments: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """compile_guards' function as source, and the namespace it runs in (not compiled)."""
    writer = _Writer(symbol_reads=guards.symbol_reads)
    body = reuse_variables(_guard_lines(guards, scope, arguments, writer, "return False"))
    text = "def guard(L):\n    try:\n" + "".join(f"        {line}\n" for line in body) + \
        "    except Exception:\n        return False\n    return True\n"
    return text, dict(writer.namespace, **scope)


def _compiled_guard(text: str, namespace: dict[str, Any]) -> Callable[..., bool]:
    exec(compile(text, "<ember guards>", "exec"), namespace)  # noqa: S102 (our own code)
    return namespace["guard"]


class LazyGuard:
    """An entry's guard function, compiled at its first call: an entry whose guards run
    inside its `call` (compile_guarded_runner) asks the guard alone only when a later call
    misses. Made from its source (`text`, `namespace`: guard_source) where that is written
    already, else from the guards, without a call's tensors to batch their checks."""

    def __init__(self, guards: GuardSet, scope: dict[str, Any], text: str | None = None,
                 namespace: dict[str, Any] | None = None):
        self.guards = guards
        self.scope = scope
        self.source = (text, namespace) if text is not None else None
        self.function: Callable[..., bool] | None = None

    def __call__(self, arguments: dict[str, Any]) -> bool:
        if self.function is None:
            if self.source is not None:
                self.function = _compiled_guard(*self.source)
                self.source = None
            else:
                self.function, _ = compile_guards(self.guards, self.scope)
        return self.function(arguments)


# What a guarded runner returns when its guards reject the call.
MISS = object()


def compile_guarded_runner(guards: GuardSet, scope: dict[str, Any], arguments: dict[str, Any],
                           input_sources: list[Source], runner_lines: list[str],
                           runner_namespace: dict[str, Any], where: str
                           ) -> Callable[..., Any] | None:
    """One function call(L): the guards (MISS when one fails), then the runner's `lines`
    with `inputs` fetched through the variables the guards already read (a module's
    parameters are reached once per call, not once to check and once to run). Errors of
    the guards' reads are misses; the runner's own errors reach the caller. None if the two
    namespaces would clash (the caller keeps guard and runner apart).
    NOTE: the guards run in a function of their own, returned from before the runner runs:
    their frame (a slot per live variable, hundreds for a model) would otherwise sit under
    the compiled call, and a CPython frame-stack chunk (16 KB) that the compiled call's own
    Python calls overflow is mapped and unmapped on each of them (reuse_variables)."""
    writer = _Writer("gk", guards.symbol_reads)  # (the runner's constants are k0, k1, ...)
    body = _guard_lines(guards, scope, arguments, writer, "return MISS")
    fetched = [writer.variable(source) for source in input_sources]
    *body, fetch = reuse_variables([*body, *writer.lines, f"return [{', '.join(fetched)}]"])
    text = "def guarded_inputs(L):\n    try:\n" + \
        "".join(f"        {line}\n" for line in body) + \
        f"    except Exception:\n        return MISS\n    {fetch}\n" + \
        "def call(L):\n    inputs = guarded_inputs(L)\n    if inputs is MISS:\n" \
        "        return MISS\n" + "".join(f"    {line}\n" for line in runner_lines)
    namespace = dict(writer.namespace, **scope, MISS=MISS)
    if any(namespace[name] is not runner_namespace[name]
           for name in set(namespace) & set(runner_namespace)):
        return None
    namespace.update(runner_namespace)
    exec(compile(text, f"<ember entry {where}>", "exec"), namespace)  # noqa: S102 (our own code)
    namespace["call"].ember_source = text  # (what EMBER_DUMP writes: ember/dumps.py)
    namespace["call"].guarded_inputs = namespace["guarded_inputs"]  # (the guards alone)
    return namespace["call"]


# A guard variable where it is a name (not inside a string literal, not an attribute)
_VARIABLE = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|(?<![.\w])(v\d+)\b""")


def reuse_variables(lines: list[str]) -> list[str]:
    """Straight-line guard code with each variable's name taken again by a later variable once
    its value is dead. One name per source gave a model's guards a frame of 1300 slots
    (10 KB); CPython frees a frame-stack chunk (16 KB) when its first frame returns, so a
    compiled call that ran near a chunk's end made every Python call under it map and unmap
    a chunk (35 page faults a call, +0.3 ms for MobileNetV3)."""
    uses = [[(m.start(1), m.end(1)) for m in _VARIABLE.finditer(line) if m.group(1)]
            for line in lines]
    last: dict[str, int] = {}
    for number, (line, spans) in enumerate(zip(lines, uses)):
        for start, end in spans:
            last[line[start:end]] = number
    names: dict[str, str] = {}
    free: list[str] = []
    result = []
    for number, (line, spans) in enumerate(zip(lines, uses)):
        defined, position = None, 0
        if spans and spans[0][0] == 0 and line[spans[0][1]:].startswith(" = "):
            defined, position, spans = line[:spans[0][1]], spans[0][1], spans[1:]
        pieces = []
        for start, end in spans:
            pieces += [line[position:start], names[line[start:end]]]
            position = end
        pieces.append(line[position:])
        for start, end in spans:  # (dead after this line: free for the next definition)
            name = line[start:end]
            if last[name] == number and name in names:
                free.append(names.pop(name))
        if defined is not None:
            names[defined] = free.pop() if free else f"v{len(names) + len(free)}"
            pieces.insert(0, names[defined])
            if last[defined] == number:  # (never read)
                free.append(names.pop(defined))
        result.append("".join(pieces))
    return result


def _guard_lines(guards: GuardSet, scope: dict[str, Any], arguments: dict[str, Any] | None,
                 writer: _Writer, fail: str) -> list[str]:
    """The statements that read the guards' sources into variables and `fail` when one
    does not hold (the tensor guards batched as compile_guards says)."""
    body: list[str] = []
    batched = _batchable(guards, dict(scope, L=arguments)) if arguments is not None else {}
    examples = list(batched.values())
    checker = torch_internals.tensor_checker(examples) if len(examples) > 1 else None
    if checker is None:
        batched = {}
    batch: list[str] = []
    for guard in guards.ordered():
        mark = len(writer.lines)
        if guard.key() in batched:
            batch.append(writer.variable(guard.source))
            body.extend(writer.lines[mark:])
            del writer.lines[mark:]
            continue
        condition = guard_condition(guard, writer)
        body.extend(writer.lines[mark:])
        del writer.lines[mark:]
        body.append(f"if not ({condition}): {fail}")
    if batch:
        body.append(f"if not {writer.constant(checker)}({', '.join(batch)}): {fail}")
    return body


def _batchable(guards: GuardSet, namespace: dict[str, Any]) -> dict[tuple, torch.Tensor]:
    """The tensor guards whose source reaches, in this call, a tensor that satisfies them:
    guard key -> that tensor (the example the C++ check copies metadata from)."""
    found: dict[tuple, torch.Tensor] = {}
    for guard in guards.ordered():
        if guard.kind != "tensor":
            continue
        try:
            tensor = guard.source.evaluate(namespace)
        except Exception:
            continue
        if isinstance(tensor, torch.Tensor) and tensor_signature(tensor) == guard.expected:
            found[guard.key()] = tensor
    return found


def first_failure(guards: GuardSet, scope: dict[str, Any]) -> str | None:
    """Why the guards reject `scope` (L, G, GG, C, K), in words; None if they accept it."""
    for guard in guards.ordered():
        writer = _Writer(symbol_reads=guards.symbol_reads)
        condition = guard_condition(guard, writer)
        namespace = dict(writer.namespace, **scope)
        try:
            for line in writer.lines:
                exec(line, namespace)  # noqa: S102
            ok = eval(condition, namespace)  # noqa: S307
        except Exception:
            ok = False
        if not ok:
            return describe_failure(guard, namespace, writer)
    return None


def describe_failure(guard: Guard, namespace: dict[str, Any], writer: _Writer) -> str:
    name = guard.source.expr() if guard.source else ""
    label = getattr(guard.source, "label", "")
    if label:
        return label
    try:
        actual = guard.source.evaluate(namespace) if guard.source else None
    except Exception:
        return f"{name} no longer exists"
    kind, expected = guard.kind, guard.expected
    if kind == "size":
        values = ", ".join(f"{writer.symbol_reads[name].describe()} = {namespace.get(name)}"
                           for name in expected.symbols)
        relation = expected.template.format(*(s.expr() for s in expected.sources))
        return f"{values} breaks {relation}" if values else f"{relation} no longer holds"
    if kind == "global":
        what, value = expected
        now = {"grad_mode": torch.is_grad_enabled, "default_dtype": torch.get_default_dtype,
               "inference_mode": torch.is_inference_mode_enabled,
               "autocast": torch_internals.autocast_state}[what]()
        return f"{what} changed {value} -> {now}"
    if kind == "tensor" and isinstance(actual, torch.Tensor):
        labels = ("type", "dtype", "device", "shape", "stride", "requires_grad")
        for label, want, got in zip(labels, expected, tensor_signature(actual)):
            if want != got:
                if label in ("shape", "stride") and len(want) == len(got):
                    for d, (a, b) in enumerate(zip(want, got)):
                        if a is not None and a != b:
                            return f"{name}.{label}()[{d}] changed {a} -> {b}" \
                                if label == "stride" else f"{name}.shape[{d}] changed {a} -> {b}"
                return f"{name}.{label} changed {want} -> {got}"
    if kind == "type":
        return f"type({name}) changed {expected.__name__} -> {type(actual).__name__}"
    if kind == "id":
        return f"{name} is a different object than when compiled"
    if kind == "length":
        return f"len({name}) changed {expected} -> {len(actual)}"
    if kind == "equals":
        return f"{name} changed {_short(expected)} -> {_short(actual)}"
    if kind == "at_least":
        return f"{name} is {actual!r}, less than {expected!r}"
    if kind == "outcome":
        form, other, left, outcome = expected
        other = other.expr() if isinstance(other, Source) else repr(other)
        test = f"bool({name})" if form == "bool" else f"math.{form}({name})" \
            if form in ("isfinite", "isnan", "isinf") else \
            f"{name} {form} {other}" if left else f"{other} {form} {name}"
        return f"{test} is no longer {outcome} ({name} is {actual!r})"
    if kind == "keys":
        return f"{name}.keys() changed: {_keys_change(list(expected), list(actual.keys()))}"
    if kind == "same":
        return f"{name} is no longer the same object as {expected.expr()}"
    return f"{name} failed its {kind} guard"

def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _keys_change(before: list, after: list) -> str:
    """What changed in a dict's keys, in a line (sys.modules has thousands)."""
    added = [k for k in after if k not in set(before)]
    removed = [k for k in before if k not in set(after)]
    parts = [f"{label} {_short(keys[:8])[1:-1]}{' ...' if len(keys) > 8 else ''}"
             for label, keys in (("added", added), ("removed", removed)) if keys]
    return "; ".join(parts) if parts else f"their order ({_short(after)})"


def same_tensor(arguments: dict[str, Any]) -> str | None:
    """Two arguments that are one tensor: the tensor guards' C++ check refuses duplicates
    that the version was not compiled for (as Dynamo's duplicate-input guard does)."""
    seen: dict[int, str] = {}
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor):
            if id(value) in seen:
                return f"L[{seen[id(value)]!r}] and L[{name!r}] are one tensor (compiled for two)"
            seen[id(value)] = name
    return None
