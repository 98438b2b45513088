"""With-blocks in captured code: grad-mode and inference-mode switches, autocast regions,
torch's backend switches (runtime/switches.py), threading locks (their side effects replayed
under the lock) and context managers written in Python (their __enter__ run as code, their
__exit__ where the block ends)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from ember import torch_internals
from ember.capture.errors import Unsupported
from ember.capture.semantics import is_enum_member, is_known, python_method, python_value
from ember.capture.sources import AttrSource
from ember.capture.values import (
    AutocastValue,
    Const,
    DictValue,
    FunctionValue,
    GeneratorContextValue,
    GradModeValue,
    LockContextValue,
    NewObjectValue,
    NullContextValue,
    ObjectValue,
    SwitchValue,
    Value,
    ValueMethodValue,
    of_torch,
)
from ember.runtime import switches

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


def enter_context(session: Session, manager: Value) -> tuple[Value, Value]:
    if isinstance(manager, GradModeValue):
        if manager.previous is None:  # torch.set_grad_enabled(b) already switched and saved
            manager.previous = session.grad_enabled
        set_grad_mode(session, manager.enabled)
        session.builder.inference_depth += manager.inference
        return ValueMethodValue(manager, "__exit__"), Const(None)
    if isinstance(manager, NullContextValue):
        return ValueMethodValue(manager, "__exit__"), Const(None)
    if isinstance(manager, AutocastValue):
        enter_autocast(session, manager)
        return ValueMethodValue(manager, "__exit__"), manager
    if isinstance(manager, SwitchValue):
        return ValueMethodValue(manager, "__exit__"), enter_switch(session, manager)
    if isinstance(manager, GeneratorContextValue):
        return enter_generator_context(session, manager)
    if type(manager) is ObjectValue and isinstance(manager.value, torch.autocast):
        # (an autocast object made outside: `@torch.autocast(...)` on a function, whose
        # wrapper enters the decorator's object on every call)
        region = AutocastValue(torch_internals.autocast_arguments(manager.value))
        return enter_context(session, region)
    cls = manager.cls if isinstance(manager, NewObjectValue) else \
        type(manager.value) if type(manager) is ObjectValue else None
    if type(manager) is ObjectValue and torch_internals.is_thread_lock(manager.value):
        return enter_lock(session, manager)
    if type(manager) is ObjectValue and torch_internals.is_compiler_config_patch(manager.value):
        # (a patch of torch's compiler configuration — an exported program's input checks
        # run under one — changes nothing eager computes)
        return enter_context(session, NullContextValue(cls))
    if cls is not None and _user_context_manager(cls):
        # a context manager written in Python (a timer, a flag it sets and clears): its
        # __enter__ runs as code now, its __exit__ where the block ends
        from ember.capture.attributes import get_attribute
        from ember.capture.calls import call_value

        exit_ = get_attribute(session, manager, "__exit__")
        entered = call_value(session, get_attribute(session, manager, "__enter__"), [], {})
        session.open_contexts.append(exit_)
        return exit_, entered
    raise Unsupported(f"with-block on {manager.describe()}",
                      "only torch.no_grad(), torch.enable_grad() and "
                      "torch.set_grad_enabled() blocks are captured")


def enter_lock(session: Session, lock: ObjectValue) -> tuple[Value, Value]:
    """`with lock:` over a threading.Lock or RLock. The capture runs in one thread, and the
    graph computes nothing another thread can see: what must be done under the lock is what
    outlives the call, the side effects, replayed after the graph. So the replay takes the
    lock around the effects the block made (where it made none, it is not taken at all, as
    Dynamo treats such locks). No break inside the block: the native part would run outside
    the lock, and the resumed code would release a lock it never took."""
    context = LockContextValue(lock)
    context.acquire = session.side_effects.call(type(lock.value).acquire, [lock])
    exit_ = ValueMethodValue(context, "__exit__")
    session.open_contexts.append(exit_)
    return exit_, Const(True)


def exit_lock(session: Session, context: LockContextValue) -> None:
    if not session.side_effects.drop_last(context.acquire):
        session.side_effects.call(type(context.lock.value).release, [context.lock])


def exit_grad_mode(session: Session, mode: GradModeValue) -> None:
    """Leaving a grad-mode block (or an inference_mode one) entered by enter_context."""
    set_grad_mode(session, mode.previous)
    session.builder.inference_depth -= mode.inference


def enter_autocast(session: Session, region: AutocastValue) -> None:
    """A node that enters the region, and the real region while capture runs inside it."""
    enter, _ = torch_internals.autocast_region_functions()
    if region.node is not None:
        raise Unsupported("an autocast region entered twice")
    region.node = session.builder.graph.call_function(enter, region.arguments)
    region.real = enter(*region.arguments)
    session.entered_regions.append(region)


def exit_autocast(session: Session, region: AutocastValue) -> None:
    _, leave = torch_internals.autocast_region_functions()
    if not session.entered_regions or session.entered_regions[-1] is not region:
        raise Unsupported("autocast regions left out of order")
    session.builder.graph.call_function(leave, (region.node,))
    session.entered_regions.pop()
    leave(region.real)


def generator_context(session: Session, callee: Value, args: list[Value],
                      kwargs: dict[str, Value], frame: Frame | None
                      ) -> GeneratorContextValue | None:
    """A call of a `@contextlib.contextmanager` function (not one of torch's): its manager,
    whose generator is made now and run when the with-block enters and leaves; None for
    any other call."""
    function = getattr(callee, "value", None)
    if not isinstance(function, types.FunctionType) or \
            function.__code__ is not _CONTEXTMANAGER_CODE or of_torch(function.__module__):
        return None
    wrapped = getattr(function, "__wrapped__", None)
    if not isinstance(wrapped, types.FunctionType):
        return None
    from ember.capture.inlining import inline_function

    source = AttrSource(callee.source, "__wrapped__") if callee.source is not None else None
    generator = inline_function(session, FunctionValue(wrapped, source), args, kwargs, frame,
                                lazy=True)
    return GeneratorContextValue(function, list(args), dict(kwargs), generator)


def enter_generator_context(session: Session, manager: GeneratorContextValue
                            ) -> tuple[Value, Value]:
    """Run the manager's generator to its first yield (what `as` binds); the body runs while
    it is suspended there, inside whatever its own with-blocks entered."""
    from ember.capture.inlining import resume

    if manager.entered:
        raise Unsupported(f"{manager.describe()} entered twice")
    entered = resume(session, manager.generator, Const(None))
    if manager.generator.frame.finished:
        raise Unsupported(f"{manager.generator.name}() did not yield",
                          "eager raises RuntimeError here")
    manager.entered = True
    exit_ = ValueMethodValue(manager, "__exit__")
    session.open_contexts.append(exit_)
    return exit_, entered


def exit_generator_context(session: Session, manager: GeneratorContextValue) -> Value:
    """Run the manager's generator on to its end (the block left without an exception)."""
    from ember.capture.inlining import resume

    resume(session, manager.generator, Const(None))
    if not manager.generator.frame.finished:
        raise Unsupported(f"{manager.generator.name}() did not stop",
                          "eager raises RuntimeError here")
    return Const(False)


@contextlib.contextmanager
def _probe() -> Iterator[None]:
    yield


# the code of every function @contextlib.contextmanager makes (its `helper`)
_CONTEXTMANAGER_CODE = _probe.__code__


def backend_switch(session: Session, callee: Value, args: list[Value],
                   kwargs: dict[str, Value]) -> SwitchValue | None:
    """A call that makes one of torch's backend switches from Python values (flags, kernel
    choices): the switch, kept to be entered by a with-block; None for any other call."""
    function = getattr(callee, "value", None)
    if not switches.is_switch_factory(function):
        return None
    values = []
    for argument in (*args, *kwargs.values()):
        if not is_known(argument) or not _plain(python_value(argument)):
            return None
        values.append(python_value(argument))
    return SwitchValue(switches.Switch(function, tuple(values[:len(args)]),
                                       dict(zip(kwargs, values[len(args):]))))


def _plain(value: object) -> bool:
    """A flag, a number, a name, an enum member or a list or tuple of them."""
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str)) or is_enum_member(value)


def enter_switch(session: Session, value: SwitchValue) -> Value:
    """A node that enters the switch, and the switch entered for real while capture runs
    inside it; what the with-block's `as` binds."""
    if value.node is not None:
        raise Unsupported(f"{value.describe()} entered twice")
    value.node = session.builder.graph.call_function(value.switch, ())
    value.real = value.switch()
    session.entered_regions.append(value)
    bound = switches.bound(value.real)
    if type(bound) is dict and not bound:  # (sdpa_kernel's: a new empty dict each time)
        return DictValue({})
    if not _plain(bound):
        raise Unsupported(f"{value.describe()} gives its block a {type(bound).__name__}")
    return Const(bound)


def exit_switch(session: Session, value: SwitchValue) -> None:
    if not session.entered_regions or session.entered_regions[-1] is not value:
        raise Unsupported("backend switches left out of order")
    session.builder.graph.call_function(switches.leave, (value.node,))
    session.entered_regions.pop()
    switches.leave(value.real)


def leave_for_real(region: AutocastValue | SwitchValue) -> None:
    """Leave a region the capture entered for real and the code did not leave (a break,
    a rollback)."""
    if isinstance(region, SwitchValue):
        switches.leave(region.real)
    else:
        torch_internals.autocast_region_functions()[1](region.real)


def set_grad_mode(session: Session, enabled: bool) -> None:
    if session.grad_enabled != enabled:
        session.builder.graph.call_function(torch_internals.set_grad_enabled, (enabled,))
        session.grad_enabled = enabled


def _user_context_manager(cls: type) -> bool:
    """A context manager class whose __enter__ and __exit__ are Python code of the user's
    (contextlib's generator-based ones would run their generator to its end at once; torch's
    own switch global state)."""
    module = getattr(cls, "__module__", "") or ""
    return python_method(cls, "__enter__") and python_method(cls, "__exit__") and \
        module != "contextlib" and not of_torch(module)
