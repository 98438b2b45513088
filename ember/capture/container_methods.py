"""Methods called on tracked Python values while capturing: a list's, a tuple's, a named
tuple's, a dict's (and a Counter's or defaultdict's, where they act as a dict's), a set's, a
context value's (__enter__/__exit__ of grad-mode, autocast and null contexts), and those of
constants (run at capture time). Mutations of containers from outside are recorded as side
effects, so the caller sees them after the graph."""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING

import torch

from ember.capture import contexts, semantics
from ember.capture.errors import Raised, Unsupported
from ember.capture.outside_values import OutsideListValue
from ember.capture.semantics import python_value, unpack
from ember.capture.sources import CallSource
from ember.capture.values import (
    AutocastValue,
    Const,
    DictValue,
    GeneratorContextValue,
    GradModeValue,
    LockContextValue,
    NewObjectValue,
    NullContextValue,
    SequenceValue,
    SetValue,
    SwitchValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.session import Session
    from ember.capture.side_effects import SideEffects


def call_value_method(session: Session, receiver: Value, name: str, args: list[Value],
                      kwargs: dict[str, Value]) -> Value:
    if isinstance(receiver, NullContextValue) and name in ("__enter__", "__exit__"):
        return Const(None)
    if isinstance(receiver, LockContextValue) and name == "__exit__":
        contexts.exit_lock(session, receiver)
        return Const(None)
    if isinstance(receiver, GeneratorContextValue) and name in ("__enter__", "__exit__"):
        if name == "__enter__":
            return contexts.enter_context(session, receiver)[1]
        if any(not (isinstance(a, Const) and a.value is None) for a in args):
            raise Unsupported(f"{receiver.describe()} left with an exception")
        return contexts.exit_generator_context(session, receiver)
    if isinstance(receiver, SwitchValue) and name in ("__enter__", "__exit__"):
        if name == "__enter__":
            return contexts.enter_context(session, receiver)[1]
        contexts.exit_switch(session, receiver)
        return Const(None)
    if isinstance(receiver, AutocastValue) and name in ("__enter__", "__exit__"):
        if name == "__enter__":
            contexts.enter_autocast(session, receiver)
            return receiver
        contexts.exit_autocast(session, receiver)
        return Const(None)
    if isinstance(receiver, GradModeValue):
        if name == "__exit__":
            contexts.exit_grad_mode(session, receiver)
            return Const(None)
        if name == "__enter__":
            return contexts.enter_context(session, receiver)[1]
    if isinstance(receiver, NewObjectValue) and receiver.mapping is not None:
        # (dict's own method of a dict-subclass object: it acts on the object's items)
        return dict_method(session, receiver.mapping, name, args, kwargs)
    if isinstance(receiver, SequenceValue):
        return _sequence_method(session, receiver, name, args, kwargs)
    if isinstance(receiver, DictValue):
        return dict_method(session, receiver, name, args, kwargs)
    if isinstance(receiver, SetValue) and name in _SET_MUTATIONS:
        return _set_mutation(session, receiver, name, args, kwargs)
    if isinstance(receiver, SetValue) and name not in _SET_QUERIES:
        # (the known set's Python copy would take the change, not the set: refused)
        raise Unsupported(f"method {name} of a set")
    if isinstance(receiver, Const) and isinstance(receiver.value, str) and name == "join" and \
            len(args) == 1 and not kwargs and not semantics.is_known(args[0]):
        # (`", ".join(str(d) for d in x.shape)`: the generator's or map's items, taken as
        # join takes them)
        args = [SequenceValue(unpack(session, args[0]), list)]
    if semantics.is_known(receiver) and all(semantics.is_known(a) for a in args) and \
            all(semantics.is_known(v) for v in kwargs.values()):
        method = getattr(python_value(receiver), name)
        try:
            result = method(*[python_value(a) for a in args],
                            **{k: python_value(v) for k, v in kwargs.items()})
        except Exception as error:
            raise Unsupported(f"{type(error).__name__}: {error}") from None
        if type(result) in semantics.DICT_VIEWS and receiver.source is not None:
            # (`out.keys()` of a dict subclass's object from outside, known by type: the view
            # is read again on each call, by the class's method; iterated, semantics.unpack)
            method = session.constant_source(getattr(type(python_value(receiver)), name))
            return session.wrap(result, CallSource(method, args=(receiver.source,)))
        return session.wrap(result, None, guard=False) if not isinstance(
            result, (tuple, list)) else semantics.constant(tuple(result)) \
            if isinstance(result, tuple) else SequenceValue([semantics.constant(r)
                                                             for r in result], list)
    if isinstance(receiver, Const) and isinstance(receiver.value, str) and name == "format":
        raise Unsupported("str.format with a tensor argument (prints tensor values)")
    raise Unsupported(f"method {name} of {receiver.describe()}")


_LIST_MUTATIONS = {"append", "extend", "insert", "pop", "clear", "reverse", "sort"}
_SET_MUTATIONS = {"add", "discard", "remove", "update", "clear"}
# what a set answers without changing (run on its known Python value)
_SET_QUERIES = {"union", "intersection", "difference", "symmetric_difference", "issubset",
                "issuperset", "isdisjoint", "copy", "__contains__", "__len__"}


def _set_mutation(session: Session, receiver: SetValue, name: str, args: list[Value],
                  kwargs: dict[str, Value]) -> Value:
    """set.add/discard/remove/update/clear on a set of the captured code: its items change
    (an item is the same as another where identical or an equal constant, as in make_set)."""
    if kwargs or (name != "update" and len(args) != (0 if name == "clear" else 1)):
        raise Unsupported(f"set.{name} with these arguments")
    session.side_effects.changed(receiver)  # (before: a break undoes the change)
    items = receiver.items
    if name == "clear":
        items.clear()
        return Const(None)
    added = [args[0]] if name == "add" else \
        [item for arg in args for item in unpack(session, arg)] if name == "update" else []
    for item in added:
        if not any(_same_item(session, item, kept) for kept in items):
            items.append(item)
    if name in ("discard", "remove"):
        found = [kept for kept in items if _same_item(session, args[0], kept)]
        if not found and name == "remove":
            raise Raised(KeyError(python_value(args[0]) if semantics.is_known(args[0])
                                  else args[0].describe()))
        items[:] = [kept for kept in items if kept not in found]
    return Const(None)


def _same_item(session: Session, one: Value, other: Value) -> bool:
    return semantics.identical(one, other, session) or semantics.equal_constants(one, other)


def _sequence_method(session: Session, sequence: SequenceValue, name: str, args: list[Value],
                     kwargs: dict[str, Value]) -> Value:
    if name == "append" and isinstance(sequence, OutsideListValue) and sequence.unread and \
            len(args) == 1 and not kwargs:
        # (replayed on the real list after the graph; its items stay unread)
        session.side_effects.changed(sequence)  # (before: a break undoes the change)
        sequence.pending.append(args[0])
        session.side_effects.call(list.append, [sequence, args[0]])
        return Const(None)
    items = sequence.items
    mutable = sequence.kind is list
    if semantics.is_namedtuple(sequence.kind) and name in ("_replace", "_asdict"):
        fields = dict(zip(sequence.kind._fields, items))
        if name == "_asdict":
            return DictValue(fields)
        if args or set(kwargs) - set(fields):
            raise Unsupported(f"{sequence.kind.__name__}._replace() of unknown fields",
                              "eager raises here")
        return SequenceValue(list({**fields, **kwargs}.values()), sequence.kind)
    if mutable and name in _LIST_MUTATIONS:
        session.side_effects.changed(sequence)  # (before: a break undoes the change)
    if name == "append" and mutable:
        items.append(args[0])
    elif name == "extend" and mutable:
        items.extend(unpack(session, args[0]))
    elif name == "insert" and mutable:
        items.insert(python_value(args[0]), args[1])
    elif name == "pop" and mutable:
        value = items.pop(python_value(args[0]) if args else -1)
        session.side_effects.mutated(sequence)
        return value
    elif name == "clear" and mutable:
        items.clear()
    elif name == "reverse" and mutable:
        items.reverse()
    elif name == "sort" and mutable and not args:
        from ember.capture.builtin_rules import sorted_items

        items[:] = sorted_items(session, list(items), **kwargs)
    elif name == "copy":
        return SequenceValue(list(items), sequence.kind)
    elif name == "index":
        for position, item in enumerate(items):
            if semantics.identical(item, args[0], session) or \
                    semantics.equal_constants(item, args[0]):
                return Const(position)
        raise Unsupported("ValueError: item not in list")
    elif name == "count":
        return Const(sum(1 for item in items if semantics.equal_constants(item, args[0])))
    elif name in ("numel",) and sequence.kind is torch.Size:
        return Const(math.prod(python_value(sequence)))
    else:
        raise Unsupported(f"method {name} of a {sequence.kind.__name__}")
    session.side_effects.mutated(sequence)
    return Const(None)


# what a Counter's or defaultdict's own methods do as a dict's do (update adds counts to a
# Counter, copy keeps the class: those and the rest run natively, at a break)
_SUBCLASS_SAFE = {"get", "keys", "values", "items", "__getitem__", "__contains__", "__len__",
                  "__iter__", "__delitem__", "pop", "setdefault", "clear", "__setitem__"}


def _view_items(mapping: DictValue, which: str) -> list[Value]:
    if which == "keys":
        return [semantics.constant(k) for k in mapping.items]
    if which == "values":
        return list(mapping.items.values())
    return [SequenceValue([semantics.constant(k), v], tuple) for k, v in mapping.items.items()]


def refresh_views(effects: SideEffects, mapping: DictValue) -> None:
    """A dict changed: the views taken of it (keys(), values(), items()) show it changed, as
    a dict's views do."""
    for view, which in mapping.views:
        effects.changed(view)  # (before: a break undoes the change)
        view.items[:] = _view_items(mapping, which)


def dict_method(session: Session, mapping: DictValue, name: str, args: list[Value],
                 kwargs: dict[str, Value]) -> Value:
    if mapping.kind not in (dict, collections.OrderedDict) and name not in _SUBCLASS_SAFE:
        raise Unsupported(f"method {name} of a {mapping.kind.__name__}")
    if name == "get":  # (before `items`: a large dict from outside is read by this key alone)
        found = mapping.read(semantics.key_of(args[0]))
        return found if found is not None else args[1] if len(args) > 1 else Const(None)
    items = mapping.items
    if name in ("keys", "values", "items") and not args and not kwargs:
        view = SequenceValue(_view_items(mapping, name), list, view=name)
        mapping.views.append((view, name))  # (live: refresh_views when the dict changes)
        return view
    if name == "copy":
        return DictValue(dict(items), mapping.kind)
    if name == "__getitem__":
        return semantics.get_item(session, mapping, args[0])
    if name == "__contains__":
        return Const(semantics.contains(session, mapping, args[0]))
    if name == "__len__":
        return Const(len(items))
    if name == "__iter__":
        return semantics.iterate(session, mapping)
    if name == "__delitem__":
        semantics.delete_item(session, mapping, args[0])
        return Const(None)
    if name in ("update", "pop", "setdefault", "clear", "__setitem__"):
        session.side_effects.changed(mapping)  # (before: a break undoes the change)
        if name == "update":
            other = args[0] if args else DictValue({})
            if not isinstance(other, DictValue):
                raise Unsupported("dict.update with a non-dict")
            items.update(other.items)
            items.update(kwargs)
            result: Value = Const(None)
        elif name == "pop":
            key = semantics.key_of(args[0])
            if key not in items and len(args) < 2:
                raise Raised(KeyError(key))
            result = items.pop(key, args[1] if len(args) > 1 else None)
        elif name == "setdefault":
            key = semantics.key_of(args[0])
            result = items.setdefault(key, args[1] if len(args) > 1 else Const(None))
        elif name == "__setitem__":
            items[semantics.key_of(args[0])] = args[1]
            result = Const(None)
        else:
            items.clear()
            result = Const(None)
        session.side_effects.mutated(mapping)
        return result
    raise Unsupported(f"method {name} of a dict")
