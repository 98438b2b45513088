"""Capture a call: bind the real arguments, interpret the function's bytecode, and package
the result — the FX graph, the sources of its inputs, its guards, and generated code that
runs the compiled graph, replays side effects and rebuilds the return value.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any

import torch
import torch.fx

from ember.capture import opcodes  # noqa: F401  (registers the opcode handlers)
from ember.capture.errors import Unsupported
from ember.capture.guards import GuardSet
from ember.capture.interpreter import Frame
from ember.capture.semantics import RealCell
from ember.capture.session import Session
from ember.capture.side_effects import Effect
from ember.capture.sources import ClosureSource, LocalSource, Source
from ember.capture.values import (
    BoundMethodValue,
    Const,
    DictValue,
    IteratorValue,
    ObjectValue,
    RangeValue,
    SequenceValue,
    SetValue,
    SliceValue,
    TensorValue,
    Value,
)


@dataclasses.dataclass
class Captured:
    graph_module: torch.fx.GraphModule
    input_sources: list[Source]
    example_inputs: list[torch.Tensor]
    guards: GuardSet
    runner_source: str            # def run(L): ... (fetch, call `compiled`, effects, result)
    runner_namespace: dict[str, Any]
    scope: dict[str, Any]         # G, GG, C, K for guards and the runner
    op_count: int


def capture(function: types.FunctionType, arguments: dict[str, Any], fullgraph: bool
            ) -> tuple[Captured | None, Session, Unsupported | None]:
    """Interpret `function` on the bound `arguments` (name -> real value)."""
    session = Session(fullgraph)
    code = function.__code__
    locals_ = {name: session.wrap(value, LocalSource(name)) for name, value in arguments.items()}
    cells: dict[str, Any] = {}
    for index, (name, cell) in enumerate(zip(code.co_freevars, function.__closure__ or ())):
        cells[name] = RealCell(cell, ClosureSource(index, name))
    session.globals_index(function.__globals__)
    try:
        frame = Frame(session, code, function.__globals__, locals_, cells,
                      function.__qualname__)
        result = frame.run()
        captured = package(session, result)
    except Unsupported as error:
        return None, session, error
    return captured, session, None


class _Writer:
    """Python expressions that rebuild values after the graph ran."""

    def __init__(self):
        self.outputs: list[TensorValue] = []
        self.namespace: dict[str, Any] = {"torch": torch}

    def constant(self, value: Any) -> str:
        if value is None or isinstance(value, (bool, int, str)) or (
                isinstance(value, float) and value == value and abs(value) != float("inf")):
            return repr(value)
        name = f"k{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def expr(self, value: Value, prefer_source: bool = True) -> str:
        if isinstance(value, TensorValue):
            for index, known in enumerate(self.outputs):
                if known.node is value.node:
                    return f"outputs[{index}]"
            self.outputs.append(value)
            return f"outputs[{len(self.outputs) - 1}]"
        if prefer_source and value.source is not None and \
                isinstance(value, (SequenceValue, DictValue, ObjectValue)):
            return value.source.expr()
        if isinstance(value, Const):
            return self.constant(value.value)
        if isinstance(value, SequenceValue):
            items = ", ".join(self.expr(item) for item in value.items)
            if value.kind is list:
                return f"[{items}]"
            if value.kind is torch.Size:
                return f"torch.Size([{items}])"
            if value.kind is tuple:
                return f"({items}{',' if len(value.items) == 1 else ''})"
            if hasattr(value.kind, "_make"):  # a namedtuple
                return f"{self.constant(value.kind)}._make([{items}])"
            return f"{self.constant(value.kind)}(({items}{','if value.items else ''}))"
        if isinstance(value, DictValue):
            return "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in value.items.items()) + "}"
        if isinstance(value, SetValue):
            return "{" + ", ".join(self.expr(v) for v in value.items) + "}" if value.items \
                else "set()"
        if isinstance(value, SliceValue):
            return f"slice({self.expr(value.start)}, {self.expr(value.stop)}, " \
                   f"{self.expr(value.step)})"
        if isinstance(value, RangeValue):
            return repr(value.range)
        if isinstance(value, IteratorValue):
            items = ", ".join(self.expr(v) for v in value.items[value.position:])
            return f"iter([{items}])"
        if isinstance(value, ObjectValue):
            return self.constant(value.value)
        if isinstance(value, BoundMethodValue) and isinstance(value.receiver, ObjectValue) \
                and isinstance(value.function, ObjectValue):
            return f"{self.constant(value.function.value)}.__get__(" \
                   f"{self.expr(value.receiver)})"
        raise Unsupported(f"returning {value.describe()} from the compiled function")


def package(session: Session, result: Value) -> Captured:
    writer = _Writer()
    effect_lines = [_effect_line(effect, writer) for effect in session.side_effects.effects]
    if session.grad_enabled != session.initial_grad_enabled:
        # torch.set_grad_enabled(b) as a statement: the caller sees the new mode
        effect_lines.append(f"torch._C._set_grad_enabled({session.grad_enabled})")
    result_expr = writer.expr(result)
    builder = session.builder
    builder.output(writer.outputs)
    graph_module = builder.module()
    fetch = ", ".join(source.expr() for source in builder.input_sources)
    lines = [f"inputs = [{fetch}]", "outputs = compiled(*inputs)", *effect_lines,
             f"return {result_expr}"]
    text = "def run(L):\n" + "".join(f"    {line}\n" for line in lines)
    scope = {"GG": session.globals_dicts, "G": session.globals_dicts[0] if session.globals_dicts
             else {}, "K": session.constants}
    return Captured(graph_module, list(builder.input_sources), list(builder.input_values),
                    session.guards, text, writer.namespace, scope, builder.op_count)


def _effect_line(effect: Effect, writer: _Writer) -> str:
    if effect.kind == "setattr":
        return f"setattr({effect.target.expr()}, {effect.name!r}, {writer.expr(effect.value)})"
    if effect.kind == "setglobal":
        return f"GG[{effect.globals_index}][{effect.name!r}] = {writer.expr(effect.value)}"
    if effect.kind == "setcell":
        return f"{effect.target.expr()} = {writer.expr(effect.value)}"
    container = effect.value
    if isinstance(container, DictValue):
        items = writer.expr(container, prefer_source=False)
        target = effect.target.expr()
        return f"{target}.clear(); {target}.update({items})"
    return f"{effect.target.expr()}[:] = {writer.expr(container, prefer_source=False)}"


def bind(function: types.FunctionType, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    signature = inspect.signature(function)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
