"""Tensors whose values the capture knows: made by torch's own deterministic ops from Python
constants alone (no input, parameter or buffer), and small. Each such op also runs on real
tensors while it is captured, so that where Python needs one of these values as a number
(arange's bounds, int(), .item(), a branch) the capture folds it into a constant instead of
breaking the graph.

It gives values, never nodes: the graph still computes every tensor. A value that depends on
an input is never known here, so reading it still breaks the graph (or, under fullgraph,
fails) as before.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember import torch_internals
from ember.capture.symbols import SYMBOLIC
from ember.capture.values import Const, DictValue, SequenceValue, SliceValue, TensorValue, Value
from ember.trees import leaves

# The most elements a known value may have: position tables and small masks fit, and running
# an op again on them costs microseconds.
LIMIT = 4096
# Ops that read only their tensor operand's metadata (dtype, device, shape), not its values:
# `pos.new_tensor([...])` is known even where `pos` is not.
_METADATA_OPERAND = {"new_tensor", "new_zeros", "new_ones", "new_full", torch.zeros_like,
                     torch.ones_like, torch.full_like, torch.Tensor.new_tensor,
                     torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_full}
# Modules whose functions are torch's own ops (torch.distributed's collectives are not: they
# talk to other processes)
_TORCH_MODULES = ("torch", "torch.functional", "torch.nn.functional", "_operator")
# Methods that read a tensor's data into Python, and what each gives of the real value
DATA_READS: dict[str, Callable[[torch.Tensor], Any]] = {
    "item": torch.Tensor.item, "tolist": torch.Tensor.tolist, "__int__": int,
    "__float__": float, "__bool__": bool, "__index__": operator.index}


# ops whose result is memory nobody wrote: a value, but not the one the graph's run will have
_UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                  "empty_permuted"}


class _Unknowable(Exception):
    pass


class _RefuseUnknowable(torch_internals.TorchDispatchMode):
    """Refuses ops whose values the graph will not reproduce, before they run: random draws
    (running one at capture time would also move the user's generator) and uninitialized
    memory."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags or \
                func.overloadpacket.__name__ in _UNINITIALIZED:
            raise _Unknowable(str(func))
        return func(*args, **(kwargs or {}))


class NumberReads(torch_internals.TorchDispatchMode):
    """Watches an op run on fake tensors: `seen` once it read a tensor's value as a number
    (fake tensors know the values of one-element tensors made by torch.tensor and a few ops
    of them, and an op that takes a number reads such a tensor without failing)."""

    seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.seen = True
        return func(*args, **(kwargs or {}))


class KnownValues:
    """The real values of the captured graph's known tensors, by node."""

    def __init__(self) -> None:
        self._values: dict[torch.fx.Node, torch.Tensor] = {}
        # the storages (of the fakes) that an op wrote without running for real
        # (`table.add_(x)` of an input x, a write through a view too large to be known):
        # every known value in them is stale (identity -> a fake that keeps it alive)
        self._stale: dict[int, torch.Tensor] = {}

    def value(self, tensor: TensorValue) -> torch.Tensor | None:
        """The tensor's value now, where the capture knows it."""
        real = self._values.get(tensor.node)
        if real is None or (self._stale and
                            torch_internals.storage_identity(tensor.fake) in self._stale):
            return None
        return real

    def number(self, tensor: TensorValue, read: Callable[[torch.Tensor], Any]) -> Value | None:
        """`read(value)` (item(), int(), bool(): Python's number) of a known tensor, as a
        constant; None where the value is not known or eager would raise there."""
        real = self.value(tensor)
        if real is None:
            return None
        try:
            answer = read(real)
        except Exception:  # noqa: BLE001 (eager raises: the read breaks the graph, as before)
            return None
        from ember.capture.semantics import constant

        return constant(answer)

    # -- an op as the graph records it ----------------------------------------------------
    def operands(self, kind: str, target: Any, args: tuple, kwargs: dict[str, Any]
                 ) -> tuple[tuple, dict[str, Any]] | None:
        """The op's real arguments where it is one of torch's ops and every tensor it takes
        is known (or read only for its metadata); None otherwise."""
        if not _torch_op(kind, target):
            return None
        metadata_only = target in _METADATA_OPERAND
        if any(t.node not in self._values and not (metadata_only and t is args[0])
               for t in _tensors((args, kwargs))):
            return None  # (the common case, said early: an op of the inputs)

        def real(value: TensorValue) -> torch.Tensor:
            known = self.value(value)
            if known is not None:
                return known
            if metadata_only and value is args[0]:
                stand_in = _stand_in(value.fake)
                if stand_in is not None:
                    return stand_in
            raise _Unknown

        try:
            return _convert((args, kwargs), real)
        except _Unknown:
            return None

    def versions(self, args: tuple, kwargs: dict[str, Any]) -> list[tuple[TensorValue, int]]:
        """The version counters of the tensors an op takes, before it runs (none needed
        while no value is known)."""
        if not self._values:
            return []
        return [(t, t.fake._version) for t in _tensors((args, kwargs))]

    def follow(self, kind: str, target: Any, operands: tuple[tuple, dict] | None,
               result: Value, example: Any, versions: list[tuple[TensorValue, int]]) -> None:
        """After an op is added to the graph: run it on the real operands (when all are
        known) and remember what it made; else, where it wrote into a tensor (its fake's
        version moved), that tensor's storage, and every known view of it, is stale from now
        on. (Where it ran for real, it wrote the real values: views of them see the write.)"""
        ran = operands is not None and self._run(kind, target, operands, result, example)
        if ran:
            return
        for tensor, version in versions:
            if tensor.fake._version != version:
                self._stale[torch_internals.storage_identity(tensor.fake)] = tensor.fake

    def _run(self, kind: str, target: Any, operands: tuple[tuple, dict], result: Value,
             example: Any) -> bool:
        made = [t for t in leaves(example)
                if isinstance(t, torch.Tensor)]
        args, kwargs = operands
        if any(not _small(t) for t in made) or not (made or _real_tensors((args, kwargs))):
            return False  # (too large; or no tensor at all, in or out: not an op of values)
        try:
            with torch.no_grad(), _RefuseUnknowable():
                if kind == "call_method":
                    answer = getattr(args[0], target)(*args[1:], **kwargs)
                else:
                    answer = target(*args, **kwargs)
        except Exception:  # noqa: BLE001 (a random draw, or any failure: not known)
            return False
        values = [result] if isinstance(result, TensorValue) else \
            list(result.items) if isinstance(result, SequenceValue) else []
        answers = [answer] if isinstance(answer, torch.Tensor) else \
            list(answer) if isinstance(answer, (tuple, list)) else []
        if len(values) != len(answers):
            return False
        for value, real in zip(values, answers):
            if isinstance(value, TensorValue) and isinstance(real, torch.Tensor) and \
                    real.shape == value.fake.shape and real.dtype == value.fake.dtype and \
                    real.device == value.fake.device:
                self._values[value.node] = real
        return True

    # -- folding ----------------------------------------------------------------------------
    def has_numbers(self, args: tuple, kwargs: dict[str, Any]) -> bool:
        """Does the op take a known 0-d tensor (which it may read as a number)?"""
        return bool(self._values) and any(t.fake.ndim == 0 and self.value(t) is not None
                                          for t in _tensors((args, kwargs)))

    def folded(self, args: tuple, kwargs: dict[str, Any]
               ) -> tuple[tuple, dict[str, Any]] | None:
        """The arguments with each known 0-d tensor as its Python number, as eager reads a
        0-d tensor where an op takes a number (arange's bounds, a size); None where there is
        none to fold."""
        count = [0]

        def fold(value: Any) -> Any:
            if isinstance(value, TensorValue) and value.fake.ndim == 0:
                real = self.value(value)
                if real is not None:
                    count[0] += 1
                    return Const(real.item())
                return value
            if isinstance(value, SequenceValue):
                return SequenceValue([fold(v) for v in value.items], value.kind)
            if isinstance(value, SliceValue):
                return SliceValue(fold(value.start), fold(value.stop), fold(value.step))
            if isinstance(value, (tuple, list)):
                return type(value)(fold(v) for v in value)
            if isinstance(value, dict):
                return {k: fold(v) for k, v in value.items()}
            return value

        args, kwargs = fold(args), fold(kwargs)
        return (args, kwargs) if count[0] else None


class _Unknown(Exception):
    pass


def _torch_op(kind: str, target: Any) -> bool:
    """Is the call one of torch's own ops (a Tensor method, a function of torch's modules),
    not user code kept as one call in the graph, nor a custom op?"""
    if kind == "call_method":
        return isinstance(target, str)
    if getattr(target, "one_call", False) or torch_internals.is_op_overload(target):
        return False
    objclass = getattr(target, "__objclass__", None)
    if objclass is not None and issubclass(objclass, torch._C.TensorBase):
        return True
    module = getattr(target, "__module__", None) or ""
    return module in _TORCH_MODULES or module.startswith("torch._C._")


def _small(tensor: torch.Tensor) -> bool:
    return not any(isinstance(d, torch.SymInt) for d in tensor.shape) and \
        tensor.numel() <= LIMIT and tensor.device.type in ("cpu", "cuda") and \
        tensor.layout == torch.strided


def _stand_in(fake: torch.Tensor) -> torch.Tensor | None:
    """A real tensor with `fake`'s metadata (what an op reading only that sees)."""
    if not _small(fake) or any(isinstance(s, torch.SymInt) for s in fake.stride()):
        return None
    return torch.empty_strided(tuple(fake.shape), tuple(fake.stride()), dtype=fake.dtype,
                               device=fake.device)


def _real_tensors(tree: Any) -> bool:
    return any(isinstance(t, torch.Tensor) for t in leaves(tree))


def _tensors(tree: Any) -> list[TensorValue]:
    found: list[TensorValue] = []

    def visit(value: Any) -> None:
        if isinstance(value, TensorValue):
            found.append(value)
        elif isinstance(value, SequenceValue):
            for item in value.items:
                visit(item)
        elif isinstance(value, SliceValue):
            for part in (value.start, value.stop, value.step):
                visit(part)
        elif isinstance(value, (tuple, list)):
            for item in value:
                visit(item)
        elif isinstance(value, (dict, DictValue)):
            for item in (value.items.values() if isinstance(value, DictValue)
                         else value.values()):
                visit(item)

    visit(tree)
    return found


def _convert(value: Any, real: Callable[[TensorValue], torch.Tensor]) -> Any:
    """Tracked values -> the op's real arguments (tensors by `real`); symbolic numbers are
    unknown."""
    if isinstance(value, TensorValue):
        return real(value)
    if isinstance(value, Const):
        if isinstance(value.value, SYMBOLIC):
            raise _Unknown
        return value.value
    if isinstance(value, SequenceValue):
        items = [_convert(v, real) for v in value.items]
        if value.kind is torch.Size:
            return torch.Size(items)
        return list(items) if value.kind is list else tuple(items)
    if isinstance(value, SliceValue):
        return slice(*(_convert(v, real) for v in (value.start, value.stop, value.step)))
    if isinstance(value, DictValue):
        return {k: _convert(v, real) for k, v in value.items.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_convert(v, real) for v in value)
    if isinstance(value, dict):
        return {k: _convert(v, real) for k, v in value.items()}
    raise _Unknown
