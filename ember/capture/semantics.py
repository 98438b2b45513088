"""Python semantics on tracked values: constants, attributes, operators, items, truth,
iteration, cells and globals. Operations on tensors become graph nodes; operations on known
Python values run at capture time; the rest is `Unsupported` with a reason.
"""

from __future__ import annotations

import collections
import enum
import operator
import sys
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import numbers
from ember.capture.errors import Unsupported
from ember.capture.outside_values import OutsideIteratorValue
from ember.capture.sources import (
    AttrSource,
    CallSource,
    EntrySource,
    GlobalSource,
    ItemSource,
    Source,
)
from ember.capture.symbols import has_symbols, specialized
from ember.capture.values import (
    NULL,
    BoundMethodValue,
    BuiltinValue,
    CellValue,
    Const,
    DictValue,
    EndlessIteratorValue,
    FunctionValue,
    IteratorValue,
    ModuleValue,
    NestedFunctionValue,
    NewObjectValue,
    ObjectValue,
    PassedNumber,
    RangeValue,
    SequenceValue,
    SetValue,
    SliceValue,
    TensorMethodValue,
    TensorValue,
    TorchValue,
    Value,
    ValueMethodValue,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


def protocol(session: Session, value: NewObjectValue, name: str, *args: Value) -> Value:
    """obj[k], k in obj, len(obj), ... of an object made during capture (calls.py's rule)."""
    from ember.capture.calls import new_object_protocol

    return new_object_protocol(session, value, name, list(args))

VERSION = sys.version_info[:2]

BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "@=": operator.imatmul, "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
    "<<=": operator.ilshift, ">>=": operator.irshift,
}
COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
           ">": operator.gt, ">=": operator.ge}
UNARY = {"-": operator.neg, "+": operator.pos, "~": operator.invert, "not": operator.not_}


# -- constants and Python values -----------------------------------------------------------
def constant(value: Any) -> Value:
    """A tracked value for a Python value computed at capture time."""
    if type(value) in (tuple, list):
        return SequenceValue([constant(v) for v in value], type(value))
    if type(value) in (set, frozenset):
        return SetValue([constant(v) for v in value])
    if type(value) is dict:
        return DictValue({k: constant(v) for k, v in value.items()})
    return Const(value)


def is_enum_member(value: object) -> bool:
    """A member of an enum: Python's, or one of a C++ extension's (pybind11's, as torch's
    SDPBackend)."""
    return isinstance(value, enum.Enum) or type(type(value)).__name__ == "pybind11_type" and \
        isinstance(getattr(value, "name", None), str) and hasattr(type(value), "__members__")


def python_value(value: Value) -> Any:
    """The exact Python object a value stands for, when it is fully known."""
    if isinstance(value, Const):
        return value.value
    if isinstance(value, SequenceValue):
        items = [python_value(v) for v in value.items]
        if value.kind is torch.Size:
            return torch.Size(items)
        return items if value.kind is list else tuple(items)
    if isinstance(value, SliceValue):
        return slice(python_value(value.start), python_value(value.stop),
                     python_value(value.step))
    if isinstance(value, RangeValue):
        return value.range
    if isinstance(value, DictValue):
        return {k: python_value(v) for k, v in value.items.items()}
    if isinstance(value, SetValue):
        return {python_value(v) for v in value.items}
    if isinstance(value, ObjectValue):
        return value.value
    if isinstance(value, TensorValue):
        raise Unsupported("a tensor is used where Python needs its value (e.g. as a number, "
                          "a bool, or in print)",
                          "this needs the tensor's data: keep it outside the compiled "
                          "function, or use tensor operations (torch.where) instead")
    raise Unsupported(f"{value.describe()} is used where its Python value is needed")


def is_known(value: Value) -> bool:
    try:
        python_value(value)
        return True
    except Unsupported:
        return False


def key_of(value: Value) -> Any:
    key = python_value(value)
    try:
        hash(key)
    except TypeError:
        raise Unsupported(f"unhashable dict key {key!r}") from None
    return key


def equal_constants(a: Value, b: Value) -> bool:
    return is_known(a) and is_known(b) and type(python_value(a)) is type(python_value(b)) \
        and python_value(a) == python_value(b)


def identical(a: Value, b: Value, session: Session | None = None) -> bool:
    """`a is b`. An object from outside whose identity decides is guarded on it (`v is
    _MISSING`, `mode is Mode.TRAIN`: the next call may pass another object)."""
    if a is b:
        return True
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        return isinstance(a, TensorValue) and isinstance(b, TensorValue) and a.node is b.node
    if isinstance(a, (Const, ObjectValue)) and isinstance(b, (Const, ObjectValue)):
        if type(python_value(a)) is not type(python_value(b)):
            # (objects of two types are never one: `cache is None` holds for any object of
            # the cache's type, so its type is guarded, not its identity — a decoding loop
            # passes a new cache each run)
            if session is not None:
                _guard_type(session, a, b)
            return False
        if session is not None:
            _guard_identity(session, a, b)
        return python_value(a) is python_value(b)
    return False


def _guard_type(session: Session, *values: Value) -> None:
    for value in values:
        if type(value) is ObjectValue and value.source is not None:
            session.guards.add("type", value.source, type(value.value))


def _guard_identity(session: Session, *values: Value) -> None:
    """Objects from outside whose identity decides an answer (`is`, an enum's ==): the
    answer holds for these objects alone."""
    for value in values:
        if type(value) is ObjectValue and value.source is not None:
            session.guards.add("id", value.source, value.value)


def is_namedtuple(cls: Any) -> bool:
    """A namedtuple class (collections' or typing's), its __new__ the generated one."""
    new = getattr(cls, "__new__", None)
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields") and \
        str(getattr(new, "__globals__", {}).get("__name__", "")).startswith("namedtuple_")


def field_names(kind: type) -> tuple[str, ...]:
    """Field names of a namedtuple or of a torch.return_types structseq, else ()."""
    return tuple(getattr(kind, "_fields", None) or getattr(kind, "__match_args__", ()) or ())


def plain_constant(value: Any) -> bool:
    """A value a graph may hold as a constant: a number, a string, None, a tuple of them."""
    if isinstance(value, tuple):
        return all(plain_constant(item) for item in value)
    return type(value) in (bool, int, float, str, bytes, type(None))


def is_none(value: Value) -> bool:
    return isinstance(value, Const) and value.value is None


def wrap_object(session: Session, value: Any, source: Source | None) -> Value:
    return session.wrap(value, source)


# -- cells and globals ---------------------------------------------------------------------
class RealCell:
    """A closure cell of a function defined outside the capture, and how to reach it."""

    def __init__(self, cell: types.CellType, source: Source | None):
        self.cell = cell
        self.source = source


def read_cell(frame: Frame, name: str) -> Value:
    cell = frame.cell(name)
    if isinstance(cell, CellValue):
        if cell.contents is None:
            raise Unsupported(f"free variable {name!r} is read before it is assigned")
        return cell.contents
    shadow = frame.session.side_effects.cells.get(id(cell.cell))
    if shadow is not None:
        return shadow
    try:
        contents = cell.cell.cell_contents
    except ValueError:
        raise Unsupported(f"free variable {name!r} is read before it is assigned") from None
    return frame.session.wrap(contents, cell.source)


def write_cell(frame: Frame, name: str, value: Value) -> None:
    cell = frame.cell(name)
    if isinstance(cell, CellValue):
        frame.session.side_effects.changed(cell)
        cell.contents = value
        return
    if cell.source is None:
        raise Unsupported(f"nonlocal {name!r} of a function ember cannot reach")
    frame.session.side_effects.set_cell(cell.cell, cell.source, value)


def load_global(frame: Frame, name: str) -> Value:
    session = frame.session
    globals_dict = frame.globals
    shadow = session.side_effects.globals.get((id(globals_dict), name))
    if shadow is not None:
        return shadow
    if name in globals_dict:
        index = session.globals_index(globals_dict)
        return session.wrap(globals_dict[name], GlobalSource(name, index))
    builtins_ = globals_dict.get("__builtins__", __builtins__)
    if isinstance(builtins_, types.ModuleType):
        builtins_ = vars(builtins_)
    if name in builtins_:
        return session.wrap(builtins_[name], None)
    raise Unsupported(f"name {name!r} is not defined", "eager raises NameError here")


def store_global(frame: Frame, name: str, value: Value) -> None:
    session = frame.session
    index = session.globals_index(frame.globals)
    session.side_effects.set_global(frame.globals, index, name, value)


# -- operators -----------------------------------------------------------------------------
def _tensor_call(session: Session, target: Any, *args: Value) -> Value:
    if target in numbers.SCALAR_OPERATORS:
        args = tuple(numbers.number_input(session, a, args) for a in args)
    return session.builder.call("call_function", target, args, {})


def binary(session: Session, symbol: str, left: Value, right: Value) -> Value:
    function = BINARY.get(symbol)
    if function is None:
        raise Unsupported(f"operator {symbol}")
    if isinstance(left, TensorValue) or isinstance(right, TensorValue):
        if symbol.endswith("=") and not isinstance(left, TensorValue):
            # (`total = 0; total += loss`: a number has no in-place operator, Python takes
            # the plain one and the tensor's reflected method)
            function = BINARY[symbol[:-1]]
        return _tensor_call(session, function, left, right)
    if isinstance(left, SequenceValue) and isinstance(right, SequenceValue) and \
            symbol in ("+", "+="):
        if symbol == "+=" and left.kind is list:
            session.side_effects.changed(left)  # (before: a break undoes the change)
            left.items.extend(right.items)
            session.side_effects.mutated(left)
            return left
        return SequenceValue(left.items + right.items, left.kind)
    if isinstance(left, SequenceValue) and symbol in ("*", "*=") and is_known(right):
        return SequenceValue(left.items * python_value(right), left.kind)
    if isinstance(left, DictValue) and isinstance(right, DictValue) and symbol in ("|", "|="):
        return DictValue({**left.items, **right.items})
    passed = numbers.arithmetic(session, symbol, left, right)
    if passed is not None:
        return passed
    if symbol.rstrip("=") in ("&", "|", "-", "^") and is_known(left) and is_known(right) and \
            any(getattr(v, "view", None) in ("keys", "items") for v in (left, right)):
        # (a dict's keys or items view with another iterable: a set, as the view's
        # operators answer)
        operands = [set(python_value(v)) if isinstance(v, SequenceValue) else python_value(v)
                    for v in (left, right)]
        return constant(BINARY[symbol.rstrip("=")](*operands))
    if is_known(left) and is_known(right):
        try:
            operands = _numpy_operands([python_value(left), python_value(right)], symbol)
            try:
                return constant(function(*operands))
            except Exception:
                if not has_symbols(operands):
                    raise
                return constant(function(*specialized(operands, f"operator {symbol}")))
        except Exception as error:
            raise Unsupported(f"{type(error).__name__}: {error}",
                              "eager raises this error here") from None
    raise Unsupported(f"operator {symbol} on {left.describe()} and {right.describe()}")


def _numpy_operands(operands: list[Any], symbol: str) -> list[Any]:
    """A numpy scalar with a symbolic size: the size's value (numpy computes on numbers, and
    its result's type — np.int64 + n is np.int64 — is no symbol's)."""
    if has_symbols(operands) and any(numbers.is_numpy_scalar(v) for v in operands):
        return specialized(operands, f"operator {symbol} with a numpy scalar")
    return operands


def unary(session: Session, symbol: str, value: Value) -> Value:
    if isinstance(value, TensorValue):
        if symbol == "not":
            truth(session, value)
        return _tensor_call(session, UNARY[symbol], value)
    if symbol == "not":
        return Const(not truth(session, value))
    return constant(UNARY[symbol](python_value(value)))


def compare(session: Session, symbol: str, left: Value, right: Value) -> Value:
    function = COMPARE.get(symbol)
    if function is None:
        raise Unsupported(f"comparison {symbol}")
    if isinstance(left, TensorValue) or isinstance(right, TensorValue):
        other = right if isinstance(left, TensorValue) else left
        if is_none(other) and symbol in ("==", "!="):
            return Const(symbol == "!=")
        return _tensor_call(session, function, left, right)
    outcome = numbers.outcome(session, symbol, left, right)
    if outcome is not None:
        return Const(outcome)
    if is_known(left) and is_known(right):
        _guard_identity(session, left, right)
        return Const(function(*_numpy_operands([python_value(left), python_value(right)],
                                                symbol)))
    if symbol in ("==", "!="):
        same = identical(left, right, session)
        return Const(same if symbol == "==" else not same)
    raise Unsupported(f"comparison {symbol} of {left.describe()} and {right.describe()}")


def contains(session: Session, container: Value, item: Value) -> bool:
    if isinstance(container, TensorValue) or isinstance(item, TensorValue):
        raise Unsupported("`in` on a tensor needs its values", "use (x == v).any() instead")
    if isinstance(container, DictValue):
        return container.read(key_of(item)) is not None
    if isinstance(container, NewObjectValue):
        return truth(session, protocol(session, container, "__contains__", item))
    if isinstance(container, (SequenceValue, SetValue)):
        return any(identical(item, v, session) or equal_constants(item, v) for v in container.items)
    if isinstance(container, ModuleValue):  # (`name in self.blocks`: guarded by its key)
        key = python_value(item)
        answer = key in container.value
        if type(key) in (str, int):
            session.guard_module_answer(container, operator.contains, (key,), answer,
                                        f"{key!r} in {container.describe()} changed from "
                                        f"{answer}")
        else:
            session.identity_reads.append(f"`in` of {container.describe()}")
        return answer
    return python_value(item) in python_value(container)


# -- truth and iteration -------------------------------------------------------------------
_UNIFORM = (torch.rand, torch.rand_like)  # (values in [0, 1))
_COMPARISONS = {operator.lt: "<", torch.lt: "<", operator.le: "<=", torch.le: "<=",
                operator.gt: ">", torch.gt: ">", operator.ge: ">=", torch.ge: ">="}


def _known_comparison(value: TensorValue) -> bool | None:
    """The truth of `torch.rand(()) < c` where it is the same whatever was drawn: a uniform
    draw lies in [0, 1), so `< 0.0` is never true (LayerDrop as transformers writes it,
    `if torch.rand([]) < self.layerdrop: continue`, with the layerdrop of 0 most models
    train with). The draw stays in the graph: the generator moves as in eager. None when
    the answer depends on the draw."""
    node = value.node
    sign = _COMPARISONS.get(node.target) if node.op == "call_function" else None
    if sign is None or len(node.args) != 2 or node.kwargs or value.fake.numel() != 1:
        return None
    drawn, bound = node.args
    if not isinstance(drawn, torch.fx.Node) or drawn.op != "call_function" or \
            drawn.target not in _UNIFORM or isinstance(bound, bool) or \
            not isinstance(bound, (int, float)) or bound != bound:
        return None
    value_of = drawn.meta.get("example_value")
    if getattr(value_of, "dtype", None) not in (torch.float32, torch.float64):
        return None  # (a half-precision draw may round up to 1.0)
    # x in [0, 1): each comparison's answer where it holds for every x
    if sign == "<":
        return True if bound >= 1 else False if bound <= 0 else None
    if sign == "<=":
        return True if bound >= 1 else False if bound < 0 else None
    if sign == ">":
        return True if bound < 0 else False if bound >= 1 else None
    return True if bound <= 0 else False if bound >= 1 else None  # (>=)

def truth(session: Session, value: Value) -> bool:
    if isinstance(value, TensorValue):
        known = _known_comparison(value)
        if known is not None:
            return known
        made = session.builder.known.number(value, bool)
        if made is not None:  # (a tensor made from constants alone: its truth)
            return made.value
        raise Unsupported("a branch depends on a tensor's value (data-dependent control flow)",
                          "use torch.where(cond, a, b) to keep both sides in the graph")
    if isinstance(value, (SequenceValue, SetValue)):
        return bool(value.items)
    if isinstance(value, DictValue):
        return bool(value.items)
    if isinstance(value, NewObjectValue):  # its own __bool__ or __len__, else dict's, else True
        for name in ("__bool__", "__len__"):
            if python_method(value.cls, name) or (value.mapping is not None and
                                                   name == "__len__"):
                return bool(python_value(protocol(session, value, name)))
        return True
    if isinstance(value, ModuleValue):  # (a container's truth is its length's)
        answer = bool(value.value)
        if any(hasattr(type(value.value), name) for name in ("__bool__", "__len__")):
            session.guard_module_answer(value, bool, (), answer,
                                        f"the truth of {value.describe()} changed from {answer}")
        return answer
    if isinstance(value, (ObjectValue, NestedFunctionValue, BoundMethodValue,
                          TensorMethodValue, ValueMethodValue)):
        if isinstance(value, ObjectValue) and type(value.value).__module__ != "builtins" and \
                any(hasattr(type(value.value), m) for m in ("__bool__", "__len__")):
            return _outside_truth(session, value)
        return True
    if value is NULL:
        return False
    if isinstance(value, PassedNumber) and value.unread:
        return numbers.outcome(session, "bool", value, None)
    return bool(python_value(value))




# views of a dict (an OrderedDict's are types of their own)
DICT_VIEWS = tuple({type(view) for mapping in ({}, collections.OrderedDict())
                    for view in (mapping.keys(), mapping.values(), mapping.items())})


def _outside_view(session: Session, view: ObjectValue) -> list[Value]:
    """The items of a dict's keys(), values() or items() view from outside (an argument, a
    local of a resumed frame, what `out.keys()` answers for a dict subclass's object known
    by type): as `list(view)` gives them, read through that on each call and guarded as a
    list from outside is — its length, then each key's value or each tensor's metadata."""
    listed = CallSource(session.constant_source(list), args=(view.source,),
                        label="the items of the view")
    return list(session.wrap(list(view.value), listed).items)


def unpack(session: Session, value: Value) -> list[Value]:
    if isinstance(value, (SequenceValue, SetValue)):
        return list(value.items)
    if isinstance(value, DictValue):
        return [constant(k) for k in value.items]
    if isinstance(value, NewObjectValue) and value.mapping is not None and \
            not python_method(value.cls, "__iter__"):
        return [constant(k) for k in value.mapping.items]
    if isinstance(value, IteratorValue):
        if isinstance(value, EndlessIteratorValue):
            raise Unsupported(f"{value.what} taken whole (it never ends: eager would not "
                              "return either)")
        if isinstance(value, OutsideIteratorValue):
            value.rest()
        items = value.items[value.position:]
        if items:
            session.side_effects.changed(value)
        value.position = len(value.items)
        return list(items)
    if isinstance(value, RangeValue):
        return [Const(i) for i in value.range]
    if isinstance(value, TensorValue):
        if value.fake.ndim == 0:
            raise Unsupported("iteration over a 0-d tensor")
        pieces = session.builder.call("call_method", "unbind", (value,), {})
        return list(pieces.items)
    if isinstance(value, ModuleValue):
        module = value.value
        if isinstance(module, torch.nn.ModuleDict):  # (its keys as they are: guarded)
            _guard_table_keys(session, value, "_modules")
            return [Const(k) for k in module.keys()]
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            return [session.wrap(m, source) for m, source in _module_entries(session, value)]
        if isinstance(module, (torch.nn.ParameterList,)):
            _guard_table_keys(session, value, "_parameters")
            return [session.wrap(p, ItemSource(value.source, i) if value.source else None)
                    for i, p in enumerate(module)]
        raise Unsupported(f"iteration over {type(module).__name__}")
    if isinstance(value, Const) and isinstance(value.value, (str, bytes, tuple, frozenset)):
        return [constant(v) for v in value.value]
    if isinstance(value, ObjectValue) and type(value.value) in DICT_VIEWS and \
            value.source is not None:
        return _outside_view(session, value)
    raise Unsupported(f"iteration over {value.describe()}")


def _outside_truth(session: Session, value: ObjectValue) -> bool:
    """The truth of an object from outside whose class answers it in Python (a KV cache's
    `__len__`: `if past_key_values and ...`): its method run as code, reading the object
    through its source (each read guarded)."""
    from ember.capture.calls import call_code

    cls = type(value.value)
    for name in ("__bool__", "__len__"):
        if not hasattr(cls, name):
            continue
        if value.source is None or not python_method(cls, name):
            break
        return bool(python_value(call_code(session, getattr(cls, name), [value])))
    raise Unsupported(f"truth of {value.describe()} runs its own __bool__/__len__")


def python_method(cls: type, name: str) -> bool:
    """Is `name`, looked up on `cls` as Python does, a function written in Python (not a
    builtin base's slot)?"""
    owner = next((klass for klass in cls.__mro__ if name in klass.__dict__), None)
    return owner is not None and isinstance(owner.__dict__[name], types.FunctionType)


def iterate(session: Session, value: Value) -> IteratorValue:
    if isinstance(value, IteratorValue):
        return value
    return IteratorValue(unpack(session, value))


def call(frame: Frame, callee: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    from ember.capture.calls import call_value

    return call_value(frame.session, callee, args, kwargs, frame)


__all__ = ["BuiltinValue", "FunctionValue", "TorchValue", "CellValue", "Source"]


def _guard_table_keys(session: Session, value: ModuleValue, table: str) -> None:
    """The keys (hence length and order) of one of a module's tables, as a walk over them
    read them now."""
    if value.source is None:
        session.identity_reads.append(f"the {table} of {value.describe()}")
        return
    session.guards.add("keys", AttrSource(value.source, table),
                       tuple(getattr(value.value, table).keys()))


def _module_entries(session: Session, value: ModuleValue) -> list[tuple[Any, Source | None]]:
    """The submodules of a ModuleList or Sequential, in order, with their sources: entries of
    its `_modules` dict, whose keys (hence length and order) a guard pins."""
    module = value.value
    if value.source is None:
        if getattr(value, "entry_sources", None) is not None:  # (a slice of a sourced one)
            return list(zip(module, value.entry_sources))
        return [(m, None) for m in module]
    table = module._modules
    session.guards.add("keys", AttrSource(value.source, "_modules"), tuple(table.keys()))
    return [(m, EntrySource(value.source, "_modules", key)) for key, m in table.items()]


# Items (x[k], x[k] = v, del x[k]) live in their own module; they build on what is above.
from ember.capture.item_semantics import (  # noqa: E402,F401  (re-exported)
    delete_item,
    format_value,
    get_item,
    make_set,
    set_item,
)
