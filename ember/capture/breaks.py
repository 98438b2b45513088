"""Graph breaks: stop capturing at an instruction of the root frame, and resume after it.

When the root frame meets a call it cannot trace (print, tensor.item(), an untraceable C
function, a user function that itself cannot be traced) or a branch on a tensor's value, the
interpreter undoes that instruction and raises `GraphBreak` with the frame's state. The
compiled function then runs the graph captured so far, replays its side effects, rebuilds the
stack and locals in Python, runs the instruction natively, and calls a *resume function*: a
copy of the function's code that starts right after the instruction (assembled with the
`bytecode` package), which ember compiles in turn, lazily, with its own guards and cache.
"""

from __future__ import annotations

import dataclasses
import dis
import inspect
import operator
import types
from typing import TYPE_CHECKING, Any

from ember.capture.errors import Unsupported
from ember.capture.values import NULL, Value

if TYPE_CHECKING:
    from ember.capture.session import Savepoint

CALLS = ("CALL", "CALL_FUNCTION_EX")
# Instructions a break can also stop at, as a call of an operator on their stack operands
# (`x[mask]`: its shape depends on the values, so the runner indexes natively).
OPERATORS = {"BINARY_SUBSCR": (operator.getitem, 2)}
STACK_PREFIX = "___stack"
# opcode -> (jumps when the value is, keeps the value on the stack when it jumps)
JUMPS = {
    "POP_JUMP_IF_TRUE": (True, False), "POP_JUMP_IF_FALSE": (False, False),
    "POP_JUMP_FORWARD_IF_TRUE": (True, False), "POP_JUMP_FORWARD_IF_FALSE": (False, False),
    "POP_JUMP_BACKWARD_IF_TRUE": (True, False), "POP_JUMP_BACKWARD_IF_FALSE": (False, False),
    "JUMP_IF_TRUE_OR_POP": (True, True), "JUMP_IF_FALSE_OR_POP": (False, True),
}


@dataclasses.dataclass
class Snapshot:
    """The root frame's state before an instruction, to undo it for a break."""

    stack: list[Value]
    locals: dict[str, Value]
    kw_names: tuple[str, ...]
    point: Savepoint  # (the graph, side effects and modes: Session.roll_back)


@dataclasses.dataclass
class GraphBreak(Exception):
    """Capture stops before `instruction` (index `index` in the frame's instructions)."""

    reason: Unsupported
    instruction: dis.Instruction
    index: int
    kind: str                              # "call" or "jump"
    below: list[Value]                     # the stack under what the instruction consumes
    locals: dict[str, Value]
    cells: dict[str, Value]                # cell variables of the frame (contents)
    callee: Value | None = None
    args: list[Value] = dataclasses.field(default_factory=list)
    kwargs: dict[str, Value] = dataclasses.field(default_factory=dict)
    star: Value | None = None              # CALL_FUNCTION_EX: the args tuple and kwargs dict
    star_kwargs: Value | None = None
    condition: Value | None = None
    jumps_when: bool = False
    keeps: bool = False                    # JUMP_IF_*_OR_POP keeps the value when it jumps
    target_index: int = -1


def call_parts(instruction: dis.Instruction, stack: list[Value], kw_names: tuple[str, ...]
               ) -> tuple[list[Value], Value, list[Value], dict[str, Value], Value | None,
                          Value | None]:
    """(stack below the call, callee, positional, keywords, star args, star kwargs)."""
    if instruction.opname == "CALL_FUNCTION_EX":
        has_kwargs = instruction.arg & 1
        count = 4 if has_kwargs else 3
        parts = stack[-count:]
        null, callee, star = parts[0], parts[1], parts[2]
        star_kwargs = parts[3] if has_kwargs else None
        if null is not NULL:
            raise Unsupported("a method call through *args at a break")
        return stack[:-count], callee, [], {}, star, star_kwargs
    count = instruction.arg
    arguments = stack[len(stack) - count:]
    first, second = stack[-count - 2], stack[-count - 1]
    if first is NULL:
        callee = second
    else:
        callee, arguments = first, [second, *arguments]
    positional = arguments[:len(arguments) - len(kw_names)]
    keywords = dict(zip(kw_names, arguments[len(arguments) - len(kw_names):]))
    return stack[:-count - 2], callee, positional, keywords, None, None


# -- resume functions ----------------------------------------------------------------------
def resume_function(function: types.FunctionType, code: types.CodeType, start: int,
                    stack: list[Value], locals_: list[str], cells: list[str],
                    lasti: int | None = None) -> tuple[types.FunctionType, int]:
    """A function running `code` from instruction `start` (an index into dis's instructions,
    EXTENDED_ARG excluded): its arguments are the stack values (NULLs are pushed, not passed),
    then the live locals and cell contents, by name. Its code is a prologue and then all of
    `code`: also returned, the prologue's length (instruction n of the resume function is
    instruction n - length of `code`).

    An exception handler's entry (`lasti`, the number of the instruction that raised, for a
    handler whose table entry asks for it) gets that instruction's offset in the resume
    function pushed below the exception, the last stack value: RERAISE sets the frame's
    position from it."""
    function_, length = _assemble(function, code, start, stack, locals_, cells,
                                  None if lasti is None else 0)
    if lasti is None:
        return function_, length
    # (the offset is known once assembled: a second assembly puts it in the constant)
    instructions = [i for i in dis.get_instructions(function_.__code__)
                    if i.opname != "EXTENDED_ARG"]
    offset = instructions[lasti + length].offset // 2  # (in code units, as CPython pushes it)
    return _assemble(function, code, start, stack, locals_, cells, offset)


def stack_parameters(stack: list[Value]) -> list[str]:
    """The resume function's parameters that carry the stack's values (NULLs are pushed)."""
    return [f"{STACK_PREFIX}{i}" for i, value in enumerate(stack) if value is not NULL]


def argument_order(code: types.CodeType, stack_names: list[str], locals_: list[str],
                   cells: list[str]) -> list[str]:
    """A resume function's parameters: the stack values, then the live locals and cells. A
    method that may call super() without arguments (its code has a __class__ cell) has it
    read the frame's first slot as `self` or `cls`: that argument comes first."""
    names = [*stack_names, *locals_, *[c for c in cells if c not in locals_]]
    if "__class__" in code.co_freevars and code.co_argcount and code.co_varnames[0] in names:
        names.remove(code.co_varnames[0])
        names.insert(0, code.co_varnames[0])
    return names


def _assemble(function: types.FunctionType, code: types.CodeType, start: int,
              stack: list[Value], locals_: list[str], cells: list[str], lasti: int | None
              ) -> tuple[types.FunctionType, int]:
    import bytecode

    program = bytecode.Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    position = _position_of(program, start)
    label = bytecode.Label()
    program.insert(position, label)
    stack_names = stack_parameters(stack)
    prologue = []
    if code.co_freevars:
        prologue.append(bytecode.Instr("COPY_FREE_VARS", len(code.co_freevars)))
    for name in code.co_cellvars:
        prologue.append(bytecode.Instr("MAKE_CELL", bytecode.CellVar(name)))
    prologue.append(bytecode.Instr("RESUME", 0))
    names = iter(stack_names)
    for number, value in enumerate(stack):
        if number == len(stack) - 1 and lasti is not None:
            prologue.append(bytecode.Instr("LOAD_CONST", lasti))
        prologue.append(bytecode.Instr("PUSH_NULL") if value is NULL
                        else bytecode.Instr("LOAD_FAST", next(names)))
    prologue.append(bytecode.Instr("JUMP_FORWARD", label))
    program[0:0] = prologue
    program.argnames = argument_order(code, stack_names, locals_, cells)
    program.argcount = len(program.argnames)
    program.posonlyargcount = 0
    program.kwonlyargcount = 0
    program.flags &= ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    program.name = f"{code.co_name}_resume_at_{start}"
    # NOTE: the prologue jumps into the middle of the code, maybe of a try block, which the
    # bytecode package's stack analysis cannot follow. The copy keeps the original's
    # structure: its handlers' depths are the original's, and its stack never grows past the
    # original's (the prologue only rebuilds a state the original had).
    resumed = program.to_code(stacksize=code.co_stacksize + 1,
                              compute_exception_stack_depths=False)
    return types.FunctionType(resumed, function.__globals__, resumed.co_name, None,
                              function.__closure__), len(prologue)


def _position_of(program: Any, start: int) -> int:
    import bytecode

    count = 0
    for position, item in enumerate(program):
        if isinstance(item, bytecode.Instr):
            if count == start:
                return position
            count += 1
    raise ValueError(f"no instruction {start} in {program.name}")


def instruction_number(instructions: list[dis.Instruction], index: int) -> int:
    """The position of instructions[index] among them with EXTENDED_ARG left out (how the
    bytecode package counts instructions)."""
    return sum(1 for i in instructions[:index] if i.opname != "EXTENDED_ARG")


# instructions after which the next one does not run
_NO_FALLTHROUGH = {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP",
                   "JUMP_NO_INTERRUPT", "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS",
                   "RERAISE"}
# names a frame may read its locals through, all at once (then every local stays live)
_READS_ALL_LOCALS = {"locals", "vars", "eval", "exec", "dir", "super"}


def live_locals(code: types.CodeType, starts: list[int]) -> set[str] | None:
    """The local variables some path from any of the instructions `starts` (numbered as
    instruction_number does) may read before it writes them: the ones a resume function must
    be given. Dead ones are left out, so a loop variable about to be rebound does not become
    a guarded input of the code after a break in the loop. None: every local may be read (the
    code calls locals(), super(), ...)."""
    instructions = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    if any(i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and i.argval in _READS_ALL_LOCALS
           for i in instructions):
        return None
    index_at = {instruction.offset: number for number, instruction in enumerate(instructions)}
    for extended in (i for i in dis.get_instructions(code) if i.opname == "EXTENDED_ARG"):
        index_at.setdefault(extended.offset, next(
            n for n, i in enumerate(instructions) if i.offset > extended.offset))
    handlers = [(entry.start, entry.end, index_at[entry.target])
                for entry in dis.Bytecode(code).exception_entries]
    successors: list[list[int]] = []
    reads: list[set[str]] = []
    writes: list[set[str]] = []
    for number, instruction in enumerate(instructions):
        following = []
        if instruction.opname not in _NO_FALLTHROUGH and number + 1 < len(instructions):
            following.append(number + 1)
        if instruction.opcode in dis.hasjrel or instruction.opcode in dis.hasjabs:
            following.append(index_at[instruction.argval])
        following += [target for start, end, target in handlers
                      if start <= instruction.offset < end]
        successors.append(following)
        names = instruction.argval if isinstance(instruction.argval, tuple) else \
            (instruction.argval,)
        name = instruction.opname
        reads.append(set(names) if name.startswith("LOAD_FAST") or name == "DELETE_FAST"
                     else set())
        writes.append(set(names) if name.startswith("STORE_FAST") else set())
    live = [set() for _ in instructions]
    changed = True
    while changed:
        changed = False
        for number in reversed(range(len(instructions))):
            out = set().union(*(live[s] for s in successors[number]))
            now = reads[number] | (out - writes[number])
            if now != live[number]:
                live[number] = now
                changed = True
    return set().union(*(live[start] for start in starts if start < len(instructions)))
