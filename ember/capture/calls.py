"""Calls during capture: torch callables become graph nodes, Python functions are inlined
(interpreted in a new frame: inlining.py), modules are called as module_calls says (their
forwards and hooks inlined), builtins and container methods follow per-callable rules, and
anything else is `Unsupported` with a reason.
"""

from __future__ import annotations

import abc
import builtins
import functools
import inspect
import logging
import math
import sys
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_internals
from ember.capture import (
    attributes,
    container_methods,
    contexts,
    known_values,
    numbers,
    semantics,
    tensor_attributes,
)
from ember.capture.errors import Raised, Unsupported
from ember.capture.inlining import inline_function, inline_nested
from ember.capture.semantics import python_value, unpack
from ember.capture.sources import AttrSource, CallSource
from ember.capture.symbols import has_symbols, specialized, tracked_size
from ember.capture.values import (
    NULL,
    BoundMethodValue,
    BuiltinValue,
    Const,
    DictValue,
    FunctionValue,
    ModuleValue,
    NestedFunctionValue,
    NewObjectValue,
    ObjectValue,
    PartialValue,
    SequenceValue,
    TensorMethodValue,
    TensorValue,
    TorchValue,
    Value,
    ValueMethodValue,
    VmappedValue,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session

Rule = Callable[..., Value]
# Rules keyed by the real callable (a builtin, a torch function, a class).
call_rules: dict[Any, Rule] = {}
# Rules for calling objects by type (operator's getters): (session, callee, args, kwargs,
# parent frame) -> the result
object_call_rules: dict[type, Rule] = {}
# Rules for tensor methods, by name: `x.cov()` as the rule of torch.Tensor.cov takes it,
# (session, tensor, *args, **kwargs) -> the result
method_rules: dict[str, Rule] = {}


# Rules for torch._dynamo's own functions wait until something imports torch._dynamo (ember
# does not: it costs seconds); user code can reach those functions only after that.
_dynamo_registrations: list[Callable[[], None]] = []
_dynamo_registered = [False]


def when_dynamo_imported(register: Callable[[], None]) -> None:
    """Run `register` (it adds rules for torch._dynamo's functions) once torch._dynamo is
    imported: now if it is, else at the first rule lookup that misses after it is."""
    _dynamo_registrations.append(register)
    if _dynamo_registered[0]:
        register()


def _rule_for(callable_: Any) -> Rule | None:
    special = call_rules.get(callable_)
    if special is None and not _dynamo_registered[0] and torch_internals.dynamo_imported():
        _dynamo_registered[0] = True
        for register in _dynamo_registrations:
            register()
        special = call_rules.get(callable_)
    return special


def rule(*callables: Any):
    def register(fn: Rule) -> Rule:
        for callable_ in callables:
            call_rules[callable_] = fn
        return fn

    return register


def call_code(session: Session, function: Any, args: list[Value]) -> Value:
    """A class's own Python function (a hook, a setter, a descriptor's method, __init__) run as
    code on `args`: no guard of its own (the class lookup that found it guards it)."""
    return call_value(session, session.wrap(function, None, guard=False), args, {})


def call_value(session: Session, callee: Value, args: list[Value], kwargs: dict[str, Value],
               frame: Frame | None = None) -> Value:
    if callee is NULL:
        raise Unsupported("call of NULL (ember bug)")
    if session.open_contexts and callee is session.open_contexts[-1]:
        session.open_contexts.pop()  # (a Python context manager's block ends)
    real = getattr(callee, "value", None) if isinstance(callee, ObjectValue) else None
    if real is not None:
        try:
            special = _rule_for(real)
        except TypeError:
            special = None
        if special is not None:
            return special(session, *args, frame=frame, **kwargs)
        if _numpy_pure(real) and all(semantics.is_known(v) for v in (*args, *kwargs.values())):
            # (np.lcm(a, b) of Python numbers: Reformer's chunk lengths) pure: run now
            # (a symbolic size: its value, numpy computes on numbers)
            return semantics.constant(real(
                *specialized([python_value(a) for a in args], f"{real.__name__}()"),
                **specialized({k: python_value(v) for k, v in kwargs.items()})))
    switch = contexts.backend_switch(session, callee, args, kwargs)  # (cudnn.flags(...))
    if switch is not None:
        return switch
    manager = contexts.generator_context(session, callee, args, kwargs, frame)
    if manager is not None:  # (a @contextmanager function's call)
        return manager
    marked = markers.call_marked(session, callee, args, kwargs, frame)  # (torch's markers)
    if marked is not None:
        return marked
    scripted = torch_internals.scripted_python(real) if real is not None else None
    if scripted is not None:  # (a torch.jit.script'd function: its Python, inlined)
        source = AttrSource(callee.source, "_torchdynamo_inline") if callee.source else None
        return inline_function(session, FunctionValue(scripted, source), args, kwargs, frame)
    if real is not None and torch_internals.is_script_function(real):
        # (a graph's node cannot hold it: FX would write its call as ScriptFunction's class)
        raise Unsupported("a TorchScript function without its Python source (loaded from a "
                          "file) runs outside the graph")
    if isinstance(callee, TorchValue) and isinstance(callee.value, types.FunctionType) and \
            any(_holds_object(v) for v in (*args, *kwargs.values())):
        # (torch's own Python over objects no op takes — pytree's flatten and unflatten with
        # their TreeSpecs, around an exported program's module: inlined as a user's function)
        return inline_function(session, FunctionValue(callee.value, callee.source), args,
                               kwargs, frame)
    if isinstance(callee, TorchValue):
        return call_torch(session, callee.value, args, kwargs)
    if isinstance(callee, TensorMethodValue):
        return call_tensor_method(session, callee.receiver, callee.name, args, kwargs)
    if isinstance(callee, ValueMethodValue):
        return container_methods.call_value_method(session, callee.receiver, callee.name,
                                                   args, kwargs)
    if isinstance(callee, BoundMethodValue):
        receiver = getattr(callee.receiver, "value", None)
        if isinstance(callee.receiver, ModuleValue):
            answer = module_calls.module_method(
                session, callee.receiver, getattr(callee.function, "value", None), args, kwargs)
            if answer is not None:
                return answer
        if isinstance(callee.receiver, ObjectValue) and \
                isinstance(receiver, torch.optim.Optimizer):
            name = getattr(callee.function, "value", None)
            name = getattr(name, "__name__", "method")
            raise Unsupported(f"optimizer.{name}() runs outside the graph"
                              + (" (as ember's fused update)" if name == "step" else ""),
                              "expected: a training step breaks at zero_grad(), backward() and "
                              "step()")
        return call_value(session, callee.function, [callee.receiver, *args], kwargs, frame)
    if isinstance(callee, FunctionValue) and callee.value in module_calls.HOOK_REGISTRATIONS \
            and args and isinstance(args[0], ModuleValue):
        return module_calls.register_hook(session, callee.value, args, kwargs)
    if isinstance(callee, FunctionValue):
        if torch_internals.scheduler_wrapped_optimizer(callee.value) is not None:
            raise Unsupported("optimizer.step() runs outside the graph (as ember's fused "
                              "update)", "expected: a training step breaks at zero_grad(), "
                              "backward() and step()")
        return inline_function(session, callee, args, kwargs, frame)
    if isinstance(callee, NestedFunctionValue):
        return inline_nested(session, callee, args, kwargs, frame)
    if isinstance(callee, PartialValue):
        return call_value(session, callee.function, [*callee.args, *args],
                          {**callee.keywords, **kwargs}, frame)
    if isinstance(callee, VmappedValue):
        return vmap_rules.call_vmapped(session, callee, args, kwargs, frame)
    if isinstance(callee, ModuleValue):
        return module_calls.call_module(session, callee, args, kwargs, frame)
    if isinstance(callee, BuiltinValue):
        return call_builtin(session, callee.value, args, kwargs)
    if isinstance(callee, ObjectValue):
        return call_object(session, callee, args, kwargs, frame)
    if isinstance(callee, NewObjectValue):  # (an object made here, whose class is callable)
        call = attributes.class_lookup(callee.cls, "__call__")
        if isinstance(call, types.FunctionType):
            return call_value(session, session.wrap(call, None, guard=False),
                              [callee, *args], kwargs, frame)
    if isinstance(callee, Const) and isinstance(callee.value, type) and \
            issubclass(callee.value, BaseException):
        return Const(callee.value(*[python_value(a) for a in args]))
    raise Unsupported(f"calling {callee.describe()}")


def _holds_object(value: Value) -> bool:
    """Is an object that no op takes (not a tensor, number or container of them) in `value`?"""
    if isinstance(value, SequenceValue):
        return any(_holds_object(item) for item in value.items)
    if isinstance(value, DictValue):
        return any(_holds_object(item) for item in value.items.values())
    return type(value) in (ObjectValue, NewObjectValue)


# -- torch ---------------------------------------------------------------------------------
# (unwrapped: importing torch._dynamo wraps torch.manual_seed and friends in new functions)
_TORCH_SIDE_EFFECTS = {inspect.unwrap(f) for f in (
    torch.manual_seed, torch.seed, torch.set_rng_state, torch.cuda.manual_seed,
    torch.cuda.manual_seed_all, torch.cuda.seed, torch.cuda.seed_all, torch.cuda.set_rng_state,
    torch.cuda.set_rng_state_all, torch.set_default_dtype, torch.set_grad_enabled,
    torch.use_deterministic_algorithms, torch.set_printoptions, torch.save, torch.load)}


def call_torch(session: Session, target: Any, args: list[Value], kwargs: dict[str, Value]
               ) -> Value:
    if _unwrapped(target) in _TORCH_SIDE_EFFECTS:
        raise Unsupported(f"{getattr(target, '__name__', target)} changes global state",
                          "call it outside the compiled function")
    name = getattr(target, "__name__", "")
    if getattr(target, "__module__", None) == "torch._C" and name.startswith("_") and \
            any(isinstance(v, TensorValue) for v in (*args, *kwargs.values())):
        # (torch's private bindings are not ops: one that takes tensors may read their
        # memory directly — the jiterator's launch would launch a kernel on the capture's
        # fake tensors, an illegal memory access on the GPU)
        raise Unsupported(f"torch._C.{name} is not an op the graph can hold",
                          "it runs natively at a graph break")
    if getattr(target, "__module__", None) in ("torch", "torch._C._VariableFunctions"):
        args, kwargs = numbers.method_numbers(session, getattr(target, "__name__", ""),
                                              list(args), kwargs)
    result = session.builder.call("call_function", target, tuple(args), kwargs)
    if type(result) is Const and type(result.value) in (bool, int, float, torch.device,
                                                        torch.dtype) and not kwargs and \
            all(type(a) is Const for a in args):
        # a number or a setting from torch's global state (are_deterministic_algorithms_
        # enabled(), get_num_threads(), get_default_device()): asked again by the guard on
        # each call
        name = getattr(target, "__name__", "a torch function")
        session.guard_answer(target, tuple(a.value for a in args), result.value,
                             f"torch's {name}() no longer answers {result.value!r}")
    return result


def _unwrapped(target: Any) -> Any:
    try:
        return inspect.unwrap(target)
    except (ValueError, TypeError):  # (a cycle of __wrapped__, an object without it)
        return target


_DATA_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                 "data_ptr", "__array__", "storage", "untyped_storage", "backward",
                 "register_hook", "retain_grad"}


def call_tensor_method(session: Session, tensor: TensorValue, name: str, args: list[Value],
                       kwargs: dict[str, Value]) -> Value:
    fake = tensor.fake
    if name == "backward":
        raise Unsupported("tensor.backward() runs outside the graph (autograd runs the "
                          "compiled backward)", "expected in a training step")
    if name in _DATA_METHODS:
        read = known_values.DATA_READS.get(name)
        known = session.builder.known.number(tensor, read) \
            if read is not None and not args and not kwargs else None
        if known is not None:  # (a tensor made from constants alone: its number)
            return known
        raise Unsupported(f"tensor.{name}() needs the tensor's data",
                          "keep it outside the compiled function, or use tensor operations")
    if name == "requires_grad_" and len(args) + len(kwargs) <= 1:
        wanted = args[0] if args else kwargs.get("requires_grad", Const(True))
        return tensor_attributes.set_requires_grad(session, tensor, wanted, method=True)
    if name == "is_inference" and not args:
        if tensor.node.op == "placeholder":
            raise Unsupported("is_inference() of an input (not guarded)")
        return Const(tensor.node in session.builder.made_in_inference)
    values = [python_value(a) for a in args] if name in _METADATA_METHODS else None
    if values is not None:
        keywords = {k: python_value(v) for k, v in kwargs.items()}
        result = getattr(fake, name)(*values, **keywords)
        if isinstance(result, torch.Size):
            return SequenceValue([Const(tracked_size(d)) for d in result], torch.Size)
        return semantics.constant(result)
    special = method_rules.get(name)
    if special is not None:
        return special(session, tensor, *args, **kwargs)
    operands, kwargs = numbers.method_numbers(session, name, [tensor, *args], kwargs)
    return session.builder.call("call_method", name, tuple(operands), kwargs)


_METADATA_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "element_size",
                     "is_contiguous", "stride", "is_floating_point", "is_complex",
                     "get_device", "is_signed", "storage_offset", "has_names"}


def _not_plain(cls: type) -> str | None:
    """Why objects of `cls` cannot be made during capture (None: they can): ember tracks a
    new object's attributes itself, so its class must keep them in a plain __dict__, made by
    object.__new__, read and written without hooks."""
    if type(cls) not in (type, abc.ABCMeta):
        return f"its metaclass is {type(cls).__name__}"
    base = attributes.mapping_base(cls)  # (a dict subclass: its items are tracked too)
    if cls.__new__ is not (base or object).__new__:
        return "it has its own __new__ or a built-in base"
    if issubclass(cls, (torch.nn.Module, torch.Tensor, BaseException)):
        return "a module, tensor or exception class"
    for klass in cls.__mro__[:-1]:
        if klass in attributes.MAPPING_BASES:
            continue
        # (hooks in Python are run on each read: ember/capture/attributes.py)
        hooks = {name for name in ("__getattribute__", "__getattr__")
                 if name in klass.__dict__ and
                 not isinstance(klass.__dict__[name], types.FunctionType)}
        if hooks:
            return f"{klass.__qualname__} defines {', '.join(sorted(hooks))}"
    return None


@rule(functools.partial)
def _partial(session: Session, function: Value, *args: Value, frame: Frame | None = None,
             **keywords: Value) -> Value:
    return PartialValue(function, list(args), dict(keywords))


@rule(logging.Logger.isEnabledFor)
def _logger_enabled(session: Session, logger: Value, level: Value, **_: Any) -> Value:
    """Whether a logger would log at `level`, answered now and guarded (its first answer
    fills a cache inside try/except, which capture cannot run): disabled log calls in a
    forward cost nothing."""
    if not isinstance(logger, ObjectValue) or logger.source is None:
        raise Unsupported("isEnabledFor() of a logger made inside the compiled function")
    number = python_value(level)
    answer = logger.value.isEnabledFor(number)
    return session.wrap(answer, CallSource(logger.source, "isEnabledFor", (number,)))


@rule(object.__init__)
def _object_init(session: Session, *args: Value, frame: Frame | None = None,
                 **kwargs: Value) -> Value:
    """super().__init__() reaching object's (a no-op)."""
    if len(args) > 1 or kwargs:
        raise Unsupported("object.__init__() with arguments")
    return Const(None)


def _make_namedtuple(session: Session, cls: type, args: list[Value],
                     kwargs: dict[str, Value]) -> Value:
    """cls(*args, **kwargs): its fields bound as its __new__ binds them (defaults too)."""
    fields = cls._fields
    if len(args) > len(fields) or set(kwargs) - set(fields):
        raise Unsupported(f"{cls.__name__}() with arguments its fields do not take",
                          "eager raises TypeError here")
    items = dict(zip(fields, args))
    for name, value in kwargs.items():
        if name in items:
            raise Unsupported(f"{cls.__name__}() got {name!r} twice", "eager raises TypeError")
        items[name] = value
    defaults = getattr(cls, "_field_defaults", {})
    missing = [name for name in fields if name not in items and name not in defaults]
    if missing:
        raise Unsupported(f"{cls.__name__}() misses {missing}", "eager raises TypeError here")
    values = [items[name] if name in items else semantics.constant(defaults[name])
              for name in fields]
    if all(semantics.is_known(v) for v in values):
        return Const(cls(*[python_value(v) for v in values]))
    return SequenceValue(values, cls)


@rule(tuple.__new__)
def _tuple_new(session: Session, cls: Value, iterable: Value | None = None,
               frame: Frame | None = None) -> Value:
    """tuple.__new__(cls, iterable): how a namedtuple's _make and _replace build it."""
    kind = python_value(cls)
    items = unpack(session, iterable) if iterable is not None else []
    if semantics.is_namedtuple(kind):
        if len(items) != len(kind._fields):
            raise Unsupported(f"{kind.__name__}._make() with {len(items)} items",
                              "eager raises TypeError here")
        return SequenceValue(items, kind)
    if kind is tuple:
        return SequenceValue(items, tuple)
    raise Unsupported(f"tuple.__new__ of {getattr(kind, '__name__', kind)}")


def call_object(session: Session, callee: ObjectValue, args: list[Value],
                kwargs: dict[str, Value], parent: Frame | None) -> Value:
    obj = callee.value
    if isinstance(obj, type):
        if semantics.is_namedtuple(obj):
            return _make_namedtuple(session, obj, args, kwargs)
        if issubclass(obj, torch.nn.Module):
            return _new_stateless_module(session, obj, args, kwargs)
        refused = _not_plain(obj)
        if refused is not None:
            raise Unsupported(f"creating a {obj.__qualname__} object inside the compiled "
                              f"function ({refused})", "create it outside and pass it in")
        base = attributes.mapping_base(obj)
        made = NewObjectValue(obj, callee.source,
                              mapping=DictValue({}, base) if base is not None else None)
        init = attributes.class_lookup(obj, "__init__")
        if isinstance(init, types.FunctionType):
            result = call_value(session, session.wrap(init, None, guard=False), [made, *args],
                                kwargs, parent)
            if not semantics.is_none(result):
                raise Unsupported(f"{obj.__qualname__}.__init__ returned a value")
        elif base is not None and init is base.__init__:  # dict's own: the items given
            if len(args) > 1:
                raise Unsupported(f"{obj.__qualname__}() with {len(args)} positional arguments")
            given = call_rules[dict](session, *args, **kwargs).items
            if base is dict:  # (dict's __init__ stores them itself ...)
                made.mapping.items.update(given)
            else:             # (... OrderedDict's through the object's own __setitem__)
                for key, value in given.items():
                    semantics.set_item(session, made, semantics.constant(key), value)
        elif args or kwargs:
            raise Unsupported(f"{obj.__qualname__}() takes no arguments")
        return made
    if type(obj) is functools.partial:
        # f(*partial.args, *args, **partial.keywords, **kwargs), each part guarded as read
        # (a partial reached without a source is read as the object it is, as everything
        # reached through it)
        source = callee.source

        def part(name: str) -> Value:
            value = getattr(obj, name)
            return session.wrap(value, AttrSource(source, name)) if source is not None \
                else session.wrap(value, None, guard=False)

        function, bound, keywords = part("func"), part("args"), part("keywords")
        return call_value(session, function, [*bound.items, *args],
                          {**keywords.items, **kwargs}, parent)
    call = attributes.class_lookup(type(obj), "__call__")
    if isinstance(call, types.FunctionType):
        function = session.wrap(call, None, guard=False)
        return call_value(session, function, [callee, *args], kwargs, parent)
    loggers = (logging.Logger, logging.LoggerAdapter)
    if not kwargs and (isinstance(getattr(obj, "__self__", None), loggers) or (
            args and isinstance(getattr(args[0], "value", None), loggers))):
        # (a logger's method that is no Python function, transformers' lru_cache'd
        # warning_once: called after the graph, in order with the other side effects)
        session.side_effects.call(obj, list(args))
        return Const(None)
    if isinstance(obj, functools._lru_cache_wrapper):
        return _call_cached(session, callee, args, kwargs, parent)
    if type(obj) in object_call_rules:
        return object_call_rules[type(obj)](session, callee, args, kwargs, parent)
    if isinstance(obj, weakref.ref) and not args and not kwargs and callee.source is not None:
        # (nn.RNNBase checks its weights through weak references on every call): the
        # referent, guarded as any object reached through the reference is
        return session.wrap(obj(), CallSource(callee.source))
    raise Unsupported(f"calling {callee.describe()}")


def _call_cached(session: Session, callee: ObjectValue, args: list[Value],
                 kwargs: dict[str, Value], parent: Frame | None) -> Value:
    """A functools.lru_cache'd function (libraries' version and feature probes, tables by
    size). Called with plain constants: called now, as eager's call calls it (the cache
    answers, or fills as eager's first call fills it), its answer a constant of the graph.
    Otherwise its own function is inlined where it has no effects (the cache not consulted,
    as under Dynamo); one with effects (which eager's cache runs once) runs natively."""
    cached = callee.value
    operands = [*args, *kwargs.values()]
    if all(type(a) is Const and semantics.plain_constant(a.value) for a in operands):
        result = cached(*[a.value for a in args], **{k: v.value for k, v in kwargs.items()})
        if semantics.plain_constant(result):
            return semantics.constant(result)
    wrapped = getattr(cached, "__wrapped__", None)
    if not isinstance(wrapped, types.FunctionType):
        raise Unsupported(f"calling the cached {callee.describe()} (no Python function "
                          f"under its cache)")
    source = AttrSource(callee.source, "__wrapped__") if callee.source else None
    before = session.side_effects.mark()
    result = inline_function(session, FunctionValue(wrapped, source), args, kwargs, parent)
    if session.side_effects.changed_outside(*before):
        raise Unsupported(f"the cached {callee.describe()} has effects",
                          "eager's cache runs them once: it is called natively")
    return result


def _new_stateless_module(session: Session, cls: type, args: list[Value],
                          kwargs: dict[str, Value]) -> Value:
    """`CrossEntropyLoss()`, `nn.GELU()` made inside a forward: made now, from constant
    arguments, when it holds no parameter and no buffer (nothing random, nothing to train),
    and kept by the entry: every call would make the same module."""
    if not all(semantics.is_known(v) for v in [*args, *kwargs.values()]):
        raise Unsupported(f"creating a {cls.__qualname__} module inside the compiled function "
                          "from values ember does not know", "create it in __init__")
    try:
        module = cls(*[python_value(v) for v in args],
                     **{k: python_value(v) for k, v in kwargs.items()})
    except Exception as error:
        raise Unsupported(f"{cls.__qualname__}(...) raised {type(error).__name__}: {error}",
                          "eager raises this error here") from None
    if next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
        raise Unsupported(f"creating a {cls.__qualname__} module with parameters or buffers "
                          "inside the compiled function", "create it in __init__")
    return session.wrap(module, session.constant_source(module))


def new_object_protocol(session: Session, value: NewObjectValue, name: str,
                        args: list[Value]) -> Value:
    """A syntax-level protocol method (obj[k], obj[k] = v, k in obj, len(obj), ...) of an
    object made during capture: its class's own, in Python, run; a dict subclass's inherited
    one acts on its items."""
    method = attributes.class_lookup(value.cls, name)
    if isinstance(method, types.FunctionType):
        return call_code(session, method, [value, *args])
    if attributes.mapping_method(value, name):
        return container_methods.dict_method(session, value.mapping, name, args, {})
    raise Unsupported(f"{name} of {value.describe()}")


# -- builtins ------------------------------------------------------------------------------
# Builtins and math functions that are pure: run at capture time on known arguments.
_PURE = {abs, min, max, round, divmod, pow, sum, all, any, sorted, len, repr, str, int, float,
         bool, complex, hash, chr, ord, format, bin, hex, oct, callable}


def _numpy_pure(function: Any) -> bool:
    """A numpy ufunc (np.lcm, np.sqrt) or scalar type (np.float32, np.int64): pure, run at
    capture time on known numbers."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and (isinstance(function, numpy.ufunc) or (
        isinstance(function, type) and issubclass(function, (numpy.bool_, numpy.number))))


def _builtin_exception(function: Any) -> bool:
    """A builtin exception class (KeyError, ValueError): made at capture time, to be raised
    there (ember/capture/exception_opcodes.py)."""
    return isinstance(function, type) and issubclass(function, BaseException) and \
        function.__module__ == "builtins"


# Builtins that make text or a hash of a number: a symbolic size is specialized first.
_TEXT = {repr, str, hash, chr, format, bin, hex, oct, ascii}


def call_builtin(session: Session, function: Any, args: list[Value],
                 kwargs: dict[str, Value]) -> Value:
    special = _rule_for(function)
    if special is not None:
        return special(session, *args, **kwargs)
    outcome = numbers.predicate(session, function, args) if not kwargs else None
    if outcome is not None:
        return Const(outcome)
    module = getattr(function, "__module__", None)
    if function in _PURE or module in ("math", "_operator", "operator") or \
            getattr(function, "__self__", None) is math or _builtin_exception(function):
        if any(isinstance(a, TensorValue) for a in args):
            if module in ("_operator", "operator"):
                return session.builder.call("call_function", function, tuple(args), kwargs)
            raise Unsupported(f"{function.__name__}() of a tensor needs its value")
        values = [python_value(a) for a in args]
        keywords = {k: python_value(v) for k, v in kwargs.items()}
        if function in _TEXT and has_symbols(values):  # (str(s0) would say "s0")
            values = specialized(values, f"{function.__name__}() of it")
        try:
            try:
                return semantics.constant(function(*values, **keywords))
            except Exception:
                if not has_symbols([values, keywords]):
                    raise
                why = f"{getattr(function, '__name__', function)}() does not take it"
                return semantics.constant(function(*specialized(values, why),
                                                   **specialized(keywords, why)))
        except Exception as error:
            raise Raised(error, "eager raises this error here") from None
    if function is builtins.print:
        raise Unsupported("print() inside the compiled function",
                          "print outside, or accept that this function runs eagerly")
    raise Unsupported(f"builtin {getattr(function, '__name__', function)}() is not supported")


# The per-callable rules (builtins, torch functions that are not graph operations) fill
# `call_rules`; they call back into this module.
from ember import stances  # noqa: E402
from ember.api import graph_break, graph_break_rule  # noqa: E402  (ember/api.py: the API)
from ember.capture import (  # noqa: E402,F401
    builtin_rules,
    copy_rules,
    covariance_rules,
    itertools_rules,
    mapping_rules,
    markers,
    module_calls,
    operator_rules,
    torch_rules,
    vmap_rules,
)

call_rules[graph_break] = graph_break_rule
stances.register_capture_rules(call_rules)
