"""torch's backend switches in compiled code: `with torch.backends.cudnn.flags(enabled=False):`,
`with torch.nn.attention.sdpa_kernel(SDPBackend.MATH):` and their kind — context managers of
torch.backends and torch.nn.attention that change which library kernel eager picks inside the
block, and nothing else.

A captured with-block over one is two nodes of the graph: a `Switch` (calling it enters a
fresh manager made as the user's code made it, returning the handle) and `leave(handle)`.
Lowering runs them as it traces, so that a choice made while tracing (scaled-dot-product
attention asks eager which kernel it would pick: lower/attention.py) is made as eager's run
makes it; the library calls traced inside remember the switches they ran under and the
wrapper enters them around each such call (`Switched`). Ember's own kernels read no backend
flag. Where the graph is split into compiled regions and eager islands, the two nodes run in
the glue where they stand, around what the block holds."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.fx

# modules whose context managers are backend switches
SWITCH_MODULES = ("torch.backends", "torch.nn.attention")


@dataclasses.dataclass
class Switch:
    """One with-block's switch: `factory(*args, **kwargs)` makes its manager. Equal when
    made by the same call."""

    factory: Callable[..., Any]
    args: tuple
    kwargs: dict

    def __post_init__(self) -> None:
        # (a graph's node calls it: FX names the node and its generated code's global by it)
        self.__name__ = f"enter_{self.factory.__name__}"

    def __call__(self) -> list:
        """Enter a fresh manager; the handle `leave` takes."""
        manager = self.factory(*self.args, **self.kwargs)
        handle = [self, manager, manager.__enter__()]
        _entered().append(handle)
        return handle

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:  # (stable across processes: the disk cache's key reads it)
        arguments = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.factory.__module__}.{self.factory.__qualname__}({', '.join(arguments)})"


def leave(handle: list) -> None:
    """Leave the switch `handle` entered (a graph's node calls it where the block ends)."""
    stack = _entered()
    for position in range(len(stack) - 1, -1, -1):  # (by identity: innermost first)
        if stack[position] is handle:
            del stack[position]
            break
    handle[1].__exit__(None, None, None)


def bound(handle: list) -> Any:
    """What the manager's __enter__ gave (a with-block's `as` binds it)."""
    return handle[2]


def active() -> tuple[Switch, ...]:
    """The switches this thread is inside, outermost first."""
    return tuple(handle[0] for handle in _entered())


@contextlib.contextmanager
def contained() -> Iterator[None]:
    """Leave, when the block ends, what a graph's switch nodes run inside it entered and
    did not leave (the run stopped between the two: an error, an op lowering refused)."""
    depth = len(_entered())
    try:
        yield
    finally:
        stack = _entered()
        while len(stack) > depth:
            leave(stack[-1])


def restoring(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """`gm.forward`, run inside `contained()` where the graph enters backend switches."""
    forward = gm.forward
    if not any(isinstance(node.target, Switch) for node in gm.graph.nodes):
        return forward

    @functools.wraps(forward)
    def run(*args: Any) -> Any:
        with contained():
            return forward(*args)

    return run


@dataclasses.dataclass(eq=False)
class Switched:
    """`with Switched(switches):` — the block under `switches`, outermost first (a wrapper's
    constant, around a library call traced under them; reusable, as a generator-based
    manager is not)."""

    switches: tuple

    def __enter__(self) -> None:
        for switch in self.switches:
            switch()

    def __exit__(self, *exc: Any) -> None:
        stack = _entered()
        for handle in reversed(stack[len(stack) - len(self.switches):]):
            leave(handle)


def is_switch_factory(function: Any) -> bool:
    """Is `function` one that makes a backend switch (a generator-based context manager of
    torch.backends or torch.nn.attention)?"""
    import inspect

    module = getattr(function, "__module__", None) or ""
    if not any(module == m or module.startswith(m + ".") for m in SWITCH_MODULES):
        return False
    try:
        return inspect.isgeneratorfunction(inspect.unwrap(function)) and \
            getattr(function, "__wrapped__", None) is not None
    except (TypeError, ValueError):
        return False


def _entered() -> list:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    return stack


_state = threading.local()
