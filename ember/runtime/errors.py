"""Errors a compiled graph raises at run time, said as eager says them and where eager would.

Takes the error a compiled graph's run raised, the FX graph it was compiled from and the
call's arguments; gives the error eager raises for that call (its type and message: for an
index out of range, which index, dimension and size), raised from the user's file and line of
the op that raised it (node.meta["stack_trace"], which ember's capture and Dynamo record).
It runs only after a failure, so it may take its time; it must never mutate what the user
passed (the eager run takes copies).
"""

from __future__ import annotations

import linecache
import re
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.fx
import torch.fx.traceback as fx_traceback

from ember.runtime import switches
from ember.torch_internals import tree_flatten

# 'File "x.py", line 12, in fn' — the innermost frame of an FX node's stack trace
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


class _Located(Exception):
    def __init__(self, node: torch.fx.Node, error: Exception):
        self.node, self.error = node, error


class _Locating(torch.fx.Interpreter):
    """Runs the graph eagerly, node by node, and says which node raised."""

    def run_node(self, node: torch.fx.Node) -> Any:
        try:
            return super().run_node(node)
        except Exception as error:
            raise _Located(node, error) from None


def graph_module(eager: Callable) -> torch.fx.GraphModule | None:
    """The FX graph behind a compiled graph's eager fallback (its bound `forward`), if any."""
    module = getattr(eager, "__self__", None)
    return module if isinstance(module, torch.fx.GraphModule) else None


def raise_located(error: Exception, eager: Callable, args: tuple, label: str) -> NoReturn:
    """Re-raise `error`, a compiled graph's, as eager raises it for these arguments, from the
    user's line of the op that raised it. Without an FX graph (or if eager does not raise),
    `error` itself goes on, with a note naming the graph."""
    module = graph_module(eager)
    located = _run_eagerly(module, args) if module is not None else None
    if located is None:
        error.add_note(f"(raised in ember's compiled {label})")
        raise error
    node, eager_error = located
    frame = _innermost_frame(node.meta.get("stack_trace") or "")
    where = f"{frame[0]}:{frame[1]}" if frame else "an op without a recorded position"
    eager_error.add_note(f"(raised by {node.name} of ember's compiled {label}, at {where}; "
                         f"eager raises it there)")
    eager_error = eager_error.with_traceback(None)  # (its frames are FX's interpreter's)
    if frame is None:
        raise eager_error from None
    _raise_from(eager_error, *frame)


def raise_located_backward(error: Exception, eager: Callable, args: tuple, grads: list[Any],
                           label: str) -> NoReturn:
    """Re-raise `error`, raised by the compiled backward of a training graph, as eager's
    backward raises it for these arguments and output gradients (`grads`: one per output of
    the FX graph, None where it gets none), from the user's line of the forward op whose
    backward raised (as autograd's anomaly mode names it)."""
    module = graph_module(eager)
    located = _backward_eagerly(module, args, grads) if module is not None else None
    if located is None:
        error.add_note(f"(raised in the backward of ember's compiled {label})")
        raise error
    eager_error, frame = located
    where = f"{frame[0]}:{frame[1]}" if frame else "an op without a recorded position"
    eager_error.add_note(f"(raised in the backward of ember's compiled {label}, by the "
                         f"backward of the op at {where}; eager raises it there)")
    eager_error = eager_error.with_traceback(None)
    if frame is None:
        raise eager_error from None
    _raise_from(eager_error, *frame)


def _backward_eagerly(module: torch.fx.GraphModule, args: tuple, grads: list[Any]
                      ) -> tuple[Exception, tuple[str, int, str] | None] | None:
    """The graph's forward and backward run as eager runs them, on copies of `args`: the
    error its backward raises, and the innermost user frame of the forward op whose backward
    raised it (anomaly mode records each op's position: FX's, with node meta preserved)."""
    copies = [a.detach().clone().requires_grad_(a.requires_grad)
              if isinstance(a, torch.Tensor) else a for a in args]
    leaves = [c for c in copies if isinstance(c, torch.Tensor) and c.requires_grad]
    with warnings.catch_warnings(record=True) as said, torch.enable_grad(), \
            fx_traceback.preserve_node_meta(), torch.autograd.detect_anomaly(check_nan=False):
        warnings.simplefilter("always")
        try:
            with switches.contained():
                outputs = torch.fx.Interpreter(module).run(*copies)
            pairs = [(out, grad) for out, grad in zip(tree_flatten(outputs)[0], grads)
                     if isinstance(out, torch.Tensor) and out.requires_grad and grad is not None]
            torch.autograd.grad([out for out, _ in pairs], leaves, [g for _, g in pairs],
                                allow_unused=True)
        except Exception as eager_error:  # noqa: BLE001 (the error to give the user)
            stacks = [str(w.message) for w in said if "forward call" in str(w.message)]
            return eager_error, _innermost_frame(stacks[-1]) if stacks else None
    return None


def _run_eagerly(module: torch.fx.GraphModule, args: tuple
                 ) -> tuple[torch.fx.Node, Exception] | None:
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    try:
        with switches.contained():
            _Locating(module).run(*copies)
    except _Located as located:
        return located.node, located.error
    except Exception:  # noqa: BLE001 (an error outside any node: keep the compiled one)
        return None
    return None


def _innermost_frame(stack_trace: str) -> tuple[str, int, str] | None:
    frames = _FRAME.findall(stack_trace)
    if not frames:
        return None
    filename, line, function = frames[-1]
    return filename, int(line), function


def _raise_from(error: Exception, filename: str, line: int, function: str) -> NoReturn:
    """Raise `error` from code that claims `filename`'s line `line`, in `function`: the
    traceback's last entry is then the user's statement, as in eager's traceback."""
    # (the statement is padded past the user's line: a traceback underlines only a span
    # shorter than the line, and this one's columns say nothing about the user's)
    width = len(linecache.getline(filename, line)) + 1
    code = compile("\n" * (line - 1) + "raise (error" + " " * width + ") from None", filename,
                   "exec")
    code = code.replace(co_name=function)
    exec(code, {"error": error})  # noqa: S102 (one raise statement)
    raise error  # (not reached)
