"""torch's markers for compilers, as libraries put them on their code, read during capture.

Takes a callee the captured code calls; gives what its marker asks for, or None when it
carries none: a torch.library custom op is one node calling its op (torch.ops.ns.name); a
torch.compiler.disable'd function breaks the graph at its call and runs natively, never
inlined; a torch.compiler.allow_in_graph'd function is one node calling it (the backend runs
it as an opaque call). A custom torch.autograd.Function's apply is found here and handed to
capture/autograd_functions.py. torch._dynamo's own marker functions get rules here too. This
module must not inline anything: what a marker keeps whole stays whole.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_internals
from ember.capture import autograd_functions
from ember.capture.calls import call_rules, call_torch, when_dynamo_imported
from ember.capture.errors import Unsupported
from ember.capture.semantics import python_value
from ember.capture.values import (
    BoundMethodValue,
    Const,
    FunctionValue,
    ModuleValue,
    ObjectValue,
    TensorValue,
    TorchValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


def call_marked(session: Session, callee: Value, args: list[Value], kwargs: dict[str, Value],
                frame: Frame | None = None) -> Value | None:
    """The call of a marked callee as its marker asks, or None (not marked: called as any
    other). The callee's identity is guarded where it was read, so the answer holds."""
    if isinstance(callee, BoundMethodValue):
        function_class = getattr(callee.receiver, "value", None)
        if isinstance(function_class, type) and \
                issubclass(function_class, torch.autograd.Function) and \
                getattr(callee.function, "value", None) is _FUNCTION_APPLY:
            return autograd_functions.call_apply(session, callee.receiver, args, kwargs, frame)
        return None
    constant = _constant_result(session, callee, args, kwargs)
    if constant is not None:
        return constant
    if not isinstance(callee, (FunctionValue, TorchValue, ModuleValue)):
        return None
    real = callee.value
    if isinstance(callee, TorchValue):
        op = torch_internals.custom_op_overload(real)
        if op is not None:  # (a CustomOpDef: a Python object that calls its op)
            return _call_custom_op(session, op, args, kwargs)
    reason = torch_internals.disabled_reason(real)
    if reason is not None:
        raise Unsupported(disabled_message(real, reason),
                          "expected (under fullgraph=True: call it outside the compiled "
                          "function, or remove the mark)")
    if isinstance(callee, FunctionValue) and torch_internals.allowed_in_graph(real):
        # NOTE: one node calling the function, which the backend runs as an opaque call
        # with real tensors, as eager does (its Python side effects too, on every call);
        # Inductor traces through it instead. Capture runs it once on fake tensors for its
        # results' metadata, as Dynamo does.
        return session.builder.call("call_function", real, tuple(args), kwargs)
    return None


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__
# what a function marked torch._dynamo.assume_constant_result may answer as a constant
_CONSTANT_RESULTS = (bool, int, float, str, type(None))


def _constant_result(session: Session, callee: Value, args: list[Value],
                     kwargs: dict[str, Value]) -> Value | None:
    """A function marked torch._dynamo.assume_constant_result (transformers' install probes,
    `is_torch_distributed_available`, under an lru_cache whose wrapper Dynamo steps past)
    called with constants: called now, its answer a constant of the graph, as Dynamo does.
    The callee's identity is guarded where it was read. None where this does not apply."""
    if not isinstance(callee, (FunctionValue, ObjectValue)):
        return None
    real = callee.value
    if not (getattr(real, "_dynamo_marked_constant", False) or getattr(
            getattr(real, "__wrapped__", None), "_dynamo_marked_constant", False)):
        return None
    operands = [*args, *kwargs.values()]
    if not all(type(a) is Const and isinstance(a.value, _CONSTANT_RESULTS) for a in operands):
        return None
    result = real(*[a.value for a in args], **{k: v.value for k, v in kwargs.items()})
    return Const(result) if isinstance(result, _CONSTANT_RESULTS) else None


def _call_custom_op(session: Session, op: Any, args: list[Value], kwargs: dict[str, Value]
                    ) -> Value:
    try:
        return call_torch(session, op, args, kwargs)
    except Unsupported as error:
        if "fake" not in error.reason:
            raise
        raise Unsupported(error.reason, "give the op a fake kernel (torch.library."
                          "register_fake): capture needs its results' shapes") from None


def frame_refusal(function: types.FunctionType) -> Unsupported | None:
    """Why a function ember.compile was asked to compile runs eagerly whatever it is given
    (it is torch.compiler.disable'd — a module's forward, say), or None."""
    reason = torch_internals.disabled_reason(function)
    if reason is None:
        return None
    return Unsupported(disabled_message(function, reason), "it runs eagerly on every call")


def disabled_message(function: Any, reason: str) -> str:
    if isinstance(function, torch.nn.Module):  # (torch.compiler.disable(module) wraps it)
        name = type(getattr(function, "_orig_mod", function)).__name__
    elif (getattr(function, "__module__", None) or "").split(".")[0] == "torch":
        name = f"{function.__module__}.{getattr(function, '__name__', function)}"
    else:
        name = getattr(function, "__qualname__", None) or type(function).__name__
        name = name.rpartition("<locals>.")[2]
    said = f" ({reason})" if reason else ""
    return f"{name} is marked torch.compiler.disable{said}: it runs natively, not compiled"


# -- torch._dynamo's own marker functions -----------------------------------------------------
def _rule(*names: str):
    def register(rule: Any) -> Any:
        def add() -> None:
            for name in names:
                found = torch_internals.dynamo_marker(name)
                if found is not None:
                    call_rules[found] = rule

        when_dynamo_imported(add)
        return rule

    return register


@_rule("graph_break")
def _graph_break(session: Session, *args: Value, frame: Any = None, **kwargs: Value) -> Value:
    raise Unsupported("torch._dynamo.graph_break() was called", "this break was asked for")


def _disable(session: Session, function: Value | None = None, *args: Value,
             frame: Any = None, **kwargs: Value) -> Value:
    """torch.compiler.disable(fn) inside the captured code: the real decorator applied to the
    real function (what a call of the result then breaks at)."""
    if function is None or args:
        raise Unsupported("torch.compiler.disable() without a function, inside the compiled "
                          "code", "decorate the function outside the compiled code")
    if isinstance(function, BoundMethodValue) and isinstance(function.function, ObjectValue) \
            and isinstance(function.receiver, ObjectValue):
        real = types.MethodType(function.function.value, function.receiver.value)
    elif isinstance(function, ObjectValue):
        real = function.value
    else:
        raise Unsupported(f"torch.compiler.disable of {function.describe()}",
                          "decorate a function defined outside the compiled code")
    options = {name: python_value(value) for name, value in kwargs.items()}
    return session.wrap(torch.compiler.disable(real, **options), None, guard=False)


call_rules[torch.compiler.disable] = _disable
_rule("disable")(_disable)


@_rule("mark_static_address")
def _mark_static_address(session: Session, tensor: Value, *args: Value, frame: Any = None,
                         **kwargs: Value) -> Value:
    """A hint for Dynamo's CUDA graphs (ember's check their inputs' addresses anyway): made on
    the real tensor after the graph, as eager makes it (it sets an attribute)."""
    if not isinstance(tensor, TensorValue):
        raise Unsupported("mark_static_address() of something other than a tensor",
                          "eager raises TypeError here")
    guard = [python_value(a) for a in args] + [python_value(v) for v in kwargs.values()]
    session.side_effects.call(torch_internals.dynamo_marker("mark_static_address"),
                              [tensor, *(Const(g) for g in guard)])
    return Const(None)


# (under ember, as under torch.compile, the code is compiling, not exporting)
if hasattr(torch.compiler, "is_exporting"):
    call_rules[torch.compiler.is_exporting] = lambda session, *a, frame=None, **k: Const(False)
