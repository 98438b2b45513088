"""The symbolic interpreter: runs a code object's bytecode on tracked values.

A Frame holds the value stack, locals and cells of one function being captured; opcode
handlers (ember/capture/opcodes.py) are registered by name with the Python versions they serve,
so the 3.11/3.12 differences sit side by side. Loops are unrolled by running them; branches on
Python values follow the value; anything else raises `Unsupported` at the user's line.
"""

from __future__ import annotations

import dis
import functools
import inspect
import linecache
import sys
import traceback
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember import config, logs
from ember.capture.breaks import CALLS, JUMPS, OPERATORS, GraphBreak, Snapshot, call_parts
from ember.capture.errors import FailedOnFakes, Location, Raised, Unsupported
from ember.capture.values import (
    BuiltinValue,
    CellValue,
    Const,
    TensorValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.session import Session

VERSION = sys.version_info[:2]
Handler = Callable[["Frame", dis.Instruction], None]
HANDLERS: dict[str, Handler] = {}

# Instructions run before capture gives up on a frame (an unrolled loop that never ends).
INSTRUCTION_LIMIT = 200_000


def handler(*opnames: str, versions: tuple[tuple[int, int], ...] = ((3, 11), (3, 12))):
    """Register a handler for opcodes, for the Python versions that have them."""

    def register(fn: Handler) -> Handler:
        if VERSION in versions:
            for name in opnames:
                HANDLERS[name] = fn
        return fn

    return register


class Return(Exception):
    def __init__(self, value: Value):
        self.value = value


class Yielded(Exception):
    """A lazy generator's frame suspends at a yield (Frame.run returns the value)."""

    def __init__(self, value: Value):
        self.value = value


@functools.lru_cache(maxsize=4096)
def _stack_trace(frames: tuple[tuple[str, int, str], ...]) -> str:
    """(filename, line, function) of each frame, innermost first, as a traceback's text (a
    model's layers run the same lines: one text serves each of their ops)."""
    return "".join(traceback.format_list(
        [(filename, line, function, linecache.getline(filename, line).strip())
         for filename, line, function in reversed(frames)]))


_decoded: dict[types.CodeType, tuple[list[dis.Instruction], dict[int, int], list]] = {}


def decode(code: types.CodeType) -> tuple[list[dis.Instruction], dict[int, int], list]:
    """Instructions, offset -> index, and the exception table of a code object (cached)."""
    if code not in _decoded:
        bytecode = dis.Bytecode(code)
        instructions = list(bytecode)
        index = {instruction.offset: i for i, instruction in enumerate(instructions)}
        _decoded[code] = instructions, index, list(bytecode.exception_entries)
    return _decoded[code]


class Frame:
    def __init__(self, session: Session, code: types.CodeType, globals_: dict[str, Any],
                 locals_: dict[str, Value], cells: dict[str, Any], name: str,
                 parent: Frame | None = None, global_sources: bool = True,
                 generator: bool = False):
        if not generator and code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE |
                                              inspect.CO_ASYNC_GENERATOR):
            raise Unsupported(f"{name} is a generator or coroutine",
                              "ember captures plain functions; call the generator outside")
        self.session = session
        self.code = code
        self.globals = globals_
        self.global_sources = global_sources
        self.locals = locals_
        self.cells = cells
        self.name = name
        self.parent = parent
        self.stack: list[Value] = []
        self.kw_names: tuple[str, ...] = ()
        self.instructions, self.index_of, self.exception_table = decode(code)
        self.pc = 0
        self.current: dis.Instruction | None = None
        self.yielded: list[Value] = []  # a generator expression's values, all of them
        # a generator run as it is driven (inlining.resume): each yield suspends the frame,
        # `finished` once it returned
        self.lazy = False
        self.finished = False
        self.handling = 0  # except blocks this frame is inside (PUSH_EXC_INFO, POP_EXCEPT)

    # -- stack ----------------------------------------------------------------------------
    def push(self, value: Value) -> None:
        self.stack.append(value)

    def pop(self) -> Value:
        return self.stack.pop()

    def popn(self, count: int) -> list[Value]:
        if count == 0:
            return []
        values = self.stack[-count:]
        del self.stack[-count:]
        return values

    def peek(self, depth: int = 1) -> Value:
        return self.stack[-depth]

    # -- control --------------------------------------------------------------------------
    def jump(self, offset: int) -> None:
        self.pc = self.index_of[offset]

    def location(self) -> Location:
        line = self.code.co_firstlineno
        if self.current is not None and self.current.positions is not None \
                and self.current.positions.lineno is not None:
            line = self.current.positions.lineno
        return Location(self.code.co_filename, line, self.name)

    def stack_trace(self) -> str:
        """Where the running instruction is, with the frames that inlined this one, in the
        format of FX's node.meta["stack_trace"] (Dynamo's): innermost last."""
        frames, frame = [], self
        while frame is not None:
            location = frame.location()
            frames.append((location.filename, location.line, location.function))
            frame = frame.parent
        return _stack_trace(tuple(frames))

    def handler_of(self, offset: int) -> Any:
        """The exception table's entry that protects the instruction at `offset` (None: an
        exception there leaves the frame). CPython 3.11+ keeps the entries apart, so one at
        most covers an offset."""
        for entry in self.exception_table:
            if entry.start <= offset < entry.end:
                return entry
        return None

    def inside_a_handler_s_reach(self) -> bool:
        """Would an exception raised by the running instruction, or by the calls of the
        frames that inlined this one, reach an except clause of the captured code? (A
        with-block's exit, a finally block and an except block's cleanup pass it on:
        followed to the block around them. transformers' output-capturing wrapper holds
        every model's forward in a try/finally.)"""
        frame = self
        while frame is not None:
            if frame.current is not None and frame._caught_at(frame.current.offset):
                return True
            frame = frame.parent
        return False

    def _caught_at(self, offset: int) -> bool:
        for _ in range(16):  # (nested blocks, each passing the exception outward)
            entry = self.handler_of(offset)
            if entry is None:
                return False
            if self._an_except_clause(self.index_of[entry.target]):
                return True
            offset = entry.target
        return True  # (deeper than any code writes: on the safe side)

    def _an_except_clause(self, start: int) -> bool:
        """Does the handler at instruction `start` begin an except clause: a bare `except:`
        (the exception popped at once) or the test of one (its classes loaded, then
        CHECK_EXC_MATCH)? Not a with-block's exit, a finally block or a cleanup."""
        following = self.instructions[start:start + 2]
        if [i.opname for i in following] == ["PUSH_EXC_INFO", "POP_TOP"]:
            return True  # (a bare except)
        if following[0].opname != "PUSH_EXC_INFO":
            return False
        for instruction in self.instructions[start + 1:]:
            if instruction.opname == "CHECK_EXC_MATCH":
                return True
            if not instruction.opname.startswith(("LOAD_", "BUILD_TUPLE", "PUSH_NULL")):
                return False
        return False

    def unbreakable(self, instruction: dis.Instruction, breakable: bool
                    ) -> tuple[str, str] | None:
        """Where this instruction lies if the graph cannot break there, and what to do:
        inside an autocast region, a backend switch or a with-block of a Python context
        manager (the resumed code would have to enter it again). A try body can break: the
        runner sends an exception of the native part to the handler's resume function."""
        if breakable and self.session.entered_regions:
            return f"inside {self.session.entered_regions[-1].describe()}", \
                "keep the with-block outside the compiled function, or what breaks out of it"
        if breakable and self.session.open_contexts:
            return "inside a with-block of a Python context manager", \
                "keep the with-block outside the compiled function, or what breaks out of it"
        if breakable and self.handling:
            # (the resumed code would start inside the handler, the exception it handles
            # gone)
            return "inside an except block", "keep the try statement outside the compiled " \
                "function, or what breaks in its handler"
        return None

    def run(self) -> Value:
        session = self.session
        # (only the frame being captured breaks: one run for a call the capture makes
        # itself — a property's getter, __getitem__, map's function — has no parent either)
        breakable = self.parent is None and session.inline_depth == 0 and session.allow_breaks
        outer, session.builder.frame = session.builder.frame, self
        try:
            while True:
                instruction = self.instructions[self.pc]
                self.current = instruction
                self.pc += 1
                session.instructions_run += 1
                if session.instructions_run > INSTRUCTION_LIMIT:
                    raise Unsupported("the function runs too many instructions to unroll",
                                      "a Python loop runs very long; move it outside")
                fn = HANDLERS.get(instruction.opname)
                if fn is None:
                    raise Unsupported(f"Python construct {instruction.opname} is not supported"
                                      f" yet", "rewrite it, or keep it outside the compiled "
                                      "function")
                unbreakable = self.unbreakable(instruction, breakable)
                snapshot = self.snapshot() if breakable and unbreakable is None else None
                try:
                    self.execute(fn, instruction)
                except Raised as error:
                    if self.catch(error, instruction):
                        continue
                    if unbreakable is not None or snapshot is not None:
                        raise self.refused(instruction, error, unbreakable, snapshot) from None
                    raise
                except FailedOnFakes:
                    raise  # (no break: the call runs eagerly from its start)
                except Unsupported as error:
                    if unbreakable is not None or snapshot is not None:
                        raise self.refused(instruction, error, unbreakable, snapshot) from None
                    raise
        except Return as result:
            self.finished = True
            return result.value
        except Yielded as suspended:  # (a lazy generator: resumed where it stopped)
            return suspended.value
        except Unsupported as error:
            raise error.at(self.location(), session.inline_depth) from None
        finally:
            session.builder.frame = outer

    def refused(self, instruction: dis.Instruction, error: Unsupported,
                unbreakable: tuple[str, str] | None, snapshot: Snapshot | None) -> Exception:
        """What an instruction ember cannot capture raises: in code where the graph cannot
        break, the refusal that sends the frame to eager; else the GraphBreak before it."""
        if unbreakable is not None:
            # code that runs as any other while it is captured, but where the graph cannot
            # break: what cannot be captured sends the frame to eager
            where, hint = unbreakable
            return Unsupported(f"{error.reason}, {where}", error.hint or hint)
        return self.graph_break(instruction, snapshot, error.at(self.location(), 0))

    def catch(self, error: Raised, instruction: dis.Instruction) -> bool:
        """Send a Python exception the captured code raised at `instruction` to this frame's
        handler for it, as CPython does (the stack cut to the entry's depth, the raising
        instruction's offset where the entry asks for it, the exception): False where no
        try block covers the instruction, or where the handler is a with-block's exit (which
        ember does not run with an exception: the exception goes on out, and the code runs
        natively)."""
        entry = self.handler_of(instruction.offset)
        if entry is None:
            return False
        target = self.index_of[entry.target]
        following = self.instructions[target + 1:target + 2]
        if following and following[0].opname == "WITH_EXCEPT_START":
            return False
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(Const(instruction.offset))
        self.push(Const(error.exception))
        self.pc = target
        return True

    def execute(self, fn: Callable, instruction: dis.Instruction) -> None:
        """Run one instruction's handler; an error of ember's own there (not a capture
        refusal) is said once as a warning and refused, so that the code runs natively (a
        break here, or the frame eagerly) and the user's program goes on."""
        try:
            fn(self, instruction)
        except (Unsupported, GraphBreak, Return, Yielded):
            raise
        except Exception as error:
            if "raise" in config.settings.logs:
                raise
            reason = f"internal error in ember's capture ({type(error).__name__}: {error})"
            logs.channel("graph_breaks").warning("%s: %s; please report it. That code runs "
                                                 "natively.", self.location(), reason)
            raise Unsupported(reason) from None

    # -- graph breaks (root frame only) ----------------------------------------------------
    def snapshot(self) -> Snapshot:
        session = self.session
        session.side_effects.reset_changes()
        return Snapshot(list(self.stack), dict(self.locals), self.kw_names,
                        session.savepoint())

    def graph_break(self, instruction: dis.Instruction, snapshot: Snapshot,
                    error: Unsupported) -> Exception:
        """The GraphBreak that undoes `instruction`, or `error` when it cannot be undone."""
        session = self.session
        name = instruction.opname
        if name not in CALLS and name not in JUMPS and name not in OPERATORS:
            return error
        # (everything the instruction changed, however deep in inlined calls, is put back:
        # the native rerun makes those changes for real)
        session.roll_back(snapshot.point)
        cells = {cell_name: cell.contents for cell_name, cell in self.cells.items()
                 if isinstance(cell, CellValue) and cell.contents is not None}
        index = self.pc - 1
        if name in CALLS:
            below, callee, args, kwargs, star, star_kwargs = call_parts(
                instruction, snapshot.stack, snapshot.kw_names)
            return GraphBreak(error, instruction, index, "call", below, snapshot.locals, cells,
                              callee, args, kwargs, star, star_kwargs)
        if name in OPERATORS:
            function, count = OPERATORS[name]
            return GraphBreak(error, instruction, index, "call", snapshot.stack[:-count],
                              snapshot.locals, cells, BuiltinValue(function, None),
                              snapshot.stack[-count:])
        condition = snapshot.stack[-1]
        if not isinstance(condition, TensorValue):
            return error
        when, keeps = JUMPS[name]
        return GraphBreak(error, instruction, index, "jump", snapshot.stack[:-1],
                          snapshot.locals, cells, condition=condition, jumps_when=when,
                          keeps=keeps, target_index=self.index_of[instruction.argval])

    def cell(self, name: str) -> Any:
        cell = self.cells.get(name)
        if cell is None:
            cell = self.cells[name] = CellValue(None)
        return cell
