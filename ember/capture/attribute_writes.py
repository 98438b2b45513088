"""Attribute writes and deletes on tracked values, as Python makes them: an object made during
capture keeps its attributes (its class's setters, descriptors and slots run as code); an
object from outside runs its class's Python setters (its own __setattr__, a property's, a
descriptor's __set__) and otherwise records the write as a side effect replayed after the
graph, which later reads in the capture see; a tensor's requires_grad is
tensor_attributes'."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

import torch

from ember.capture import tensor_attributes
from ember.capture.attributes import MISSING, class_lookup, python_descriptor, stored_dict
from ember.capture.errors import Raised, Unsupported
from ember.capture.values import Const, NewObjectValue, ObjectValue, TensorValue, Value

if TYPE_CHECKING:
    from ember.capture.session import Session


def set_new_object_attribute(session: Session, target: NewObjectValue, name: str,
                             value: Value) -> None:
    descriptor = class_lookup(target.cls, name)
    if isinstance(descriptor, types.MemberDescriptorType):
        pass  # a slot: tracked as any attribute, set through it when the object is made
    elif isinstance(descriptor, property) and isinstance(descriptor.fset, types.FunctionType):
        from ember.capture.calls import call_code

        call_code(session, descriptor.fset, [target, value])
        return
    elif hasattr(descriptor, "__set__"):  # (a property without a Python setter among them)
        python_descriptor(session, descriptor, "__set__", [target, value],
                           f"{target.cls.__qualname__}.{name}")
        return
    elif not target.cls.__dictoffset__:
        raise Unsupported(f"{target.cls.__qualname__} object has no attribute {name!r} (its "
                          f"__slots__ do not name it)", "eager raises AttributeError here")
    session.side_effects.changed(target)
    target.attributes[name] = value


def delete_attribute(session: Session, receiver: Value, name: str) -> None:
    """del obj.name (delattr) on an object made during capture: its own __delattr__ in
    Python runs; otherwise the attribute is gone from what ember tracks."""
    if not isinstance(receiver, NewObjectValue):
        raise Unsupported(f"deleting attribute {name!r} of {receiver.describe()}")
    deleter = class_lookup(receiver.cls, "__delattr__")
    if isinstance(deleter, types.FunctionType):
        from ember.capture.calls import call_code

        call_code(session, deleter, [receiver, Const(name)])
        return
    if deleter is not object.__delattr__:
        raise Unsupported(f"{receiver.cls.__qualname__} has its own __delattr__")
    if name not in receiver.attributes:
        raise Raised(AttributeError(name))
    session.side_effects.changed(receiver)
    del receiver.attributes[name]


def set_outside_attribute(session: Session, receiver: ObjectValue, name: str, value: Value,
                          hooks: bool = True) -> None:
    """`obj.name = value` on an object from outside (`hooks`: False for
    object.__setattr__, past the class's own __setattr__)."""
    obj = receiver.value
    registered = isinstance(obj, torch.nn.Module) and any(
        name in obj.__dict__.get(table, {}) for table in ("_parameters", "_buffers", "_modules"))
    if not registered and _python_setter(session, receiver, name, value, hooks):
        return
    if isinstance(obj, torch.nn.Module) and isinstance(value, TensorValue) and \
            name in obj.__dict__.get("_parameters", {}):
        raise Unsupported("assigning a tensor to a module parameter",
                          "update the parameter in place, or outside the compiled function")
    session.side_effects.set_attribute(obj, receiver.source, name, value)
    stored = stored_dict(session, obj)
    if stored is not None:  # (its __dict__, read as a dict before: it shows the write)
        stored.items[name] = value


def _python_setter(session: Session, receiver: ObjectValue, name: str, value: Value,
                   hooks: bool = True) -> bool:
    """`obj.name = value` on an object from outside whose class sets it in Python: its own
    __setattr__ (`hooks`; not a module's: a transformers config maps names through it), a
    property's setter, a data descriptor's __set__ (a module's too) — run as code, as eager
    runs them (a plain write would be read back where eager reads the descriptor). False: a
    plain write."""
    from ember.capture.calls import call_code

    cls = type(receiver.value)
    setter = class_lookup(cls, "__setattr__")
    if hooks and isinstance(setter, types.FunctionType) and \
            not isinstance(receiver.value, torch.nn.Module):  # (a module's: the plain write)
        call_code(session, setter, [receiver, Const(name), value])
        return True
    descriptor = class_lookup(cls, name)
    if isinstance(descriptor, property) and isinstance(descriptor.fset, types.FunctionType):
        call_code(session, descriptor.fset, [receiver, value])
        return True
    custom = class_lookup(type(descriptor), "__set__") if descriptor is not MISSING else None
    if isinstance(custom, types.FunctionType):
        python_descriptor(session, descriptor, "__set__", [receiver, value], name)
        return True
    return False


def set_attribute(session: Session, receiver: Value, name: str, value: Value) -> None:
    if isinstance(receiver, TensorValue) and name == "requires_grad":
        tensor_attributes.set_requires_grad(session, receiver, value, method=False)
        return
    if isinstance(receiver, NewObjectValue):
        setter = class_lookup(receiver.cls, "__setattr__")
        if isinstance(setter, types.FunctionType):  # its own __setattr__, in Python: run it
            from ember.capture.calls import call_code

            call_code(session, setter, [receiver, Const(name), value])
            return
        if setter is not object.__setattr__:
            raise Unsupported(f"{receiver.cls.__qualname__} has its own __setattr__")
        set_new_object_attribute(session, receiver, name, value)
        return
    if isinstance(receiver, ObjectValue) and receiver.source is not None:
        set_outside_attribute(session, receiver, name, value)
        return
    raise Unsupported(f"setting attribute {name!r} of {receiver.describe()}")
