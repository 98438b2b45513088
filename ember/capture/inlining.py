"""Inlining: a Python function the captured code calls, interpreted in a new frame.

Takes a function defined outside the captured code (a FunctionValue) or one made while
capturing (a NestedFunctionValue) and tracked arguments; binds them as Python binds a call and
runs the function's bytecode in an interpreter frame; gives its tracked result (a generator's
items, run to the end). It decides nothing about what to inline: calls.py does.
"""

from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any

import torch.utils._contextlib

from ember.capture.errors import Unsupported
from ember.capture.semantics import RealCell
from ember.capture.sources import AttrSource, ItemSource
from ember.capture.values import (
    DictValue,
    FunctionValue,
    GeneratorValue,
    IteratorValue,
    NestedFunctionValue,
    SequenceValue,
    Value,
    of_torch,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session

# Inlined calls nest at most this deep (recursion in the user's code).
MAX_INLINE_DEPTH = 48


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
               parent: Frame | None, lazy: bool = False) -> Value:
    from ember.capture.interpreter import Frame

    if lazy:  # (a generator run as it is driven: resume())
        if not code.co_flags & inspect.CO_GENERATOR:
            raise Unsupported(f"{name} is not a generator function")
        session.inlined_codes.append(code)
        frame = Frame(session, code, globals_, bound, cells, name, parent, generator=True)
        frame.lazy = True
        return GeneratorValue(frame, name)
    if session.inline_depth >= MAX_INLINE_DEPTH:
        raise Unsupported("calls nest too deep (recursion?)", "recursion is not captured")
    # A generator expression is consumed where it is made (sum(x for x in xs)), so running
    # it to the end at once keeps eager's order of effects. A generator function's run to
    # the end is kept only when it changed nothing (`for layer in self.blocks(): ...`): with
    # effects, its laziness could reorder them.
    expression = code.co_name == "<genexpr>"
    generator = expression or bool(code.co_flags & inspect.CO_GENERATOR)
    before = session.side_effects.mark()
    session.inline_depth += 1
    session.inlined_codes.append(code)
    try:
        frame = Frame(session, code, globals_, bound, cells, name, parent, generator=generator)
        result = frame.run()
    finally:
        session.inline_depth -= 1
    if generator and not expression and session.side_effects.changed_outside(*before):
        raise Unsupported(f"the generator {name} changes state while it runs",
                          "its laziness could reorder those changes; make it a function "
                          "that returns a list")
    return IteratorValue(frame.yielded, returned=result) if generator else result


def resume(session: Session, generator: GeneratorValue, sent: Value) -> Value:
    """Run a lazy generator on to its next yield (its value) or its end (its return value;
    the frame `finished`), `sent` the value of the yield it stopped at."""
    frame = generator.frame
    if frame.finished:
        raise Unsupported(f"{generator.describe()} has already finished")
    if generator.started:
        frame.push(sent)
    generator.started = True
    if session.inline_depth >= MAX_INLINE_DEPTH:
        raise Unsupported("calls nest too deep (recursion?)", "recursion is not captured")
    session.inline_depth += 1
    try:
        return frame.run()
    finally:
        session.inline_depth -= 1


def inline_function(session: Session, callee: FunctionValue, args: list[Value],
                    kwargs: dict[str, Value], parent: Frame | None, lazy: bool = False
                    ) -> Value:
    """The call's result; `lazy`: a generator function's generator, run as it is driven."""
    function = callee.value
    source = callee.source
    if getattr(function, "__wrapped__", None) is not None and \
            of_torch(function.__module__) and \
            function.__code__.co_filename != torch.utils._contextlib.__file__:
        # (a wrapper of torch's own other than its context-manager decorators', whose
        # `with ctx(): return func(...)` is captured as a with-block: `@torch.no_grad()` on
        # spectral norm's power method)
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
                      parent, lazy)


def inline_nested(session: Session, callee: NestedFunctionValue, args: list[Value],
                  kwargs: dict[str, Value], parent: Frame | None) -> Value:
    code = callee.code
    bound = bind_arguments(code, callee.name, callee.defaults, callee.kwdefaults, args, kwargs)
    cells = dict(zip(code.co_freevars, callee.closure))
    return _run_frame(session, code, callee.globals, bound, cells, callee.name, parent)
