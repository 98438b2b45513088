"""One handler per CPython opcode, tagged with the Python versions it serves (3.11, 3.12).

Handlers move tracked values between the stack, locals and cells, and hand the semantics of
operations (attributes, calls, operators) to ember/capture/semantics.py. The opcodes that build
and take apart containers (and `match` patterns) are in ember/capture/container_opcodes.py.
"""

from __future__ import annotations

import builtins
import dis
import importlib
import sys

from ember.capture import attribute_writes, attributes, branches, contexts, inlining, semantics
from ember.capture.errors import Raised, Unsupported
from ember.capture.interpreter import Frame, Return, Yielded, handler
from ember.capture.values import (
    NULL,
    BoundMethodValue,
    CellValue,
    Const,
    DictValue,
    GeneratorValue,
    IteratorValue,
    NestedFunctionValue,
    SequenceValue,
    SetValue,
    SliceValue,
    TensorValue,
    Value,
)

Instruction = dis.Instruction


# -- no-ops and the stack ------------------------------------------------------------------
@handler("NOP", "RESUME", "EXTENDED_ARG", "CACHE")
def _nop(frame: Frame, instruction: Instruction) -> None:
    pass


@handler("PRECALL", versions=((3, 11),))
def _precall(frame: Frame, instruction: Instruction) -> None:
    pass


@handler("PUSH_NULL")
def _push_null(frame: Frame, instruction: Instruction) -> None:
    frame.push(NULL)


@handler("POP_TOP")
def _pop_top(frame: Frame, instruction: Instruction) -> None:
    frame.pop()


@handler("COPY")
def _copy(frame: Frame, instruction: Instruction) -> None:
    frame.push(frame.peek(instruction.arg))


@handler("SWAP")
def _swap(frame: Frame, instruction: Instruction) -> None:
    stack, i = frame.stack, instruction.arg
    stack[-1], stack[-i] = stack[-i], stack[-1]


@handler("LOAD_CONST")
def _load_const(frame: Frame, instruction: Instruction) -> None:
    frame.push(semantics.constant(instruction.argval))


@handler("RETURN_VALUE")
def _return_value(frame: Frame, instruction: Instruction) -> None:
    raise Return(frame.pop())


@handler("RETURN_CONST", versions=((3, 12),))
def _return_const(frame: Frame, instruction: Instruction) -> None:
    raise Return(semantics.constant(instruction.argval))


# -- locals, cells, globals ----------------------------------------------------------------
@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(frame: Frame, instruction: Instruction) -> None:
    name = instruction.argval
    if name not in frame.locals:
        raise Unsupported(f"local variable {name!r} is read before it is assigned",
                          "eager raises UnboundLocalError here")
    frame.push(frame.locals[name])


@handler("LOAD_FAST_AND_CLEAR", versions=((3, 12),))
def _load_fast_and_clear(frame: Frame, instruction: Instruction) -> None:
    frame.push(frame.locals.pop(instruction.argval, NULL))


@handler("STORE_FAST")
def _store_fast(frame: Frame, instruction: Instruction) -> None:
    value = frame.pop()
    if value is NULL:
        frame.locals.pop(instruction.argval, None)
    else:
        frame.locals[instruction.argval] = value


@handler("DELETE_FAST")
def _delete_fast(frame: Frame, instruction: Instruction) -> None:
    frame.locals.pop(instruction.argval, None)


@handler("MAKE_CELL")
def _make_cell(frame: Frame, instruction: Instruction) -> None:
    name = instruction.argval
    if name not in frame.cells:
        frame.cells[name] = CellValue(frame.locals.pop(name, None))


@handler("COPY_FREE_VARS")
def _copy_free_vars(frame: Frame, instruction: Instruction) -> None:
    pass  # the frame was created with its closure cells in place


@handler("LOAD_CLOSURE")
def _load_closure(frame: Frame, instruction: Instruction) -> None:
    frame.push(frame.cell(instruction.argval))


@handler("LOAD_DEREF")
def _load_deref(frame: Frame, instruction: Instruction) -> None:
    frame.push(semantics.read_cell(frame, instruction.argval))


@handler("STORE_DEREF")
def _store_deref(frame: Frame, instruction: Instruction) -> None:
    semantics.write_cell(frame, instruction.argval, frame.pop())


@handler("LOAD_GLOBAL")
def _load_global(frame: Frame, instruction: Instruction) -> None:
    if instruction.arg & 1:
        frame.push(NULL)
    frame.push(semantics.load_global(frame, instruction.argval))


@handler("STORE_GLOBAL")
def _store_global(frame: Frame, instruction: Instruction) -> None:
    semantics.store_global(frame, instruction.argval, frame.pop())


# -- attributes ----------------------------------------------------------------------------
@handler("LOAD_ATTR")
def _load_attr(frame: Frame, instruction: Instruction) -> None:
    receiver = frame.pop()
    value = attributes.get_attribute(frame.session, receiver, instruction.argval)
    if instruction.opname == "LOAD_ATTR" and semantics.VERSION >= (3, 12) and instruction.arg & 1:
        frame.push(NULL)  # method form: NULL + bound callable is equivalent for CALL
    frame.push(value)


@handler("LOAD_METHOD", versions=((3, 11),))
def _load_method(frame: Frame, instruction: Instruction) -> None:
    receiver = frame.pop()
    frame.push(NULL)
    frame.push(attributes.get_attribute(frame.session, receiver, instruction.argval))


@handler("LOAD_SUPER_ATTR", versions=((3, 12),))
def _load_super_attr(frame: Frame, instruction: Instruction) -> None:
    receiver = frame.pop()
    cls = frame.pop()
    frame.pop()  # the global `super`
    value = attributes.super_attribute(frame, cls, receiver, instruction.argval)
    if instruction.arg & 1:
        frame.push(NULL)
    frame.push(value)


@handler("STORE_ATTR")
def _store_attr(frame: Frame, instruction: Instruction) -> None:
    receiver = frame.pop()
    value = frame.pop()
    attribute_writes.set_attribute(frame.session, receiver, instruction.argval, value)


# -- operators -----------------------------------------------------------------------------
@handler("BINARY_OP")
def _binary_op(frame: Frame, instruction: Instruction) -> None:
    right = frame.pop()
    left = frame.pop()
    frame.push(semantics.binary(frame.session, instruction.argrepr, left, right))


@handler("UNARY_NEGATIVE", "UNARY_NOT", "UNARY_INVERT", "UNARY_POSITIVE")
def _unary(frame: Frame, instruction: Instruction) -> None:
    operation = {"UNARY_NEGATIVE": "-", "UNARY_NOT": "not", "UNARY_INVERT": "~",
                 "UNARY_POSITIVE": "+"}[instruction.opname]
    frame.push(semantics.unary(frame.session, operation, frame.pop()))


@handler("CALL_INTRINSIC_1", versions=((3, 12),))
def _call_intrinsic_1(frame: Frame, instruction: Instruction) -> None:
    name = instruction.argrepr
    if name == "INTRINSIC_UNARY_POSITIVE":
        frame.push(semantics.unary(frame.session, "+", frame.pop()))
    elif name == "INTRINSIC_LIST_TO_TUPLE":
        value = frame.pop()
        frame.push(SequenceValue(list(value.items), tuple))
    else:
        raise Unsupported(f"Python construct {name} is not supported yet")


@handler("LIST_TO_TUPLE", versions=((3, 11),))
def _list_to_tuple(frame: Frame, instruction: Instruction) -> None:
    value = frame.pop()
    frame.push(SequenceValue(list(value.items), tuple))


@handler("COMPARE_OP")
def _compare_op(frame: Frame, instruction: Instruction) -> None:
    right = frame.pop()
    left = frame.pop()
    operation = instruction.argval if isinstance(instruction.argval, str) else instruction.argrepr
    frame.push(semantics.compare(frame.session, operation, left, right))


@handler("IS_OP")
def _is_op(frame: Frame, instruction: Instruction) -> None:
    right = frame.pop()
    left = frame.pop()
    same = semantics.identical(left, right, frame.session)
    frame.push(Const(same != bool(instruction.arg)))


@handler("CONTAINS_OP")
def _contains_op(frame: Frame, instruction: Instruction) -> None:
    container = frame.pop()
    item = frame.pop()
    found = semantics.contains(frame.session, container, item)
    frame.push(Const(found != bool(instruction.arg)))


# -- subscripts and slices -----------------------------------------------------------------
@handler("BINARY_SUBSCR")
def _binary_subscr(frame: Frame, instruction: Instruction) -> None:
    key = frame.pop()
    container = frame.pop()
    frame.push(semantics.get_item(frame.session, container, key))


@handler("BINARY_SLICE", versions=((3, 12),))
def _binary_slice(frame: Frame, instruction: Instruction) -> None:
    stop = frame.pop()
    start = frame.pop()
    container = frame.pop()
    key = SliceValue(start, stop, Const(None))
    frame.push(semantics.get_item(frame.session, container, key))


@handler("STORE_SUBSCR")
def _store_subscr(frame: Frame, instruction: Instruction) -> None:
    key = frame.pop()
    container = frame.pop()
    value = frame.pop()
    semantics.set_item(frame.session, container, key, value)


@handler("STORE_SLICE", versions=((3, 12),))
def _store_slice(frame: Frame, instruction: Instruction) -> None:
    stop = frame.pop()
    start = frame.pop()
    container = frame.pop()
    value = frame.pop()
    semantics.set_item(frame.session, container, SliceValue(start, stop, Const(None)), value)


@handler("DELETE_SUBSCR")
def _delete_subscr(frame: Frame, instruction: Instruction) -> None:
    key = frame.pop()
    container = frame.pop()
    semantics.delete_item(frame.session, container, key)


@handler("BUILD_SLICE")
def _build_slice(frame: Frame, instruction: Instruction) -> None:
    parts = frame.popn(instruction.arg)
    if len(parts) == 2:
        parts.append(Const(None))
    frame.push(SliceValue(*parts))


# -- control flow --------------------------------------------------------------------------
@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP",
         "JUMP_NO_INTERRUPT")
def _jump(frame: Frame, instruction: Instruction) -> None:
    frame.jump(instruction.argval)


def _conditional(when: bool | None, none_test: bool = False):
    def run(frame: Frame, instruction: Instruction) -> None:
        value = frame.pop()
        if none_test:
            outcome = semantics.is_none(value)
        else:
            try:
                outcome = semantics.truth(frame.session, value)
            except Unsupported:
                # (a check whose failing side only raises: assumed to pass, tested after
                # the graph; a body that only computes runs on both sides, merged at the
                # target)
                if isinstance(value, TensorValue) and (
                        branches.assume_it_passes(frame, instruction, value, when) or
                        branches.merge_both_sides(frame, instruction, value, when)):
                    return
                raise
        if outcome == when:
            frame.jump(instruction.argval)

    return run


for _names, _when, _none in (
        (("POP_JUMP_IF_TRUE",), True, False), (("POP_JUMP_IF_FALSE",), False, False),
        (("POP_JUMP_IF_NONE",), True, True), (("POP_JUMP_IF_NOT_NONE",), False, True)):
    handler(*_names, versions=((3, 12),))(_conditional(_when, _none))
for _suffix, _when, _none in (("TRUE", True, False), ("FALSE", False, False),
                              ("NONE", True, True), ("NOT_NONE", False, True)):
    handler(f"POP_JUMP_FORWARD_IF_{_suffix}", f"POP_JUMP_BACKWARD_IF_{_suffix}",
            versions=((3, 11),))(_conditional(_when, _none))


@handler("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP", versions=((3, 11),))
def _jump_or_pop(frame: Frame, instruction: Instruction) -> None:
    value = frame.peek()
    outcome = semantics.truth(frame.session, value)
    if outcome == (instruction.opname == "JUMP_IF_TRUE_OR_POP"):
        frame.jump(instruction.argval)
    else:
        frame.pop()


@handler("GET_ITER")
def _get_iter(frame: Frame, instruction: Instruction) -> None:
    frame.push(semantics.iterate(frame.session, frame.pop()))


@handler("FOR_ITER")
def _for_iter(frame: Frame, instruction: Instruction) -> None:
    iterator = frame.peek()
    if not isinstance(iterator, IteratorValue):
        raise Unsupported(f"iteration over {iterator.describe()}")
    frame.session.side_effects.changed(iterator)
    item = iterator.next()
    if item is not None:
        frame.push(item)
        return
    frame.pop()
    frame.jump(instruction.argval)
    if frame.instructions[frame.pc].opname == "END_FOR":
        frame.pc += 1  # 3.12: the exhausted FOR_ITER skips END_FOR


@handler("END_FOR", versions=((3, 12),))
def _end_for(frame: Frame, instruction: Instruction) -> None:
    frame.popn(2)


# -- calls and functions -------------------------------------------------------------------
@handler("KW_NAMES")
def _kw_names(frame: Frame, instruction: Instruction) -> None:
    frame.kw_names = tuple(frame.code.co_consts[instruction.arg])


@handler("CALL")
def _call(frame: Frame, instruction: Instruction) -> None:
    count = instruction.arg
    arguments = frame.popn(count)
    second = frame.pop()
    first = frame.pop()
    if first is NULL:
        callee = second
    else:
        callee, arguments = first, [second, *arguments]
    names, frame.kw_names = frame.kw_names, ()
    positional = arguments[:len(arguments) - len(names)]
    keywords = dict(zip(names, arguments[len(arguments) - len(names):]))
    frame.push(semantics.call(frame, callee, positional, keywords))


@handler("CALL_FUNCTION_EX")
def _call_function_ex(frame: Frame, instruction: Instruction) -> None:
    keywords = frame.pop() if instruction.arg & 1 else DictValue({})
    positional = frame.pop()
    callee = frame.pop()
    null = frame.pop()
    if null is not NULL:  # a bound-method form: (callable, self) below the arguments
        callee, positional = null, SequenceValue([callee, *semantics.unpack(
            frame.session, positional)])
    if not isinstance(keywords, DictValue):
        raise Unsupported("** of a non-dict value")
    frame.push(semantics.call(frame, callee, semantics.unpack(frame.session, positional),
                              {str(k): v for k, v in keywords.items.items()}))


@handler("MAKE_FUNCTION")
def _make_function(frame: Frame, instruction: Instruction) -> None:
    flags = instruction.arg
    code = semantics.python_value(frame.pop())
    closure = tuple(frame.pop().items) if flags & 0x08 else ()
    if flags & 0x04:
        frame.pop()  # annotations
    kwdefaults = frame.pop().items if flags & 0x02 else {}
    defaults = tuple(frame.pop().items) if flags & 0x01 else ()
    frame.push(NestedFunctionValue(code, frame.globals, code.co_name, defaults,
                                   dict(kwdefaults), closure))


@handler("BEFORE_WITH")
def _before_with(frame: Frame, instruction: Instruction) -> None:
    manager = frame.pop()
    exit_, entered = contexts.enter_context(frame.session, manager)
    frame.push(exit_)
    frame.push(entered)


@handler("RETURN_GENERATOR")
def _return_generator(frame: Frame, instruction: Instruction) -> None:
    frame.push(Const(None))  # a generator expression runs to its end at once (see calls.py)


@handler("YIELD_VALUE")
def _yield_value(frame: Frame, instruction: Instruction) -> None:
    if frame.lazy:  # (suspended: inlining.resume pushes what is sent when it goes on)
        raise Yielded(frame.pop())
    frame.yielded.append(frame.pop())
    frame.push(Const(None))


@handler("GET_YIELD_FROM_ITER")
def _get_yield_from_iter(frame: Frame, instruction: Instruction) -> None:
    if not isinstance(frame.peek(), IteratorValue | GeneratorValue):
        frame.push(semantics.iterate(frame.session, frame.pop()))


@handler("SEND")
def _send(frame: Frame, instruction: Instruction) -> None:
    """`yield from`'s step: the delegate's next item, or at its end its return value (3.11:
    in the delegate's place; 3.12: above it, for END_SEND) and a jump past the loop."""
    sent = frame.pop()
    delegate = frame.peek()
    if isinstance(delegate, GeneratorValue):
        item = inlining.resume(frame.session, delegate, sent)
        done = delegate.frame.finished
    elif isinstance(delegate, IteratorValue):
        if not semantics.is_none(sent):
            raise Unsupported(f"a value sent through `yield from` to {delegate.describe()}",
                              "only a generator takes what is sent")
        frame.session.side_effects.changed(delegate)
        item = delegate.next()
        done = item is None
        if done:
            item = delegate.returned or Const(None)
    else:
        raise Unsupported(f"`yield from` over {delegate.describe()}")
    if not done:
        frame.push(item)
        return
    if sys.version_info < (3, 12):
        frame.pop()
    frame.push(item)
    frame.jump(instruction.argval)


@handler("END_SEND", versions=((3, 12),))
def _end_send(frame: Frame, instruction: Instruction) -> None:
    value = frame.pop()
    frame.pop()
    frame.push(value)


@handler("LOAD_ASSERTION_ERROR")
def _load_assertion_error(frame: Frame, instruction: Instruction) -> None:
    frame.push(Const(AssertionError))


@handler("RAISE_VARARGS")
def _raise_varargs(frame: Frame, instruction: Instruction) -> None:
    # an exception known in the capture is raised there: a handler of the captured code may
    # catch it (interpreter.Frame.catch); uncaught, it is refused, and eager raises it
    values = frame.popn(instruction.arg)
    if not values:  # (a bare `raise` in an except block)
        if frame.session.handled_exception is None:
            raise Unsupported("a bare raise outside an except block of the captured code")
        raise Raised(frame.session.handled_exception)
    exception = semantics.python_value(values[0]) if semantics.is_known(values[0]) else None
    if isinstance(exception, type) and issubclass(exception, BaseException):
        exception = exception()
    if not isinstance(exception, BaseException):
        raise Unsupported("the function raises an exception here",
                          "eager raises it; the compiled function runs eagerly so that it does")
    if len(values) == 2:
        cause = semantics.python_value(values[1]) if semantics.is_known(values[1]) else None
        if isinstance(cause, type) and issubclass(cause, BaseException):
            cause = cause()
        exception.__cause__ = cause
        exception.__suppress_context__ = True
    raise Raised(exception, "eager raises it; the compiled function runs eagerly so that it "
                            "does")


@handler("IMPORT_NAME")
def _import_name(frame: Frame, instruction: Instruction) -> None:
    fromlist = semantics.python_value(frame.pop())
    level = semantics.python_value(frame.pop())
    if level:  # (resolved against the package of the code's globals, as CPython does)
        module = builtins.__import__(instruction.argval, frame.globals, None, fromlist, level)
    else:
        module = importlib.import_module(instruction.argval)
        if not fromlist:
            module = importlib.import_module(instruction.argval.split(".")[0])
    # (the module is kept by the cache entry: what the code reads from it is guarded as
    # any global is, a class's attributes among them)
    frame.push(semantics.wrap_object(frame.session, module,
                                     frame.session.constant_source(module)))


@handler("IMPORT_FROM")
def _import_from(frame: Frame, instruction: Instruction) -> None:
    module = frame.peek()
    frame.push(attributes.get_attribute(frame.session, module, instruction.argval))


__all__ = ["BoundMethodValue", "TensorValue", "Value", "SetValue"]


@handler("DELETE_ATTR")
def _delete_attr(frame: Frame, instruction: Instruction) -> None:
    attribute_writes.delete_attribute(frame.session, frame.pop(), instruction.argval)
