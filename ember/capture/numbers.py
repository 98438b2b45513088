"""Numbers from outside the captured code (arguments, attributes, the .item() a resume
function takes): how they are guarded only as far as the code asks of them.

A number is wrapped as a PassedNumber (values.py): guarded on its value only once something
reads it. Before that:

- compared with a constant or another such number, or tested for truth or with
  math.isfinite/isnan/isinf, it is guarded on the outcome (`outcome`, `predicate`);
- in arithmetic with a CPU float or integer tensor it becomes a 0-d tensor input
  (`number_input`), so the graph takes the next call's number;
- in Python arithmetic with numbers it stays an expression of their sources (`arithmetic`), a
  running total or a counter that the code hands on;
- handed on unread, it is read again on each call (rebuild.py).

A loss value, a learning rate or a loop index then runs the same compiled code on every call
instead of compiling again until the recompile limit.

A numpy scalar (np.bool_, np.int64, np.float32, ...) is a constant instead: guarded on its
type and value, its Python arithmetic numpy's; an op of the graph takes it as the Python
number it holds (`plain_numbers`), where torch reads both alike.
"""

from __future__ import annotations

import math
import operator
import sys
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.sources import (
    ArithmeticSource,
    AttrSource,
    FormatSource,
    JoinSource,
    LocalSource,
    NumberTensorSource,
    Source,
)
from ember.capture.values import Const, PassedNumber, TensorValue, Value

if TYPE_CHECKING:
    from ember.capture.session import Session

_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}
# Python arithmetic of such numbers that stays an expression (`total += value`: "+=" is "+")
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


# arithmetic whose Python-number operand may as well be a 0-d tensor (the same type promotion)
SCALAR_OPERATORS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.pow,
                    operator.iadd, operator.isub, operator.imul, operator.itruediv}
# Tensor methods and torch functions whose positional numbers take a 0-d tensor as well
# (`e.mul_(decay)`, `torch.lerp(a, b, weight)`); an `alpha=` number is moved onto its
# operand (`add(y, alpha=d)` is `add(y * d)`), since alpha must be a Python number.
SCALAR_METHODS = {"add", "sub", "mul", "div", "lerp", "add_", "sub_", "mul_", "div_", "lerp_",
                  "true_divide", "multiply", "subtract", "true_divide_", "multiply_",
                  "subtract_"}


def is_numpy_scalar(value: Any) -> bool:
    """A numpy bool or number (np.bool_, np.int64, np.float32, np.complex64, ...)."""
    numpy = sys.modules.get("numpy")  # (numpy is not imported for programs that never use it)
    return numpy is not None and isinstance(value, (numpy.bool_, numpy.number))


def plain_numbers(tree: Any) -> Any:
    """`tree` (tuples, lists, dicts, slices of FX arguments) with each numpy scalar the
    Python number it holds: FX writes a graph's constants as Python literals, and ember's
    lowering knows Python numbers."""
    if is_numpy_scalar(tree):
        return tree.item()
    if isinstance(tree, (tuple, list)) and type(tree) in (tuple, list):
        return type(tree)(plain_numbers(item) for item in tree)
    if type(tree) is dict:
        return {key: plain_numbers(item) for key, item in tree.items()}
    if isinstance(tree, slice):
        return slice(*(plain_numbers(v) for v in (tree.start, tree.stop, tree.step)))
    return tree


def holds_numpy_scalars(tree: Any) -> bool:
    if isinstance(tree, (tuple, list)):
        return any(holds_numpy_scalars(item) for item in tree)
    if isinstance(tree, dict):
        return any(holds_numpy_scalars(item) for item in tree.values())
    if isinstance(tree, slice):
        return holds_numpy_scalars((tree.start, tree.stop, tree.step))
    return is_numpy_scalar(tree)


def passed(session: Session, value: Any, source: Source,
           leaves: dict[str, Any] | None = None) -> PassedNumber:
    """A number (or string) read through `source`, guarded equal to `value` once read. The
    ints it is made of (itself, or the numbers from outside `leaves` of arithmetic) are
    remembered as read: if one changes, automatic dynamic makes it a symbol where the next
    capture meets it (symbols.py) — `self.length += n` then `max(self.length - w, 0)` reads
    the sum, and the symbol is the attribute the sum is made of."""
    def read() -> None:
        session.guards.add("equals", source, value)
        for name, leaf in number.leaves.items():
            if type(leaf) is int:
                session.builder.shapes.policy.frame.read_int(name, leaf)

    number = PassedNumber(value, source, read, leaves)
    return number


def number_input(session: Session, value: Value, operands: tuple) -> Value:
    """A number from outside in arithmetic with a CPU tensor (`x * scale`, `x + step` in a
    loop that breaks): a 0-d tensor input read on each call, not a constant guarded on its
    value — the next call's number (the next iteration's, the next learning rate) runs the
    same graph. The 0-d tensor has the dtype eager computes in (the number is cast to it
    first, as eager casts it), so results and their dtypes are eager's."""
    if not (isinstance(value, PassedNumber) and value.unread and
            type(value._value) in (int, float) and from_the_call(value.source)):
        return value
    tensors = [a for a in operands if isinstance(a, TensorValue)]
    # (where a number cast to the op's dtype computes as eager's: CPU tensors of float32 or
    # float64 — float16/bfloat16 ops keep a number unrounded — and, for an int, integer and
    # bool tensors too)
    exact = (torch.float32, torch.float64) if type(value._value) is float else \
        (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
         torch.uint8, torch.bool)
    if not tensors or any(t.fake.device.type != "cpu" or t.fake.dtype not in exact
                          for t in tensors):
        return value
    kind = tensors[0].fake.dtype
    for tensor in tensors:
        kind = torch.promote_types(kind, tensor.fake.dtype)
    kind = torch.result_type(torch.empty((), dtype=kind), value._value)
    number = torch.tensor(value._value, dtype=kind)
    return session.builder.input_tensor(number, NumberTensorSource(value.source, kind))


def method_numbers(session: Session, name: str, operands: list[Value],
                   kwargs: dict[str, Value]) -> tuple[list[Value], dict[str, Value]]:
    """The operands and keywords of a tensor method or torch function `name` with numbers
    from the call as 0-d tensor inputs, as `number_input` makes them for operators."""
    if name not in SCALAR_METHODS:
        return operands, kwargs
    operands = [number_input(session, a, tuple(operands)) for a in operands]
    alpha = kwargs.get("alpha")
    if alpha is not None and len(operands) == 2:
        weight = number_input(session, alpha, tuple(operands))
        if weight is not alpha:  # (y * alpha, as eager's kernel computes alpha * y)
            kwargs = {k: v for k, v in kwargs.items() if k != "alpha"}
            scaled = session.builder.call("call_function", operator.mul,
                                          (operands[1], weight), {})
            operands = [operands[0], scaled]
    return operands, kwargs


def arithmetic(session: Session, symbol: str, left: Value, right: Value) -> Value | None:
    """`total + loss.item()`, `n + 1`, `0.9 * avg + 0.1 * value` where a number from outside
    is not yet read: a number that is this expression of their sources, computed again on
    each call where the code hands it on (a loop-carried total, a running average), and
    guarded on its value only once something reads it. None where this does not apply."""
    operator_ = symbol.removesuffix("=")
    if operator_ not in _ARITHMETIC:
        return None
    sides = (left, right)
    if not any(isinstance(v, PassedNumber) and v.unread for v in sides):
        return None
    if not all((isinstance(v, PassedNumber) and v.unread) or
               (type(v) is Const and type(v.value) in (int, float)) for v in sides):
        return None
    values = [v._value if isinstance(v, PassedNumber) else v.value for v in sides]
    try:
        result = _ARITHMETIC[operator_](*values)
    except Exception:  # noqa: BLE001 (ZeroDivisionError...: computed the usual way instead)
        return None
    if type(result) not in (int, float):
        return None
    operands = tuple(v.source if isinstance(v, PassedNumber) else v.value for v in sides)
    source = ArithmeticSource(operator_, *operands)
    session.guards.add("type", source, type(result))
    leaves = {name: leaf for v in sides if isinstance(v, PassedNumber)
              for name, leaf in v.leaves.items()}
    return passed(session, result, source, leaves)


# tests of a number whose outcome alone is guarded (`if not math.isfinite(loss):`)
PREDICATES = {"isfinite": math.isfinite, "isnan": math.isnan, "isinf": math.isinf}


def predicate(session: Session, function: Any, args: list[Value]) -> bool | None:
    """math.isfinite/isnan/isinf of a number from outside: its outcome, guarded as one."""
    form = getattr(function, "__name__", "")
    if len(args) != 1 or PREDICATES.get(form) is not function:
        return None
    return outcome(session, form, args[0], None)


def outcome(session: Session, form: str, left: Value, right: Value | None) -> bool | None:
    """A number from outside compared with a constant (`loss > 10`), or its truth: the
    outcome, guarded as an outcome (the number may change as long as the answer does not),
    not as the number's value. None where this does not apply."""
    mine = [v for v in (left, right) if isinstance(v, PassedNumber) and v.unread]
    if not mine:
        return None
    number = mine[0]
    other = right if number is left else left
    if len(mine) == 2:  # (two numbers from outside: `loss > best`)
        other_value, guarded_other = other._value, other.source
    elif other is None or (type(other) is Const and type(other.value) in (int, float, bool)):
        other_value = guarded_other = None if other is None else other.value
    else:
        return None
    value = number._value  # (read without the equality guard)
    if form == "bool":
        answer = bool(value)
    elif form in PREDICATES:
        answer = PREDICATES[form](value)
    else:
        a, b = (value, other_value) if number is left else (other_value, value)
        answer = _COMPARE[form](a, b)
    session.guards.add("outcome", number.source,
                       (form, guarded_other, number is left, answer))
    return answer


def from_the_call(source: Any) -> bool:
    """Does the number come from what the call was given (an argument, an item of one, the
    stack of a resume function, arithmetic of those)? Attributes and globals (a module's
    `self.scale`, a constant) change rarely: they stay constants, guarded on their value,
    instead of an input made on every call."""
    if isinstance(source, ArithmeticSource):
        return all(from_the_call(side) for side in (source.left, source.right)
                   if not isinstance(side, (int, float)))
    while source is not None and not isinstance(source, LocalSource):
        if isinstance(source, AttrSource):
            return False
        source = getattr(source, "base", None)
    return source is not None


def reached_from_the_call(source: Any) -> bool:
    """Is the number read from what the call was given, through attributes too (a cache
    object's `cumulative_length`, a counter on an object passed in)? Such an int becomes a
    symbol once it has changed between captures (automatic dynamic); one that never changes
    stays a constant, as `from_the_call`'s attributes do."""
    if isinstance(source, ArithmeticSource):
        return all(reached_from_the_call(side) for side in (source.left, source.right)
                   if not isinstance(side, (int, float)))
    while source is not None and not isinstance(source, LocalSource):
        source = getattr(source, "base", None)
    return source is not None


def formatted(session: Session, value: Value, conversion: int, spec: str) -> Value | None:
    """f"{loss:.4f}" of a number from outside not yet read: the string, as an expression
    formatted again on each call (printed at a break, logged), not a constant guarded on the
    number. None where this does not apply."""
    if not (isinstance(value, PassedNumber) and value.unread):
        return None
    real = value._value
    real = {0: real, 1: str(real), 2: repr(real), 3: ascii(real)}[conversion]
    text = format(real, spec)
    return passed(session, text, FormatSource(value.source, conversion, spec))


def joined(session: Session, parts: list[Value]) -> Value | None:
    """An f-string's pieces joined, where one is a formatted number not yet read."""
    if not any(isinstance(p, PassedNumber) and p.unread for p in parts) or \
            not all((isinstance(p, PassedNumber) and p.unread and type(p._value) is str) or
                    (type(p) is Const and type(p.value) is str) for p in parts):
        return None
    text = "".join(p._value if isinstance(p, PassedNumber) else p.value for p in parts)
    return passed(session, text, JoinSource(tuple(
        p.source if isinstance(p, PassedNumber) else p.value for p in parts)))
