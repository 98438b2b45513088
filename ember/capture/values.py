"""What the symbolic interpreter puts on its stack: tracked values.

A tracked value stands for a Python object of the user's program during capture. Tensors are
nodes of the FX graph being built (with a fake tensor for their metadata); Python constants
are known exactly (and guarded); containers hold tracked items; modules, functions and other
objects are known by identity. Each value may remember its `source` — how to reach the same
object from the function's arguments, globals or closure — for guards and graph inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import types
from typing import Any

import torch
import torch.fx

from ember.capture.sources import Source

# Creation order of mutable tracked values: a graph break rolls back to an instruction's start
# only if no value older than that instruction was mutated by it.
births = itertools.count()


def of_torch(module: str | None) -> bool:
    """Is `module` (a `__module__`) torch's own? torchvision's and torchaudio's names begin
    with "torch" too, and are Python of libraries like any other."""
    return module == "torch" or (module or "").startswith("torch.")


class Value:
    source: Source | None = None

    def python_type(self) -> type:
        raise NotImplementedError

    def is_constant(self) -> bool:
        return False

    def describe(self) -> str:
        return type(self).__name__


@dataclasses.dataclass(eq=False)
class Const(Value):
    """A Python value known exactly at capture time (numbers, strings, None, dtypes, types,
    devices, ...): operations on it run at capture time."""

    value: Any
    source: Source | None = None

    def python_type(self) -> type:
        kind = type(self.value)
        # (a symbolic size stands for the int eager has: type() and isinstance say so)
        return _SYMBOLIC_TYPES.get(kind, kind)

    def is_constant(self) -> bool:
        return True

    def describe(self) -> str:
        return repr(self.value)


_SYMBOLIC_TYPES = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


@dataclasses.dataclass(eq=False)
class IdentityConst(Const):
    """What id() answered during capture: right for comparing and as a dictionary key, never
    to be handed out (ember/capture/rebuild.py refuses it)."""


class PassedNumber(Const):
    """An int, float or str from outside (an argument; the result of .item() that a resume
    function takes; an f-string of one, see capture/numbers.py): guarded (equal to what it
    was) only once the capture reads it — into the
    graph, a shape, a branch. One the code only hands on (to print, to a list it returns, to
    the call a break makes) is read again on each call, so a value that changes every call
    (a loss) does not make every call compile again."""

    def __init__(self, value: Any, source: Any, on_read: Any,
                 leaves: dict[str, Any] | None = None):
        self._value = value
        self.source = source
        self._on_read = on_read  # registers the guard; None once it has
        # the numbers from outside it is arithmetic of, by source (itself, if none)
        self.leaves = leaves if leaves is not None else {source.expr(): value}

    @property
    def value(self) -> Any:
        if self._on_read is not None:
            on_read, self._on_read = self._on_read, None
            on_read()
        return self._value

    @property
    def unread(self) -> bool:
        return self._on_read is not None

    def python_type(self) -> type:
        return type(self._value)  # (its type is guarded apart)

    def __repr__(self) -> str:
        return f"PassedNumber({self._value!r}, {self.source})"


@dataclasses.dataclass(eq=False)
class TensorValue(Value):
    node: torch.fx.Node
    fake: torch.Tensor
    source: Source | None = None
    exact_type: type = torch.Tensor

    def python_type(self) -> type:
        return self.exact_type

    def describe(self) -> str:
        return f"Tensor({str(self.fake.dtype).replace('torch.', '')}{list(self.fake.shape)})"


@dataclasses.dataclass(eq=False)
class SequenceValue(Value):
    """A list, tuple or torch.Size of tracked items. Lists are mutable: `mutated` marks one
    whose changes must reach the caller (it has a source, so it outlives the frame)."""

    items: list[Value]
    kind: type = tuple
    source: Source | None = None
    born: int = dataclasses.field(default_factory=births.__next__)
    view: str | None = None  # a dict's keys(), values() or items() (kept as a list)

    def python_type(self) -> type:
        return self.kind

    def is_constant(self) -> bool:
        return all(item.is_constant() for item in self.items)


@dataclasses.dataclass(eq=False)
class DictValue(Value):
    items: dict[Any, Value]
    kind: type = dict
    source: Source | None = None
    born: int = dataclasses.field(default_factory=births.__next__)
    default_factory: Value | None = None  # a defaultdict's (None: it has none)
    views: list = dataclasses.field(default_factory=list)  # its keys() etc.: refresh_views

    def python_type(self) -> type:
        return self.kind

    def read(self, key: Any) -> Value | None:
        """The item under `key`, None where there is none."""
        return self.items.get(key)


@dataclasses.dataclass(eq=False)
class SetValue(Value):
    items: list[Value]
    source: Source | None = None
    born: int = dataclasses.field(default_factory=births.__next__)

    def python_type(self) -> type:
        return set


@dataclasses.dataclass(eq=False)
class RangeValue(Value):
    range: range
    source: Source | None = None

    def python_type(self) -> type:
        return range

    def is_constant(self) -> bool:
        return True


@dataclasses.dataclass(eq=False)
class IteratorValue(Value):
    """An iterator over items known at capture time (loops are unrolled)."""

    items: list[Value]
    position: int = 0
    source: Source | None = None
    born: int = dataclasses.field(default_factory=births.__next__)
    returned: Value | None = None  # a generator's return value (what `yield from` gives)

    def python_type(self) -> type:
        return type(iter(()))

    def next(self) -> Value | None:
        if self.position >= len(self.items):
            return None
        self.position += 1
        return self.items[self.position - 1]

    def take(self, count: int) -> list[Value]:
        """The next `count` items (fewer where it runs dry), taken."""
        taken = []
        while len(taken) < count:
            item = self.next()
            if item is None:
                break
            taken.append(item)
        return taken


@dataclasses.dataclass(eq=False)
class EndlessIteratorValue(IteratorValue):
    """An iterator with no end (itertools.count(), cycle(items), repeat(x)): its k-th item is
    `make(k)`, made when the code takes it. Taken whole (list(), a zip of endless iterators
    alone) it would run forever, as in eager: ember says so instead (semantics.unpack)."""

    make: Any = None
    what: str = "an endless iterator"

    def next(self) -> Value | None:
        while self.position >= len(self.items):
            self.items.append(self.make(len(self.items)))
        return super().next()


@dataclasses.dataclass(eq=False)
class SliceValue(Value):
    start: Value
    stop: Value
    step: Value
    source: Source | None = None

    def python_type(self) -> type:
        return slice

    def is_constant(self) -> bool:
        return self.start.is_constant() and self.stop.is_constant() and self.step.is_constant()


@dataclasses.dataclass(eq=False)
class ObjectValue(Value):
    """A Python object known by identity (an nn.Module, a function, a module, a class, any
    other object): attribute reads look at the real object, calls are traced or inlined."""

    value: Any
    source: Source | None = None

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        name = getattr(self.value, "__qualname__", None) or type(self.value).__name__
        return f"{type(self).__name__}({name})"


@dataclasses.dataclass(eq=False)
class ModuleValue(ObjectValue):
    """An nn.Module: parameters and buffers become graph inputs; calls inline forward."""

    # a ModuleList's or Sequential's slice made while capturing (`self.layers[:n]`, as
    # transformers' models loop over their layers): the sources of its entries, read through
    # the container it was sliced from (it has no source of its own)
    entry_sources: tuple | None = None


class FunctionValue(ObjectValue):
    """A Python function defined outside the captured code: calls are inlined."""


class BuiltinValue(ObjectValue):
    """A builtin function or type (len, isinstance, int, ...): handled by a rule."""


class TorchValue(ObjectValue):
    """A torch callable (torch.relu, F.gelu, a torch.ops op): calls become graph nodes."""


class PythonModuleValue(ObjectValue):
    """A Python module (torch, math, torch.nn.functional): attribute reads."""


@dataclasses.dataclass(eq=False)
class NestedFunctionValue(Value):
    """A function created while capturing (a lambda, a nested def, a comprehension)."""

    code: types.CodeType
    globals: dict[str, Any]
    name: str
    defaults: tuple[Value, ...] = ()
    kwdefaults: dict[str, Value] = dataclasses.field(default_factory=dict)
    closure: tuple[Any, ...] = ()  # CellValue or real cells
    source: Source | None = None

    def python_type(self) -> type:
        return types.FunctionType


@dataclasses.dataclass(eq=False)
class AutocastValue(Value):
    """torch.autocast(device_type, dtype, enabled, cache_enabled) as a with-block: entering
    and leaving it are nodes of the graph (the backend applies its casts) and, while capture
    runs inside it, a real region (so the fake tensors take autocast's dtypes)."""

    arguments: tuple  # (device_type, dtype, enabled, cache_enabled), Python values
    node: Any = None  # the graph's _enter_autocast node, once entered
    real: Any = None  # the real region entered while capturing
    source: Source | None = None

    def python_type(self) -> type:
        return torch.autocast

    def describe(self) -> str:
        return "an autocast region"


@dataclasses.dataclass(eq=False)
class SwitchValue(Value):
    """A backend switch of torch's made by the captured code (`torch.backends.cudnn.flags(
    enabled=False)`, `sdpa_kernel(SDPBackend.MATH)`; runtime/switches.py) as a with-block:
    entering and leaving it are nodes of the graph and, while capture runs inside it, the
    switch entered for real."""

    switch: Any  # runtime/switches.Switch
    node: Any = None  # the graph's node entering it, once entered
    real: Any = None  # the handle of the switch entered while capturing
    source: Source | None = None

    def python_type(self) -> type:
        return contextlib.AbstractContextManager

    def describe(self) -> str:
        return f"a with-block of {self.switch!r}"


@dataclasses.dataclass(eq=False)
class GeneratorValue(Value):
    """A generator made by the captured code and run as it is driven (a frame suspended at
    each yield, resumed with what is sent): a contextmanager's generator, whose with-block
    body runs between its yields."""

    frame: Any  # interpreter.Frame, lazy
    name: str
    started: bool = False

    def python_type(self) -> type:
        return types.GeneratorType

    def describe(self) -> str:
        return f"the generator {self.name}"


@dataclasses.dataclass(eq=False)
class GeneratorContextValue(Value):
    """`@contextlib.contextmanager`'s manager made by the captured code: `factory(*args,
    **kwargs)` (the decorated function) made it; its generator runs to its first yield when
    the with-block is entered and on to its end when the block is left."""

    factory: Any  # the decorated function, real
    args: list[Value]
    kwargs: dict[str, Value]
    generator: GeneratorValue
    entered: bool = False

    def python_type(self) -> type:
        return contextlib._GeneratorContextManager

    def describe(self) -> str:
        return f"a with-block of {self.generator.name}()"


@dataclasses.dataclass(eq=False)
class PartialValue(Value):
    """functools.partial(function, *args, **keywords) made while capturing."""

    function: Value
    args: list[Value]
    keywords: dict[str, Value]
    source: Source | None = None

    def python_type(self) -> type:
        return functools.partial


@dataclasses.dataclass(eq=False)
class BoundMethodValue(Value):
    """`obj.method` for a Python-level method: calling inlines it with obj as self."""

    function: Value
    receiver: Value
    source: Source | None = None

    def python_type(self) -> type:
        return types.MethodType


@dataclasses.dataclass(eq=False)
class TensorMethodValue(Value):
    """`tensor.name` before the call: `x.add` in `x.add(1)`."""

    receiver: TensorValue
    name: str
    source: Source | None = None

    def python_type(self) -> type:
        return types.BuiltinMethodType


@dataclasses.dataclass(eq=False)
class ValueMethodValue(Value):
    """A method of a tracked container or constant, e.g. `items.append`, `d.get`, `s.format`."""

    receiver: Value
    name: str
    source: Source | None = None

    def python_type(self) -> type:
        return types.BuiltinMethodType


@dataclasses.dataclass(eq=False)
class CellValue(Value):
    """A closure cell created while capturing."""

    contents: Value | None = None
    born: int = dataclasses.field(default_factory=births.__next__)

    def python_type(self) -> type:
        return types.CellType


@dataclasses.dataclass(eq=False)
class NullContextValue(Value):
    """A context manager with no effect on what the graph computes: contextlib.nullcontext(),
    torch.autograd.profiler.record_function(name) (a profiler label: inside a compiled region
    there is no op of its own to label, as under torch.compile)."""

    kind: type

    def python_type(self) -> type:
        return self.kind


@dataclasses.dataclass(eq=False)
class HookHandleValue(Value):
    """The handle of a module hook the captured code registered: registered for real only
    when the effects are replayed, after the graph, so the capture cannot use it (remove()
    breaks the graph); handed on, it is the replayed registration's result."""

    def python_type(self) -> type:
        from torch.utils.hooks import RemovableHandle

        return RemovableHandle

    def describe(self) -> str:
        return "the handle of a hook registered inside the compiled function"


@dataclasses.dataclass(eq=False)
class LockContextValue(Value):
    """A with-block over a threading.Lock or RLock (see contexts.enter_lock). `acquire`: the
    effect that takes the lock when the effects are replayed."""

    lock: Value
    acquire: Any = None

    def python_type(self) -> type:
        return type(self.lock.value)


@dataclasses.dataclass(eq=False)
class GradModeValue(Value):
    """torch.no_grad() / torch.enable_grad() / torch.set_grad_enabled(b) as a context or a
    decorator."""

    enabled: bool
    previous: bool | None = None
    source: Source | None = None
    inference: bool = False  # torch.inference_mode(): grad off, and what is made inside
    # is an inference tensor (see captured.py)

    def python_type(self) -> type:
        return torch.no_grad if not self.enabled else torch.enable_grad


@dataclasses.dataclass(eq=False)
class SuperValue(Value):
    """`super()` or `super(cls, obj)`: attribute reads look past `klass` in obj's MRO."""

    klass: type
    receiver: Value
    source: Source | None = None

    def python_type(self) -> type:
        return super


@dataclasses.dataclass(eq=False)
class NewObjectValue(Value):
    """An object of a plain Python class (a dataclass, a small record class) made inside the
    captured code: its class and the attributes its code set, as tracked values. It is made
    again, with their final values, wherever it outlives the graph (ember/capture/rebuild.py).
    An object of a dict or OrderedDict subclass (Hugging Face's ModelOutput) also holds its
    items: `mapping`, which the builtin dict methods it inherits act on."""

    cls: type
    cls_source: Source | None = None  # where the class was reached (its attributes' source)
    attributes: dict[str, Value] = dataclasses.field(default_factory=dict)
    source: Source | None = None
    born: int = dataclasses.field(default_factory=births.__next__)
    mapping: DictValue | None = None

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"new {self.cls.__qualname__} object"


class NullValue(Value):
    """The NULL that CPython pushes below a callable."""

    def python_type(self) -> type:
        return type(None)


NULL = NullValue()


@dataclasses.dataclass(eq=False)
class VmappedValue(Value):
    """torch.vmap(function, in_dims, out_dims) made while capturing (calling it: capture/
    vmap_rules.py)."""

    function: Value
    in_dims: Any
    out_dims: Any
    source: Source | None = None

    def python_type(self) -> type:
        return types.FunctionType
