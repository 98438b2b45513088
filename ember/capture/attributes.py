"""Attribute reads on tracked values: module parameters, buffers and submodules, object
attributes (properties, methods, class attributes), super(); a tensor's metadata and methods
are tensor_attributes.py's, writes and deletes attribute_writes.py's. Reads of real objects
go through `session.wrap`, which installs the guards."""

from __future__ import annotations

import collections
import inspect
import operator
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import tensor_attributes
from ember.capture.errors import Raised, Unsupported
from ember.capture.semantics import field_names, python_value
from ember.capture.sources import AttrSource, EntrySource
from ember.capture.values import (
    AutocastValue,
    BoundMethodValue,
    Const,
    DictValue,
    GeneratorContextValue,
    GradModeValue,
    ModuleValue,
    NestedFunctionValue,
    NewObjectValue,
    NullContextValue,
    ObjectValue,
    PythonModuleValue,
    RangeValue,
    SequenceValue,
    SetValue,
    SliceValue,
    SuperValue,
    SwitchValue,
    TensorValue,
    Value,
    ValueMethodValue,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


# what a bound method tells of its function, as the function itself tells it
_FUNCTION_FACTS = ("__name__", "__qualname__", "__module__", "__doc__", "__code__",
                   "__defaults__", "__kwdefaults__", "__wrapped__", "__annotations__")


def get_attribute(session: Session, value: Value, name: str) -> Value:
    if name == "__class__" and not isinstance(value, (ObjectValue, NewObjectValue,
                                                      PythonModuleValue)):
        kind = value.python_type()  # (type(value): a tensor's, a list's; an object's is its)
        return session.wrap(kind, session.constant_source(kind), guard=False)
    if isinstance(value, TensorValue):
        return tensor_attributes.tensor_attribute(session, value, name)
    if isinstance(value, ModuleValue):
        return module_attribute(session, value, name)
    if isinstance(value, PythonModuleValue):
        real = getattr(value.value, name, MISSING)
        if real is MISSING:
            raise Unsupported(f"module {value.value.__name__} has no attribute {name!r}")
        from ember.capture.session import is_stable_module

        stable = is_stable_module(value.value)
        source = AttrSource(value.source, name) if value.source is not None else None
        return session.wrap(real, source, guard=not stable)
    if name == "__get__" and (isinstance(value, NestedFunctionValue) or (
            isinstance(value, ObjectValue) and isinstance(value.value, types.FunctionType))):
        # function.__get__(obj): the method bound to obj (a rule for types.MethodType)
        return BoundMethodValue(session.wrap(types.MethodType, None, guard=False), value)
    if isinstance(value, ObjectValue):
        return object_attribute(session, value, name)
    if isinstance(value, NewObjectValue):
        return new_object_attribute(session, value, name)
    if isinstance(value, SuperValue):  # (3.11: super() is a value, then its attribute)
        return _past(session, value.klass, value.receiver, name)
    if isinstance(value, Const):
        real = getattr(value.value, name, MISSING)
        if real is MISSING:
            raise Unsupported(f"{value.describe()} has no attribute {name!r}")
        if callable(real) and not isinstance(real, type):
            return ValueMethodValue(value, name)
        return Const(real)
    if isinstance(value, SequenceValue) and name in field_names(value.kind):
        return value.items[field_names(value.kind).index(name)]  # a named tuple's field
    if isinstance(value, (SequenceValue, DictValue, SetValue, RangeValue, SliceValue)):
        if isinstance(value, SliceValue) and name in ("start", "stop", "step"):
            return getattr(value, name)
        if isinstance(value, RangeValue) and name in ("start", "stop", "step"):
            return Const(getattr(value.range, name))
        if not hasattr(value.python_type(), name):
            # (hasattr and getattr's default read this as missing, as eager does)
            raise Unsupported(f"{value.describe()} has no attribute {name!r}")
        return ValueMethodValue(value, name)
    if isinstance(value, NestedFunctionValue):
        if name == "__name__":
            return Const(value.name)
    if isinstance(value, BoundMethodValue):
        if name == "__func__":
            return value.function
        if name == "__self__":
            return value.receiver
        if isinstance(value.function, ObjectValue) and name in _FUNCTION_FACTS:
            return session.wrap(getattr(value.function.value, name), None, guard=False)
    if isinstance(value, (GradModeValue, NullContextValue, AutocastValue, SwitchValue,
                          GeneratorContextValue)) and name in ("__enter__", "__exit__"):
        return ValueMethodValue(value, name)
    raise Unsupported(f"attribute {name!r} of {value.describe()}")


MISSING = object()
_GENERIC_GETATTRIBUTE = object.__getattribute__  # (how object reads an attribute, past hooks)


def module_attribute(session: Session, value: ModuleValue, name: str) -> Value:
    module = value.value
    shadow = session.side_effects.attributes.get((id(module), name))
    if shadow is not None:
        return shadow
    for table in ("_parameters", "_buffers", "_modules"):
        entries = module.__dict__.get(table, {})
        tracked = session.tracked(entries)
        if isinstance(tracked, DictValue):
            # the table as the captured code left it (register_buffer in a forward)
            if name in tracked.items and name not in module.__dict__:
                return tracked.items[name]
            continue
        if name in entries and name not in module.__dict__:
            entry = entries[name]
            source = EntrySource(value.source, table, name) if value.source is not None \
                else None
            if entry is None:  # (register_buffer("b", None): a tensor may take its place)
                if source is not None:
                    session.guards.add("equals", source, None)
                return Const(None)
            return session.wrap(entry, source)
    return object_attribute(session, value, name)


def object_attribute(session: Session, value: ObjectValue, name: str, hooks: bool = True
                     ) -> Value:
    """An attribute of an object from outside, read as Python reads it: through its class's
    own __getattribute__ where that is Python code (`hooks`: inlined, as a transformers
    config maps names), else as object.__getattribute__ reads it — a data descriptor of
    the class, the instance's dict, the class's attribute — then the class's __getattr__.
    What object.__getattribute__ read past a class's own is guarded as read that way too
    (`AttrSource.past_hooks`: the guard does not run the hook again on every call)."""
    obj = value.value
    stored = stored_dict(session, obj)  # (its __dict__ read as a dict: what that holds now)
    found = stored.read(name) if stored is not None and name != "__dict__" else None
    shadow = found or session.side_effects.attributes.get((id(obj), name))
    if shadow is not None:
        return shadow
    if name == "__dict__" and value.source is not None and _plain_dict(obj) is not None:
        return _instance_dict_value(session, value)
    if hooks:
        hooked = _through_own_getattribute(session, value, name)
        if hooked is not None:
            return hooked
    past_hooks = not hooks  # (object.__getattribute__ called: its own reads, no __getattr__)
    source = AttrSource(value.source, name, past_hooks) if value.source is not None else None
    instance_dict = _instance_dict(obj)
    cls = obj if isinstance(obj, type) else type(obj)
    descriptor = class_lookup(cls, name)
    receiver = None if isinstance(obj, type) else value
    if isinstance(descriptor, property) and receiver is not None:
        _guard_class_member(session, value, cls, name, descriptor)
        return _class_member(session, descriptor, cls, receiver)
    if name in instance_dict:
        return session.wrap(instance_dict[name], source)
    member = _class_member(session, descriptor, cls, receiver)
    if member is not None:
        _guard_class_member(session, value, cls, name, descriptor)
        return member
    getter = class_lookup(type(descriptor), "__get__") if descriptor is not MISSING else None
    if isinstance(getter, types.FunctionType) and receiver is not None and \
            session.side_effects.written_attributes(obj):
        # (a Python descriptor of an object the capture wrote to: its __get__ run as code,
        # reading what was written; read natively, it would read the object as it was)
        _guard_class_member(session, value, cls, name, descriptor)
        return python_descriptor(session, descriptor, "__get__",
                                 [receiver, session.wrap(cls, None, guard=False)], name)
    try:
        real = _GENERIC_GETATTRIBUTE(obj, name) if past_hooks else getattr(obj, name)
    except AttributeError:
        error = Unsupported(f"{type(obj).__name__} object has no attribute {name!r}",
                            "eager raises AttributeError here")
        error.absent = (value, name, past_hooks)  # (what hasattr's guard asks: _guard_absent)
        raise error from None
    if isinstance(real, types.MethodType) and real.__self__ is obj:
        function = session.wrap(real.__func__, None, guard=False)
        return BoundMethodValue(function, value)
    return session.wrap(real, source)


def stored_dict(session: Session, obj: Any) -> DictValue | None:
    """The tracked dict of an outside object's __dict__, where the capture read it."""
    own = _plain_dict(obj)
    tracked = session.tracked(own) if own is not None else None
    return tracked if isinstance(tracked, DictValue) else None


def _plain_dict(obj: Any) -> dict | None:
    """An outside object's own __dict__, read and written as a dict (not a class's or a
    module's, which their own rules read); None where it has none."""
    if isinstance(obj, (type, torch.nn.Module)):
        return None
    own = getattr(obj, "__dict__", None)
    return own if isinstance(own, dict) else None


def _instance_dict_value(session: Session, value: ObjectValue) -> DictValue:
    """`obj.__dict__` of an object from outside: its dict, tracked, holding what the
    capture wrote to the object before (attribute writes after it change it too,
    set_outside_attribute), so `o.__dict__[k] = v; o.k` and `setattr(o, k, v);
    o.__dict__[k]` read what eager reads."""
    obj = value.value
    stored = session.wrap(obj.__dict__, AttrSource(value.source, "__dict__"))
    if not isinstance(stored, DictValue):
        raise Unsupported(f"__dict__ of {value.describe()}")
    stored.items.update(session.side_effects.written_attributes(obj))
    return stored


def _own_getattribute(cls: type) -> types.FunctionType | None:
    """The class's own __getattribute__ where it is Python code (transformers' configs map
    names through theirs); None where attributes are read as object reads them."""
    if cls.__getattribute__ is _GENERIC_GETATTRIBUTE:  # (the common case, one lookup)
        return None
    hook = class_lookup(cls, "__getattribute__")
    return hook if isinstance(hook, types.FunctionType) else None


def _through_own_getattribute(session: Session, value: ObjectValue, name: str
                              ) -> Value | None:
    """The attribute as the class's own Python __getattribute__ gives it, the hook inlined;
    None where there is none, or where the hook cannot be captured (the read is then made
    as object.__getattribute__ makes it, as before the hook was inlined). A class with a
    __getattr__ besides (called when the hook raises AttributeError) is left to that."""
    obj = value.value
    if isinstance(obj, type) or value.source is None:
        return None
    cls = type(obj)
    hook = _own_getattribute(cls)
    if hook is None or class_lookup(cls, "__getattr__") is not MISSING:
        return None
    from ember.capture.calls import call_code

    session.guard_answer(class_lookup, (session.constant_source(cls), "__getattribute__"),
                         hook, f"{cls.__qualname__}.__getattribute__ was replaced", kind="id")
    point = session.savepoint()
    try:
        return call_code(session, hook, [value, Const(name)])
    except Unsupported as error:
        # (missing as the hook was followed, and for real: hasattr and getattr's default
        # answer it; a hook that catches the AttributeError itself is not followed)
        if getattr(error, "absent", None) is not None and not hasattr(obj, name):
            raise
        session.roll_back(point)
        return None


def _instance_dict(obj: Any) -> dict:
    """The object's own attributes as object.__getattribute__ finds them ({} for a class, or
    an object without a __dict__)."""
    if isinstance(obj, type):
        return {}
    try:
        found = _GENERIC_GETATTRIBUTE(obj, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return found if isinstance(found, dict) else {}


_MODULE = torch.nn.Module
_MODULE_GETATTR = torch.nn.Module.__getattr__


def lacks(obj: Any, name: str) -> bool:
    """`not hasattr(obj, name)` — a guard, on every call. hasattr itself is fastest where the
    class has no __getattr__ (CPython looks without raising); on an nn.Module it raised and
    caught an exception through Module.__getattr__'s frame (1.3 us), so there the dicts are
    looked in (0.5 us): the instance's, the module's three tables, its classes' (a name a
    class has goes to hasattr: a property may raise AttributeError)."""
    cls = type(obj)
    if not isinstance(obj, _MODULE) or cls.__getattr__ is not _MODULE_GETATTR or \
            cls.__getattribute__ is not _GENERIC_GETATTRIBUTE:
        return not hasattr(obj, name)
    instance = _GENERIC_GETATTRIBUTE(obj, "__dict__")
    if name in instance or name in instance.get("_parameters", _NONE) or \
            name in instance.get("_buffers", _NONE) or name in instance.get("_modules", _NONE):
        return False
    for namespace in class_dicts(cls):
        if name in namespace:
            return not hasattr(obj, name)
    return True


_NONE: dict = {}


def lacks_past_hooks(obj: Any, name: str) -> bool:
    """Does object.__getattribute__ find no `name` on `obj`? (What a class's own
    __getattribute__, inlined, asked of it: a guard.) Looked up in the dicts where no class
    has the name (raising AttributeError in C cost ~0.5 us); asked for real where one has it
    (a descriptor may raise AttributeError)."""
    for namespace in class_dicts(type(obj)):
        if name in namespace:
            try:
                _GENERIC_GETATTRIBUTE(obj, name)
            except AttributeError:
                return True
            return False
    try:
        return name not in _GENERIC_GETATTRIBUTE(obj, "__dict__")
    except AttributeError:  # (slots only)
        return True


# The builtin bases whose objects ember can make during capture (their items tracked).
MAPPING_BASES = (collections.OrderedDict, dict)


def mapping_base(cls: type) -> type | None:
    """OrderedDict or dict, whichever `cls` derives from first; None for neither."""
    return next((klass for klass in cls.__mro__ if klass in MAPPING_BASES), None)


def mapping_method(value: Value, name: str) -> bool:
    """Is `name` on a new dict-subclass object one of dict's own methods (not overridden in
    Python)? Those act on its tracked items."""
    if not isinstance(value, NewObjectValue) or value.mapping is None:
        return False
    owner = next((klass for klass in value.cls.__mro__ if name in klass.__dict__), None)
    return owner in MAPPING_BASES


def new_object_attribute(session: Session, value: NewObjectValue, name: str,
                         hooks: bool = True) -> Value:
    """An attribute of an object made during capture: what its code set, else its class's
    (methods bound to it, properties run; a dict subclass's dict methods act on its items).
    A class's own __getattribute__ in Python runs for every read (`hooks`), and its
    __getattr__ for a name found nowhere; object.__getattribute__ reads past them."""
    if hooks:
        hook = class_lookup(value.cls, "__getattribute__")
        if isinstance(hook, types.FunctionType):
            from ember.capture.calls import call_code

            return call_code(session, hook, [value, Const(name)])
    if name not in value.attributes and name != "__dict__" and \
            class_lookup(value.cls, name) is MISSING:
        fallback = class_lookup(value.cls, "__getattr__")
        if isinstance(fallback, types.FunctionType):
            from ember.capture.calls import call_code

            return call_code(session, fallback, [value, Const(name)])
    if name in value.attributes:
        return value.attributes[name]
    if name == "__class__":  # (reached where its class was: its attributes guarded there)
        return session.wrap(value.cls, value.cls_source, guard=value.cls_source is not None)
    if name == "__dict__" and value.cls.__dictoffset__:
        # (its attributes themselves: a write through it is a write of an attribute)
        if any(isinstance(class_lookup(value.cls, key), types.MemberDescriptorType)
               for key in value.attributes):
            raise Unsupported(f"__dict__ of a {value.cls.__qualname__} object with slots set")
        return DictValue(value.attributes)
    if mapping_method(value, name):  # (bound to the object: a break calls it on the object)
        return ValueMethodValue(value, name)
    descriptor = class_lookup(value.cls, name)
    if descriptor is MISSING:
        raise Raised(AttributeError(f"{value.cls.__qualname__!r} object has no attribute "
                                    f"{name!r}"))
    member = _class_member(session, descriptor, value.cls, value)
    if member is not None:
        return member
    if hasattr(descriptor, "__get__"):
        return python_descriptor(session, descriptor, "__get__",
                                  [value, session.wrap(value.cls, None, guard=False)],
                                  f"{value.cls.__qualname__}.{name}")
    # a class attribute: read through the class (guarded; changes to a list or dict there
    # are written back to it)
    if value.cls_source is not None:
        return session.wrap(descriptor, AttrSource(value.cls_source, name))
    if isinstance(descriptor, (list, dict, set)):
        raise Unsupported(f"{value.cls.__qualname__}.{name}: a class attribute that holds a "
                          f"list, dict or set, reached by no source")
    return session.wrap(descriptor, None, guard=False)


def python_descriptor(session: Session, descriptor: Any, method: str, args: list[Value],
                       what: str) -> Value:
    """A descriptor's __get__ or __set__, where its class writes it in Python
    (torch.distributions' lazy_property, a user's caching descriptor), on an object made
    during capture or one from outside that the capture wrote to: run, as eager runs it."""
    function = inspect.getattr_static(type(descriptor), method, None)
    if not isinstance(function, types.FunctionType):
        raise Unsupported(f"{what} is a descriptor")
    from ember.capture.calls import call_code

    return call_code(session, function, [session.wrap(descriptor, None, guard=False), *args])


def _class_member(session: Session, descriptor: Any, cls: type, receiver: Value | None
                  ) -> Value | None:
    """A function found on the class, as reading it gives it: a property's value, a static
    or class method, or a method bound to `receiver` (None: read from the class itself,
    unbound). None for anything else."""
    if isinstance(descriptor, property) and receiver is not None:
        from ember.capture.calls import call_code

        return call_code(session, descriptor.fget, [receiver])
    if isinstance(descriptor, staticmethod):
        return session.wrap(descriptor.__func__, None, guard=False)
    if isinstance(descriptor, classmethod):
        function = session.wrap(descriptor.__func__, None, guard=False)
        return BoundMethodValue(function, session.wrap(cls, None, guard=False))
    if isinstance(descriptor, types.FunctionType):
        function = session.wrap(descriptor, None, guard=False)
        return function if receiver is None else BoundMethodValue(function, receiver)
    return None


def _guard_class_member(session: Session, value: ObjectValue, cls: type, name: str,
                        descriptor: Any) -> None:
    """A method (property, static or class method) read through an object from outside:
    guarded to be the class's same function, not shadowed by the instance (`model.act =
    torch.tanh`, `Model.act = other`, after the capture)."""
    if value.source is None or isinstance(value.value, type):
        return
    session.guard_answer(class_lookup, (session.constant_source(cls), name), descriptor,
                         f"{cls.__qualname__}.{name} was replaced", kind="id")
    if hasattr(value.value, "__dict__"):
        session.guard_answer(operator.contains, (AttrSource(value.source, "__dict__", True), name),
                             False, f"{value.source.expr()}.{name} was set on the instance")


def class_lookup(cls: type, name: str) -> Any:
    """`name` as the class's MRO has it (what object.__getattribute__ finds on the class),
    else MISSING. Also a guard (a method not replaced): on every call."""
    for namespace in class_dicts(cls):
        if name in namespace:
            return namespace[name]
    return MISSING


def class_dicts(cls: type) -> tuple:
    """The dicts of the classes of `cls`'s MRO, as live views (a class's `__dict__` makes a new
    view on each read: a third of a lookup's time), kept per class while its MRO stands."""
    try:
        mro, dicts = _CLASS_DICTS.get(cls, _NO_CLASS)
    except TypeError:  # (a metaclass whose classes do not hash)
        return tuple(klass.__dict__ for klass in cls.__mro__)
    if mro is not cls.__mro__:  # (first seen, or its bases were assigned)
        if len(_CLASS_DICTS) >= 4096:  # (classes made on the fly: not kept without bound)
            _CLASS_DICTS.clear()
        mro = cls.__mro__
        dicts = tuple(klass.__dict__ for klass in mro)
        _CLASS_DICTS[cls] = (mro, dicts)
    return dicts


_CLASS_DICTS: dict[type, tuple[tuple, tuple]] = {}
_NO_CLASS = (None, ())


def super_attribute(frame: Frame, cls: Value, receiver: Value, name: str) -> Value:
    """super().name as 3.12's LOAD_SUPER_ATTR reads it."""
    return _past(frame.session, python_value(cls), receiver, name)


def _past(session: Session, klass: type, receiver: Value, name: str) -> Value:
    """`name` looked up past `klass` in the receiver's MRO (super()'s attribute)."""
    if isinstance(receiver, NewObjectValue):
        owner = receiver.cls
    else:
        obj = python_value(receiver)
        # (a class method's super(): the receiver is the class itself, and super() walks its
        # own MRO, not its metaclass's)
        owner = obj if isinstance(obj, type) and issubclass(obj, klass) else type(obj)
    mro = owner.__mro__
    for base in mro[mro.index(klass) + 1:]:
        if name in base.__dict__:
            attribute = base.__dict__[name]
            if base in MAPPING_BASES and isinstance(receiver, NewObjectValue) and \
                    receiver.mapping is not None:
                return ValueMethodValue(receiver.mapping, name)  # super().__setitem__(k, v)
            if isinstance(attribute, staticmethod):
                return session.wrap(attribute.__func__, None, guard=False)
            if isinstance(attribute, (classmethod, types.ClassMethodDescriptorType)):
                # super().apply(...) in a class method: bound to the receiver's class
                return session.wrap(attribute.__get__(None, owner), None, guard=False)
            function = session.wrap(attribute, None, guard=False)
            if isinstance(attribute, (types.FunctionType, types.WrapperDescriptorType,
                                      types.MethodDescriptorType)):
                return BoundMethodValue(function, receiver)  # super().__setattr__(n, v) too
            return function
    raise Unsupported(f"super() has no attribute {name!r}")
