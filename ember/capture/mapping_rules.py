"""Rules for dict's own functions called through the class, by the real callable
(`call_rules`): dict.fromkeys, and dict.__getitem__/get/__contains__ called on an object from
outside of a dict subclass with its own __getitem__ (super().__getitem__(key) in an
OrderedDict subclass, as transformers' ACT2FN does). They read the items past the subclass's
methods, on guards that read them the same way; they must not run the subclass's own code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.capture import semantics
from ember.capture.calls import rule
from ember.capture.container_methods import dict_method
from ember.capture.errors import Raised, Unsupported
from ember.capture.semantics import python_value, unpack
from ember.capture.sources import CallSource
from ember.capture.values import Const, DictValue, NewObjectValue, ObjectValue, Value

if TYPE_CHECKING:
    from ember.capture.session import Session


@rule(dict.fromkeys)
def _fromkeys(session: Session, keys: Value, value: Value | None = None, **_: Any) -> Value:
    filler = Const(None) if value is None else value
    return DictValue({semantics.key_of(key): filler for key in unpack(session, keys)})


def _outside_mapping(mapping: Value, method: str) -> dict:
    obj = mapping.value if isinstance(mapping, ObjectValue) else None
    if not isinstance(obj, dict) or mapping.source is None:
        raise Unsupported(f"dict.{method} of {mapping.describe()}")
    return obj


def _contains(session: Session, mapping: ObjectValue, obj: dict, key: Any) -> bool:
    """Whether the dict has `key`, by dict's own __contains__, on the guard that it still
    answers so."""
    found = dict.__contains__(obj, key)
    session.guards.add("equals", CallSource(session.constant_source(dict.__contains__),
                                            args=(mapping.source, key),
                                            label=f"whether it has the key {key!r}"), found)
    return found


def _item(session: Session, mapping: ObjectValue, obj: dict, key: Any) -> Value:
    source = CallSource(session.constant_source(dict.__getitem__), args=(mapping.source, key))
    return session.wrap(dict.__getitem__(obj, key), source)


@rule(dict.__getitem__)
def _getitem(session: Session, mapping: Value, key: Value, **_: Any) -> Value:
    if isinstance(mapping, (DictValue, NewObjectValue)):
        items = mapping if isinstance(mapping, DictValue) else mapping.mapping
        if items is None:
            raise Unsupported(f"dict.__getitem__ of {mapping.describe()}")
        return semantics.get_item(session, items, key)
    obj, index = _outside_mapping(mapping, "__getitem__"), python_value(key)
    if not _contains(session, mapping, obj, index):
        raise Raised(KeyError(index))
    return _item(session, mapping, obj, index)


@rule(dict.__contains__)
def _dict_contains(session: Session, mapping: Value, key: Value, **_: Any) -> Value:
    if isinstance(mapping, DictValue):
        return Const(semantics.contains(session, mapping, key))
    obj = _outside_mapping(mapping, "__contains__")
    return Const(_contains(session, mapping, obj, python_value(key)))


@rule(dict.get)
def _get(session: Session, mapping: Value, key: Value, default: Value | None = None,
         **_: Any) -> Value:
    if isinstance(mapping, DictValue):
        return dict_method(session, mapping, "get", [key] if default is None else
                           [key, default], {})
    obj, index = _outside_mapping(mapping, "get"), python_value(key)
    if not _contains(session, mapping, obj, index):
        return Const(None) if default is None else default
    return _item(session, mapping, obj, index)
