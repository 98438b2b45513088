"""Changes the captured code makes to Python objects that outlive the call.

Attribute writes, global and nonlocal writes happen in order; lists and dicts that came in
from outside are written back with their final contents. All of it runs after the graph, in
the generated code of the compiled function, so the caller sees what eager would show.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ember.capture.sources import Source
from ember.capture.values import DictValue, SequenceValue, Value


@dataclasses.dataclass
class Effect:
    kind: str            # "setattr" | "setglobal" | "setcell" | "contents" | "call" | "advance"
    target: Source | None
    name: str = ""
    value: Value | None = None
    globals_index: int = 0
    function: Any = None  # "call": what is called, on `value`'s items


class SideEffects:
    def __init__(self):
        self.effects: list[Effect] = []
        self.attributes: dict[tuple[int, str], Value] = {}   # (id(obj), name) -> new value
        self.globals: dict[tuple[int, str], Value] = {}
        self.cells: dict[int, Value] = {}
        self.containers: dict[int, Value] = {}               # id(SequenceValue) -> it
        # The birth (values.births) of the oldest mutable value changed since the interpreter
        # last reset it: a graph break can undo an instruction only if nothing older changed.
        self.oldest_changed = math.inf
        # each value changed since then, with an iterator's position before the change (None
        # for anything else): a break can put iterators back, nothing else
        self.changed_since: dict[int, tuple[Value, int | None]] = {}

    def changed(self, value: Value) -> None:
        """A mutable value (list, dict, set, iterator, cell) is about to change, wherever it
        came from."""
        self.oldest_changed = min(self.oldest_changed, getattr(value, "born", -1))
        self.changed_since.setdefault(id(value), (value, getattr(value, "position", None)))

    def reset_changes(self) -> None:
        """Before an instruction the interpreter may have to undo for a break."""
        self.oldest_changed = math.inf
        self.changed_since.clear()

    def set_attribute(self, obj: Any, source: Source, name: str, value: Value) -> None:
        self.attributes[(id(obj), name)] = value
        self.effects.append(Effect("setattr", source, name, value))

    def set_global(self, globals_dict: dict, index: int, name: str, value: Value) -> None:
        self.globals[(id(globals_dict), name)] = value
        self.effects.append(Effect("setglobal", None, name, value, index))

    def set_cell(self, cell: Any, source: Source, value: Value) -> None:
        self.cells[id(cell)] = value
        self.effects.append(Effect("setcell", source, "", value))

    def call(self, function: Any, args: list[Value]) -> None:
        """A call whose result the code does not use (a warning): made after the graph, in
        order with the other effects."""
        self.effects.append(Effect("call", None, value=SequenceValue(args, tuple),
                                   function=function))

    def advance(self, iterator: Value) -> None:
        """An iterator from outside: the real one gives up, after the graph, the items the
        captured code took from it."""
        self.effects.append(Effect("advance", iterator.source, value=iterator))

    def mutated(self, container: SequenceValue | DictValue) -> None:
        """A list or dict changed; one from outside gets its final contents written back."""
        self.changed(container)
        if container.source is None or id(container) in self.containers:
            return
        self.containers[id(container)] = container
        self.effects.append(Effect("contents", container.source, "", container))

    def __bool__(self) -> bool:
        return bool(self.effects)
