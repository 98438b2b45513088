"""The opcodes of try statements' handlers (3.11, 3.12), for a Python exception that the
captured code raises and one of its frames catches (interpreter.Frame.catch: the exception is
a Const on the stack). They run the handler in the capture, as CPython runs it. They must not
enter a handler for an exception raised natively (a resume function's): that one runs
natively, as before.
"""

from __future__ import annotations

import dis

from ember.capture import semantics
from ember.capture.errors import Raised, Unsupported
from ember.capture.interpreter import Frame, handler
from ember.capture.values import Const

Instruction = dis.Instruction


def _exception(frame: Frame, value: object) -> BaseException:
    if not (isinstance(value, Const) and isinstance(value.value, BaseException)):
        raise Unsupported("an except block entered for an exception raised natively",
                          "keep the try statement outside the compiled function")
    return value.value


@handler("PUSH_EXC_INFO")
def _push_exc_info(frame: Frame, instruction: Instruction) -> None:
    # (below the exception, what sys.exc_info() was: POP_EXCEPT puts it back)
    exception = frame.pop()
    _exception(frame, exception)
    frame.push(Const(frame.session.handled_exception))
    frame.session.handled_exception = exception.value
    frame.handling += 1
    frame.push(exception)


@handler("POP_EXCEPT")
def _pop_except(frame: Frame, instruction: Instruction) -> None:
    frame.session.handled_exception = semantics.python_value(frame.pop())
    frame.handling -= 1


@handler("CHECK_EXC_MATCH")
def _check_exc_match(frame: Frame, instruction: Instruction) -> None:
    kinds = semantics.python_value(frame.pop())
    frame.push(Const(isinstance(_exception(frame, frame.peek()), kinds)))


@handler("RERAISE")
def _reraise(frame: Frame, instruction: Instruction) -> None:
    exception = _exception(frame, frame.pop())
    if instruction.arg:
        frame.pop()  # (the raising instruction's offset: where CPython's traceback points)
    raise Raised(exception)
