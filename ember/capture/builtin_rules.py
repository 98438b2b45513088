"""Rules for calling builtins, by the real callable (`call_rules`): len, isinstance, range,
enumerate, zip, getattr, super, min/max on numbers, ... (torch's functions that are not graph
operations: ember/capture/torch_rules.py)."""

from __future__ import annotations

import collections
import functools
import operator
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.checkpoint

from ember.capture import attribute_writes, attributes, semantics
from ember.capture.calls import call_code, call_rules, call_value, rule
from ember.capture.errors import Raised, Unsupported
from ember.capture.semantics import python_value, unpack
from ember.capture.symbols import has_symbols, specialized, tracked_size
from ember.capture.values import (
    BoundMethodValue,
    Const,
    DictValue,
    EndlessIteratorValue,
    IdentityConst,
    IteratorValue,
    ModuleValue,
    NewObjectValue,
    ObjectValue,
    RangeValue,
    SequenceValue,
    SetValue,
    SliceValue,
    SuperValue,
    TensorValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


def answered_now(*functions: Callable) -> None:
    """Rules for functions of what the capture knows (torch.finfo, operator.itemgetter): called
    at capture on the values, their answer a value of the capture."""
    def rule_for(function: Callable) -> Callable:
        def answer(session: Session, *args: Value, frame: Any = None, **kwargs: Value) -> Value:
            return session.wrap(function(*[python_value(a) for a in args],
                                         **{k: python_value(v)
                                            for k, v in kwargs.items()}), None, guard=False)
        return answer

    call_rules.update({function: rule_for(function) for function in functions})


@rule(len)
def _len(session: Session, value: Value, **_: Any) -> Value:
    if isinstance(value, TensorValue):
        if value.fake.ndim == 0:
            raise Unsupported("len() of a 0-d tensor")
        return Const(tracked_size(value.fake.shape[0]))
    if isinstance(value, (SequenceValue, SetValue)):
        return Const(len(value.items))
    if isinstance(value, DictValue):
        return Const(len(value.items))
    if isinstance(value, ModuleValue):  # (a ModuleList's: its entries may come and go)
        length = len(value.value)
        session.guard_module_answer(value, len, (), length,
                                    f"len() of {value.describe()} changed from {length}")
        return Const(length)
    if isinstance(value, NewObjectValue):
        return Const(python_value(semantics.protocol(session, value, "__len__")))
    if isinstance(value, ObjectValue) and value.source is not None and \
            semantics.python_method(type(value.value), "__len__"):
        # (an object from outside: its own __len__ run as code, its reads guarded)
        return Const(python_value(call_code(session, type(value.value).__len__, [value])))
    return Const(len(python_value(value)))


@rule(isinstance)
def _isinstance(session: Session, value: Value, classes: Value, **_: Any) -> Value:
    kinds = python_value(classes)
    kind = value.python_type() if not isinstance(value, ObjectValue) else type(value.value)
    if isinstance(value, TensorValue) and value.exact_type is torch.Tensor:
        kind = torch.Tensor
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return Const(any(_is_subclass(kind, k) for k in kinds))


def _is_subclass(kind: type, target: Any) -> bool:
    try:
        return issubclass(kind, target)
    except TypeError:
        return False


@rule(issubclass)
def _issubclass(session: Session, kind: Value, classes: Value, **_: Any) -> Value:
    return Const(issubclass(python_value(kind), python_value(classes)))


@rule(range)
def _range(session: Session, *args: Value, **_: Any) -> Value:
    return RangeValue(range(*[python_value(a) for a in args]))


@rule(slice)
def _slice(session: Session, *args: Value, **_: Any) -> Value:
    """slice(stop) / slice(start, stop[, step]) (Swin's window masks): a slice value, as
    `a:b:c` in a subscript makes."""
    if not 1 <= len(args) <= 3:
        raise Unsupported(f"slice() takes 1 to 3 arguments ({len(args)} given)")
    none = Const(None)
    start, stop, step = (none, args[0], none) if len(args) == 1 else \
        (args[0], args[1], args[2] if len(args) == 3 else none)
    return SliceValue(start, stop, step)


@rule(enumerate)
def _enumerate(session: Session, iterable: Value, start: Value | None = None,
               **_: Any) -> Value:
    first = python_value(start) if start is not None else 0
    if isinstance(iterable, EndlessIteratorValue):  # (enumerate(itertools.count()))
        return EndlessIteratorValue(
            [], make=lambda k: SequenceValue([Const(first + k), iterable.next()], tuple),
            what=f"enumerate of {iterable.what}")
    return IteratorValue([SequenceValue([Const(first + i), item], tuple)
                          for i, item in enumerate(unpack(session, iterable))])


def _columns(session: Session, iterables: tuple[Value, ...]) -> list[list[Value]]:
    """The items of zip's or map's iterables, as far as the shortest goes: an endless one
    (itertools.count(), repeat(x)) gives as many as the others have."""
    endless = [isinstance(it, EndlessIteratorValue) for it in iterables]
    if iterables and all(endless):
        raise Unsupported(f"zip or map of endless iterators alone ({iterables[0].what})")
    columns = [None if end else unpack(session, it) for it, end in zip(iterables, endless)]
    if any(endless):
        length = min(len(c) for c in columns if c is not None)
        for index, it in enumerate(iterables):
            if endless[index]:
                session.side_effects.changed(it)
                columns[index] = it.take(length)
    return columns


@rule(zip)
def _zip(session: Session, *iterables: Value, strict: Value | None = None, **_: Any) -> Value:
    columns = _columns(session, iterables)
    if strict is not None and python_value(strict) and len({len(c) for c in columns}) > 1:
        raise Unsupported("zip(strict=True) of different lengths")
    return IteratorValue([SequenceValue(list(row), tuple) for row in zip(*columns)])


@rule(map)
def _map(session: Session, function: Value, *iterables: Value, **_: Any) -> Value:
    columns = _columns(session, iterables)
    return IteratorValue([call_value(session, function, list(row), {}) for row in zip(*columns)])


@rule(filter)
def _filter(session: Session, function: Value, iterable: Value, **_: Any) -> Value:
    kept = []
    for item in unpack(session, iterable):
        test = item if semantics.is_none(function) else call_value(session, function, [item], {})
        if semantics.truth(session, test):
            kept.append(item)
    return IteratorValue(kept)


@rule(sorted)
def _sorted(session: Session, iterable: Value, frame: Any = None, **kwargs: Value) -> Value:
    return SequenceValue(sorted_items(session, unpack(session, iterable), **kwargs), list)


def sorted_items(session: Session, items: list[Value], key: Value | None = None,
                 reverse: Value | None = None) -> list[Value]:
    """The items themselves in sorted()'s order: by their keys' values (`key` called on each,
    in order, as sorted() calls it), stable, reversed as sorted() reverses."""
    if key is None or semantics.is_none(key):
        keys = [python_value(item) for item in items]
    else:
        keys = [python_value(call_value(session, key, [item], {})) for item in items]
    backwards = bool(python_value(reverse)) if reverse is not None else False
    order = sorted(range(len(items)), key=keys.__getitem__, reverse=backwards)
    return [items[index] for index in order]


@rule(reversed)
def _reversed(session: Session, iterable: Value, **_: Any) -> Value:
    return IteratorValue(list(reversed(unpack(session, iterable))))


@rule(iter)
def _iter(session: Session, iterable: Value, **_: Any) -> Value:
    return semantics.iterate(session, iterable)


@rule(next)
def _next(session: Session, iterator: Value, *default: Value, **_: Any) -> Value:
    if not isinstance(iterator, IteratorValue):
        raise Unsupported(f"next() of {iterator.describe()}")
    session.side_effects.changed(iterator)
    item = iterator.next()
    if item is None:
        if default:
            return default[0]
        returned = iterator.returned or Const(None)
        if not isinstance(returned, Const):
            raise Unsupported(f"the return value of {iterator.describe()} through next()",
                              "the exception's value holds no tracked value")
        raise Raised(StopIteration() if returned.value is None else
                     StopIteration(returned.value))
    return item


call_rules[list] = lambda session, iterable=None, **_: SequenceValue(
    unpack(session, iterable) if iterable is not None else [], list)
call_rules[tuple] = lambda session, iterable=None, **_: SequenceValue(
    unpack(session, iterable) if iterable is not None else [], tuple)


@rule(dict)
def _dict(session: Session, *args: Value, frame: Any = None, **kwargs: Value) -> Value:
    items: dict[Any, Value] = {}
    if args:
        source = args[0]
        if isinstance(source, DictValue):
            items.update(source.items)
        else:
            for pair in unpack(session, source):
                key, value = unpack(session, pair)
                items[semantics.key_of(key)] = value
    items.update(kwargs)
    return DictValue(items)


@rule(collections.defaultdict)
def _defaultdict(session: Session, factory: Value | None = None, *args: Value,
                 frame: Any = None, **kwargs: Value) -> Value:
    """collections.defaultdict(factory, ...) made in the captured code: a dict whose missing
    keys get factory()'s value (item_semantics._missing)."""
    made = _dict(session, *args, **kwargs)
    return DictValue(made.items, collections.defaultdict,
                     default_factory=factory if factory is not None else Const(None))


@rule(collections.Counter)
def _counter(session: Session, iterable: Value | None = None, frame: Any = None,
             **kwargs: Value) -> Value:
    """collections.Counter(...) made in the captured code: a dict of counts whose missing keys
    count 0 (item_semantics._missing)."""
    if iterable is None or isinstance(iterable, DictValue):
        made = _dict(session, *([iterable] if iterable is not None else []), **kwargs)
        return DictValue(made.items, collections.Counter)
    if kwargs:
        raise Unsupported("Counter(iterable, **counts)")
    counted = collections.Counter(semantics.key_of(v) for v in unpack(session, iterable))
    return DictValue({key: Const(count) for key, count in counted.items()},
                     collections.Counter)


@rule(functools.reduce)
def _reduce(session: Session, function: Value, iterable: Value, *initial: Value,
            frame: Any = None, **_: Any) -> Value:
    """functools.reduce(f, items[, start]): f called item by item, as its C loop does."""
    items = unpack(session, iterable)
    if not initial and not items:
        raise Raised(TypeError("reduce() of empty iterable with no initial value"))
    total, rest = (initial[0], items) if initial else (items[0], items[1:])
    for item in rest:
        total = call_value(session, function, [total, item], {}, frame)
    return total


@rule(types.MethodType)
def _method(session: Session, function: Value, receiver: Value, **_: Any) -> Value:
    return BoundMethodValue(function, receiver)  # (types.MethodType(f, obj), f.__get__(obj))


@rule(set, frozenset)
def _set(session: Session, iterable: Value = None, **_: Any) -> Value:
    return semantics.make_set(unpack(session, iterable) if iterable is not None else [])


@rule(getattr)
def _getattr(session: Session, obj: Value, name: Value, *default: Value, **_: Any) -> Value:
    try:
        return attributes.get_attribute(session, obj, python_value(name))
    except Unsupported as error:
        if default and "no attribute" in error.reason:
            _guard_absent(session, obj, python_value(name), error)
            return default[0]
        raise


@rule(hasattr)
def _hasattr(session: Session, obj: Value, name: Value, **_: Any) -> Value:
    try:
        attributes.get_attribute(session, obj, python_value(name))
        return Const(True)
    except Unsupported as error:
        if "no attribute" in error.reason:
            _guard_absent(session, obj, python_value(name), error)
            return Const(False)
        raise


def _guard_absent(session: Session, obj: Value, name: str, error: Unsupported) -> None:
    """An attribute found missing (getattr's default taken, hasattr False) is guarded missing:
    a buffer registered or an attribute set after the capture is seen by the next call.
    Where a class's own __getattribute__ was inlined, what it found missing is guarded
    (the name it asked object.__getattribute__ for; its other reads have their guards)."""
    found, asked, past_hooks = getattr(error, "absent", None) or (obj, name, False)
    if getattr(found, "source", None) is None:  # (missing on an object no guard can reach)
        found, asked, past_hooks = obj, name, False
    source = getattr(found, "source", None)
    if source is None:
        return
    check = attributes.lacks_past_hooks if past_hooks else attributes.lacks
    session.guard_answer(check, (source, asked), True, f"{source.expr()}.{asked} now exists")


@rule(setattr)
def _setattr(session: Session, obj: Value, name: Value, value: Value, **_: Any) -> Value:
    attribute_writes.set_attribute(session, obj, python_value(name), value)
    return Const(None)


@rule(object.__setattr__)
def _object_setattr(session: Session, target: Value, name: Value, value: Value,
                    **_: Any) -> Value:
    """object.__setattr__(self, name, value): how a frozen dataclass's __init__ sets fields,
    and a class's own __setattr__ (a config's) sets past itself."""
    if isinstance(target, NewObjectValue):
        attribute_writes.set_new_object_attribute(session, target, python_value(name), value)
        return Const(None)
    if type(target) is ObjectValue and target.source is not None:
        attribute_writes.set_outside_attribute(session, target, python_value(name), value, False)
        return Const(None)
    raise Unsupported(f"object.__setattr__ on {target.describe()}")


@rule(delattr)
def _delattr(session: Session, obj: Value, name: Value, **_: Any) -> Value:
    attribute_writes.delete_attribute(session, obj, python_value(name))
    return Const(None)


@rule(type)
def _type(session: Session, value: Value, *more: Value, **_: Any) -> Value:
    if more:
        raise Unsupported("type(name, bases, namespace) makes a class",
                          "make the class outside the compiled function")
    return type_of(session, value)


def type_of(session: Session, value: Value) -> Value:
    """type(value), value.__class__."""
    kind = value.python_type() if not isinstance(value, ObjectValue) else type(value.value)
    # (a class known by identity — the value's type is guarded — with a source, so what is
    # read from it, type(self).ATTR, is guarded as read)
    return session.wrap(kind, session.constant_source(kind), guard=False)


@rule(super)
def _super(session: Session, *args: Value, frame: Frame | None = None, **_: Any) -> Value:
    if args:
        return SuperValue(python_value(args[0]), args[1])
    if frame is None or "__class__" not in frame.cells or not frame.code.co_varnames:
        raise Unsupported("super() without arguments outside a method")
    klass = semantics.read_cell(frame, "__class__")
    receiver = frame.locals.get(frame.code.co_varnames[0])
    if receiver is None:
        receiver = semantics.read_cell(frame, frame.code.co_varnames[0])
    return SuperValue(python_value(klass), receiver)


@rule(sum)
def _sum(session: Session, iterable: Value, start: Value | None = None, **_: Any) -> Value:
    total = start if start is not None else Const(0)
    for item in unpack(session, iterable):
        total = semantics.binary(session, "+", total, item)
    return total


def _extremum(pick: Callable):
    def run(session: Session, *args: Value, frame: Any = None, **kwargs: Value) -> Value:
        values = unpack(session, args[0]) if len(args) == 1 else list(args)
        key = kwargs.get("key")
        by_key = key is not None and not semantics.is_none(key)
        if by_key and set(kwargs) <= {"key", "default"}:
            # (by key: the item itself, the first of the least or greatest keys, as the
            # builtin picks; the items may hold tensors)
            if not values:
                if "default" in kwargs:
                    return kwargs["default"]
                raise Raised(ValueError(f"{pick.__name__}() iterable argument is empty"))
            keys = [python_value(call_value(session, key, [v], {}, frame)) for v in values]
            return values[pick(range(len(values)), key=keys.__getitem__)]
        if any(isinstance(v, TensorValue) for v in values):
            raise Unsupported(f"builtin {pick.__name__}() compares tensors (data-dependent)",
                              f"use torch.{'maximum' if pick is max else 'minimum'} instead")
        return semantics.constant(pick([python_value(v) for v in values],
                                       **{k: python_value(v) for k, v in kwargs.items()}))

    return run


call_rules[min] = _extremum(min)
call_rules[max] = _extremum(max)


@rule(abs)
def _abs(session: Session, value: Value, **_: Any) -> Value:
    if isinstance(value, TensorValue):
        return session.builder.call("call_function", operator.abs, (value,), {})
    return semantics.constant(abs(python_value(value)))


def _numeric(kind: type):
    def run(session: Session, *args: Value, frame: Any = None, **kwargs: Value) -> Value:
        if any(isinstance(a, TensorValue) for a in args):
            known = session.builder.known.number(args[0], kind) \
                if len(args) == 1 and not kwargs and kind is not str else None
            if known is not None:  # (a tensor made from constants alone: its number)
                return known
            raise Unsupported(f"{kind.__name__}() of a tensor reads its value",
                              "keep it outside the compiled function")
        values = [python_value(a) for a in args]
        if kind is str and has_symbols(values):  # (str(x.shape) would say "s0")
            values = specialized(values, "str() of it")
        return semantics.constant(kind(*values))

    return run


for _kind in (int, float, str, complex):
    call_rules[_kind] = _numeric(_kind)


@rule(bool)
def _bool(session: Session, value: Value | None = None, **_: Any) -> Value:
    """bool(v): v's truth as `if v:` takes it (an object's own __bool__/__len__ run)."""
    if isinstance(value, TensorValue):
        known = session.builder.known.number(value, bool)
        if known is not None:  # (a tensor made from constants alone: its truth)
            return known
        raise Unsupported("bool() of a tensor reads its value",
                          "keep it outside the compiled function")
    return Const(False) if value is None else Const(semantics.truth(session, value))


def _truthy(pick: Callable):
    def run(session: Session, iterable: Value, frame: Any = None, **_: Any) -> Value:
        return Const(pick(semantics.truth(session, v) for v in unpack(session, iterable)))

    return run


call_rules[all] = _truthy(all)
call_rules[any] = _truthy(any)


@rule(callable)
def _callable(session: Session, value: Value, **_: Any) -> Value:
    return Const(not isinstance(value, (Const, SequenceValue, DictValue, TensorValue))
                 or callable(getattr(value, "value", None)))


@rule(object.__getattribute__)
def _object_getattribute(session: Session, target: Value, name: Value, **_: Any) -> Value:
    """object.__getattribute__(self, name): a class's own __getattribute__ reading past
    itself (super().__getattribute__(key))."""
    if isinstance(target, NewObjectValue):
        return attributes.new_object_attribute(session, target, python_value(name),
                                               hooks=False)
    if isinstance(target, ObjectValue) and not isinstance(target, ModuleValue):
        return attributes.object_attribute(session, target, python_value(name), hooks=False)
    return attributes.get_attribute(session, target, python_value(name))


@rule(id)
def _id(session: Session, value: Value, **_: Any) -> Value:
    """id(x), as copy.deepcopy's memo and other bookkeeping use it: one number for each
    object (the real object's id, guarded to stay that object; a value made inside, its
    tracker's). It may not leave the compiled code: its value there would be ember's."""
    real = getattr(value, "value", None) if isinstance(value, ObjectValue) else None
    if real is not None:
        if value.source is not None:
            session.guards.add("id", value.source, real)
        if isinstance(value, ModuleValue):  # (the number itself: this object's alone)
            session.identity_reads.append(f"id() of {value.describe()}")
        return IdentityConst(id(real))
    return IdentityConst(id(value))
