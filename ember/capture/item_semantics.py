"""Python semantics of items on tracked values: `x[k]`, `x[k] = v`, `del x[k]` on tensors,
sequences, dicts, ranges and objects from outside; sets and formatted values. Re-exported by
ember/capture/semantics.py, whose constants and operators these build on (import them from
there: this module is loaded at the end of that one)."""

from __future__ import annotations

import collections
import operator
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import numbers, scalar_indices
from ember.capture.errors import Raised, Unsupported
from ember.capture.semantics import (
    _module_entries,
    _tensor_call,
    constant,
    equal_constants,
    identical,
    is_known,
    is_none,
    key_of,
    protocol,
    python_method,
    python_value,
    unpack,
)
from ember.capture.sources import CallSource, ItemSource
from ember.capture.symbols import specialized
from ember.capture.values import (
    Const,
    DictValue,
    ModuleValue,
    NewObjectValue,
    ObjectValue,
    RangeValue,
    SequenceValue,
    SetValue,
    TensorValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.session import Session


def get_item(session: Session, container: Value, key: Value) -> Value:
    if isinstance(container, TensorValue):
        try:
            return _tensor_call(session, operator.getitem, container, key)
        except Unsupported:
            gathered = scalar_indices.get_item(session, container, key)
            if gathered is None:
                raise
            return gathered
    if isinstance(container, SequenceValue):
        if isinstance(key, TensorValue):  # (a list indexed by a tensor: its __index__)
            key = session.builder.known.number(key, operator.index) or key
        index = python_value(key)
        if isinstance(index, slice):
            return SequenceValue(container.items[index], container.kind)
        try:
            return container.items[index]
        except IndexError as error:
            raise Raised(error) from None
        except TypeError as error:
            raise Unsupported(f"{type(error).__name__}: {error}") from None
    if isinstance(container, DictValue):
        index = key_of(key)
        found = container.read(index)
        return _missing(session, container, index) if found is None else found
    if isinstance(container, ModuleValue):
        index = python_value(key)
        item = container.value[index]
        if isinstance(index, slice):
            if not isinstance(item, torch.nn.Module):
                session.identity_reads.append(f"a slice of {container.describe()}")
                return session.wrap(item, None, guard=False)
            if isinstance(container.value, (torch.nn.ModuleList, torch.nn.Sequential)):
                entries = _module_entries(session, container)[index]
                if all(source is not None for _, source in entries):
                    return ModuleValue(item, None,
                                       entry_sources=tuple(source for _, source in entries))
            session.identity_reads.append(f"a slice of {container.describe()}")
            return ModuleValue(item, None)
        if isinstance(container.value, (torch.nn.ModuleList, torch.nn.Sequential)) and \
                isinstance(index, int):
            entries = _module_entries(session, container)
            return session.wrap(item, entries[index][1])
        source = ItemSource(container.source, index) if container.source is not None else None
        return session.wrap(item, source)
    if isinstance(container, NewObjectValue):
        return protocol(session, container, "__getitem__", key)
    if isinstance(container, RangeValue):
        result = container.range[python_value(key)]
        return RangeValue(result) if isinstance(result, range) else Const(result)
    if isinstance(container, ObjectValue) and type(container.value).__module__ == "typing" \
            and is_known(key):  # (List[torch.Tensor] in torch.jit.annotate: a pure lookup)
        return session.wrap(container.value[python_value(key)], None, guard=False)
    if isinstance(container, ObjectValue) and container.source is not None:
        return _outside_item(session, container, key)
    if isinstance(container, (Const, ObjectValue)) and is_known(key):
        try:
            result = python_value(container)[python_value(key)]
        except Exception as error:
            raise Unsupported(f"{type(error).__name__}: {error}") from None
        return session.wrap(result, None, guard=False) if isinstance(container, ObjectValue) \
            else constant(result)
    raise Unsupported(f"indexing {container.describe()}")


def _outside_item(session: Session, container: ObjectValue, key: Value) -> Value:
    """obj[key] of an object from outside: its class's own __getitem__ in Python is run as
    code (a UserDict, Hugging Face's BatchEncoding); a dict's, list's or tuple's is read through
    the item's source, so each call reads (and guards) what is there then. (Read once at
    capture and kept, it was the first call's value on every call.)"""
    from ember.capture.attributes import get_attribute
    from ember.capture.calls import call_value

    obj = container.value
    if python_method(type(obj), "__getitem__"):
        return call_value(session, get_attribute(session, container, "__getitem__"), [key], {})
    index = python_value(key)
    if isinstance(obj, (dict, list, tuple)) and not isinstance(index, slice):
        if isinstance(obj, dict) and index not in obj:
            if hasattr(type(obj), "__missing__"):
                raise Unsupported(f"a missing key {index!r} of a {type(obj).__name__} from "
                                  f"outside (its __missing__)")
            # (eager raises KeyError: on the guard that the key stays missing)
            session.guards.add("equals", CallSource(container.source, "__contains__",
                                                    (index,)), False)
            raise Raised(KeyError(index))
        try:
            result = obj[index]
        except Exception as error:
            raise Unsupported(f"{type(error).__name__}: {error}") from None
        # (a defaultdict's or Counter's [] inserts a missing key: the guards read with get())
        source = CallSource(container.source, "get", (index,)) \
            if hasattr(type(obj), "__missing__") else ItemSource(container.source, index)
        return session.wrap(result, source)
    raise Unsupported(f"indexing {container.describe()} (its own __getitem__ in C)")


def _missing(session: Session, mapping: DictValue, index: Any) -> Value:
    """mapping[index] where it has no such key: a dict's KeyError, a Counter's 0 (nothing
    inserted), a defaultdict's new item (its factory called and the item inserted, as its
    __missing__ does); another class's own __missing__ runs natively."""
    if issubclass(mapping.kind, collections.Counter):
        return Const(0)
    if issubclass(mapping.kind, collections.defaultdict):
        factory = mapping.default_factory
        if factory is None or is_none(factory):
            raise Raised(KeyError(index))
        from ember.capture.calls import call_value

        value = call_value(session, factory, [], {})
        session.side_effects.changed(mapping)  # (before: a break undoes the change)
        mapping.items[index] = value
        session.side_effects.mutated(mapping)
        return value
    if hasattr(mapping.kind, "__missing__"):
        raise Unsupported(f"a missing key {index!r} of a {mapping.kind.__name__} (its "
                          f"__missing__)")
    raise Raised(KeyError(index))


def set_item(session: Session, container: Value, key: Value, value: Value) -> None:
    if isinstance(container, TensorValue):
        try:
            _tensor_call(session, operator.setitem, container, key, value)
        except Unsupported:
            if not scalar_indices.set_item(session, container, key, value):
                raise
        return
    if isinstance(container, SequenceValue) and container.kind is list:
        index = python_value(key)
        session.side_effects.changed(container)  # (before: a break undoes the change)
        if isinstance(index, slice):
            container.items[index] = unpack(session, value)
        else:
            container.items[index] = value
        session.side_effects.mutated(container)
        return
    if isinstance(container, DictValue):
        session.side_effects.changed(container)
        container.items[key_of(key)] = value
        session.side_effects.mutated(container)
        return
    if isinstance(container, NewObjectValue):
        protocol(session, container, "__setitem__", key, value)
        return
    raise Unsupported(f"item assignment on {container.describe()}")


def delete_item(session: Session, container: Value, key: Value) -> None:
    if isinstance(container, NewObjectValue):
        protocol(session, container, "__delitem__", key)
        return
    if isinstance(container, SequenceValue) and container.kind is list:
        session.side_effects.changed(container)
        del container.items[python_value(key)]
    elif isinstance(container, DictValue):
        session.side_effects.changed(container)
        del container.items[key_of(key)]
    else:
        raise Unsupported(f"del on {container.describe()}")
    session.side_effects.mutated(container)


def make_set(items: list[Value]) -> SetValue:
    unique: list[Value] = []
    for item in items:
        if not any(equal_constants(item, other) or identical(item, other) for other in unique):
            unique.append(item)
    return SetValue(unique)


def format_value(session: Session, value: Value, conversion: int, spec: str) -> Value:
    formatted = numbers.formatted(session, value, conversion, spec)
    if formatted is not None:
        return formatted
    real = specialized(python_value(value), "formatted as text")
    real = {0: real, 1: str(real), 2: repr(real), 3: ascii(real)}[conversion]
    return Const(format(real, spec))


