"""Tracked values → Python expressions that rebuild them after the graph ran.

The generated code of a compiled function uses these to return results, replay side effects
and, at a graph break, rebuild the stack and locals for the rest of the function. Tensors come
from the graph's outputs; objects with a source are fetched through it (so identity is kept);
new containers are built once each (so two references stay one object).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import types
from typing import Any

import torch

from ember.capture.attributes import class_lookup
from ember.capture.errors import Unsupported
from ember.capture.outside_values import OutsideIteratorValue
from ember.capture.semantics import RealCell
from ember.capture.sources import AHEAD_MARK
from ember.capture.symbols import SYMBOLIC
from ember.capture.values import (
    BoundMethodValue,
    CellValue,
    Const,
    DictValue,
    EndlessIteratorValue,
    GeneratorContextValue,
    GradModeValue,
    IdentityConst,
    IteratorValue,
    NestedFunctionValue,
    NewObjectValue,
    NullContextValue,
    ObjectValue,
    PartialValue,
    PassedNumber,
    RangeValue,
    SequenceValue,
    SetValue,
    SliceValue,
    TensorMethodValue,
    TensorValue,
    Value,
    ValueMethodValue,
)

_NULL_CONTEXT = contextlib.nullcontext()


def replay(items: list[Any], returned: Any) -> Any:
    """A generator that the captured code ran ahead to its end (it changed nothing), handed
    on unfinished: a generator again, its items and return value as eager's would give."""
    yield from items
    return returned


class Rebuilder:
    def __init__(self, shapes: Any = None, live_cells: set[int] | frozenset = frozenset()):
        self.shapes = shapes  # (symbols.Shapes: how a symbolic size is read from the call)
        self.live_cells = live_cells  # (ids of the cells of the frame resumed after a break)
        self._symbols: set[str] = set()
        self.outputs: list[TensorValue] = []
        self.namespace: dict[str, Any] = {"torch": torch, "types": types}
        self.lines: list[str] = []          # temporaries, in the order expressions need them
        # what is read from the caller's state as it was at the call: once the graph ran,
        # before any effect changes it (`old = self.steps; self.steps += 1; return old`) and
        # before an iterator from outside is advanced (an item read through its position)
        self.prologue: list[str] = []
        self._memo: dict[int, str] = {}
        self._fetched: dict[int, str] = {}  # objects from outside, fetched in the prologue

    def constant(self, value: Any) -> str:
        # (by exact type: a subclass's repr is no literal — np.float64(9.0), an IntEnum's)
        if value is None or type(value) in (bool, int, str) or (
                type(value) is float and value == value and abs(value) != float("inf")):
            return repr(value)
        for name, known in self.namespace.items():
            if known is value and name.startswith("k"):
                return name
        name = f"k{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def _key(self, key: Any) -> str:
        """A dict key as the generated code writes it: a literal, or a kept constant."""
        plain = type(key) in (str, int, bool, type(None)) or (
            type(key) is tuple and all(type(k) in (str, int, bool, type(None)) for k in key))
        return repr(key) if plain else self.constant(key)

    def result(self, value: Value) -> str:
        """The name a statement of the caller's assigns `value` to (a replayed call's)."""
        name = f"t{len(self._memo)}"
        self._memo[id(value)] = name
        return name

    def temporary(self, value: Value, expression: str) -> str:
        name = f"t{len(self._memo)}"
        self.lines.append(f"{name} = {expression}")
        self._memo[id(value)] = name
        return name

    def expr(self, value: Value, prefer_source: bool = True) -> str:
        sourced = prefer_source and isinstance(value, (SequenceValue, DictValue, ObjectValue)) \
            and getattr(value.source, "base", None) is not None
        if sourced:
            # the caller's own object, reached through a container or an attribute that an
            # effect may change (`kwargs[new] = kwargs.pop(old)`): fetched before the effects
            if id(value) not in self._fetched:
                name = f"n{len(self.prologue)}"
                self.prologue.append(f"{name} = {value.source.expr()}")
                self._fetched[id(value)] = name
            return self._fetched[id(value)]
        text = self._expr(value, prefer_source)
        if AHEAD_MARK in text and id(value) not in self._memo:
            return self._read_first(value, text)  # (through an iterator's position)
        return text

    def _read_first(self, value: Value, text: str) -> str:
        name = f"n{len(self.prologue)}"
        self.prologue.append(f"{name} = {text}")
        self._memo[id(value)] = name
        return name

    def _expr(self, value: Value, prefer_source: bool = True) -> str:
        if prefer_source and value.source is not None and \
                isinstance(value, (SequenceValue, DictValue, ObjectValue)):
            return value.source.expr()  # the caller's own object (after its write-back)
        if id(value) in self._memo:
            return self._memo[id(value)]
        if isinstance(value, TensorValue):
            for index, known in enumerate(self.outputs):
                if known.node is value.node:
                    return f"outputs[{index}]"
            self.outputs.append(value)
            return f"outputs[{len(self.outputs) - 1}]"
        if isinstance(value, PassedNumber) and value.unread:
            # (handed on, never read: read again on each call)
            return self._read_first(value, value.source.expr())
        if isinstance(value, IdentityConst):
            raise Unsupported("an id() taken in the compiled code leaves it",
                              "its number there is not the object's at run time")
        if isinstance(value, Const) and isinstance(value.value, SYMBOLIC):
            return self._size(value.value)
        if isinstance(value, Const):
            return self.constant(value.value)
        if isinstance(value, SequenceValue):
            items = ", ".join(self.expr(item) for item in value.items)
            if value.kind is list:
                return self.temporary(value, f"[{items}]")
            if value.kind is torch.Size:
                return f"torch.Size([{items}])"
            if value.kind is tuple:
                return f"({items}{',' if len(value.items) == 1 else ''})"
            if hasattr(value.kind, "_make"):  # a namedtuple
                return f"{self.constant(value.kind)}._make([{items}])"
            return f"{self.constant(value.kind)}(({items}{',' if value.items else ''}))"
        if isinstance(value, DictValue):
            body = ", ".join(f"{self._key(k)}: {self.expr(v)}" for k, v in value.items.items())
            if value.kind in (collections.OrderedDict, collections.Counter):
                return self.temporary(value, f"{self.constant(value.kind)}({{{body}}})")
            if value.kind is collections.defaultdict and value.default_factory is not None:
                return self.temporary(value, f"{self.constant(value.kind)}("
                                             f"{self.expr(value.default_factory)}, "
                                             f"{{{body}}})")
            if value.kind is not dict:  # (a Counter's, a defaultdict's own state)
                raise Unsupported(f"a {value.kind.__name__} made in the compiled code "
                                  f"leaves it")
            return self.temporary(value, "{" + body + "}")
        if isinstance(value, SetValue):
            body = ", ".join(self.expr(v) for v in value.items)
            return self.temporary(value, "{" + body + "}" if value.items else "set()")
        if isinstance(value, SliceValue):
            return f"slice({self.expr(value.start)}, {self.expr(value.stop)}, " \
                   f"{self.expr(value.step)})"
        if isinstance(value, RangeValue):
            return repr(value.range)
        if isinstance(value, OutsideIteratorValue):
            # the real iterator (the effect that advances it runs before this is read)
            return value.source.expr()
        if isinstance(value, EndlessIteratorValue):
            raise Unsupported(f"{value.what} alive where the graph breaks")
        if isinstance(value, IteratorValue):
            items = ", ".join(self.expr(v) for v in value.items[value.position:])
            if value.returned is not None:  # (a generator, run ahead: a generator again)
                return self.temporary(value, f"{self.constant(replay)}([{items}], "
                                             f"{self.expr(value.returned)})")
            return self.temporary(value, f"iter([{items}])")
        if isinstance(value, ObjectValue):
            return self.constant(value.value)
        if isinstance(value, BoundMethodValue) and isinstance(value.function, ObjectValue):
            return f"{self.constant(value.function.value)}.__get__({self.expr(value.receiver)})"
        if isinstance(value, TensorMethodValue):
            return f"{self.expr(value.receiver)}.{value.name}"
        if isinstance(value, ValueMethodValue):
            if isinstance(value.receiver, GradModeValue) and value.name == "__exit__":
                return self._grad_mode_exit(value.receiver)
            if isinstance(value.receiver, NullContextValue):  # (resumed without its label)
                # (one bound method, so the resumed code sees the same object every call)
                return self.constant(getattr(_NULL_CONTEXT, value.name))
            return f"{self.expr(value.receiver)}.{value.name}"
        if isinstance(value, NestedFunctionValue):
            defaults = ", ".join(self.expr(d) for d in value.defaults)
            filled: list[tuple[str, Value]] = []  # (new cells: filled once the function is
            # made, which what they hold may refer to)
            closure = ", ".join(self._cell(cell, filled) for cell in value.closure)
            made = self.temporary(value, (
                f"types.FunctionType({self.constant(value.code)}, "
                f"{self.constant(value.globals)}, {value.name!r}, ({defaults}"
                f"{',' if len(value.defaults) == 1 else ''}), ({closure}"
                f"{',' if len(value.closure) == 1 else ''}))"))
            if value.kwdefaults:
                items = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in value.kwdefaults.items())
                self.lines.append(f"{made}.__kwdefaults__ = {{{items}}}")
            for name, contents in filled:
                self.lines.append(f"{name}.cell_contents = {self.expr(contents)}")
            return made
        if isinstance(value, NewObjectValue):  # made first: its attributes may refer to it
            base = value.mapping.kind if value.mapping is not None else object
            name = self.temporary(value, f"{self.constant(base)}.__new__("
                                         f"{self.constant(value.cls)})")
            if value.mapping is not None:  # (its items set as its base sets them: no hooks)
                for key, item in value.mapping.items.items():
                    self.lines.append(f"{self.constant(base)}.__setitem__({name}, "
                                      f"{self.constant(key)}, {self.expr(item)})")
            # (as object.__setattr__ sets them, past the class's own __setattr__: a slot
            # through its descriptor, the rest in the instance's __dict__)
            slots = {k: v for k, v in value.attributes.items()
                     if isinstance(class_lookup(value.cls, k), types.MemberDescriptorType)}
            for key, item in slots.items():
                self.lines.append(f"object.__setattr__({name}, {key!r}, {self.expr(item)})")
            body = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in value.attributes.items()
                             if k not in slots)
            if body:
                self.lines.append(f"{name}.__dict__.update({{{body}}})")
            return name
        if isinstance(value, GeneratorContextValue) and not value.entered:
            # (made again: its generator runs nothing until the with-block enters)
            parts = [*(self.expr(a) for a in value.args),
                     *(f"{k}={self.expr(v)}" for k, v in value.kwargs.items())]
            return self.temporary(value, f"{self.constant(value.factory)}({', '.join(parts)})")
        if isinstance(value, PartialValue):
            parts = [self.expr(value.function), *(self.expr(a) for a in value.args)]
            parts += [f"{k}={self.expr(v)}" for k, v in value.keywords.items()]
            return f"{self.constant(functools.partial)}({', '.join(parts)})"
        if isinstance(value, CellValue):
            raise Unsupported("a closure cell is alive at the break")
        raise Unsupported(f"{value.describe()} cannot be rebuilt in Python")

    def _cell(self, cell: Any, filled: list[tuple[str, Value]]) -> str:
        """A closure cell of a function made during the capture: a real one as it is; one
        of a frame the capture ran, new, holding what the frame left in it (one per cell,
        so functions that shared it still do). Not one of the frame that goes on after a
        break: its code would write its own."""
        if isinstance(cell, RealCell):
            return self.constant(cell.cell)
        if id(cell) in self.live_cells:
            raise Unsupported("a function defined inside, with a closure, is alive at the "
                              "break", "move the nested function out of the compiled code")
        if id(cell) in self._memo:
            return self._memo[id(cell)]
        name = self.temporary(cell, "types.CellType()")
        if cell.contents is not None:
            filled.append((name, cell.contents))
        return name

    def _size(self, value: Any) -> str:
        """A symbolic size handed out (returned, stored, at a break): computed from the call's
        inputs, each symbol read once into a variable of its name (`s0 = L['x'].shape[0]`).
        A symbolic float or bool is specialized: its value now, guarded."""
        if not isinstance(value, torch.SymInt):
            return self.constant({torch.SymFloat: float, torch.SymBool: bool}[type(value)](value))
        for name in self.shapes.symbols_of(value):
            if name not in self._symbols:
                read = self.shapes.reads[name]
                self.lines.append(f"{name} = {read.code(read.source.expr())}")
                self._symbols.add(name)
        return f"({self.shapes.render(value)})"

    def _grad_mode_exit(self, mode: GradModeValue) -> str:
        """The __exit__ of a with-block over grad mode, entered for real: leaving the block in
        the resumed code restores the mode that was active before it."""
        kind = "torch.enable_grad()" if mode.enabled else "torch.no_grad()"
        name = f"t{len(self._memo)}"
        self.lines.append(f"torch._C._set_grad_enabled({bool(mode.previous)})")
        self.lines.append(f"{name} = {kind}")
        self.lines.append(f"{name}.__enter__()")
        self._memo[id(mode)] = name
        return f"{name}.__exit__"

    def flush(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines
