"""A custom torch.autograd.Function's `apply`, met while capturing.

Takes the call's tracked arguments — tensors, constants and None, modules and functions (known
by identity), lists, tuples and dicts of them, objects the captured code made — and gives its
result, one of two ways:

- traced: where autograd records nothing (grad mode off, or no tensor argument requires
  grad), apply is the forward run under no_grad: the forward is inlined with a stand-in ctx,
  so its operations join the graph and its Python effects are captured as any code's. Where
  the forward cannot be captured, what it did is rolled back and the call is made the other
  way.
- one call: a node whose target (capture/applier.py) runs the real Function — its forward,
  and through autograd its own backward, which reaches the parameters of the modules it was
  given as eager's does. The arguments are made again on each call from a template made
  here; what the forward adds to the lists, dicts and objects it was given comes back as
  extra results, and the capture sees it there. A forward that writes a tensor it did not
  make, or reads a tensor's value, runs outside the graph.

This module never traces a backward: ember's autodiff does not differentiate a Function.
"""

from __future__ import annotations

import collections
import functools
import inspect
import types
from typing import TYPE_CHECKING, Any

import torch

from ember import logs, torch_internals
from ember.capture import contexts, semantics
from ember.capture.applier import AutogradFunctionApply, Changes, Literal, Made, Operand, Tag
from ember.capture.errors import Raised, Unsupported
from ember.capture.sources import AttrSource
from ember.capture.symbols import SYMBOLIC
from ember.capture.values import (
    BoundMethodValue,
    BuiltinValue,
    Const,
    DictValue,
    FunctionValue,
    IdentityConst,
    ModuleValue,
    NewObjectValue,
    ObjectValue,
    PartialValue,
    PythonModuleValue,
    SequenceValue,
    TensorValue,
    TorchValue,
    Value,
)
from ember.trees import leaves

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


def call_apply(session: Session, function_class: Value, args: list[Value],
               kwargs: dict[str, Value], frame: Frame | None) -> Value:
    """`function_class.apply(*args, **kwargs)` (function_class: the tracked class, guarded
    where it was read)."""
    if not _recorded(session, args, kwargs):
        traced = _traced(session, function_class, args, kwargs, frame)
        if traced is not None:
            return traced
    return _one_call(session, function_class.value, args, kwargs)


def _recorded(session: Session, args: list[Value], kwargs: dict[str, Value]) -> bool:
    """Does autograd record the call? As eager's apply decides: grad mode is on and one of
    its own tensor arguments (not one inside a container) requires grad."""
    return session.grad_enabled and any(isinstance(v, TensorValue) and v.fake.requires_grad
                                        for v in (*args, *kwargs.values()))


# -- traced: the forward inlined ----------------------------------------------------------------
class TracedContext(torch.autograd.function.FunctionCtx):
    """The ctx a traced forward gets. Its backward never runs (autograd records nothing), so
    its methods only keep what they are given, under FunctionCtx's own names; its
    needs_input_grad is all False, as eager's is then."""

    def save_for_backward(self, *tensors: Any) -> None:
        self.to_save = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        self.saved_for_forward = tensors

    def mark_dirty(self, *tensors: Any) -> None:
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


def _traced(session: Session, function_class: Value, args: list[Value],
            kwargs: dict[str, Value], frame: Frame | None) -> Value | None:
    """The forward inlined under no_grad, or None (nothing changed) where it cannot be."""
    from ember.capture.calls import call_value

    cls = function_class.value
    forward = getattr(cls, "forward", None)
    if not isinstance(forward, types.FunctionType):
        return None

    def member(name: str) -> Value:
        source = AttrSource(function_class.source, name) if function_class.source else None
        return session.wrap(getattr(cls, name), source)

    point = session.savepoint()
    try:
        contexts.set_grad_mode(session, False)
        try:
            split = cls.setup_context is not torch.autograd.Function.setup_context
            if split:  # (forward without ctx, then setup_context: apply binds the defaults)
                try:
                    bound = inspect.signature(forward).bind(*args, **kwargs)
                except TypeError as error:
                    raise Unsupported(f"TypeError: {error}") from None
                bound.apply_defaults()
                args = [a if isinstance(a, Value) else session.wrap(a, None, guard=False)
                        for a in bound.args]
                kwargs = dict(bound.kwargs)
            # (one flag per argument, keywords too, as eager's apply counts them)
            flags = [Const(False)] * (len(args) + len(kwargs))
            ctx = NewObjectValue(TracedContext,
                                 attributes={"needs_input_grad": SequenceValue(flags, tuple)})
            if split:
                output = call_value(session, member("forward"), args, kwargs, frame)
                call_value(session, member("setup_context"),
                           [ctx, SequenceValue(list(args), tuple), output], {}, frame)
            else:
                output = call_value(session, member("forward"), [ctx, *args], kwargs, frame)
        finally:
            contexts.set_grad_mode(session, point.grad_enabled)
    except Raised:
        raise  # (the forward raises, as eager's apply does then)
    except Unsupported as error:
        session.roll_back(point)
        logs.channel("graph_breaks").info("%s.apply: its forward is not traced (%s); tried as "
                                          "one call instead", cls.__qualname__, error.reason)
        return None
    inputs = [v for v in (*args, *kwargs.values()) if isinstance(v, TensorValue)]
    dirty = ctx.attributes.get("dirty_tensors")
    dirty = dirty.items if isinstance(dirty, SequenceValue) else []
    return _as_apply_returns(session, output, inputs, dirty)


def _as_apply_returns(session: Session, output: Value, inputs: list[TensorValue],
                      dirty: list[Value]) -> Value:
    """What apply gives back of its forward's result where autograd records nothing: an
    input returned as it is comes back as a view of it (eager's apply makes one), unless the
    forward marked it dirty."""
    from ember.capture.calls import call_tensor_method

    def fresh(value: Value) -> Value:
        if not isinstance(value, TensorValue) or \
                not any(value.node is i.node for i in inputs) or \
                any(isinstance(d, TensorValue) and value.node is d.node for d in dirty):
            return value
        return call_tensor_method(session, value, "view_as", [value], {})

    if isinstance(output, SequenceValue) and output.kind is tuple:
        return SequenceValue([fresh(item) for item in output.items], tuple)
    return fresh(output)


# -- one call: the real Function --------------------------------------------------------------
class _Template:
    """Apply's arguments as the node makes them: its operands (tracked tensors and symbolic
    sizes), the objects it holds, the containers it makes."""

    def __init__(self, name: str):
        self.name = name
        self.operands: list[Value] = []
        self.mutables: list[Made] = []        # in number order
        self.mutable_values: list[Value] = []  # the tracked value each one stands for
        self.held: list[Any] = []              # objects known by identity, passed as they are
        self.held_values: list[Value] = []
        self._memo: dict[int, Any] = {}

    def add(self, value: Value) -> Any:
        found = self._memo.get(id(value))
        if found is _UNDER_WAY:
            raise Unsupported(f"{self.name}.apply takes a tuple that holds itself")
        if found is not None:
            return found
        self._memo[id(value)] = _UNDER_WAY
        node = self._memo[id(value)] = self._node(value)
        return node

    def _node(self, value: Value) -> Any:
        if isinstance(value, TensorValue) or \
                (isinstance(value, Const) and isinstance(value.value, SYMBOLIC)):
            for index, known in enumerate(self.operands):
                if known is value or (isinstance(known, TensorValue) and
                                      isinstance(value, TensorValue) and
                                      known.node is value.node):
                    return Operand(index)
            self.operands.append(value)
            return Operand(len(self.operands) - 1)
        if isinstance(value, IdentityConst):
            raise Unsupported(f"{self.name}.apply takes what id() answered while capturing")
        if isinstance(value, Const):
            return Literal(value.value)  # (a number from outside is guarded as it is read)
        if isinstance(value, SequenceValue):
            if value.kind is list:
                return self._mutable("list", list, value, lambda: [
                    self.add(item) for item in value.items])
            if value.kind in (tuple, torch.Size) or semantics.is_namedtuple(value.kind):
                return Made("sequence", value.kind, [self.add(item) for item in value.items])
        if isinstance(value, DictValue) and value.kind in (dict, collections.OrderedDict):
            return self._mutable("dict", value.kind, value, lambda: {
                key: self.add(item) for key, item in value.items.items()})
        if isinstance(value, NewObjectValue) and value.mapping is None and \
                value.cls.__dictoffset__ and not any(
                    isinstance(inspect.getattr_static(value.cls, name, None),
                               types.MemberDescriptorType) for name in value.attributes):
            return self._mutable("object", value.cls, value, lambda: {
                name: self.add(item) for name, item in value.attributes.items()})
        if isinstance(value, BoundMethodValue):
            return Made("method", types.MethodType,
                         [self.add(value.function), self.add(value.receiver)])
        if isinstance(value, PartialValue):
            return Made("partial", functools.partial,
                         [self.add(value.function), [self.add(a) for a in value.args],
                          {k: self.add(v) for k, v in value.keywords.items()}])
        if _known_by_identity(value):
            self.held.append(value.value)
            self.held_values.append(value)
            return Literal(value.value)
        raise Unsupported(f"{self.name}.apply takes {value.describe()}, which ember cannot "
                          f"pass to one call of the Function: the call runs outside the graph")

    def _mutable(self, form: str, kind: Any, value: Value, parts: Any) -> Made:
        node = Made(form, kind, None, len(self.mutables))
        self._memo[id(value)] = node  # (before its parts: a list may hold itself)
        self.mutables.append(node)
        self.mutable_values.append(value)
        node.parts = parts()
        return node


_UNDER_WAY = object()


def _known_by_identity(value: Value) -> bool:
    """A tracked object the capture knows by identity — a module, a function defined outside
    the captured code, a Python module, a class, a builtin or torch function: the node may
    hold it, as the capture would call it. (Any other object from outside is known only by
    its type: the next call may bring another.)"""
    if isinstance(value, (ModuleValue, FunctionValue, TorchValue, BuiltinValue,
                          PythonModuleValue)):
        return True
    return type(value) is ObjectValue and isinstance(value.value, type)


def _one_call(session: Session, function_class: type, args: list[Value],
              kwargs: dict[str, Value]) -> Value:
    name = function_class.__qualname__
    if _marks_dirty(function_class):
        raise Unsupported(f"{name}.apply writes its input in place (ctx.mark_dirty): it runs "
                          f"outside the graph")
    template = _Template(name)
    arguments = [template.add(a) for a in args]
    keywords = {k: template.add(v) for k, v in kwargs.items()}
    applier = AutogradFunctionApply(function_class, arguments, keywords, template.mutables,
                                    template.held)
    result = session.builder.call("call_function", applier, tuple(template.operands), {},
                                  refuse=_returns_an_input_view, run=applier.run_watched)
    if applier.changes is None:
        return result
    return _take_changes(session, template, applier.changes, result)


def _take_changes(session: Session, template: _Template, changes: Changes,
                  returned: Value) -> Value:
    """The call's result, from the node's (its result's tensors, then the new tensors of the
    mutable arguments), and those arguments' tracked values changed as the forward changed
    them."""
    items = returned.items
    count = 1 if changes.result is None else sum(changes.result)
    results, new = items[:count], items[count:]
    if changes.result is None:
        result: Value = results[0]
    else:
        given = iter(results)
        result = SequenceValue([next(given) if present else Const(None)
                                for present in changes.result], tuple)

    def value_of(description: tuple) -> Value:
        tag, part = description
        if tag is Tag.OPERAND:
            return template.operands[part]
        if tag is Tag.RESULT:
            return results[part]
        if tag is Tag.NEW:
            return new[part]
        if tag is Tag.MADE:
            return template.mutable_values[part]
        if tag is Tag.HELD:
            return template.held_values[part]
        if tag is Tag.CONSTANT:
            return Const(part)
        if tag in (dict, collections.OrderedDict):
            return DictValue({key: value_of(item) for key, item in part}, tag)
        return SequenceValue([value_of(item) for item in part], tag)

    for number in changes.changed:
        value, contents = template.mutable_values[number], changes.state[number]
        session.side_effects.changed(value)  # (before: a break undoes the change)
        if isinstance(value, SequenceValue):
            value.items[:] = [value_of(item) for item in contents]
            session.side_effects.mutated(value)
        elif isinstance(value, DictValue):
            value.items.clear()
            value.items.update((key, value_of(item)) for key, item in contents)
            session.side_effects.mutated(value)
        else:
            value.attributes.clear()
            value.attributes.update((key, value_of(item)) for key, item in contents)
    return result


def _returns_an_input_view(example: Any, operands: list) -> str | None:
    """A Function whose result views its input (gradient reversal's `x.view_as(x)`) cannot be
    one call: a graph's library result may not share an operand's memory."""
    inputs = {torch_internals.storage_identity(t) for t in operands
              if isinstance(t, torch.Tensor)}
    results = leaves(example)
    if any(isinstance(t, torch.Tensor) and torch_internals.storage_identity(t) in inputs
           for t in results):
        return "a custom autograd.Function returns a view of its input: it runs outside " \
            "the graph"
    return None


def _marks_dirty(function_class: type) -> bool:
    """Does the Function's forward write an input in place, as autograd asks it to say
    (ctx.mark_dirty)? One call in the graph would not show the write to what follows."""
    forward = inspect.getattr_static(function_class, "forward", None)
    forward = getattr(forward, "__func__", forward)
    code = getattr(forward, "__code__", None)
    return code is None or "mark_dirty" in code.co_names
