"""One capture: the graph under construction, its guards and side effects, and the rules that
turn the program's real objects into tracked values (installing the guard each one needs).
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import inspect
import sys
import types
from typing import Any

import torch

from ember import torch_internals
from ember.capture import contexts, numbers
from ember.capture.builder import GraphBuilder
from ember.capture.errors import Unsupported
from ember.capture.guards import GuardSet
from ember.capture.outside_values import OutsideDictValue, OutsideIteratorValue, OutsideListValue
from ember.capture.side_effects import SideEffects
from ember.capture.sources import AttrSource, CallSource, ItemSource, Source
from ember.capture.symbols import Shapes
from ember.capture.values import (
    BuiltinValue,
    Const,
    DictValue,
    FunctionValue,
    ModuleValue,
    ObjectValue,
    PythonModuleValue,
    RangeValue,
    SequenceValue,
    SliceValue,
    TorchValue,
    Value,
    of_torch,
)

_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis),
            type(NotImplemented))
_TORCH_CONSTANTS = (torch.dtype, torch.device, torch.layout, torch.memory_format)
# iterators whose __reduce__ gives (iter, (sequence,), position)
_SEQUENCE_ITERATORS = (type(iter([])), type(iter(())), type(iter(range(0))))
# a dict from outside with more items than this is read item by item (guarded alone), not
# whole (its keys guarded)
LARGE_MAPPING = 256
# mappings from outside whose items are tracked (their own methods: calls.py)
_MAPPINGS = (dict, collections.OrderedDict, collections.Counter, collections.defaultdict)
# mutable objects from outside tracked as one value however many paths reach them
_SHARED = (list, set, *_MAPPINGS, *_SEQUENCE_ITERATORS)
# Attributes of these modules are taken as they are, unguarded: they do not change at run time.
_STABLE_MODULES = ("torch", "math", "operator", "builtins", "functools", "itertools",
                   "collections", "typing", "numbers", "warnings", "inspect")


def is_stable_module(module: types.ModuleType) -> bool:
    name = getattr(module, "__name__", "")
    return name.split(".")[0] in _STABLE_MODULES


def is_torch_callable(value: Any) -> bool:
    """Callables that become graph nodes: torch functions, Tensor methods, ops."""
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(value, "__module__", None) or ""
    if isinstance(value, type) or torch_internals.is_context_decorator(value):
        return False
    if isinstance(value, types.FunctionType) and of_torch(module) and \
            not _named_in_module(value):
        return False  # (a lambda or local function of torch's: Python code, not an op)
    if torch_internals.custom_op_overload(value) is not None:
        return True  # (a torch.library.custom_op: its op is one node, capture/markers.py)
    if not isinstance(value, types.BuiltinFunctionType) and \
            isinstance(inspect.getattr_static(type(value), "__call__", None),
                       types.FunctionType):
        return False  # (an object whose call is Python, as the jiterator's: inlined)
    if callable(value) and of_torch(module):
        # (torch's module code, its context-manager decorators, the optimizers' Python — an
        # LR scheduler's wrapper of optimizer.step among it — parametrizations' getters and
        # pytree's flattening and unflattening of containers, the associative scan's generic
        # form, the distributions' classes and their methods are Python to inline)
        return not module.startswith(("torch.nn.modules", "torch.utils._contextlib",
                                       "torch.distributions",
                                       "torch.autograd.grad_mode", "torch.optim",
                                       "torch.nn.utils.parametriz", "torch.utils._pytree",
                                       "torch.fx._pytree",
                                       "torch._higher_order_ops.associative_scan"))
    objclass = getattr(value, "__objclass__", None)
    return isinstance(objclass, type) and issubclass(objclass, torch._C.TensorBase)


def _named_in_module(function: types.FunctionType) -> bool:
    """Whether the function is what its module holds under its qualified name: only such a
    function can be a graph node, which the graph's code names by module and name."""
    value: Any = sys.modules.get(function.__module__)
    for part in function.__qualname__.split("."):
        value = getattr(value, part, None)
    return value is function


def _ember_compiled(value: Any, source: Source | None) -> tuple[Any, Source | None] | None:
    """What an ember-compiled (or torch.compile'd) module or function called inside compiled
    code stands for — the module, the function — and its source; None for anything else.
    (Traced as it is, the capture went through ember's own runtime, its guards and timers;
    or through Dynamo's, which then tried to compile ember's own code.)"""
    from ember import api, compiled_module
    from ember.capture.sources import AttrSource

    def under(name: str) -> Source | None:
        return AttrSource(source, name) if source is not None else None

    original = torch_internals.torch_compiled_original(value)
    if original is not None:
        if isinstance(value, torch.nn.Module):
            return original, under("_orig_mod")
        if isinstance(value, types.MethodType):
            return original, None
        return original, under("_torchdynamo_inline")

    if isinstance(value, compiled_module.CompiledModule) and value._wrapped is None:
        return value._orig_mod, under("_orig_mod")
    if isinstance(value, api.CompiledFunction):
        if value.bound_self is not None:
            return types.MethodType(value.function, value.bound_self), None
        return value.function, under("function")
    return None


def _plain_key(key: Any) -> bool:
    """A dict key the guards can write as a literal (a shape-keyed cache's tuples too)."""
    if type(key) is tuple:
        return all(_plain_key(k) for k in key)
    return type(key) in (str, int, bool, type(None))


def _kept_key(key: Any) -> bool:
    """Any other key but a tensor (a table of validators by type, typing.Union...): written
    as the entry's constant (K[i]) wherever a source or a guard names it."""
    return not isinstance(key, torch.Tensor)


class _KeyRef:
    """A dict key as a source writes it: `repr` gives the expression that reads it."""

    def __init__(self, expression: str):
        self.expression = expression

    def __repr__(self) -> str:
        return self.expression


@dataclasses.dataclass(frozen=True)
class Savepoint:
    effects: tuple[int, int]
    last_node: Any
    op_count: int
    grad_enabled: bool
    inference_depth: int
    contexts: int
    regions: int
    assumptions: int


class Session:
    def __init__(self, fullgraph: bool = False, shapes: Shapes | None = None,
                 assuming: bool = True, views_refused: frozenset = frozenset()):
        self.allow_breaks = not fullgraph
        self.guards = GuardSet()
        self.builder = GraphBuilder(self.guards, shapes)
        self.side_effects = SideEffects()
        self.fullgraph = fullgraph
        self.instructions_run = 0
        self.initial_grad_enabled = self.grad_enabled
        self.globals_dicts: list[dict] = []
        self.constants: list[Any] = []
        self._wrapped: dict[str, Value] = {}
        self._containers: dict[int, Value] = {}
        self._keep_alive: list[Any] = []
        self.inline_depth = 0
        self.inlined_codes: list[types.CodeType] = []  # (a warm start checks their files)
        # modules whose calls break the graph but whose forward ember compiles on its own
        # (a DDP's model, a module with hooks such as an FSDP-sharded block): the API layer
        # routes their calls to a compiled version
        self.compile_apart: list[torch.nn.Module] = []
        self.inlined_modules: list[torch.nn.Module] = []  # (see module_calls.call_module)
        self.inlined_dicts: list[dict] = []  # (their __dict__s)
        self.inlined_ids: set[int] = set()  # (of both lists' objects, which the lists keep)
        self.plain_guarded = False
        # answers read from a module that only its identity guard stands for (no guard of
        # their own restates them): a warm start cannot carry such a capture to a new
        # process, where the module is a new object (ember/warm_entries.py)
        self.identity_reads: list[str] = []
        # modules inlined with their hooks, and their hook tables' lengths and keys as the
        # capture found them (see calls._call_with_hooks)
        self.hooked_modules: list[torch.nn.Module] = []
        self.hook_tables: list[dict] = []
        self.hook_lengths: list[int] = []
        self.hook_keys: list[tuple] = []
        self.guards.add("global", None, ("grad_mode", self.grad_enabled))
        # called under torch.inference_mode(): what the graph makes are inference tensors
        inference = torch.is_inference_mode_enabled()
        self.guards.add("global", None, ("inference_mode", inference))
        self.builder.inference_depth = int(inference)
        self.guards.add("global", None, ("default_dtype", torch.get_default_dtype()))
        self.guards.add("global", None, ("autocast", torch_internals.autocast_state()))
        # autocast regions and backend switches entered by the captured code, innermost last
        self.entered_regions: list[Any] = []
        # the __exit__ of each Python context manager whose block the code is inside (no
        # break there: its __exit__ would not see an exception a native rerun raises)
        self.open_contexts: list[Any] = []
        # the exception an except block of the captured code handles (sys.exc_info()'s)
        self.handled_exception: BaseException | None = None
        # checks on tensors' values assumed to pass (condition, the truth that passes, where),
        # tested by the runner after the graph (branches.assume_it_passes); off when a
        # capture starts again without them (captured.AssumptionsRefused)
        self.assumptions: list[tuple[Any, bool, Any]] = []
        self.assuming = assuming
        # gathers standing for eager's select views (`x[i]`, i a 0-d integer tensor),
        # checked at the graph's end (scalar_indices.check); the subscripts (code, offset)
        # where an earlier capture found one told apart from the view: breaks this time
        self.copied_views: list[Any] = []
        self.views_refused = views_refused
        self.assumptions_refused = False

    @property
    def grad_enabled(self) -> bool:
        """The grad mode at this point of the captured code (what its fake results are made
        under, so their requires_grad and is_leaf answer as eager's would here)."""
        return self.builder.grad_enabled

    @grad_enabled.setter
    def grad_enabled(self, enabled: bool) -> None:
        self.builder.grad_enabled = enabled

    def globals_index(self, globals_dict: dict) -> int:
        for position, known in enumerate(self.globals_dicts):
            if known is globals_dict:
                return position
        self.globals_dicts.append(globals_dict)
        return len(self.globals_dicts) - 1

    def constant_source(self, value: Any) -> Source:
        """A source for an object with no path from the arguments: kept by the entry."""
        from ember.capture.sources import ConstantSource

        for position, known in enumerate(self.constants):
            if known is value:
                return ConstantSource(position)
        self.constants.append(value)
        return ConstantSource(len(self.constants) - 1)

    def savepoint(self) -> Savepoint:
        """The capture's state now, for roll_back: before an instruction of the root frame
        (a break undoes it: interpreter.graph_break), or inside one (a call tried one way —
        a custom Function's forward traced — that, where it fails, is made another way)."""
        return Savepoint(self.side_effects.savepoint(), self.builder.last_node(),
                         self.builder.op_count, self.grad_enabled, self.builder.inference_depth,
                         len(self.open_contexts), len(self.entered_regions),
                         len(self.assumptions))

    def roll_back(self, point: Savepoint) -> None:
        """Put the graph, the side effects and the modes back as they were at `point`.
        Guards added since stay: they only make the entry more specific."""
        self.side_effects.roll_back(point.effects)
        del self.open_contexts[point.contexts:]
        del self.assumptions[point.assumptions:]  # (their conditions' nodes are gone)
        while len(self.entered_regions) > point.regions:  # (entered for real)
            contexts.leave_for_real(self.entered_regions.pop())
        self.builder.rollback(point.last_node, point.op_count)
        self.grad_enabled = point.grad_enabled
        self.builder.inference_depth = point.inference_depth

    # -- real objects -> tracked values ---------------------------------------------------
    def wrap(self, value: Any, source: Source | None, guard: bool = True) -> Value:
        """The tracked value of a real object reached through `source` (guards installed)."""
        if source is not None:
            key = source.expr()
            if key in self._wrapped:
                return self._wrapped[key]
        if type(value) in _SHARED and id(value) in self._containers:
            # one list reached two ways: one tracked value, so a change through either path
            # is seen through both (and a guard that both still reach one object)
            known = self._containers[id(value)]
            if source is not None and known.source is not None:
                self.guards.add("same", source, known.source)
            return known
        result = self._wrap(value, source, guard and source is not None)
        if source is not None:
            self._wrapped[source.expr()] = result
        if type(value) in _SHARED:
            self._containers[id(value)] = result
            self._keep_alive.append(value)
        return result

    def guard_answer(self, function: Any, args: tuple, expected: Any, label: str,
                     kind: str = "equals") -> None:
        """Guard that `function(*args)` still answers `expected` (`is` it, for kind "id"):
        arguments that are sources are read as the guards read them. `label` says what
        changed when it fails."""
        from ember.capture.sources import CallSource

        self.guards.add(kind, CallSource(self.constant_source(function), args=args,
                                         label=label), expected)

    def guard_module_answer(self, module: Value, function: Any, args: tuple, answer: Any,
                            label: str) -> None:
        """Guard that `function(module, *args)` still answers `answer` (len, bool, `in` of
        an nn.Module container): read through the module's source; without one, the answer
        rests on the module's identity alone (`identity_reads`)."""
        if module.source is None:
            self.identity_reads.append(label)
            return
        self.guard_answer(function, (module.source, *args), answer, label)

    def tracked(self, obj: Any) -> Value | None:
        """The tracked value of a list, dict or set from outside, if the capture has one."""
        return self._containers.get(id(obj))

    def _wrap(self, value: Any, source: Source | None, guard: bool) -> Value:
        unwrapped = _ember_compiled(value, source)
        if unwrapped is not None:  # (a compiled model or function called inside: its code)
            return self.wrap(*unwrapped, guard)
        if isinstance(value, torch.Tensor):
            if source is None:
                source = self.constant_source(value)
            return self.builder.input_tensor(value, source)
        if type(value) in (int, float, str) and guard:
            from ember.capture.numbers import passed, reached_from_the_call

            self.guards.add("type", source, type(value))
            if type(value) is int and reached_from_the_call(source):
                symbol = self.builder.shapes.int_symbol(value, source)
                if symbol is not None:  # (a size that changed between calls: a symbol)
                    return Const(symbol, source)
            return passed(self, value, source)
        if isinstance(value, _SCALARS) or numbers.is_numpy_scalar(value):
            if guard:  # (the guard compares the type too: np.float64 is no float)
                self.guards.add("equals", source, value)
            return Const(value, source)
        if isinstance(value, _TORCH_CONSTANTS):
            if guard:
                self.guards.add("equals", source, value)
            return Const(value, source)
        if type(value) in (set, frozenset) and guard and \
                all(isinstance(item, _SCALARS) for item in value):
            # (`if i in self.skip`: its members, as they are now, guarded — a copy, since the
            # set itself may change)
            self.guards.add("equals", source, type(value)(value))
        if isinstance(value, torch.Size):
            if guard:
                self.guards.add("equals", source, value)
            return SequenceValue([Const(int(d)) for d in value], torch.Size, source)
        if type(value) is list and guard and source is not None:
            self.guards.add("type", source, list)

            def materialize() -> list[Value]:
                self.guards.add("length", source, len(value))
                return [self.wrap(item, ItemSource(source, i)) for i, item in enumerate(value)]

            return OutsideListValue(source, materialize)
        if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
            if guard:
                self.guards.add("type", source, type(value))
                self.guards.add("length", source, len(value))
            items = [self.wrap(item, ItemSource(source, i) if source else None, guard)
                     for i, item in enumerate(value)]
            return SequenceValue(items, type(value), source)
        if type(value) in (dict, collections.OrderedDict) and guard and source is not None \
                and len(value) > LARGE_MAPPING:
            return self._outside_dict(value, source)
        if type(value) in _MAPPINGS:
            return self._wrap_mapping(value, source, guard)
        if isinstance(value, range):
            if guard:
                self.guards.add("equals", source, value)
            return RangeValue(value, source)
        if isinstance(value, slice):
            return SliceValue(Const(value.start), Const(value.stop), Const(value.step), source)
        if isinstance(value, types.BuiltinMethodType) and \
                isinstance(value.__self__, (torch.Tensor, list, dict, set)):
            # a method of a tensor or container, bound before a graph break
            from ember.capture.values import TensorMethodValue, ValueMethodValue

            receiver = self.wrap(value.__self__, AttrSource(source, "__self__") if source
                                 else None, guard)
            kind = TensorMethodValue if isinstance(value.__self__, torch.Tensor) \
                else ValueMethodValue
            return kind(receiver, value.__name__, source)
        if isinstance(value, types.MethodType) and value.__name__ == "__exit__" and \
                isinstance(value.__self__, (torch.no_grad, torch.enable_grad)):
            # a grad-mode block entered before a graph break, left in resumed code
            from ember.capture.values import GradModeValue, ValueMethodValue

            mode = GradModeValue(isinstance(value.__self__, torch.enable_grad),
                                 getattr(value.__self__, "prev", True))
            return ValueMethodValue(mode, "__exit__", source)
        if guard:
            # objects known by identity; other objects only by type (their attributes are
            # guarded one by one as the code reads them); a bound method is a new object each
            # time it is read: its function and its receiver are guarded instead, below
            torch_callable = is_torch_callable(value)
            known_by_identity = torch_callable or isinstance(
                value, (torch.nn.Module, types.ModuleType, type, types.FunctionType,
                        types.BuiltinFunctionType))
            receiver = getattr(value, "__self__", None)
            if isinstance(value, types.BuiltinMethodType) and receiver is not None and \
                    not isinstance(receiver, (types.ModuleType, type)):
                # a C method bound to an object (generator.manual_seed): a new object each
                # read, the same method while the receiver's type is the same
                self.guards.add("type", AttrSource(source, "__self__"), type(receiver))
            elif torch_callable or not isinstance(value, types.MethodType):
                self.guards.add("id" if known_by_identity else "type", source,
                                value if known_by_identity else type(value))
        if isinstance(value, torch.nn.Module):
            return ModuleValue(value, source)
        if isinstance(value, types.ModuleType):
            return PythonModuleValue(value, source)
        if is_torch_callable(value):
            return TorchValue(value, source)
        if isinstance(value, types.FunctionType):
            return FunctionValue(value, source)
        if isinstance(value, types.MethodType):
            from ember.capture.values import BoundMethodValue

            function = self.wrap(value.__func__, AttrSource(source, "__func__")
                                 if source else None, guard)
            receiver = self.wrap(value.__self__, AttrSource(source, "__self__")
                                 if source else None, guard)
            return BoundMethodValue(function, receiver, source)
        if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)) or \
                (isinstance(value, type) and
                 getattr(value, "__module__", None) == "builtins") or \
                value is getattr(builtins, getattr(value, "__name__", ""), None):
            return BuiltinValue(value, source)
        if type(value) in _SEQUENCE_ITERATORS and source is not None:
            return self._outside_iterator(value, source)
        return ObjectValue(value, source)

    def _wrap_mapping(self, value: Any, source: Source | None, guard: bool) -> Value:
        """A dict (an OrderedDict, a Counter, a defaultdict) read whole: its keys guarded,
        each item wrapped."""
        if not all(_plain_key(k) or _kept_key(k) for k in value):
            raise Unsupported("a dict with tensors as keys")
        if guard:
            self.guards.add("type", source, type(value))
            self.guards.add("keys", source, tuple(value.keys()))

        def written(key: Any) -> Any:
            return key if _plain_key(key) else _KeyRef(self.constant_source(key).expr())

        # (guards read a defaultdict's items with get(): its [] inserts a missing key, and
        # an item's guard may come before the keys' guard)
        read = (lambda k: CallSource(source, "get", (written(k),))) \
            if hasattr(type(value), "__missing__") else \
            (lambda k: ItemSource(source, written(k)))
        items = {k: self.wrap(v, read(k) if source else None, guard)
                 for k, v in value.items()}
        factory = None
        if isinstance(value, collections.defaultdict):  # (what a missing key makes)
            factory = self.wrap(value.default_factory, AttrSource(source, "default_factory")
                                if source else None, guard)
        return DictValue(items, type(value), source, default_factory=factory)

    def _outside_dict(self, value: dict, source: Source) -> Value:
        """A large dict from outside, read key by key until read whole
        (outside_values.OutsideDictValue)."""
        self.guards.add("type", source, type(value))

        def lookup(key: Any) -> Value | None:
            if key in value:
                return self.wrap(value[key], ItemSource(source, key), True)
            self.guards.add("equals", CallSource(source, "__contains__", (key,)), False)
            return None

        return OutsideDictValue(type(value), source,
                                lambda: self._wrap_mapping(value, source, True).items, lookup)

    def _outside_iterator(self, iterator: Any, source: Source) -> Value:
        """An iterator over a list, tuple or range from outside, read as the code takes items
        (see OutsideIteratorValue); the real one is advanced after the graph."""
        from ember.capture.sources import AheadSource, items_left
        self.guards.add("type", source, type(iterator))
        left = items_left(source)

        def pull(ahead: int) -> Value | None:
            if ahead < iterator.__length_hint__():
                self.guards.add("at_least", left, ahead + 1)
                reduced = iterator.__reduce__()
                return self.wrap(reduced[1][0][reduced[2] + ahead], AheadSource(source, ahead))
            self.guards.add("equals", left, ahead)
            return None

        value = OutsideIteratorValue([], source=source, pull=pull)
        self.side_effects.advance(value)
        return value
