"""Arguments by name and back: a compiled function's call binds its arguments into a dict
keyed by parameter name (what guards and runners read), and calls the function itself from
such a dict where it runs eagerly. Both are generated Python, so the binding happens in C."""

from __future__ import annotations

import builtins
import inspect
import types
from collections.abc import Callable
from typing import Any


def positional_names(function: types.FunctionType) -> list[str] | None:
    """A resume function's parameter names when some are not identifiers (pytest's rewritten
    asserts leave locals like `@py_assert1`): it is only ever called positionally."""
    code = function.__code__
    names = list(code.co_varnames[:code.co_argcount])
    if all(name.isidentifier() for name in names) or code.co_flags & (
            inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
        return None
    return names


def binder(function: types.FunctionType) -> Callable[..., dict[str, Any]]:
    """A function with `function`'s signature that returns its arguments by name: binding
    happens in C, as fast as a call."""
    names = positional_names(function)
    if names is not None:
        return lambda *args: dict(zip(names, args))
    signature = inspect.signature(function, follow_wrapped=False)
    namespace: dict[str, Any] = {}
    parameters = []
    for index, parameter in enumerate(signature.parameters.values()):
        text = parameter.name
        if parameter.default is not inspect.Parameter.empty:
            namespace[f"_default{index}"] = parameter.default
            text += f"=_default{index}"
        if parameter.kind is parameter.VAR_POSITIONAL:
            text = "*" + parameter.name
        elif parameter.kind is parameter.VAR_KEYWORD:
            text = "**" + parameter.name
        parameters.append((parameter.kind, text))
    rendered, star_done = [], False
    for kind, text in parameters:
        if kind is inspect.Parameter.KEYWORD_ONLY and not star_done:
            rendered.append("*")
            star_done = True
        if kind is inspect.Parameter.VAR_POSITIONAL:
            star_done = True
        rendered.append(text)
        if kind is inspect.Parameter.POSITIONAL_ONLY and (
                len(rendered) == len([p for p in parameters
                                      if p[0] is inspect.Parameter.POSITIONAL_ONLY])):
            rendered.append("/")
    names = ", ".join(f"{p.name!r}: {p.name}" for p in signature.parameters.values())
    text = f"def bind({', '.join(rendered)}):\n    return {{{names}}}\n"
    exec(builtins.compile(text, "<ember binder>", "exec"), namespace)  # noqa: S102 (our own code)
    return namespace["bind"]


def caller(function: types.FunctionType) -> Callable[[dict[str, Any]], Any]:
    """The inverse of the binder: call `function` with arguments bound by name."""
    names = positional_names(function)
    if names is not None:
        return lambda arguments: function(*[arguments[name] for name in names])
    parts = []
    for parameter in inspect.signature(function, follow_wrapped=False).parameters.values():
        name = f"L[{parameter.name!r}]"
        if parameter.kind is parameter.VAR_POSITIONAL:
            parts.append(f"*{name}")
        elif parameter.kind is parameter.VAR_KEYWORD:
            parts.append(f"**{name}")
        elif parameter.kind is parameter.KEYWORD_ONLY:
            parts.append(f"{parameter.name}={name}")
        else:
            parts.append(name)
    namespace = {"function": function}
    exec(builtins.compile(f"def call(L):\n    return function({', '.join(parts)})\n",  # noqa: S102
                 "<ember caller>", "exec"), namespace)
    return namespace["call"]
