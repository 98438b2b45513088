"""Rules for operator's callable objects, which library Python passes as keys and accessors
(`sorted(items, key=itemgetter(1))`, `attrgetter("weight")`): itemgetter, attrgetter and
methodcaller objects, made inside from constants or reached from outside, are called as what
they do — an item read, an attribute read, a method call on the argument — so each read is
the capture's own (tracked, guarded). One from outside is guarded by identity (what it reads
is fixed when it is made)."""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING

from ember.capture import semantics
from ember.capture.builtin_rules import answered_now
from ember.capture.calls import call_value, object_call_rules
from ember.capture.errors import Unsupported
from ember.capture.values import ObjectValue, SequenceValue, Value

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session

GETTERS = (operator.itemgetter, operator.attrgetter, operator.methodcaller)


def _call(session: Session, callee: ObjectValue, args: list[Value], kwargs: dict[str, Value],
          parent: Frame | None) -> Value:
    from ember.capture.attributes import get_attribute

    getter = callee.value
    if len(args) != 1 or kwargs:
        raise Unsupported(f"operator.{type(getter).__name__} called with "
                          f"{len(args)} arguments")
    if callee.source is not None:
        session.guards.add("id", callee.source, getter)
    target = args[0]
    made_by, parts = getter.__reduce__()
    if type(getter) is operator.itemgetter:
        found = [semantics.get_item(session, target, semantics.constant(key)) for key in parts]
    elif type(getter) is operator.attrgetter:
        found = []
        for dotted in parts:
            value = target
            for name in dotted.split("."):
                value = get_attribute(session, value, name)
            found.append(value)
    else:  # methodcaller: (methodcaller, (name, *args)) or (partial(..., name, **kw), args)
        if isinstance(made_by, functools.partial):
            name, arguments, keywords = made_by.args[0], parts, made_by.keywords
        else:
            name, arguments, keywords = parts[0], parts[1:], {}
        method = get_attribute(session, target, name)
        return call_value(session, method, [semantics.constant(a) for a in arguments],
                          {k: semantics.constant(v) for k, v in keywords.items()}, parent)
    return found[0] if len(found) == 1 else SequenceValue(found, tuple)


answered_now(*GETTERS)  # (made from constants)
object_call_rules.update(dict.fromkeys(GETTERS, _call))
