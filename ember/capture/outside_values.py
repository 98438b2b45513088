"""Containers from outside the function read as the code reads them, not whole on sight: a
list appended to before it is read (OutsideListValue), a large dict read by key
(OutsideDictValue), an iterator a resumed loop takes items from (OutsideIteratorValue). Each
guards only what was read; once the code reads the container whole, it is tracked as any
other (its length or keys guarded, every item wrapped)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ember.capture.values import DictValue, IteratorValue, SequenceValue, Value, births


class OutsideListValue(SequenceValue):
    """A list from outside whose items are wrapped (and its length guarded) only once the
    capture reads it. Until then the code may append to it (`history.append(loss.item())`,
    `out.append(i * s)` in a loop that breaks): each append is replayed on the real list
    after the graph, so a list that grows every call does not make every call compile
    again. `materialize` wraps the real items (guards) and adds the pending appends."""

    def __init__(self, source: Any, materialize: Any):
        self.kind = list
        self.source = source
        self.born = next(births)
        self._materialize = materialize
        self._items: list[Value] | None = None
        self.pending: list[Value] = []   # appended before the items were read

    @property
    def items(self) -> list[Value]:
        if self._items is None:
            self._items = self._materialize() + self.pending
        return self._items

    @items.setter
    def items(self, value: list[Value]) -> None:
        self._items = value

    @property
    def unread(self) -> bool:
        return self._items is None

    def __repr__(self) -> str:
        return f"OutsideListValue({self.source})"


class OutsideDictValue(DictValue):
    """A large dict from outside (sys.modules, a registry) read by key: until the capture
    reads it whole (iterates it, takes its length, changes it), each key it looks up is read
    and guarded alone (`read`: the item, or that the key is missing), so a call checks a few
    guards, not thousands, and an import does not recompile. Read whole, `materialize`
    wraps every item (the keys guarded), keeping the items already read."""

    def __init__(self, kind: type, source: Any, materialize: Any, lookup: Any):
        self.kind, self.source, self.born = kind, source, next(births)
        self.default_factory, self.views = None, []
        self._materialize, self._lookup = materialize, lookup
        self._items: dict[Any, Value] | None = None
        self.read_items: dict[Any, Value | None] = {}  # (None: missing, on a guard)

    @property
    def items(self) -> dict[Any, Value]:
        if self._items is None:
            whole = self._materialize()
            self._items = {k: self.read_items.get(k) or v for k, v in whole.items()}
        return self._items

    @items.setter
    def items(self, value: dict[Any, Value]) -> None:
        self._items = value

    def read(self, key: Any) -> Value | None:
        """The item under `key` (None where there is none), read alone while the dict is
        unread whole."""
        if self._items is not None or type(key) not in (str, int):
            return self.items.get(key)
        if key not in self.read_items:
            self.read_items[key] = self._lookup(key)
        return self.read_items[key]

    def __repr__(self) -> str:
        return f"OutsideDictValue({self.source})"


@dataclasses.dataclass(eq=False)
class OutsideIteratorValue(IteratorValue):
    """An iterator over a list, tuple or range that came in from outside (the loop's iterator
    a resume function takes after a break inside a for loop). Its items are read only as the
    code takes them, each through its source, and the guards ask only that at least as many
    are left as were taken (when the code ran it dry: exactly as many): the code after a break
    inside a loop compiles once for every iteration left, not once per iteration."""

    pull: Any = None          # k -> the k-th item ahead of the real iterator, or None (dry)
    dry: bool = False

    def next(self) -> Value | None:
        if self.position >= len(self.items) and not self.dry:
            self._take()
        return super().next()

    def rest(self) -> list[Value]:
        """Every item left (the guards then ask for exactly that many)."""
        while not self.dry:
            self._take()
        return self.items[self.position:]

    def _take(self) -> None:
        item = self.pull(len(self.items))
        if item is None:
            self.dry = True
        else:
            self.items.append(item)
