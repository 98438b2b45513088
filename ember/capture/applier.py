"""The target of a graph node that calls a custom torch.autograd.Function once.

Takes the node's operands (tensors, sizes) and a template of apply's arguments (what
capture/autograd_functions.py made of the tracked ones); gives apply's result, and, where the
capture saw the forward change the lists, dicts or objects it was given, the new tensors they
hold after it. The same object runs in the capture (on fakes, watched), the lowering, the
compiled code and its eager fallback. It knows no tracked values: only real objects.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import os
import traceback
import types
from typing import Any

import torch

from ember import torch_internals
from ember.capture import semantics
from ember.capture.errors import Unsupported
from ember.capture.symbols import SYMBOLIC
from ember.trees import leaves


@dataclasses.dataclass(frozen=True)
class Operand:
    """The node's operand `index` (a tensor or a symbolic size)."""

    index: int


@dataclasses.dataclass(frozen=True)
class Literal:
    """A constant, or an object known by identity (a module, a function): passed as is."""

    value: Any


@dataclasses.dataclass(eq=False)
class Made:
    """A container or object made anew on each call. form: "list", "dict", "object" (the
    mutable ones, numbered by `number`: their changes come back), "sequence" (a tuple, a
    named tuple, a torch.Size), "method" (parts: function, receiver), "partial" (parts:
    function, args, keywords)."""

    form: str
    kind: Any
    parts: Any = None
    number: int | None = None


def _build(node: Any, operands: tuple, made: dict[int, Any]) -> Any:
    """The argument `node` stands for, made of `operands`; `made`: the containers made so
    far, by node (one container reached twice is one object)."""
    if type(node) is Operand:
        return operands[node.index]
    if type(node) is Literal:
        return node.value
    if id(node) in made:
        return made[id(node)]
    if node.form == "list":
        value = made[id(node)] = []
        value.extend(_build(part, operands, made) for part in node.parts)
    elif node.form == "dict":
        value = made[id(node)] = node.kind()
        value.update((key, _build(part, operands, made)) for key, part in node.parts.items())
    elif node.form == "object":  # (as rebuild.py makes an object: no __init__)
        value = made[id(node)] = object.__new__(node.kind)
        value.__dict__.update((name, _build(part, operands, made))
                              for name, part in node.parts.items())
    elif node.form == "method":
        value = made[id(node)] = types.MethodType(*(_build(p, operands, made)
                                                    for p in node.parts))
    elif node.form == "partial":
        function, args, keywords = node.parts
        value = made[id(node)] = functools.partial(
            _build(function, operands, made), *(_build(a, operands, made) for a in args),
            **{k: _build(v, operands, made) for k, v in keywords.items()})
    else:
        items = [_build(part, operands, made) for part in node.parts]
        value = made[id(node)] = node.kind(*items) if semantics.is_namedtuple(node.kind) \
            else node.kind(items)
    return value


class Tag(enum.Enum):
    """How a description names a value: (tag, number) or (CONSTANT, the value)."""

    OPERAND = "operand"   # the node's operand i
    RESULT = "result"     # the result's tensor i
    NEW = "new"           # the k-th other tensor met
    MADE = "made"         # the j-th mutable argument
    HELD = "held"         # the k-th object the node holds
    CONSTANT = "constant"


# The state of the lists, dicts and objects apply was given, as a description that holds no
# object: (tag, number or value) as Tag says, and (type, parts) for a list, tuple or dict
# the forward made.
_CONSTANTS = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, *SYMBOLIC)


class _Indescribable(Exception):
    pass


def _describe(value: Any, known: dict[int, tuple], new: list[torch.Tensor],
              depth: int = 0) -> Any:
    found = known.get(id(value))
    if found is not None:
        return found
    if isinstance(value, torch.Tensor):
        new.append(value)
        found = known[id(value)] = (Tag.NEW, len(new) - 1)
        return found
    if isinstance(value, _CONSTANTS):
        return (Tag.CONSTANT, value)
    if depth > 50:
        raise _Indescribable("a container nested too deep")
    kind = type(value)
    if kind in (list, tuple, torch.Size) or semantics.is_namedtuple(kind):
        return (kind, tuple(_describe(item, known, new, depth + 1) for item in value))
    if kind in (dict, collections.OrderedDict) and \
            all(isinstance(key, (str, int, bool, type(None))) for key in value):
        return (kind, tuple((key, _describe(item, known, new, depth + 1))
                            for key, item in value.items()))
    raise _Indescribable(f"a {kind.__qualname__} object")


def _state(mutables: list[Any], forms: list[Made], known: dict[int, tuple],
           new: list[torch.Tensor]) -> tuple:
    """Each mutable argument's contents, described."""
    described = []
    for value, node in zip(mutables, forms):
        if node.form == "list":
            described.append(tuple(_describe(item, known, new) for item in value))
            continue
        contents = value if node.form == "dict" else vars(value)
        if not all(isinstance(key, (str, int, bool, type(None))) for key in contents):
            raise _Indescribable("a dict with other keys than numbers and strings")
        described.append(tuple((key, _describe(item, known, new))
                               for key, item in contents.items()))
    return tuple(described)


def _same(expected: Any, found: Any, loose: bool) -> bool:
    """Do two descriptions agree? `loose`: a symbolic size matches any number (a call's own
    size, where the capture's was a symbol, or the lowering's symbol)."""
    if isinstance(expected, tuple) and isinstance(found, tuple):
        if len(expected) == 2 and expected[0] is Tag.CONSTANT and found[:1] == (Tag.CONSTANT,):
            a, b = expected[1], found[1]
            if isinstance(a, SYMBOLIC) or isinstance(b, SYMBOLIC):
                return loose or a is b
            return type(a) is type(b) and (a == b or (a != a and b != b))
        return len(expected) == len(found) and \
            all(_same(a, b, loose) for a, b in zip(expected, found))
    if isinstance(expected, tuple) or isinstance(found, tuple):
        return False
    return expected == found


@dataclasses.dataclass(frozen=True)
class Changes:
    """What a call's forward did to the mutable arguments, as the capture saw it."""

    state: tuple                # every mutable argument's contents after the call
    changed: tuple[int, ...]    # the numbers of those that changed
    result: tuple | None        # where the result's tensors are: None (one tensor) or a
    #                             tuple of booleans (a tuple: a tensor or None each)
    new: int                    # how many new tensors the arguments hold after the call


class AutogradFunctionApply:
    """`SomeFunction.apply` as a graph node's target: makes the arguments from the node's
    operands, calls apply, and — where the capture saw the forward change the lists, dicts or
    objects it was given — returns the result's tensors followed by the new tensors those
    hold. (A callable of ember's: FX would write the bound method's own name as torch's
    `apply`.)"""

    one_call = True  # (lowering keeps it one library call: never traced into its forward)

    def __init__(self, function_class: type, args: list[Any], kwargs: dict[str, Any],
                 mutables: list[Made], held: list[Any]):
        self.function_class = function_class
        self.args = args            # apply's arguments as templates (Operand, Literal, Made)
        self.kwargs = kwargs
        self.mutables = mutables    # the mutable Made ones, in number order
        self.held = held            # the objects known by identity it passes as they are
        self.changes: Changes | None = None  # (settled by the capture's run, run_watched)
        self.__name__ = f"{function_class.__name__}_apply"
        self.__qualname__ = f"{function_class.__qualname__}.apply"

    def __call__(self, *operands: Any) -> Any:
        made: dict[int, Any] = {}
        args, kwargs = self._arguments(operands, made)
        result = self.function_class.apply(*args, **kwargs)
        if self.changes is None:
            return result
        known, tensors = self._known(operands, made, result)
        new: list[torch.Tensor] = []
        try:
            state = _state([made[id(node)] for node in self.mutables], self.mutables, known,
                           new)
        except _Indescribable as error:
            state = str(error)
        if not _same(self.changes.state, state, loose=True):
            raise RuntimeError(f"ember: {self.__qualname__} changed its arguments otherwise "
                               f"than while capturing (a list, dict or object it was given: "
                               f"ember took what it added as results of the graph)")
        return (*tensors, *new)

    def run_watched(self, *operands: Any) -> Any:
        """The capture's run (on fakes): refuses a forward that writes a tensor it did not
        make, and settles `changes`."""
        made: dict[int, Any] = {}
        self.changes = None
        args, kwargs = self._arguments(operands, made)
        mutables = [made[id(node)] for node in self.mutables]
        known, _ = self._known(operands, made, None)
        try:
            before = _state(mutables, self.mutables, known, [])
        except _Indescribable as error:
            raise Unsupported(f"{self.__qualname__} takes {error}") from None
        with _WriteWatch(self.__qualname__):
            try:
                result = self.function_class.apply(*args, **kwargs)
            except torch_internals.data_dependent_errors() as error:
                # (folding the operands into numbers, as builder.call would, would hand the
                # Function numbers where it takes tensors)
                name = self.function_class.__qualname__
                raise Unsupported(f"{name}'s forward reads a tensor's value{_where(error)}: "
                                  f"ember cannot know what one call of it returns without "
                                  f"running it", "the call runs outside the graph, as eager "
                                  "runs it") from None
        if not mutables:
            return result
        known, tensors = self._known(operands, made, result)
        new: list[torch.Tensor] = []
        try:
            after = _state(mutables, self.mutables, known, new)
        except _Indescribable as error:
            raise Unsupported(f"{self.__qualname__}'s forward leaves {error} in an argument, "
                              f"which ember cannot take back from one call") from None
        changed = tuple(j for j, (a, b) in enumerate(zip(before, after))
                        if not _same(a, b, loose=False))
        if not changed:
            return result
        if isinstance(result, torch.Tensor):
            form = None
        elif type(result) is tuple and all(isinstance(r, torch.Tensor) or r is None
                                           for r in result):
            form = tuple(r is not None for r in result)
        else:
            raise Unsupported(f"{self.__qualname__} returns a {type(result).__name__} and "
                              f"changes its arguments: ember cannot take both from one call")
        self.changes = Changes(after, changed, form, len(new))
        return (*tensors, *new)

    def _arguments(self, operands: tuple, made: dict[int, Any]) -> tuple[list, dict]:
        """Apply's arguments, made anew of the operands (the containers made: `made`)."""
        return ([_build(a, operands, made) for a in self.args],
                {k: _build(v, operands, made) for k, v in self.kwargs.items()})

    def _known(self, operands: tuple, made: dict[int, Any], result: Any
               ) -> tuple[dict[int, tuple], list[torch.Tensor]]:
        """How a description names what the call had before (its operands, its mutable
        arguments, the objects it holds) and the result's tensors (also returned)."""
        known: dict[int, tuple] = {}
        for k, held in enumerate(self.held):
            known[id(held)] = (Tag.HELD, k)
        for j, node in enumerate(self.mutables):
            known[id(made[id(node)])] = (Tag.MADE, j)
        for i, operand in enumerate(operands):
            if isinstance(operand, torch.Tensor):
                known.setdefault(id(operand), (Tag.OPERAND, i))
        tensors = [result] if isinstance(result, torch.Tensor) else \
            [r for r in result if isinstance(r, torch.Tensor)] if type(result) is tuple \
            else []
        for i, tensor in enumerate(tensors):
            known.setdefault(id(tensor), (Tag.RESULT, i))
        return known, tensors

    def __repr__(self) -> str:
        return self.__qualname__


class _WriteWatch(torch_internals.TorchDispatchMode):
    """Watches a Function's forward run on fakes: a write to a tensor it did not make (an
    argument, a module's buffer) is refused, since one call in the graph would hide the
    write from what the graph computes around it."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.made: set[int] = set()     # storages of the tensors the forward made
        self.kept: list[torch.Tensor] = []  # (alive while their storages are compared)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = torch_internals.schema_of(func)
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            written = args[position] if position < len(args) else kwargs.get(argument.name)
            for tensor in leaves(written):
                if isinstance(tensor, torch.Tensor) and _storage(tensor) not in self.made:
                    raise Unsupported(f"{self.name} writes a tensor its forward did not make "
                                      f"({func}): it runs outside the graph")
        inputs = {_storage(t) for t in leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        result = func(*args, **kwargs)
        for tensor in leaves(result):
            storage = _storage(tensor) if isinstance(tensor, torch.Tensor) else None
            if storage is not None and storage not in inputs:
                self.made.add(storage)
                self.kept.append(tensor)
        return result


def _where(error: BaseException) -> str:
    """ " at file:line in function" for the innermost frame of the user's (not torch's, not
    ember's) in the error's traceback, or ""."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith(_LIBRARY_FOLDERS)]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {frame.filename}:{frame.lineno} in {frame.name}"


_LIBRARY_FOLDERS = (os.path.dirname(torch.__file__) + os.sep,
                    os.path.dirname(os.path.dirname(__file__)) + os.sep)


def _storage(tensor: torch.Tensor) -> int | None:
    """The tensor's storage identity; None where it has none (a write to such a tensor is
    refused: nothing says the forward made it)."""
    try:
        return torch_internals.storage_identity(tensor)
    except (RuntimeError, NotImplementedError):
        return None
