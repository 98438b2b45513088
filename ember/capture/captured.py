"""Capture a call: bind the real arguments, interpret the function's bytecode, and package
the result — the FX graph, the sources of its inputs, its guards, and generated code that
runs the compiled graph, replays side effects and rebuilds the return value.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any

import torch
import torch.fx

from ember import config, logs, torch_internals
from ember.capture import (  # noqa: F401  (register the opcode handlers)
    container_opcodes,
    contexts,
    exception_opcodes,
    opcodes,
    scalar_indices,
)
from ember.capture.breaks import (
    STACK_PREFIX,
    GraphBreak,
    argument_order,
    instruction_number,
    live_locals,
    stack_parameters,
)
from ember.capture.errors import (
    AssumptionFailed,
    AssumptionsRefused,
    GraphRaised,
    Unsupported,
    ViewsRefused,
)
from ember.capture.guards import GuardSet
from ember.capture.interpreter import Frame
from ember.capture.rebuild import Rebuilder
from ember.capture.semantics import RealCell
from ember.capture.session import Session
from ember.capture.side_effects import Effect
from ember.capture.sources import ClosureSource, LocalSource, Source, advance
from ember.capture.symbols import DynamicPolicy, NeedsSymbols, Shapes
from ember.capture.values import (
    NULL,
    BoundMethodValue,
    Const,
    DictValue,
    FunctionValue,
    ModuleValue,
    Value,
)


@dataclasses.dataclass
class Resumption:
    """A resume function the runner calls by `name`: the code from instruction `start` (as
    the bytecode package counts), taking the stack (NULL slots pushed, not passed), then the
    locals and cells by name."""

    name: str
    start: int
    stack: list[Value]
    locals: list[str]
    cells: list[str]
    # an exception handler's entry: the instruction that raised, when the handler's table
    # entry asks for its position (pushed below the exception, the last stack value)
    lasti: int | None = None


@dataclasses.dataclass
class Captured:
    graph_module: torch.fx.GraphModule
    input_sources: list[Source]
    example_inputs: list[torch.Tensor]
    guards: GuardSet
    runner_source: str            # def run(L): ... (fetch, call `compiled`, effects, result)
    runner_namespace: dict[str, Any]
    scope: dict[str, Any]         # G, GG, C, K for guards and the runner
    op_count: int
    # at a graph break: why, the resume functions, and functions the runner calls compiled
    break_reason: Unsupported | None = None
    resumptions: list[Resumption] = dataclasses.field(default_factory=list)
    callees: dict[str, Any] = dataclasses.field(default_factory=dict)
    runner_lines: list[str] = dataclasses.field(default_factory=list)  # the runner after its fetch
    # sizes are symbols: one capture serves a family of shapes (guards: the "size" relations)
    symbolic: bool = False
    # the code objects of the functions it inlined (a warm start checks their files)
    inlined_codes: list[types.CodeType] = dataclasses.field(default_factory=list)
    # what it read of modules that their identity guards alone stand for (Session's)
    identity_reads: list[str] = dataclasses.field(default_factory=list)
    # where the checks it assumed pass are (branches.assume_it_passes: the runner tests them)
    assumed_checks: list[str] = dataclasses.field(default_factory=list)


def capture(function: types.FunctionType, arguments: dict[str, Any], fullgraph: bool,
            policy: DynamicPolicy | None = None, where: str = ""
            ) -> tuple[Captured | None, Session, Unsupported | None]:
    """Interpret `function` on the bound `arguments` (name -> real value). Sizes are symbols
    where `policy` says (dynamic=, marks, automatic dynamic): a capture starts static and
    starts again with a ShapeEnv at the first size that must be a symbol."""
    policy = policy if policy is not None else DynamicPolicy(dynamic=False)
    symbolic, assuming, views_refused = False, True, frozenset()
    while True:
        with torch_internals.quiet_failed_meta_runs():
            captured, session, error = _capture(function, arguments, fullgraph,
                                                Shapes(policy, symbolic, where), assuming,
                                                views_refused)
        if session.builder.shapes.wants_symbols and not symbolic:
            symbolic = True   # (again, symbolic)
        elif session.assumptions_refused:
            assuming = False  # (again, each check a break)
        elif session.views_refused - views_refused:
            views_refused |= session.views_refused  # (again, those subscripts breaks)
        else:
            return captured, session, error


def _capture(function: types.FunctionType, arguments: dict[str, Any], fullgraph: bool,
             shapes: Shapes, assuming: bool = True,
             views_refused: frozenset = frozenset()
             ) -> tuple[Captured | None, Session, Unsupported | None]:
    session = Session(fullgraph, shapes, assuming, views_refused)
    code = function.__code__
    try:
        locals_ = {name: session.wrap(value, LocalSource(name))
                   for name, value in arguments.items()}
        cells: dict[str, Any] = {}
        for index, (name, cell) in enumerate(zip(code.co_freevars, function.__closure__ or ())):
            cells[name] = RealCell(cell, ClosureSource(index, name))
        session.globals_index(function.__globals__)
        frame = Frame(session, code, function.__globals__, locals_, cells,
                      function.__qualname__)
        try:
            result = frame.run()
            captured = package(session, result)
        except GraphBreak as stop:
            captured = package_break(session, stop, frame)
    except NeedsSymbols:  # (capture() starts again, symbolic)
        return None, session, None
    except AssumptionsRefused:  # (capture() starts again, assuming nothing)
        session.assumptions_refused = True
        return None, session, None
    except ViewsRefused as refused:  # (capture() starts again, those subscripts breaks)
        session.views_refused = frozenset(refused.sites)
        return None, session, None
    except Unsupported as error:
        return None, session, error
    except Exception as error:  # ember's own error: the function runs eagerly, said once
        if "raise" in config.settings.logs:
            raise
        reason = f"internal error in ember's capture ({type(error).__name__}: {error})"
        logs.channel("graph_breaks").warning("%s (%s:%d): %s; please report it. The function "
                                             "runs eagerly.", function.__qualname__,
                                             code.co_filename, code.co_firstlineno, reason)
        return None, session, Unsupported(reason)
    finally:
        while session.entered_regions:  # (regions the capture entered and never left)
            contexts.leave_for_real(session.entered_regions.pop())
    return captured, session, None


def effect_lines(session: Session, writer: Rebuilder) -> list[str]:
    """Replay the side effects, then leave grad mode as the captured code left it. (Iterators
    from outside are advanced later: advance_lines.)"""
    lines = []
    for effect in session.side_effects.effects:
        if effect.kind == "advance":
            continue
        line = _effect_line(effect, writer)
        lines += writer.flush() + [line]
    if session.grad_enabled != session.initial_grad_enabled:
        # torch.set_grad_enabled(b) as a statement: the caller sees the new mode
        lines.append(f"torch._C._set_grad_enabled({session.grad_enabled})")
    return lines


def advance_lines(session: Session, writer: Rebuilder) -> list[str]:
    """The temporaries still to make, then the iterators from outside advanced by what the
    captured code took from them (items handed on were read in the prologue)."""
    lines = writer.flush()
    for effect in session.side_effects.effects:
        if effect.kind == "advance" and effect.value.position:
            lines.append(_effect_line(effect, writer))
    return lines


_GRAPH_CALL = "outputs = compiled(*inputs)"  # (the runner's call of the graph)


def runner_text(session: Session, writer: Rebuilder, tail: list[str]) -> tuple[str, list[str]]:
    """def run(L): fetch inputs, run the graph, then `tail` (effects, result or a break); and
    the lines after the fetch (a guarded runner fetches through its guards' variables)."""
    builder = session.builder
    checks = _assumption_lines(session, writer)
    scalar_indices.check(session, writer.outputs)
    builder.output(writer.outputs)
    fetch = ", ".join(source.expr() for source in builder.input_sources)
    run = [_GRAPH_CALL]
    if _made_in_inference_mode(builder, writer.outputs):  # (its results: inference tensors)
        run = ["with torch.inference_mode():", f"    {_GRAPH_CALL}"]
    written = builder.written_inputs()
    save, restore, rerun = [], [], not written  # (an eager rerun finds the inputs as they came)
    if written and builder.caught_inside:
        # (the user's handler may catch what the graph raises: the inputs it writes are
        # kept, and put back before the eager rerun, which writes them once)
        save = [f"saved = {writer.constant(_save_inputs)}(inputs, {tuple(written)})"]
        restore = [f"    {writer.constant(_restore_inputs)}(inputs, {tuple(written)}, saved)"]
        rerun = True
    # (a graph that raises inside its `with torch.no_grad()` leaves the mode as it came)
    run = ["try:", *(f"    {line}" for line in run), "except Exception as error:",
           f"    torch.set_grad_enabled({session.initial_grad_enabled})", *restore,
           f"    raise {writer.constant(GraphRaised)}(error) from None" if rerun else "    raise"]
    after = [*save, *run, *checks, *tail]
    lines = [f"inputs = [{fetch}]", *after]
    return "def run(L):\n" + "".join(f"    {line}\n" for line in lines), after


def after_graph_call(lines: list[str]) -> list[str] | None:
    """The runner's lines after its plain graph call (runner_text's: in a try statement or
    not), None where they do not start with one (a call under inference mode, or one that
    keeps the inputs it writes)."""
    if lines[:2] == ["try:", f"    {_GRAPH_CALL}"]:
        return lines[5:]
    return lines[1:] if lines[:1] == [_GRAPH_CALL] else None


def _save_inputs(inputs: list, positions: tuple[int, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [inputs[i].clone() for i in positions]


def _restore_inputs(inputs: list, positions: tuple[int, ...], saved: list[torch.Tensor]
                    ) -> None:
    with torch.no_grad():
        for i, value in zip(positions, saved):
            inputs[i].copy_(value)


def _assumption_lines(session: Session, writer: Rebuilder) -> list[str]:
    """The runner's tests of the checks the capture assumed pass (branches.assume_it_passes),
    right after the graph and before any effect: where one fails, AssumptionFailed (the
    function runs eagerly from its start). Refused where the graph writes an input in place
    (an eager rerun would write it twice): the capture starts again without assuming."""
    if not session.assumptions:
        return []
    if session.builder.writes_inputs():
        raise AssumptionsRefused()
    failed = writer.constant(AssumptionFailed)
    return [f"if bool({writer.expr(condition)}) is not {passes}: raise {failed}()"
            for condition, passes, _ in session.assumptions]


def _made_in_inference_mode(builder: Any, outputs: list[Any]) -> bool:
    """Are the graph's results made inside torch.inference_mode() (eager's are inference
    tensors: the graph then runs under it)? Some inside and some outside: refused."""
    made = [v.node for v in outputs if v.node.op != "placeholder"]
    inside = [node in builder.made_in_inference for node in made]
    if any(inside) and not all(inside):
        raise Unsupported("results made inside and outside torch.inference_mode() leave the "
                          "graph together", "return them from separate functions")
    return bool(made) and all(inside)


def package(session: Session, result: Value) -> Captured:
    writer = Rebuilder(session.builder.shapes)
    lines = effect_lines(session, writer)
    result_expr = writer.expr(result)
    lines += advance_lines(session, writer) + [f"return {result_expr}"]
    text, after = runner_text(session, writer, writer.prologue + lines)
    builder = session.builder
    graph_module = builder.module()
    scope = {"GG": session.globals_dicts, "G": session.globals_dicts[0] if session.globals_dicts
             else {}, "K": session.constants}
    _size_guards(session)
    return Captured(graph_module, list(builder.input_sources), list(builder.input_values),
                    session.guards, text, writer.namespace, scope, builder.op_count,
                    runner_lines=after, symbolic=builder.shapes.symbolic,
                    inlined_codes=list(session.inlined_codes),
                    identity_reads=list(session.identity_reads),
                    assumed_checks=[str(where) for *_, where in session.assumptions])


def _size_guards(session: Session) -> None:
    """The relations the symbols must keep, as "size" guards (read last: after everything
    that could specialize a size — the graph, the rebuilt results — has run)."""
    session.guards.shapes = session.builder.shapes
    session.guards.add_size_relations()


def package_break(session: Session, stop: GraphBreak, frame: Frame) -> Captured:
    """The graph up to the break, and a runner that finishes the instruction natively and
    calls the resume function(s)."""
    writer = Rebuilder(session.builder.shapes, {id(cell) for cell in frame.cells.values()})
    lines = effect_lines(session, writer)
    below = [writer.expr(v) for v in stop.below if v is not NULL]
    after = frame.instructions
    number = instruction_number(after, stop.index + 1)
    starts = [number] if stop.kind == "call" else \
        [number, instruction_number(after, stop.target_index)]
    handler = frame.handler_of(stop.instruction.offset)
    if handler is not None:  # (an exception the native part raises goes to its handler)
        starts.append(instruction_number(after, frame.index_of[handler.target]))
    read = live_locals(frame.code, starts)
    # a resume function's own stack arguments are dead once its prologue pushed them, and so
    # are locals the code after the break writes before it reads them
    live = {name: value for name, value in stop.locals.items()
            if not name.startswith(STACK_PREFIX) and (read is None or name in read)}
    local_names = list(live)
    locals_ = [writer.expr(v) for v in live.values()]
    cell_names = [name for name in stop.cells if name not in live]
    cells_ = [writer.expr(stop.cells[name]) for name in cell_names]
    callees: dict[str, Any] = {}
    resumptions = []

    def resume_call(name: str, start: int, stack: list[Value], stack_exprs: list[str],
                    lasti: int | None = None) -> str:
        resumptions.append(Resumption(name, start, stack, local_names, cell_names, lasti))
        stack_names = stack_parameters(stack)
        exprs = dict(zip([*stack_names, *local_names, *cell_names],
                         [*stack_exprs, *locals_, *cells_]))
        order = argument_order(frame.code, stack_names, local_names, cell_names)
        return f"{name}({', '.join(exprs[n] for n in order)})"

    def natively(statement: str) -> list[str]:
        """`statement` as the runner runs it: inside a try block of the user's code, an
        exception it raises goes on in the resume function of the block's handler, with the
        stack the handler's table entry keeps (as CPython unwinds it)."""
        if handler is None:
            return [statement]
        kept = stop.below[:handler.depth]
        kept_exprs = [writer.expr(v) for v in kept if v is not NULL]
        raised = instruction_number(after, stop.index)
        resume = resume_call("resume_handler",
                             instruction_number(after, frame.index_of[handler.target]),
                             [*kept, Const(None)], [*kept_exprs, "caught"],
                             raised if handler.lasti else None)
        return ["caught = None", "try:", f"    {statement}",
                "except BaseException as error:", "    caught = error",
                "if caught is not None:", f"    return {resume}"]

    if stop.kind == "call":
        # a function that broke inside is called compiled (its own breaks resume in its own
        # frame); one that was itself the problem (print, graph_break) is called as it is
        inside = stop.reason.depth > 0
        callee = _callee(stop.callee, writer, callees) if inside else writer.expr(stop.callee)
        if _optimizer_step(stop.callee):  # opt.step() becomes ember's fused update
            from ember import optim

            if isinstance(stop.callee, BoundMethodValue):
                receiver = writer.expr(stop.callee.receiver)
                callee = f"{writer.constant(optim.step)}.__get__({receiver})"
            else:  # (an LR scheduler's wrapper of the optimizer's step)
                wrapper = writer.expr(stop.callee)
                callee = f"{writer.constant(optim.scheduled_step)}.__get__({wrapper})"
        arguments = [writer.expr(a) for a in stop.args]
        arguments += [f"{k}={writer.expr(v)}" for k, v in stop.kwargs.items()]
        if stop.star is not None:
            arguments.append(f"*{writer.expr(stop.star)}")
        if stop.star_kwargs is not None:
            arguments.append(f"**{writer.expr(stop.star_kwargs)}")
        lines += advance_lines(session, writer)
        lines += natively(f"result = {callee}({', '.join(arguments)})")
        stack = [*stop.below, Const(None)]  # the slot the call's result takes
        call = resume_call("resume_next", number, stack, [*below, "result"])
        lines.append(f"return {call}")
    else:
        condition = writer.expr(stop.condition)
        lines += advance_lines(session, writer)
        taken_stack = [*stop.below, stop.condition] if stop.keeps else list(stop.below)
        taken_exprs = [*below, condition] if stop.keeps else below
        taken = resume_call("resume_taken", instruction_number(after, stop.target_index),
                            taken_stack, taken_exprs)
        following = resume_call("resume_next", number, list(stop.below), below)
        lines += natively(f"taken = bool({condition}) is {stop.jumps_when}")
        lines.append("if taken:")
        lines.append(f"    return {taken}")
        lines.append(f"return {following}")
    text, after = runner_text(session, writer, writer.prologue + lines)
    builder = session.builder
    graph_module = builder.module()
    scope = {"GG": session.globals_dicts, "G": session.globals_dicts[0] if session.globals_dicts
             else {}, "K": session.constants}
    _size_guards(session)
    return Captured(graph_module, list(builder.input_sources), list(builder.input_values),
                    session.guards, text, writer.namespace, scope, builder.op_count,
                    stop.reason, resumptions, callees, runner_lines=after,
                    symbolic=builder.shapes.symbolic, inlined_codes=list(session.inlined_codes),
                    identity_reads=list(session.identity_reads),
                    assumed_checks=[str(where) for *_, where in session.assumptions])


def _optimizer_step(callee: Value) -> bool:
    if isinstance(callee, FunctionValue):
        return torch_internals.scheduler_wrapped_optimizer(callee.value) is not None
    return isinstance(callee, BoundMethodValue) and \
        isinstance(getattr(callee.receiver, "value", None), torch.optim.Optimizer) and \
        getattr(getattr(callee.function, "value", None), "__name__", "") == "step"


def _callee(callee: Value, writer: Rebuilder, callees: dict[str, Any]) -> str:
    """The expression of what the break calls natively: user functions and module forwards
    are called through their own ember-compiled version (named in `callees`); a generator
    or coroutine function natively (the generator it makes runs as the caller drives it)."""
    from ember import torch_internals

    def compiled(function: types.FunctionType) -> str:
        name = f"callee{len(callees)}"
        callees[name] = function
        return name

    if isinstance(callee, FunctionValue) and _plain_function(callee.value):
        return compiled(callee.value)
    if isinstance(callee, BoundMethodValue) and isinstance(callee.function, FunctionValue) \
            and _plain_function(callee.function.value):
        return f"{compiled(callee.function.value)}.__get__({writer.expr(callee.receiver)})"
    if isinstance(callee, ModuleValue) and not torch_internals.module_has_hooks(callee.value):
        forward = type(callee.value).forward
        if isinstance(forward, types.FunctionType) and _plain_function(forward):
            return f"{compiled(forward)}.__get__({writer.expr(callee)})"
    return writer.expr(callee)


def _plain_function(function: Any) -> bool:
    """A Python function that returns when called (not a generator or coroutine function)."""
    return isinstance(function, types.FunctionType) and not function.__code__.co_flags & (
        inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)


def _effect_line(effect: Effect, writer: Rebuilder) -> str:
    if effect.kind == "setattr":
        return f"setattr({effect.target.expr()}, {effect.name!r}, {writer.expr(effect.value)})"
    if effect.kind == "setglobal":
        return f"GG[{effect.globals_index}][{effect.name!r}] = {writer.expr(effect.value)}"
    if effect.kind == "setcell":
        return f"{effect.target.expr()} = {writer.expr(effect.value)}"
    if effect.kind == "call":
        args = ", ".join(writer.expr(v) for v in effect.value.items)
        call = f"{writer.constant(effect.function)}({args})"
        return call if effect.result is None else f"{writer.result(effect.result)} = {call}"
    if effect.kind == "advance":
        return f"{writer.constant(advance)}({effect.target.expr()}, {effect.value.position})"
    container = effect.value
    if isinstance(container, DictValue):
        items = writer.expr(container, prefer_source=False)
        target = effect.target.expr()
        return f"{target}.clear(); {target}.update({items})"
    return f"{effect.target.expr()}[:] = {writer.expr(container, prefer_source=False)}"


def bind(function: types.FunctionType, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    signature = inspect.signature(function, follow_wrapped=False)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
