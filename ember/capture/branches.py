"""A branch on a tensor's value whose body only computes: both sides kept, merged with
torch.where. Takes the frame at a conditional jump whose condition is a tensor; gives the
frame at the jump's target, each local the body rebinds to a tensor selected by the
condition. It must not merge a body with any effect beyond its locals (a write to an object,
a list or a tensor in place, a random draw, an op that can raise for some values): those
still break the graph, as data-dependent control flow must.

The shape served is `if cond: body` with no else (`if not torch.isfinite(x).all(): x =
x.clamp(...)`, DETR's encoder layers in training): the body falls through to the jump's
target, the skipped side is the state before it.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import torch

from ember.capture.breaks import GraphBreak
from ember.capture.errors import Raised, Unsupported
from ember.capture.interpreter import HANDLERS, Return
from ember.capture.values import Const, TensorValue, births

if TYPE_CHECKING:
    import dis

    from ember.capture.interpreter import Frame

# A body longer than this many instructions is not run twice over (both sides are computed
# on every call: a long body costs what a break saves).
BODY_LIMIT = 400
# Ops whose result depends on a random draw or that can fail for some values (an index out
# of range): run on the side the condition rejects, they would draw or raise where eager
# does not.
_REFUSED_PIECES = ("rand", "dropout", "bernoulli", "multinomial", "normal_", "gather",
                   "index", "take", "scatter", "embedding", "nonzero", "masked_select",
                   "item", "tolist", "setitem")
_READS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST",
          "LOAD_FAST_LOAD_FAST", "LOAD_CLOSURE", "STORE_FAST_LOAD_FAST")


# What the side of a check that fails may hold before its `raise`: building the exception
# and its message (never run by ember: see assume_it_passes)
_MESSAGE_BUILDING = {
    "LOAD_CONST", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD",
    "LOAD_DEREF", "LOAD_NAME", "PUSH_NULL", "PRECALL", "CALL", "KW_NAMES", "BUILD_STRING",
    "FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE", "BUILD_TUPLE",
    "BUILD_LIST", "BINARY_OP", "COPY", "SWAP", "NOP", "CACHE", "EXTENDED_ARG", "RESUME",
    "LOAD_FAST_LOAD_FAST", "LOAD_ASSERTION_ERROR"}
_MESSAGE_LIMIT = 80  # instructions


def assume_it_passes(frame: Frame, instruction: dis.Instruction, condition: TensorValue,
                     jumps_when: bool) -> bool:
    """A check on a one-element tensor whose failing side only raises (`if not
    torch._is_all_true(valid): raise ValueError(...)`, a distribution's validation; `assert
    (x >= 0).all()`): assumed to pass, the frame going on along the passing side. The runner
    tests the condition right after the graph, before any effect: where it fails, the
    function runs eagerly from its start (AssumptionFailed), so eager's exception, its
    message and any handler of it are eager's own. False where neither side or both only
    raise."""
    session = frame.session
    if not session.assuming or condition.fake.numel() != 1:
        return False
    following, target = frame.pc, frame.index_of[instruction.argval]
    raises_on, raises_off = _only_raises(frame, target), _only_raises(frame, following)
    if raises_on == raises_off:
        return False
    # the jump is taken when the truth is `jumps_when`: that side raises, or the other does
    session.assumptions.append((condition, not jumps_when if raises_on else jumps_when,
                                frame.location()))
    if raises_off:
        frame.jump(instruction.argval)
    return True


def _only_raises(frame: Frame, start: int) -> bool:
    """Do the instructions from `start` build an exception and raise it, with no jump,
    store or return before?"""
    for current in frame.instructions[start:start + _MESSAGE_LIMIT]:
        if current.opname == "RAISE_VARARGS":
            return current.arg >= 1
        if current.opname not in _MESSAGE_BUILDING:
            return False
    return False


def merge_both_sides(frame: Frame, instruction: dis.Instruction, condition: TensorValue,
                     jumps_when: bool) -> bool:
    """Run the body the jump skips, then merge it with the skipped side at the jump's
    target. False (nothing merged; the frame as it was, for the caller's break at the jump)
    where the body does more than compute tensors into locals."""
    if condition.fake.numel() != 1:
        return False
    start, target = frame.pc, frame.index_of[instruction.argval]
    if target <= start or target - start > BODY_LIMIT:
        return False
    stack, local_values, names = list(frame.stack), dict(frame.locals), frame.kw_names
    merged = _run_body(frame, instruction, condition, jumps_when, start, target)
    if merged is None:  # (a break at the jump reads the frame's position)
        frame.pc, frame.stack[:], frame.kw_names = start, stack, names
        frame.locals.clear()
        frame.locals.update(local_values)
        return False
    frame.locals.clear()
    frame.locals.update(merged)
    return True


def _run_body(frame: Frame, instruction: dis.Instruction, condition: TensorValue,
              jumps_when: bool, start: int, target: int) -> dict | None:
    session = frame.session
    effects = session.side_effects
    activity, changes, born = effects.activity, len(effects.births_changed), next(births)
    stack, local_values = list(frame.stack), dict(frame.locals)
    cells = _cell_contents(frame)
    last, grad_enabled = session.builder.last_node(), session.grad_enabled
    contexts = (len(session.open_contexts), len(session.entered_regions))
    try:
        while frame.pc != target:
            if not start <= frame.pc < target:  # (a jump out of the body: else, return)
                return None
            current = frame.instructions[frame.pc]
            frame.current = current
            frame.pc += 1
            function = HANDLERS.get(current.opname)
            if function is None:
                return None
            frame.execute(function, current)
    except (Unsupported, Raised, Return, GraphBreak):
        return None
    finally:
        frame.current = instruction
    if effects.changed_outside(activity, changes, born) or session.grad_enabled != \
            grad_enabled or contexts != (len(session.open_contexts),
                                         len(session.entered_regions)) or \
            len(frame.stack) != len(stack) or any(a is not b for a, b in
                                                  zip(frame.stack, stack)) or \
            cells != _cell_contents(frame) or \
            not _only_computes(session.builder.graph, last):
        return None
    return _merged_locals(frame, start, target, condition, jumps_when, local_values)


def _only_computes(graph: torch.fx.Graph, last: torch.fx.Node | None) -> bool:
    """Do the ops the body added neither write in place nor draw nor fail for some values?"""
    nodes = list(graph.nodes)
    added = nodes[nodes.index(last) + 1:] if last is not None else nodes
    for node in added:
        if node.op == "placeholder":
            continue
        name = node.target if isinstance(node.target, str) else \
            getattr(node.target, "__name__", "")
        if node.target is operator.setitem or (name.endswith("_") and
                                                not name.endswith("__")):
            return False
        if any(piece in name for piece in _REFUSED_PIECES):
            return False
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and \
                _holds_tensor(node.args[0]) and \
                any(_holds_tensor(n) for n in _nodes_in(node.args[1:])):
            return False  # (x[index_tensor]: out of range on the rejected side)
    return True


def _holds_tensor(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("example_value"), torch.Tensor)


def _nodes_in(arguments: tuple) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(arguments, found.append)
    return found


def _cell_contents(frame: Frame) -> dict[str, int]:
    return {name: id(getattr(cell, "contents", cell)) for name, cell in frame.cells.items()}


def _merged_locals(frame: Frame, start: int, target: int, condition: TensorValue,
                   jumps_when: bool, skipped: dict) -> dict | None:
    """The locals at the target: each the body rebound to a tensor, `where(runs, body's,
    skipped's)`; one it bound otherwise, kept where both sides agree or where no code
    outside the body reads it; None where they cannot be merged."""
    session = frame.session
    body = frame.locals
    runs: TensorValue | None = None
    merged = dict(skipped)
    for name in set(body) | set(skipped):
        mine, theirs = body.get(name), skipped.get(name)
        if mine is theirs:
            continue
        if isinstance(mine, TensorValue) and isinstance(theirs, TensorValue):
            if (mine.fake.shape, mine.fake.dtype, mine.fake.device) != \
                    (theirs.fake.shape, theirs.fake.dtype, theirs.fake.device):
                return None
            if runs is None:
                runs = _body_runs(session, condition, jumps_when)
            merged[name] = session.builder.call("call_function", torch.where,
                                                (runs, mine, theirs), {})
        elif isinstance(mine, Const) and isinstance(theirs, Const) and \
                type(mine.value) is type(theirs.value) and mine.value == theirs.value:
            continue
        elif _read_outside(frame, name, start, target):
            return None
        elif theirs is None:
            merged.pop(name, None)
    return merged


def _body_runs(session, condition: TensorValue, jumps_when: bool) -> TensorValue:
    """A bool tensor: does the body run? (The jump skips it when the truth is `jumps_when`.)"""
    truth = condition
    if condition.fake.dtype != torch.bool:
        truth = session.builder.call("call_function", torch.ne, (condition, Const(0)), {})
    if jumps_when:
        truth = session.builder.call("call_function", torch.logical_not, (truth,), {})
    return truth


def _read_outside(frame: Frame, name: str, start: int, target: int) -> bool:
    """Does any instruction outside the body read `name` (conservative: the whole code)?"""
    for index, instruction in enumerate(frame.instructions):
        if start <= index < target or instruction.opname not in _READS:
            continue
        value = instruction.argval
        if value == name or (isinstance(value, tuple) and name in value):
            return True
    return False
