"""copy.copy and copy.deepcopy of tracked values, as rules (`call_rules`).

Libraries copy small Python objects inside a forward (transformers deep-copies a config to
derive a decoder's). A copy is a new tracked value with the same contents: containers and
objects made inside, or a plain object from outside read attribute by attribute through its
source (each attribute guarded as any read is). Tensors are cloned when no gradient flows
through them; a class with its own copy protocol, or a tensor that needs grad, is refused.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import attributes
from ember.capture.calls import call_rules, rule
from ember.capture.errors import Unsupported
from ember.capture.sources import AttrSource
from ember.capture.values import (
    Const,
    DictValue,
    NewObjectValue,
    ObjectValue,
    SequenceValue,
    SetValue,
    TensorValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.session import Session

# what a set from outside may hold for ember to copy it as constants
_ATOMS = (bool, int, float, str, bytes, type(None))
# classes whose copies ember makes itself from what it tracks (no copy protocol of their own)
_PROTOCOL = ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__",
             "__setstate__", "__getnewargs__", "__getnewargs_ex__")


@rule(copy.deepcopy)
def _deepcopy(session: Session, value: Value, memo: Value | None = None, **_: Any) -> Value:
    if memo is not None and not (isinstance(memo, Const) and memo.value is None):
        raise Unsupported("copy.deepcopy() with a memo")
    return _copy(session, value, {}, deep=True)


@rule(copy.copy)
def _shallow_copy(session: Session, value: Value, **_: Any) -> Value:
    return _copy(session, value, {}, deep=False)


def _copy(session: Session, value: Value, memo: dict[int, Value], deep: bool) -> Value:
    if id(value) in memo:  # (one copy of an object reached twice, as copy's memo keeps it)
        return memo[id(value)]
    item = (lambda v: _copy(session, v, memo, deep)) if deep else (lambda v: v)
    if isinstance(value, Const):
        made: Value = Const(copy.deepcopy(value.value) if deep else copy.copy(value.value))
    elif isinstance(value, TensorValue):
        if not deep:
            raise Unsupported("copy.copy() of a tensor")
        if value.fake.requires_grad:
            raise Unsupported("copy.deepcopy() of a tensor that needs grad",
                              "eager copies only leaf tensors; detach or clone it")
        from ember.capture.calls import call_tensor_method

        made = call_tensor_method(session, value, "clone", [],
                                  {"memory_format": Const(torch.preserve_format)})
    elif isinstance(value, SequenceValue) and value.kind in (list, tuple):
        made = SequenceValue([], value.kind)
        memo[id(value)] = made
        made.items = [item(v) for v in value.items]
    elif isinstance(value, DictValue) and value.kind is dict:
        made = DictValue({})
        memo[id(value)] = made
        made.items = {key: item(v) for key, v in value.items.items()}
    elif isinstance(value, SetValue):
        made = SetValue([item(v) for v in value.items])
    elif isinstance(value, NewObjectValue):
        _refuse_protocol(value.cls)
        made = NewObjectValue(value.cls, value.cls_source)
        memo[id(value)] = made
        made.attributes = {name: item(v) for name, v in value.attributes.items()}
        if value.mapping is not None:
            made.mapping = DictValue({key: item(v) for key, v in value.mapping.items.items()},
                                     value.mapping.kind)
    elif isinstance(value, ObjectValue) and value.source is not None and \
            type(value.value) in (set, frozenset) and \
            all(type(v) in _ATOMS for v in value.value):
        # (a set of constants from outside, its contents guarded: a config's set of names)
        contents = type(value.value)(value.value)  # (a copy of ours: the guard's own)
        session.guards.add("equals", value.source, contents)
        made = SetValue([Const(v) for v in contents]) if type(contents) is set else \
            Const(contents)
    elif isinstance(value, ObjectValue) and value.source is not None and \
            _plain_instance(value.value):
        made = _copy_outside_object(session, value, memo, item)
    else:
        raise Unsupported(f"copy.{'deepcopy' if deep else 'copy'}() of {value.describe()}")
    memo[id(value)] = made
    return made


def _copy_outside_object(session: Session, value: ObjectValue, memo: dict[int, Value],
                         item: Any) -> Value:
    """A plain object from outside: a new object of its class whose attributes are (copies
    of) its attributes now, each read through its source; its attribute names guarded."""
    obj = value.value
    cls = type(obj)
    _refuse_protocol(cls)
    names = tuple(vars(obj))
    session.guards.add("keys", AttrSource(value.source, "__dict__"), names)
    made = NewObjectValue(cls, session.constant_source(cls))
    memo[id(value)] = made
    made.attributes = {name: item(attributes.get_attribute(session, value, name))
                       for name in names}
    return made


def _plain_instance(obj: Any) -> bool:
    """An object whose class ember can make during capture (calls._not_plain), with its
    attributes in a __dict__."""
    from ember.capture.calls import _not_plain

    cls = type(obj)
    return hasattr(obj, "__dict__") and not isinstance(obj, type) and \
        _not_plain(cls) is None


def _refuse_protocol(cls: type) -> None:
    """Classes that say how they are copied: their own protocol runs in eager."""
    for klass in cls.__mro__[:-1]:
        if klass in attributes.MAPPING_BASES:
            continue
        own = set(_PROTOCOL) & set(klass.__dict__)
        if own:
            raise Unsupported(f"copying a {cls.__qualname__} object ({klass.__qualname__} "
                              f"defines {', '.join(sorted(own))})")


__all__ = ["call_rules"]
