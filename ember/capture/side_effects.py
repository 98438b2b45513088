"""Changes the captured code makes to Python objects that outlive the call.

Attribute writes, global and nonlocal writes happen in order; lists and dicts that came in
from outside are written back with their final contents. All of it runs after the graph, in
the generated code of the compiled function, so the caller sees what eager would show.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

from ember.capture.sources import Source
from ember.capture.values import Const, DictValue, SequenceValue, Value, births


@dataclasses.dataclass
class Effect:
    kind: str            # "setattr" | "setglobal" | "setcell" | "contents" | "call" | "advance"
    target: Source | None
    name: str = ""
    value: Value | None = None
    globals_index: int = 0
    function: Any = None  # "call": what is called, on `value`'s items
    result: Value | None = None  # "call": the value that stands for what it returns


class SideEffects:
    def __init__(self):
        self.effects: list[Effect] = []
        self.attributes: dict[tuple[int, str], Value] = {}   # (id(obj), name) -> new value
        self.globals: dict[tuple[int, str], Value] = {}
        self.cells: dict[int, Value] = {}
        self.containers: dict[int, Value] = {}               # id(SequenceValue) -> it
        # forward hooks the captured code registered, registered for real by the replay:
        # (id(module), "pre" | "post") -> ((hook, takes kwargs, prepend), ...) in order
        self.hooks: dict[tuple[int, str], tuple] = {}
        # How to undo what the current instruction of the root frame changed, newest last
        # (tracked values' contents, the maps above, the effects), so that a graph break
        # there can put everything back as it was before the instruction, however deep in
        # inlined calls the capture got.
        self._undo: list[Callable[[], None]] = []
        self._saved: set[int] = set()     # ids of the values whose state is in _undo
        self._mark = 0                    # len(effects) when the instruction began
        self.activity = 0                 # effects so far, counted
        self.births_changed: list[int] = []  # each change of a tracked value: its birth

    def changed(self, value: Value) -> None:
        """A mutable value (list, dict, set, iterator, cell, new object) is about to change,
        wherever it came from: its state before the instruction is kept to undo."""
        self.births_changed.append(getattr(value, "born", -1))
        if id(value) in self._saved:
            return
        self._saved.add(id(value))
        state = {name: (field, copy.copy(field) if isinstance(field, (list, dict, set))
                        else None) for name, field in vars(value).items()}
        self._undo.append(lambda: _restore(value, state))

    def reset_changes(self) -> None:
        """Before an instruction the interpreter may have to undo for a break."""
        self._undo.clear()
        self._saved.clear()
        self._mark = len(self.effects)

    def mark(self) -> tuple[int, int, int]:
        """Where the effects stand now, for changed_outside(*mark): values born from here on
        are the code's own."""
        return self.activity, len(self.births_changed), next(births)

    def changed_outside(self, activity: int, changes: int, born: int) -> bool:
        """Has anything made before birth `born` changed, or an effect been recorded, since
        `activity` and `changes` (len(births_changed)) were read?"""
        return self.activity != activity or \
            any(birth < born for birth in self.births_changed[changes:])

    def undo(self) -> None:
        """Put back what changed since reset_changes(): the instruction is undone."""
        while self._undo:
            self._undo.pop()()
        self._saved.clear()
        del self.effects[self._mark:]

    def savepoint(self) -> tuple[int, int]:
        """A point inside the current instruction that roll_back() returns to (a call tried
        one way and, where that fails, made another). From here each value's first change is
        kept again, so that its state at this point can be put back."""
        self._saved.clear()
        return len(self._undo), len(self.effects)

    def roll_back(self, point: tuple[int, int]) -> None:
        """Put back what changed since `point` (from savepoint()); what changed before it
        stays, and undo() still puts back the whole instruction."""
        undo_length, effects_length = point
        while len(self._undo) > undo_length:
            self._undo.pop()()
        self._saved.clear()
        del self.effects[effects_length:]

    def _keep(self, mapping: dict, key: Any) -> None:
        self.activity += 1
        old = mapping.get(key, _MISSING)
        self._undo.append(lambda: mapping.pop(key, None) if old is _MISSING
                          else mapping.__setitem__(key, old))

    def written_attributes(self, obj: Any) -> dict[str, Value]:
        """What the capture wrote to `obj`'s attributes so far, by name."""
        return {name: value for (owner, name), value in self.attributes.items()
                if owner == id(obj)}

    def set_attribute(self, obj: Any, source: Source, name: str, value: Value) -> None:
        self._keep(self.attributes, (id(obj), name))
        self.attributes[(id(obj), name)] = value
        self.effects.append(Effect("setattr", source, name, value))

    def set_global(self, globals_dict: dict, index: int, name: str, value: Value) -> None:
        self._keep(self.globals, (id(globals_dict), name))
        self.globals[(id(globals_dict), name)] = value
        self.effects.append(Effect("setglobal", None, name, value, index))

    def set_cell(self, cell: Any, source: Source, value: Value) -> None:
        self._keep(self.cells, id(cell))
        self.cells[id(cell)] = value
        self.effects.append(Effect("setcell", source, "", value))

    def call(self, function: Any, args: list[Value], result: Value | None = None) -> Effect:
        """A call made after the graph, in order with the other effects: one whose result
        the code does not use (a warning), or whose result `result` stands for."""
        self.activity += 1
        effect = Effect("call", None, value=SequenceValue(args, tuple), function=function,
                        result=result)
        self.effects.append(effect)
        return effect

    def warn(self, frame: Any, message: str | Warning, category: type[Warning]) -> None:
        """A warning issued after the graph (in order with the other effects) as eager
        issues it at `frame`'s line: through its module's registry, so the filters show it
        as often as eager's."""
        from ember.capture.values import ObjectValue

        location = frame.location()
        registry = frame.globals.setdefault("__warningregistry__", {})
        module = frame.globals.get("__name__", "<string>")
        self.call(warnings.warn_explicit, [
            ObjectValue(message, None) if isinstance(message, Warning) else Const(message),
            ObjectValue(category, None), Const(location.filename), Const(location.line),
            Const(module), ObjectValue(registry, None)])  # (the registry itself, not a copy)

    def drop_last(self, effect: Effect) -> bool:
        """Take back `effect` if it is the last one; did it? (Where it came before the
        current instruction, that instruction cannot be undone by a break: a with-block's
        end, whose block cannot break.)"""
        if not self.effects or self.effects[-1] is not effect:
            return False
        self.effects.pop()
        self._mark = min(self._mark, len(self.effects))
        return True

    def register_hook(self, module: Value, kind: str, hook: Value, flags: dict[str, bool],
                      register: Callable[..., Any], handle: Value) -> None:
        """A forward hook ("post") or pre-hook ("pre") registered on `module`: the rest of
        the capture calls the module with it; the replay registers it, by `register`, whose
        result (the real handle) `handle` stands for."""
        key = (id(module.value), kind)
        self._keep(self.hooks, key)
        self.hooks[key] = (*self.hooks.get(key, ()),
                           (hook, flags["with_kwargs"], flags["prepend"]))
        self.call(register, [module, hook, *(Const(flags[name]) for name in sorted(flags))],
                  handle)

    def advance(self, iterator: Value) -> None:
        """An iterator from outside: the real one gives up, after the graph, the items the
        captured code took from it."""
        self.activity += 1
        self.effects.append(Effect("advance", iterator.source, value=iterator))

    def mutated(self, container: SequenceValue | DictValue) -> None:
        """A list or dict changed; one from outside gets its final contents written back.
        NOTE: its state to undo is kept by changed(), which must come before the change."""
        self.changed(container)
        if isinstance(container, DictValue) and container.views:
            from ember.capture.container_methods import refresh_views

            refresh_views(self, container)
        if container.source is None or id(container) in self.containers:
            return
        self._keep(self.containers, id(container))
        self.containers[id(container)] = container
        self.effects.append(Effect("contents", container.source, "", container))

    def __bool__(self) -> bool:
        return bool(self.effects)


_MISSING = object()

def _restore(value: Value, state: dict[str, tuple[Any, Any]]) -> None:
    """Put a tracked value's fields back: the same objects, and a list's, dict's or set's
    contents as they were (other values may hold the same one)."""
    for name, (field, contents) in state.items():
        if isinstance(field, list):
            field[:] = contents
        elif isinstance(field, (dict, set)):
            field.clear()
            field.update(contents)
        setattr(value, name, field)
    for name in set(vars(value)) - set(state):
        delattr(value, name)
