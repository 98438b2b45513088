"""Calls during capture: torch callables become graph nodes, Python functions and module
forwards are inlined (interpreted in a new frame), builtins and container methods follow
per-callable rules, and anything else is `Unsupported` with a reason.
"""

from __future__ import annotations

import builtins
import inspect
import math
import operator
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_internals
from ember.capture import semantics
from ember.capture.errors import Unsupported
from ember.capture.semantics import RealCell, python_value, unpack
from ember.capture.sources import AttrSource, ItemSource, Source
from ember.capture.values import (
    NULL,
    BoundMethodValue,
    BuiltinValue,
    CellValue,
    Const,
    DictValue,
    FunctionValue,
    GradModeValue,
    IteratorValue,
    ModuleValue,
    NestedFunctionValue,
    ObjectValue,
    RangeValue,
    SequenceValue,
    SetValue,
    SuperValue,
    TensorMethodValue,
    TensorValue,
    TorchValue,
    Value,
    ValueMethodValue,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session

Rule = Callable[..., Value]
# Rules keyed by the real callable (a builtin, a torch function, a class).
call_rules: dict[Any, Rule] = {}
# Inlined calls nest at most this deep (recursion in the user's code).
MAX_INLINE_DEPTH = 48


def rule(*callables: Any):
    def register(fn: Rule) -> Rule:
        for callable_ in callables:
            call_rules[callable_] = fn
        return fn

    return register


def call_value(session: Session, callee: Value, args: list[Value], kwargs: dict[str, Value],
               frame: Frame | None = None) -> Value:
    if callee is NULL:
        raise Unsupported("call of NULL (ember bug)")
    real = getattr(callee, "value", None) if isinstance(callee, ObjectValue) else None
    if real is not None:
        try:
            special = call_rules.get(real)
        except TypeError:
            special = None
        if special is not None:
            return special(session, *args, frame=frame, **kwargs)
    if isinstance(callee, TorchValue):
        return call_torch(session, callee.value, args, kwargs)
    if isinstance(callee, TensorMethodValue):
        return call_tensor_method(session, callee.receiver, callee.name, args, kwargs)
    if isinstance(callee, ValueMethodValue):
        return call_value_method(session, callee.receiver, callee.name, args, kwargs)
    if isinstance(callee, BoundMethodValue):
        return call_value(session, callee.function, [callee.receiver, *args], kwargs, frame)
    if isinstance(callee, FunctionValue):
        return inline_function(session, callee, args, kwargs, frame)
    if isinstance(callee, NestedFunctionValue):
        return inline_nested(session, callee, args, kwargs, frame)
    if isinstance(callee, ModuleValue):
        return call_module(session, callee, args, kwargs, frame)
    if isinstance(callee, BuiltinValue):
        return call_builtin(session, callee.value, args, kwargs)
    if isinstance(callee, ObjectValue):
        return call_object(session, callee, args, kwargs, frame)
    if isinstance(callee, Const) and isinstance(callee.value, type) and \
            issubclass(callee.value, BaseException):
        return Const(callee.value(*[python_value(a) for a in args]))
    raise Unsupported(f"calling {callee.describe()}")


# -- torch ---------------------------------------------------------------------------------
_TORCH_SIDE_EFFECTS = {torch.manual_seed, torch.seed, torch.set_default_dtype,
                       torch.set_grad_enabled, torch.use_deterministic_algorithms,
                       torch.set_printoptions, torch.save, torch.load}


def call_torch(session: Session, target: Any, args: list[Value], kwargs: dict[str, Value]
               ) -> Value:
    if target in _TORCH_SIDE_EFFECTS:
        raise Unsupported(f"{getattr(target, '__name__', target)} changes global state",
                          "call it outside the compiled function")
    return session.builder.call("call_function", target, tuple(args), kwargs)


_DATA_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                 "data_ptr", "__array__", "storage", "untyped_storage", "backward",
                 "register_hook", "retain_grad"}


def call_tensor_method(session: Session, tensor: TensorValue, name: str, args: list[Value],
                       kwargs: dict[str, Value]) -> Value:
    fake = tensor.fake
    if name in _DATA_METHODS:
        raise Unsupported(f"tensor.{name}() needs the tensor's data",
                          "keep it outside the compiled function, or use tensor operations")
    values = [python_value(a) for a in args] if name in _METADATA_METHODS else None
    if values is not None:
        keywords = {k: python_value(v) for k, v in kwargs.items()}
        result = getattr(fake, name)(*values, **keywords)
        if isinstance(result, torch.Size):
            return SequenceValue([Const(int(d)) for d in result], torch.Size)
        return semantics.constant(result)
    return session.builder.call("call_method", name, (tensor, *args), kwargs)


_METADATA_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "element_size",
                     "is_contiguous", "stride", "is_floating_point", "is_complex",
                     "get_device", "is_signed", "storage_offset", "has_names"}


# -- inlining ------------------------------------------------------------------------------
def bind_arguments(code: types.CodeType, name: str, defaults: tuple[Value, ...],
                   kwdefaults: dict[str, Value], args: list[Value],
                   kwargs: dict[str, Value]) -> dict[str, Value]:
    """Map call arguments onto a code object's parameters (Python's binding rules)."""
    count = code.co_argcount
    kwonly = code.co_kwonlyargcount
    names = code.co_varnames
    positional_names = names[:count]
    kwonly_names = names[count:count + kwonly]
    index = count + kwonly
    varargs = names[index] if code.co_flags & inspect.CO_VARARGS else None
    if varargs:
        index += 1
    varkw = names[index] if code.co_flags & inspect.CO_VARKEYWORDS else None
    bound: dict[str, Value] = {}
    for position, value in enumerate(args[:count]):
        bound[positional_names[position]] = value
    extra = args[count:]
    if extra and not varargs:
        raise Unsupported(f"{name}() takes {count} positional arguments but {len(args)} "
                          "were given", "eager raises TypeError here")
    if varargs:
        bound[varargs] = SequenceValue(list(extra), tuple)
    rest: dict[str, Value] = {}
    posonly = code.co_posonlyargcount
    for key, value in kwargs.items():
        if key in positional_names[posonly:] or key in kwonly_names:
            if key in bound:
                raise Unsupported(f"{name}() got multiple values for argument {key!r}")
            bound[key] = value
        elif varkw:
            rest[key] = value
        else:
            raise Unsupported(f"{name}() got an unexpected keyword argument {key!r}",
                              "eager raises TypeError here")
    first_default = count - len(defaults)
    for position, parameter in enumerate(positional_names):
        if parameter not in bound:
            if position >= first_default:
                bound[parameter] = defaults[position - first_default]
            else:
                raise Unsupported(f"{name}() missing argument {parameter!r}",
                                  "eager raises TypeError here")
    for parameter in kwonly_names:
        if parameter not in bound:
            if parameter in kwdefaults:
                bound[parameter] = kwdefaults[parameter]
            else:
                raise Unsupported(f"{name}() missing keyword argument {parameter!r}")
    if varkw:
        bound[varkw] = DictValue(rest)
    return bound


def _run_frame(session: Session, code: types.CodeType, globals_: dict[str, Any],
               bound: dict[str, Value], cells: dict[str, Any], name: str,
               parent: Frame | None) -> Value:
    from ember.capture.interpreter import Frame

    if session.inline_depth >= MAX_INLINE_DEPTH:
        raise Unsupported("calls nest too deep (recursion?)", "recursion is not captured")
    # A generator expression is consumed where it is made (sum(x for x in xs)), so running
    # it to the end at once keeps eager's order of effects. Other generators are not
    # captured: their laziness could reorder effects.
    generator = code.co_name == "<genexpr>"
    session.inline_depth += 1
    try:
        frame = Frame(session, code, globals_, bound, cells, name, parent, generator=generator)
        result = frame.run()
    finally:
        session.inline_depth -= 1
    return IteratorValue(frame.yielded) if generator else result


def inline_function(session: Session, callee: FunctionValue, args: list[Value],
                    kwargs: dict[str, Value], parent: Frame | None) -> Value:
    function = callee.value
    source = callee.source
    if getattr(function, "__wrapped__", None) is not None and \
            function.__module__.startswith("torch"):
        raise Unsupported(f"decorated torch function {function.__qualname__}")
    defaults = tuple(session.wrap(v, ItemSource(AttrSource(source, "__defaults__"), i)
                                  if source else None)
                     for i, v in enumerate(function.__defaults__ or ()))
    kwdefaults = {k: session.wrap(v, ItemSource(AttrSource(source, "__kwdefaults__"), k)
                                  if source else None)
                  for k, v in (function.__kwdefaults__ or {}).items()}
    code = function.__code__
    bound = bind_arguments(code, function.__name__, defaults, kwdefaults, args, kwargs)
    cells = {}
    for index, (name, cell) in enumerate(zip(code.co_freevars, function.__closure__ or ())):
        cell_source = AttrSource(ItemSource(AttrSource(source, "__closure__"), index),
                                 "cell_contents") if source else None
        cells[name] = RealCell(cell, cell_source)
    return _run_frame(session, code, function.__globals__, bound, cells, function.__name__,
                      parent)


def inline_nested(session: Session, callee: NestedFunctionValue, args: list[Value],
                  kwargs: dict[str, Value], parent: Frame | None) -> Value:
    code = callee.code
    bound = bind_arguments(code, callee.name, callee.defaults, callee.kwdefaults, args, kwargs)
    cells = dict(zip(code.co_freevars, callee.closure))
    return _run_frame(session, code, callee.globals, bound, cells, callee.name, parent)


def call_module(session: Session, module_value: ModuleValue, args: list[Value],
                kwargs: dict[str, Value], parent: Frame | None) -> Value:
    module = module_value.value
    if torch_internals.module_has_hooks(module):
        raise Unsupported(f"{type(module).__name__} has forward hooks",
                          "remove the hooks, or compile the module without them")
    forward = type(module).forward
    function = session.wrap(forward, None, guard=False)
    return call_value(session, function, [module_value, *args], kwargs, parent)


def call_object(session: Session, callee: ObjectValue, args: list[Value],
                kwargs: dict[str, Value], parent: Frame | None) -> Value:
    obj = callee.value
    if isinstance(obj, type):
        if issubclass(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
            values = [python_value(a) for a in args]
            if all(semantics.is_known(a) for a in args):
                return Const(obj(*values, **{k: python_value(v) for k, v in kwargs.items()}))
        raise Unsupported(f"creating a {obj.__qualname__} object inside the compiled function",
                          "create it outside and pass it in")
    call = next((klass.__dict__["__call__"] for klass in type(obj).__mro__
                 if "__call__" in klass.__dict__), None)
    if isinstance(call, types.FunctionType):
        function = session.wrap(call, None, guard=False)
        return call_value(session, function, [callee, *args], kwargs, parent)
    raise Unsupported(f"calling {callee.describe()}")


# -- methods of containers and constants ---------------------------------------------------
def call_value_method(session: Session, receiver: Value, name: str, args: list[Value],
                      kwargs: dict[str, Value]) -> Value:
    if isinstance(receiver, GradModeValue):
        if name == "__exit__":
            semantics.set_grad_mode(session, receiver.previous)
            return Const(None)
        if name == "__enter__":
            return semantics.enter_context(session, receiver)[1]
    if isinstance(receiver, SequenceValue):
        return _sequence_method(session, receiver, name, args, kwargs)
    if isinstance(receiver, DictValue):
        return _dict_method(session, receiver, name, args, kwargs)
    if isinstance(receiver, SetValue) and name == "add":
        session.side_effects.changed(receiver)
        receiver.items.append(args[0])
        return Const(None)
    if semantics.is_known(receiver) and all(semantics.is_known(a) for a in args) and \
            all(semantics.is_known(v) for v in kwargs.values()):
        method = getattr(python_value(receiver), name)
        try:
            result = method(*[python_value(a) for a in args],
                            **{k: python_value(v) for k, v in kwargs.items()})
        except Exception as error:
            raise Unsupported(f"{type(error).__name__}: {error}") from None
        return session.wrap(result, None, guard=False) if not isinstance(
            result, (tuple, list)) else semantics.constant(tuple(result)) \
            if isinstance(result, tuple) else SequenceValue([semantics.constant(r)
                                                             for r in result], list)
    if isinstance(receiver, Const) and isinstance(receiver.value, str) and name == "format":
        raise Unsupported("str.format with a tensor argument (prints tensor values)")
    raise Unsupported(f"method {name} of {receiver.describe()}")


def _sequence_method(session: Session, sequence: SequenceValue, name: str, args: list[Value],
                     kwargs: dict[str, Value]) -> Value:
    items = sequence.items
    mutable = sequence.kind is list
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
    elif name == "copy":
        return SequenceValue(list(items), sequence.kind)
    elif name == "index":
        for position, item in enumerate(items):
            if semantics.identical(item, args[0]) or semantics.equal_constants(item, args[0]):
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


def _dict_method(session: Session, mapping: DictValue, name: str, args: list[Value],
                 kwargs: dict[str, Value]) -> Value:
    items = mapping.items
    if name == "get":
        key = semantics.key_of(args[0])
        return items.get(key, args[1] if len(args) > 1 else Const(None))
    if name == "keys":
        return SequenceValue([semantics.constant(k) for k in items], list)
    if name == "values":
        return SequenceValue(list(items.values()), list)
    if name == "items":
        return SequenceValue([SequenceValue([semantics.constant(k), v], tuple)
                              for k, v in items.items()], list)
    if name == "copy":
        return DictValue(dict(items))
    if name in ("update", "pop", "setdefault", "clear", "__setitem__"):
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
                raise Unsupported(f"KeyError: {key!r}")
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


# -- builtins ------------------------------------------------------------------------------
# Builtins and math functions that are pure: run at capture time on known arguments.
_PURE = {abs, min, max, round, divmod, pow, sum, all, any, sorted, len, repr, str, int, float,
         bool, complex, hash, chr, ord, format, bin, hex, oct, callable}


def call_builtin(session: Session, function: Any, args: list[Value],
                 kwargs: dict[str, Value]) -> Value:
    special = call_rules.get(function)
    if special is not None:
        return special(session, *args, **kwargs)
    module = getattr(function, "__module__", None)
    if function in _PURE or module in ("math", "_operator", "operator") or \
            getattr(function, "__self__", None) is math:
        if any(isinstance(a, TensorValue) for a in args):
            if module in ("_operator", "operator"):
                return session.builder.call("call_function", function, tuple(args), kwargs)
            raise Unsupported(f"{function.__name__}() of a tensor needs its value")
        values = [python_value(a) for a in args]
        keywords = {k: python_value(v) for k, v in kwargs.items()}
        try:
            return semantics.constant(function(*values, **keywords))
        except Exception as error:
            raise Unsupported(f"{type(error).__name__}: {error}",
                              "eager raises this error here") from None
    if function is builtins.print:
        raise Unsupported("print() inside the compiled function",
                          "print outside, or accept that this function runs eagerly")
    raise Unsupported(f"builtin {getattr(function, '__name__', function)}() is not supported")


@rule(len)
def _len(session: Session, value: Value, **_: Any) -> Value:
    if isinstance(value, TensorValue):
        if value.fake.ndim == 0:
            raise Unsupported("len() of a 0-d tensor")
        return Const(int(value.fake.shape[0]))
    if isinstance(value, (SequenceValue, SetValue)):
        return Const(len(value.items))
    if isinstance(value, DictValue):
        return Const(len(value.items))
    if isinstance(value, ModuleValue):
        return Const(len(value.value))
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


@rule(enumerate)
def _enumerate(session: Session, iterable: Value, start: Value | None = None,
               **_: Any) -> Value:
    first = python_value(start) if start is not None else 0
    return IteratorValue([SequenceValue([Const(first + i), item], tuple)
                          for i, item in enumerate(unpack(session, iterable))])


@rule(zip)
def _zip(session: Session, *iterables: Value, strict: Value | None = None, **_: Any) -> Value:
    columns = [unpack(session, it) for it in iterables]
    if strict is not None and python_value(strict) and len({len(c) for c in columns}) > 1:
        raise Unsupported("zip(strict=True) of different lengths")
    return IteratorValue([SequenceValue(list(row), tuple) for row in zip(*columns)])


@rule(map)
def _map(session: Session, function: Value, *iterables: Value, **_: Any) -> Value:
    columns = [unpack(session, it) for it in iterables]
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
    values = [python_value(v) for v in unpack(session, iterable)]
    options = {k: python_value(v) for k, v in kwargs.items()}
    return SequenceValue([semantics.constant(v) for v in sorted(values, **options)], list)


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
    item = iterator.next()
    session.side_effects.changed(iterator)
    if item is None:
        if default:
            return default[0]
        raise Unsupported("StopIteration", "eager raises StopIteration here")
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


@rule(set, frozenset)
def _set(session: Session, iterable: Value = None, **_: Any) -> Value:
    return semantics.make_set(unpack(session, iterable) if iterable is not None else [])


@rule(getattr)
def _getattr(session: Session, obj: Value, name: Value, *default: Value, **_: Any) -> Value:
    try:
        return semantics.get_attribute(session, obj, python_value(name))
    except Unsupported as error:
        if default and "no attribute" in error.reason:
            return default[0]
        raise


@rule(hasattr)
def _hasattr(session: Session, obj: Value, name: Value, **_: Any) -> Value:
    try:
        semantics.get_attribute(session, obj, python_value(name))
        return Const(True)
    except Unsupported as error:
        if "no attribute" in error.reason:
            return Const(False)
        raise


@rule(setattr)
def _setattr(session: Session, obj: Value, name: Value, value: Value, **_: Any) -> Value:
    semantics.set_attribute(session, obj, python_value(name), value)
    return Const(None)


@rule(type)
def _type(session: Session, value: Value, **_: Any) -> Value:
    kind = value.python_type() if not isinstance(value, ObjectValue) else type(value.value)
    return session.wrap(kind, None, guard=False)


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
            raise Unsupported(f"{kind.__name__}() of a tensor reads its value",
                              "keep it outside the compiled function")
        return semantics.constant(kind(*[python_value(a) for a in args]))

    return run


for _kind in (int, float, bool, str, complex):
    call_rules[_kind] = _numeric(_kind)


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


# -- torch functions that are not graph operations -----------------------------------------
@rule(torch.no_grad)
def _no_grad(session: Session, *args: Value, frame: Any = None, **_: Any) -> Value:
    return GradModeValue(False)


@rule(torch.enable_grad)
def _enable_grad(session: Session, *args: Value, frame: Any = None, **_: Any) -> Value:
    return GradModeValue(True)


@rule(torch.set_grad_enabled)
def _set_grad_enabled(session: Session, mode: Value, frame: Any = None, **_: Any) -> Value:
    enabled = bool(python_value(mode))
    previous = session.grad_enabled
    semantics.set_grad_mode(session, enabled)
    value = GradModeValue(enabled, previous)
    return value


@rule(torch.is_grad_enabled)
def _is_grad_enabled(session: Session, frame: Any = None, **_: Any) -> Value:
    return Const(session.grad_enabled)


@rule(torch.get_default_dtype)
def _get_default_dtype(session: Session, frame: Any = None, **_: Any) -> Value:
    return Const(torch.get_default_dtype())


@rule(torch.is_tensor)
def _is_tensor(session: Session, value: Value, frame: Any = None, **_: Any) -> Value:
    return Const(isinstance(value, TensorValue))


@rule(torch.is_floating_point)
def _is_floating_point(session: Session, value: Value, frame: Any = None, **_: Any) -> Value:
    return Const(value.fake.is_floating_point())


@rule(torch.numel)
def _numel(session: Session, value: Value, frame: Any = None, **_: Any) -> Value:
    return Const(value.fake.numel())


@rule(torch.Size)
def _size(session: Session, dims: Value = None, frame: Any = None, **_: Any) -> Value:
    return SequenceValue(unpack(session, dims) if dims is not None else [], torch.Size)


def _constant_call(session: Session, function: Any, args: list[Value],
                   kwargs: dict[str, Value]) -> Value:
    return session.wrap(function(*[python_value(a) for a in args],
                                 **{k: python_value(v) for k, v in kwargs.items()}),
                        None, guard=False)


for _function in (torch.device, torch.finfo, torch.iinfo, torch.promote_types,
                  torch.result_type, torch.can_cast):
    call_rules[_function] = (lambda function: lambda session, *a, frame=None, **k:
                             _constant_call(session, function, list(a), k))(_function)

for _function, _value in ((torch.jit.is_scripting, False), (torch.jit.is_tracing, False),
                          (torch.compiler.is_compiling, True),
                          (torch.compiler.is_dynamo_compiling, False)):
    call_rules[_function] = (lambda value: lambda session, *a, frame=None, **k:
                             Const(value))(_value)


__all__ = ["BuiltinValue", "CellValue", "Source"]
