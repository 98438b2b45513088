"""Symbolic sizes of one capture: which sizes become symbols, and the guards they leave.

Takes the compile's `dynamic=` setting, marks on tensors (ember.mark_dynamic/mark_static and
torch._dynamo's) and the sizes earlier captures of the function saw (FrameSizes: automatic
dynamic); gives fake tensors whose dims are symbols, symbolic ints, FX nodes that compute a
symbolic size from the inputs, and, when the capture ends, the relations torch's ShapeEnv
recorded, as guards over ember's names s0, s1, ... A capture without a symbol never makes a
ShapeEnv (Shapes.symbolic is False): the static path stays exactly as it was.
"""

from __future__ import annotations

import builtins
import dataclasses
import operator
from typing import Any

import torch
import torch.fx

from ember import logs, torch_internals
from ember.capture.sources import AttrSource, NumberTensorSource, Source

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def tracked_size(value: Any) -> Any:
    """A size as capture keeps it: an int, or the SymInt of a symbolic size (int() of it would
    specialize it: a guard that it keeps this value)."""
    return value if isinstance(value, torch.SymInt) else int(value)


def has_symbols(values: Any) -> bool:
    if isinstance(values, SYMBOLIC):
        return True
    if isinstance(values, (list, tuple)):
        return any(has_symbols(v) for v in values)
    if isinstance(values, dict):
        return any(has_symbols(v) for v in values.values())
    return False


def specialized(values: Any, why: str = "") -> Any:
    """`values` with each symbolic size replaced by its value now — guarded by the ShapeEnv,
    so the capture stays right, only specialized (said on EMBER_LOGS=recompiles)."""
    if isinstance(values, SYMBOLIC):
        if why:
            logs.channel("recompiles").info("a symbolic size is specialized to its value: %s",
                                            why)
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[
            type(values)](values)
    if isinstance(values, (list, tuple)) and has_symbols(values):
        return type(values)(specialized(v, why) for v in values)
    if isinstance(values, dict) and has_symbols(values):
        return {k: specialized(v, why) for k, v in values.items()}
    return values


# -- marks ----------------------------------------------------------------------------------
def mark_dynamic(tensor: torch.Tensor, dim: int, min: int | None = None,  # noqa: A002
                 max: int | None = None) -> None:  # noqa: A002  (torch's names)
    """Make `tensor`'s size at `dim` a symbol in the captures that meet it (within [min, max]
    when given), as torch._dynamo.mark_dynamic does. Sizes 0 and 1 stay constants."""
    dim = dim % tensor.dim() if tensor.dim() else dim
    marks = tensor.__dict__.setdefault("_ember_dynamic_dims", {})
    marks[dim] = (min, max)
    tensor.__dict__.get("_ember_static_dims", set()).discard(dim)


def mark_static(tensor: torch.Tensor, dim: int) -> None:
    """Keep `tensor`'s size at `dim` a constant, even under dynamic=True."""
    dim = dim % tensor.dim() if tensor.dim() else dim
    tensor.__dict__.setdefault("_ember_static_dims", set()).add(dim)
    tensor.__dict__.get("_ember_dynamic_dims", {}).pop(dim, None)


def _marks(tensor: torch.Tensor) -> tuple[dict[int, tuple], set[int]]:
    dynamic, static = torch_internals.dynamo_dim_marks(tensor)
    dynamic.update(tensor.__dict__.get("_ember_dynamic_dims", {}))
    static |= tensor.__dict__.get("_ember_static_dims", set())
    return {d: r for d, r in dynamic.items() if d not in static}, static


# -- which sizes are symbols ------------------------------------------------------------------
class FrameSizes:
    """The sizes a function's captures saw, per source: a dim (or an int) seen with two values
    holds None from then on — automatic dynamic makes it a symbol in later captures."""

    def __init__(self):
        self.tensors: dict[str, list[int | None]] = {}
        self.ints: dict[str, int | None] = {}
        # sizes a dim had before and after it changed (value-linked automatic dynamic)
        self.changed: set[int] = set()

    def see_tensor(self, name: str, shape: tuple[int | None, ...]) -> list[int | None]:
        """A capture saw this tensor's sizes (None: a dim it made a symbol, as a warm entry
        captured with symbolic sizes tells)."""
        known = self.tensors.get(name)
        if known is None or len(known) != len(shape):
            known = self.tensors[name] = list(shape)
        for dim, size in enumerate(shape):
            if size is None:
                known[dim] = None
            elif known[dim] is not None and known[dim] != size:
                self.changed |= {known[dim], size}
                known[dim] = None
        return known

    def read_int(self, name: str, value: int) -> None:
        """A capture read this int as a value (guarded equal to it: a size, an index)."""
        self.ints.setdefault(name, value)

    def changed_int(self, name: str, value: int) -> bool:
        """Has this int, read as a value by an earlier capture, changed since? (Ints only
        handed on, or only compared, never count: numbers.py serves them without a symbol.)"""
        if name not in self.ints:
            return False
        if self.ints[name] != value:
            self.ints[name] = None
        return self.ints[name] is None


# NOTE: a symbol's range starts at 2. Sizes 0 and 1 are never symbols (as in torch): with
# them excluded, broadcasting and contiguity are decidable, and a size-1 call gets an entry
# of its own instead of a guard failure deep inside a kernel.
SMALLEST_SYMBOL = 2


@dataclasses.dataclass
class DynamicPolicy:
    """`dynamic=` of ember.compile and the function's FrameSizes: which dims of a tensor, and
    which ints, a capture makes symbols."""

    dynamic: bool | None = None
    frame: FrameSizes = dataclasses.field(default_factory=FrameSizes)
    # dynamic=None: does a recompile make changed sizes symbols? Not where the backend builds
    # kernels per concrete shape anyway (ember's IR interpreter, or once a symbolic compile of
    # the function fell back per shape: api._automatic): a symbolic capture would cost several
    # times a static one and save no kernel, and a decoding loop would build kernels for
    # shape after shape under each new capture (GPT-2 on the CPU: 17x eager's time per run).
    automatic: bool = True
    # sources this capture met first (a restart with a ShapeEnv meets them again)
    new_sources: set[str] = dataclasses.field(default_factory=set)

    def linked(self, name: str, size: int) -> bool:
        """Value-linked automatic dynamic (plan §4): a dim of a source first seen in this
        capture whose size a changed dim had before or after it changed is a symbol too. A
        decoding step meets the attention mask grown 7 -> 8 and, for the first time, a KV
        cache of length 7: the cache's length is the step's symbol, so the next step does not
        compile again. A false link costs a slower kernel (or a relation guard), never a wrong
        one."""
        return name in self.new_sources and size in self.frame.changed

    def tensor_ranges(self, tensor: torch.Tensor, source: Source, where: str
                      ) -> list[tuple[int, int | None] | None]:
        """Per dim: (min, max or None) for a symbol, None for a constant."""
        name = source.expr()
        if name not in self.frame.tensors:
            self.new_sources.add(name)
        seen = self.frame.see_tensor(name, tuple(tensor.shape))
        marked, static = _marks(tensor)
        if self.dynamic is False:
            if marked:
                logs.channel("recompiles").info(
                    "%s: %s is marked dynamic at dims %s, but dynamic=False specializes it",
                    where, name, sorted(marked))
            return [None] * tensor.dim()
        # parameters stay static; so do a module's buffers under dynamic=True (as in torch:
        # a model's state does not change shape; automatic dynamic still catches one that does)
        parameter = isinstance(tensor, torch.nn.Parameter) or (
            self.dynamic is True and _module_state(source))
        ranges: list[tuple[int, int | None] | None] = []
        for dim, size in enumerate(tensor.shape):
            if dim in marked:
                low, high = marked[dim]
                wanted = (builtins.max(SMALLEST_SYMBOL, low or 0), high)
            elif dim in static or parameter:
                wanted = None
            elif self.dynamic is True or (self.automatic and (
                    seen[dim] is None or self.linked(name, size))):
                wanted = (SMALLEST_SYMBOL, None)
            else:
                wanted = None
            if wanted is not None and size < SMALLEST_SYMBOL:
                if dim in marked:
                    logs.channel("recompiles").info(
                        "%s: %s.size()[%d] is marked dynamic but is %d: sizes 0 and 1 are "
                        "specialized", where, name, dim, size)
                wanted = None
            ranges.append(wanted)
        return ranges

    def int_is_symbolic(self, value: int, source: Source) -> bool:
        """A Python int from the call that changed between captures (a length, a step) is a
        symbol once it has changed, under dynamic=None or True (0 and 1 never are)."""
        if self.dynamic is False or type(value) is not int or \
                (self.dynamic is None and not self.automatic):
            return False
        return self.frame.changed_int(source.expr(), value) and value >= SMALLEST_SYMBOL


def _module_state(source: Source) -> bool:
    """Is the tensor an entry of a module's tables (`self._buffers['running_mean']`)?"""
    from ember.capture.sources import EntrySource

    while source is not None:
        if isinstance(source, EntrySource):
            return True
        source = getattr(source, "base", None)
    return False


class NeedsSymbols(BaseException):
    """Raised where a static capture meets its first symbol: the capture starts again with a
    ShapeEnv. (A BaseException: the interpreter's own `except Exception` must not take it for
    a graph break.)"""


# -- the symbols of one capture ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Relation:
    """A guard over symbols: `template` with {0}, {1}, ... for the variables of `sources`
    (a tensor whose strides are checked), and the symbols it reads."""

    template: str
    symbols: tuple[str, ...]
    sources: tuple[Source, ...] = ()


@dataclasses.dataclass(frozen=True)
class SymbolRead:
    """Where a symbol's value is read on each call: a tensor's size or stride, or an int."""

    source: Source
    kind: str | None = None   # "size", "stride", "storage_offset", "item" (a 0-d tensor's),
    index: int | None = None  # or None: the int itself

    def code(self, variable: str) -> str:
        if self.kind is None:
            return variable
        if self.index is None:  # (storage_offset(), item())
            return f"{variable}.{self.kind}()"
        return f"{variable}.{'shape' if self.kind == 'size' else 'stride()'}[{self.index}]"

    def describe(self) -> str:
        if self.kind is None:
            return self.source.expr()
        if self.index is None:
            return f"{self.source.expr()}.{self.kind}()"
        return f"{self.source.expr()}.{self.kind}()[{self.index}]"


class CannotRebuild(Exception):
    """A symbolic expression the graph cannot compute from its inputs (it is specialized)."""


class Shapes:
    """A capture's ShapeEnv (symbolic captures only), its symbols by ember's names, and where
    each is read."""

    def __init__(self, policy: DynamicPolicy, symbolic: bool, where: str = ""):
        self.policy = policy
        self.symbolic = symbolic
        self.where = where
        self.wants_symbols = False   # (a static capture met a symbol: start again)
        self.fake_mode, self.shape_env = torch_internals.make_symbolic_fake_mode() \
            if symbolic else (torch_internals.make_fake_mode(), None)
        self.names: dict[Any, str] = {}          # sympy symbol -> "s0"
        self.reads: dict[str, SymbolRead] = {}   # "s0" -> where it is read
        self.sources: dict[str, Source] = {}     # source expression -> the Source
        self.strided: list[tuple[Source, torch.Tensor]] = []  # symbolic tensors' fakes
        self.numbers: dict[str, tuple[int, torch.SymInt]] = {}  # symbolic ints: value, symbol
        self._nodes: dict[Any, torch.fx.Node] = {}  # expression -> the node computing it

    # -- inputs
    def fake_tensor(self, tensor: torch.Tensor, source: Source) -> torch.Tensor | None:
        """A fake with symbols where the policy says; None where it says none (then the
        caller makes today's static fake)."""
        ranges = self.policy.tensor_ranges(tensor, source, self.where)
        if not any(ranges):
            return None
        name = self._symbolic_source(source)
        self._base_source(tensor, source)
        fake = torch_internals.symbolic_fake(self.fake_mode, tensor, name, ranges)
        self._name_new_symbols()
        self.strided.append((source, fake))
        return fake

    def _symbolic_source(self, source: Source) -> str:
        """The name of a source whose value gets symbols; a capture without a ShapeEnv starts
        again with one (NeedsSymbols)."""
        if not self.symbolic:
            self.wants_symbols = True
            raise NeedsSymbols
        name = source.expr()
        self.sources[name] = source
        return name

    def static_fake(self, tensor: torch.Tensor, source: Source) -> torch.Tensor:
        """A fake with every size a constant (on a ShapeEnv too: it would otherwise make
        symbols of its own for a tensor without a source)."""
        if not self.symbolic:
            return torch_internals.fake_of(self.fake_mode, tensor)
        self._base_source(tensor, source)
        self.sources[source.expr()] = source  # (a 0-d one's .item() may make a symbol)
        return torch_internals.symbolic_fake(self.fake_mode, tensor, source.expr(),
                                             [None] * tensor.dim())

    def _base_source(self, tensor: torch.Tensor, source: Source) -> None:
        """The fake of a view fakes its base too, whose sizes the ShapeEnv may make symbols
        read from `source._base` (a view's base: a call whose tensor is no view then fails
        that read, and so the guard)."""
        if tensor._base is not None:
            self.sources[f"{source.expr()}._base"] = AttrSource(source, "_base")

    def int_symbol(self, value: int, source: Source) -> torch.SymInt | None:
        """A symbolic int for a number from the call that the policy makes a symbol."""
        if not self.policy.int_is_symbolic(value, source):
            return None
        name = self._symbolic_source(source)
        symint = torch_internals.symbolic_int(self.shape_env, value, name)
        self._name_new_symbols()
        self.numbers[name] = (value, symint)
        return symint

    def _name_new_symbols(self) -> None:
        for symbol, (base, kind, index) in torch_internals.symbol_origins(
                self.shape_env).items():
            if symbol not in self.names:
                name = f"s{len(self.names)}"
                self.names[symbol] = name
                source = self.sources[base]
                if kind == "item" and isinstance(source, NumberTensorSource):
                    source, kind = source.base, None  # (a number from the call, read as it is)
                self.reads[name] = SymbolRead(source, kind, index)

    # -- guards
    def relations(self) -> list[Relation]:
        """What must hold of a call for the capture to serve it: each symbol's range, each
        symbolic tensor's strides as expressions of the symbols, the ShapeEnv's guards."""
        if not self.names:
            return []
        relations = []
        for symbol, name in self.names.items():
            low, high = torch_internals.symbol_range(self.shape_env, symbol)
            bounds = ([] if low == torch_internals.LOWEST else [str(low)]) + [name] + \
                ([] if high is None else [str(high)])
            if len(bounds) > 1:  # (else any int)
                relations.append(Relation(" <= ".join(bounds), (name,)))
        for source, fake in self.strided:
            strides = [self.render(s) for s in fake.stride()]
            if any(isinstance(s, torch.SymInt) for s in fake.stride()):
                text = "{0}.stride() == (" + ", ".join(strides) + \
                    ("," if len(strides) == 1 else "") + ")"
                relations.append(Relation(text, self._symbols_in(fake.stride()), (source,)))
        for expression in torch_internals.shape_guards(self.shape_env):
            text = torch_internals.render_python(expression, self.names)
            used = tuple(n for s, n in self.names.items() if s in expression.free_symbols)
            relations.append(Relation(text, used))
        return relations

    def _symbols_in(self, values: Any) -> tuple[str, ...]:
        free = set()
        for value in values:
            if isinstance(value, SYMBOLIC):
                free |= torch_internals.expression_of(value).free_symbols
        return tuple(n for s, n in self.names.items() if s in free)

    def render(self, value: Any) -> str:
        """A size (int or symbolic) as Python over the symbols' names."""
        if not isinstance(value, SYMBOLIC):
            return repr(value)
        return torch_internals.render_python(torch_internals.expression_of(value), self.names)

    def symbols_of(self, value: Any) -> tuple[str, ...]:
        return self._symbols_in([value])

    # -- the graph
    def fx_node(self, builder: Any, value: Any) -> Any:
        """The FX node (or int) that computes a symbolic size from the graph's inputs."""
        expression = torch_internals.expression_of(value)
        return self._build(builder, expression)

    def _build(self, builder: Any, expression: Any) -> Any:
        if expression.is_Integer:
            return int(expression)
        known = self._nodes.get(expression)
        if known is not None:
            return known
        if expression.is_Symbol:
            node = self._read(builder, expression)
        else:
            function = _FX_OPERATORS.get(type(expression).__name__)
            if function is None:
                raise CannotRebuild(str(expression))
            parts = [self._build(builder, argument) for argument in expression.args]
            if function is operator.pow and not isinstance(parts[1], int):
                raise CannotRebuild(str(expression))
            node = parts[0]
            for part in parts[1:]:
                node = builder.graph.call_function(function, (node, part))
        self._nodes[expression] = node
        return node

    def _read(self, builder: Any, symbol: Any) -> torch.fx.Node:
        name = self.names.get(symbol)
        if name is None:
            raise CannotRebuild(str(symbol))
        read = self.reads[name]
        if read.kind is None:
            value, symint = self.numbers[read.source.expr()]
            return builder.input_number(read.source, value, symint)
        base = builder.input_node(read.source)
        return builder.graph.call_method(read.kind, (base, read.index))

    def forget_nodes(self, alive: set[torch.fx.Node]) -> None:
        """After a rollback: forget nodes no longer in the graph."""
        self._nodes = {e: n for e, n in self._nodes.items() if n in alive}


# sympy's (and torch's sympy functions') heads -> the Python operator the graph calls
_FX_OPERATORS = {"Add": operator.add, "Mul": operator.mul, "FloorDiv": operator.floordiv,
                 "Mod": operator.mod, "PythonMod": operator.mod, "Pow": operator.pow,
                 "Max": builtins.max, "Min": builtins.min}
