"""Rules for calling torch's functions that are not graph operations, by the real callable
(`call_rules`): grad modes, autocast, checkpoint, inference mode, warnings and logging calls,
inspect.signature, torch.is_grad_enabled and friends, and the is-compiling tests
(ember/capture/builtin_rules.py holds the builtins')."""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.checkpoint

from ember import torch_internals
from ember.capture import contexts
from ember.capture.builtin_rules import answered_now
from ember.capture.calls import call_rules, call_value, rule, when_dynamo_imported
from ember.capture.errors import Unsupported
from ember.capture.semantics import python_value, unpack
from ember.capture.sources import CallSource
from ember.capture.values import (
    AutocastValue,
    BoundMethodValue,
    Const,
    GradModeValue,
    NullContextValue,
    ObjectValue,
    SequenceValue,
    TensorValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


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
    contexts.set_grad_mode(session, enabled)
    value = GradModeValue(enabled, previous)
    return value


@rule(torch_internals.set_grad_enabled)
def _set_grad_enabled_now(session: Session, mode: Value, frame: Any = None, **_: Any) -> Value:
    """torch._C._set_grad_enabled(b) (what torch's own context managers call): the mode
    switches here, in the graph and, after it, for the caller."""
    contexts.set_grad_mode(session, bool(python_value(mode)))
    return Const(None)


@rule(torch.utils.checkpoint.checkpoint)
def _checkpoint(session: Session, function: Value, *args: Value, frame: Any = None,
                use_reentrant: Value | None = None, preserve_rng_state: Value | None = None,
                determinism_check: Value | None = None, debug: Value | None = None,
                **kwargs: Value) -> Value:
    """Activation checkpointing: the function's values and gradients are those of calling it
    (what the backward keeps is ember's choice in a compiled graph), so it is inlined."""
    if "context_fn" in kwargs:
        raise Unsupported("checkpoint(context_fn=...)")
    return call_value(session, function, list(args), kwargs, frame)


def _region(device_type: str, dtype: Value | None, enabled: Value | None,
            cache_enabled: Value | None) -> AutocastValue:
    """torch.autocast's arguments, as Python values (enabled unless told otherwise)."""
    dtype, enabled, cache_enabled = (None if v is None else python_value(v)
                                     for v in (dtype, enabled, cache_enabled))
    return AutocastValue((device_type, dtype, True if enabled is None else enabled,
                          cache_enabled))


@rule(torch.autocast)
def _autocast(session: Session, device_type: Value, dtype: Value | None = None,
              enabled: Value | None = None, cache_enabled: Value | None = None,
              frame: Any = None, **_: Any) -> Value:
    return _region(python_value(device_type), dtype, enabled, cache_enabled)


def _device_autocast(device_type: str, default: torch.dtype) -> Callable[..., Value]:
    """torch.cuda.amp.autocast / torch.cpu.amp.autocast (deprecated spellings, still in use):
    their device's autocast, with its default dtype when none is given."""
    def rule_(session: Session, enabled: Value | None = None, dtype: Value | None = None,
              cache_enabled: Value | None = None, frame: Any = None, **_: Any) -> Value:
        return _region(device_type, dtype or Const(default), enabled, cache_enabled)
    return rule_


call_rules[torch.cuda.amp.autocast] = _device_autocast("cuda", torch.float16)
call_rules[torch.cpu.amp.autocast] = _device_autocast("cpu", torch.bfloat16)


@rule(warnings.warn)
def _warn(session: Session, message: Value, category: Value | None = None,
          stacklevel: Value | None = None, source: Value | None = None,
          frame: Frame | None = None, **_: Any) -> Value:
    """warnings.warn(...) in a forward: issued after the graph (in order with the other side
    effects) as eager issues it: from the line `stacklevel` frames up, through its module's
    registry, so the filters show it as often as eager's."""
    level = 1 if stacklevel is None else python_value(stacklevel)
    where = frame
    for _ in range(max(level, 1) - 1):
        where = where.parent if where is not None else None
    text = python_value(message)
    kind = UserWarning if category is None else python_value(category)
    if where is None or source is not None or not isinstance(level, int) or \
            not isinstance(text, (str, Warning)):
        raise Unsupported("warnings.warn() with a message or a place ember cannot give")
    session.side_effects.warn(where, text, kind)
    return Const(None)


def _emit_log_record(logger: logging.Logger, level: int, filename: str, line: int,
                     function: str, message: Any, args: tuple, extra: Any) -> None:
    """What Logger.info(...) and the others do, with the caller's place given (the record's
    pathname, lineno and funcName are the user's line, not ember's)."""
    if logger.isEnabledFor(level):
        logger.handle(logger.makeRecord(logger.name, level, filename, line, message, args,
                                        None, function, extra, None))


def _log_rule(level: int | None) -> Callable:
    def rule_(session: Session, logger: Value, *args: Value, frame: Frame | None = None,
              **kwargs: Value) -> Value:
        """logger.info(...) and the others in a forward: the record is made and handled after
        the graph (in order with the other side effects), as eager would at that line."""
        real = getattr(logger, "value", None)
        if not isinstance(real, logging.Logger) or frame is None or \
                set(kwargs) - {"extra"} or (level is None and not args):
            raise Unsupported("a logging call ember cannot replay (exc_info, stack_info, "
                              "stacklevel)")
        if level is None:
            found, *args = args
            found = python_value(found)
        else:
            found = level
        if not isinstance(found, int) or not args:
            raise Unsupported("a logging call ember cannot replay")
        if logger.source is not None:
            # a disabled call costs nothing: it is left out, on the guard that its level
            # stays disabled (enabling it compiles again)
            enabled = CallSource(logger.source, "isEnabledFor", (found,))
            session.guards.add("equals", enabled, real.isEnabledFor(found))
            if not real.isEnabledFor(found):
                return Const(None)
        message, *rest = args
        location = frame.location()
        extra = kwargs.get("extra", Const(None))
        session.side_effects.call(_emit_log_record, [
            ObjectValue(real, logger.source), Const(found), Const(location.filename),
            Const(location.line), Const(frame.code.co_name), message,
            SequenceValue(list(rest), tuple), extra])
        return Const(None)
    return rule_


for _name, _level in (("debug", logging.DEBUG), ("info", logging.INFO),
                      ("warning", logging.WARNING), ("warn", logging.WARNING),
                      ("error", logging.ERROR), ("critical", logging.CRITICAL),
                      ("fatal", logging.CRITICAL), ("log", None)):
    call_rules[getattr(logging.Logger, _name)] = _log_rule(_level)


@rule(torch.inference_mode)
def _inference_mode(session: Session, mode: Value | None = None, frame: Any = None,
                    **_: Any) -> Value:
    """torch.inference_mode() (a block or a decorator): grad mode off for what runs inside,
    as no_grad, and the graph runs under inference mode when its results are made inside
    (captured.runner_text); inference_mode(False): no change."""
    if mode is None or bool(python_value(mode)):
        return GradModeValue(False, inference=True)
    return NullContextValue(contextlib.nullcontext)


@rule(torch.autograd.profiler.record_function, contextlib.nullcontext)
def _null_context(session: Session, *args: Value, frame: Any = None, **_: Any) -> Value:
    return NullContextValue(torch.autograd.profiler.record_function if args
                            else contextlib.nullcontext)


@rule(inspect.signature)
def _signature(session: Session, value: Value, frame: Frame | None = None,
               **keywords: Value) -> Value:
    """inspect.signature of a function, a method bound to a tracked object, or an object
    known by identity: answered now (a Signature is immutable, and what it reads — code,
    defaults, the class — is what the call's own guards hold)."""
    options = {name: python_value(option) for name, option in keywords.items()}
    if isinstance(value, BoundMethodValue) and isinstance(value.function, ObjectValue):
        signature = inspect.signature(value.function.value, **options)
        parameters = list(signature.parameters.values())[1:]  # (self, as binding drops it)
        return Const(signature.replace(parameters=parameters))
    if isinstance(value, ObjectValue):
        return Const(inspect.signature(value.value, **options))
    raise Unsupported(f"inspect.signature of {value.describe()}")


@rule(torch.autograd.grad, torch.autograd.backward)
def _autograd_call(session: Session, *args: Value, frame: Any = None, **_: Any) -> Value:
    """A backward pass asked for inside: the graph breaks there (the graph's forward runs
    inside its own autograd node, so autograd cannot run through it), as at
    tensor.backward()."""
    raise Unsupported("torch.autograd.grad/backward runs outside the graph",
                      "expected in a training step or a gradient penalty")


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


answered_now(torch.device, torch.finfo, torch.iinfo, torch.promote_types, torch.result_type,
             torch.can_cast)

# (model code takes its compiler-friendly branches under ember as under torch.compile: the
# Dynamo spellings of the test answer as torch.compiler.is_compiling does)
def _answer(value: Any) -> Any:
    return lambda session, *a, frame=None, **k: Const(value)


for _function, _value in ((torch.jit.is_scripting, False), (torch.jit.is_tracing, False),
                          (torch.compiler.is_compiling, True),
                          (torch.compiler.is_dynamo_compiling, True)):
    call_rules[_function] = _answer(_value)


_DISPATCH_MODE_STACK = torch_internals.dispatch_mode_stack_function()


@rule(_DISPATCH_MODE_STACK)
def _dispatch_mode_stack(session: Session, *args: Value, frame: Any = None,
                         **kwargs: Value) -> Value:
    """The TorchDispatchModes active: none where a compiled function is called as code
    usually is, answered now and guarded to stay so (a mode active at a later call fails the
    guard; its recompile breaks here)."""
    if _DISPATCH_MODE_STACK():
        raise Unsupported("torch's dispatch-mode stack asked under an active mode")
    session.guards.add("equals", CallSource(session.constant_source(_DISPATCH_MODE_STACK)), [])
    return SequenceValue([], list)


when_dynamo_imported(lambda: call_rules.update(
    {f: _answer(True) for f in torch_internals.dynamo_compiling_tests()}))

