"""Library calls whose gradient is eager's own autograd, kept from the forward.

A library call without a rule of its own (attention, embedding_bag, grid_sample, ...) is
differentiated by torch. The forward graph runs it under autograd, on detached aliases of its
operands that require grad where a gradient is wanted, and keeps what autograd made — the
call's backward node and the tensors it saved, exactly what eager keeps — on the training
step's tape; the backward graph hands that node the incoming gradients. Nothing runs twice
(attention's backward reads the log-sum-exp its forward kept), and a call random through its
dropout gets the gradient of the very draw its forward made.

The tape is the training step's (runtime/training.py opens one per forward and hands it to
the backward): a list with one entry per taped call, filled by the forward. A forward run
without a tape (the graph called under no_grad) calls the op plainly.

Under CUDA graphs a replayed forward runs no Python, so nothing would fill the tape: graphs
compiled for mode="reduce-overhead" take the older path instead (vjp.library_vjp runs the
call again inside the backward).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ember import logs
from ember.ir.library import fill
from ember.ir.sizes import any_symbolic, guess
from ember.lower.registry import Unsupported


@dataclasses.dataclass(frozen=True, eq=False)
class TapedCall:
    """A forward library call (its target, argument template and result form) and where its
    autograd record goes on the step's tape; eq=False: two calls never merge."""

    target: Any
    args: tuple
    kwargs: dict
    tuple_result: bool
    differentiable: tuple[bool, ...]  # per operand: is a gradient wanted
    index: int                        # its entry on the tape
    layouts: tuple = ()               # per result: the strides the graph planned for it


@dataclasses.dataclass(frozen=True)
class DenseOrder:
    """A planned layout over symbolic sizes, as the order of its dims from outermost to
    innermost: its strides are made per call from the result's shape (a symbolic graph's
    planned strides are expressions of its sizes, unknown to the tape)."""

    order: tuple[int, ...]

    def strides(self, shape: Sequence[int]) -> tuple[int, ...]:
        strides, step = [0] * len(shape), 1
        for dim in reversed(self.order):
            strides[dim] = step
            step *= max(shape[dim], 1)
        return tuple(strides)


def planned_layout(shape: Sequence[Any], strides: Sequence[Any] | None) -> Any:
    """What a taped call keeps of the strides the graph planned for a result: the strides,
    or where they are symbolic a DenseOrder; raises Unsupported for a symbolic layout that is
    not dense (its strides could not be made per call)."""
    if strides is None or not any_symbolic(strides):
        return strides
    ranked = sorted(range(len(shape)), key=lambda d: (-guess(strides[d]), d))
    order = DenseOrder(tuple(ranked))
    if any(a != b for a, b in zip(order.strides(shape), strides)):
        raise Unsupported("a library call of a training graph whose planned result layout "
                          "over symbolic sizes is not dense")
    return order


class Tape:
    """One training step's autograd records of its taped library calls."""

    def __init__(self, count: int):
        self.entries: list[tuple[tuple, list[torch.Tensor]] | None] = [None] * count


_active = threading.local()


@contextlib.contextmanager
def using(tape: Tape | None) -> Iterator[None]:
    """Taped calls made (or differentiated) in this thread meanwhile use `tape`."""
    saved = getattr(_active, "tape", None)
    _active.tape = tape
    try:
        yield
    finally:
        _active.tape = saved


_compiling = threading.local()


@contextlib.contextmanager
def kept(wanted: bool) -> Iterator[None]:
    """Training graphs compiled in this thread meanwhile tape their library calls (the
    default) or not (`wanted` False: graphs for CUDA graphs)."""
    saved = keeping()
    _compiling.wanted = wanted
    try:
        yield
    finally:
        _compiling.wanted = saved


def keeping() -> bool:
    return getattr(_compiling, "wanted", True)


def taped_call(call: TapedCall, *operands: torch.Tensor) -> Any:
    """The forward's library call, recorded by autograd on the active tape."""
    tape = getattr(_active, "tape", None)
    if tape is None:
        return call.target(*fill(call.args, operands), **fill(call.kwargs, operands))
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(wanted) if isinstance(t, torch.Tensor) else t
                  for t, wanted in zip(operands, call.differentiable)]
        result = call.target(*fill(call.args, leaves), **fill(call.kwargs, leaves))
    outputs = tuple(result) if call.tuple_result else (result,)
    tape.entries[call.index] = (outputs, [leaf for leaf, wanted in
                                          zip(leaves, call.differentiable) if wanted])
    detached = tuple(_planned(call, o.detach(), strides) if isinstance(o, torch.Tensor)
                     else o
                     for o, strides in zip(outputs, call.layouts or (None,) * len(outputs)))
    return detached if call.tuple_result else detached[0]


# taped calls whose relaid result was said on the fallbacks channel (once each)
_relaid_told: weakref.WeakSet = weakref.WeakSet()


def _planned(call: TapedCall, result: torch.Tensor, strides: tuple | None) -> torch.Tensor:
    """`result` in the layout the graph planned: an op may lay its result out otherwise when
    its operands require grad (attention with a mask that requires grad, T5's position bias,
    takes another kernel than the no-grad run the plan asked) — copied then, values kept,
    and said once per call on the fallbacks channel: where the result is also the graph's
    output, its strides are the plan's, not eager's."""
    if strides is None or result.numel() == 0:
        return result
    if isinstance(strides, DenseOrder):
        strides = strides.strides(result.shape)
    if tuple(result.stride()) == tuple(strides):
        return result
    if call not in _relaid_told:
        _relaid_told.add(call)
        logs.channel("fallbacks").info(
            "%s under autograd laid out its result with strides %s, not the planned %s: "
            "copied into the planned layout (values kept; as a graph output its strides "
            "are the plan's, not eager's)", call.target, tuple(result.stride()),
            tuple(strides))
    relaid = torch.empty_strided(result.shape, strides, dtype=result.dtype,
                                 device=result.device)
    return relaid.copy_(result)


def taped_vjp(index: int, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gradients of taped call `index`'s differentiable operands, from the gradients of
    its results (one per result, zeros where none came), by the autograd record its forward
    left on the active tape."""
    tape = getattr(_active, "tape", None)
    entry = tape.entries[index] if tape is not None else None
    if entry is None:
        raise RuntimeError("ember: a library call's backward ran without its forward's "
                           "autograd record (please report it)")
    outputs, leaves = entry
    pairs = [(out, grad) for out, grad in zip(outputs, grads)
             if isinstance(out, torch.Tensor) and out.requires_grad]
    # (retain_graph: a backward may run twice, as eager's may with retain_graph=True; the
    # record goes with the step's autograd.Function)
    found = torch.autograd.grad([out for out, _ in pairs], leaves,
                                [grad for _, grad in pairs], allow_unused=True,
                                retain_graph=True) if pairs else [None] * len(leaves)
    return owned_gradients(found, leaves, grads)


def owned_gradients(found: Any, leaves: list[torch.Tensor], operands: tuple
                    ) -> tuple[torch.Tensor, ...]:
    """torch's gradients of `leaves` (zeros where none), dense, each in memory of its own: a
    gradient may be one of the backward call's `operands` itself (index_put's for `self`, an
    incoming gradient), which the backward graph may free or reuse."""
    held = {t.untyped_storage().data_ptr() for t in operands
            if isinstance(t, torch.Tensor) and t.numel()}

    def own(gradient: torch.Tensor) -> torch.Tensor:
        gradient = gradient.contiguous()
        if gradient.numel() and gradient.untyped_storage().data_ptr() in held:
            return gradient.clone()
        return gradient

    return tuple(own(f if f is not None else torch.zeros_like(leaf))
                 for f, leaf in zip(found, leaves))
