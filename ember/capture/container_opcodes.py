"""The opcodes that build containers and take them apart: tuples, lists, sets, dicts and
strings built, comprehensions' appends, unpacking, and `match` statements' patterns.

Handlers as in ember/capture/opcodes.py (registered by name and Python version); the
containers they make are tracked values (ember/capture/values.py), never real ones.
"""

from __future__ import annotations

import collections.abc
import dis

from ember.capture import attributes, numbers, semantics
from ember.capture.calls import call_rules
from ember.capture.errors import Unsupported
from ember.capture.interpreter import Frame, handler
from ember.capture.values import (
    Const,
    DictValue,
    SequenceValue,
    Value,
)

Instruction = dis.Instruction


# -- containers ----------------------------------------------------------------------------
@handler("BUILD_TUPLE")
def _build_tuple(frame: Frame, instruction: Instruction) -> None:
    frame.push(SequenceValue(frame.popn(instruction.arg), tuple))


@handler("BUILD_LIST")
def _build_list(frame: Frame, instruction: Instruction) -> None:
    frame.push(SequenceValue(frame.popn(instruction.arg), list))


@handler("BUILD_SET")
def _build_set(frame: Frame, instruction: Instruction) -> None:
    frame.push(semantics.make_set(frame.popn(instruction.arg)))


@handler("BUILD_MAP")
def _build_map(frame: Frame, instruction: Instruction) -> None:
    flat = frame.popn(2 * instruction.arg)
    items = {}
    for key, value in zip(flat[::2], flat[1::2]):
        items[semantics.key_of(key)] = value
    frame.push(DictValue(items))


@handler("BUILD_CONST_KEY_MAP")
def _build_const_key_map(frame: Frame, instruction: Instruction) -> None:
    keys = semantics.python_value(frame.pop())
    values = frame.popn(instruction.arg)
    frame.push(DictValue(dict(zip(keys, values))))


@handler("BUILD_STRING")
def _build_string(frame: Frame, instruction: Instruction) -> None:
    parts = frame.popn(instruction.arg)
    joined = numbers.joined(frame.session, parts)
    frame.push(joined if joined is not None else
               Const("".join(semantics.python_value(p) for p in parts)))


@handler("FORMAT_VALUE")
def _format_value(frame: Frame, instruction: Instruction) -> None:
    flags = instruction.arg
    spec = semantics.python_value(frame.pop()) if flags & 0x04 else ""
    value = frame.pop()
    frame.push(semantics.format_value(frame.session, value, flags & 0x03, spec))


@handler("LIST_APPEND")
def _list_append(frame: Frame, instruction: Instruction) -> None:
    value = frame.pop()
    target = frame.peek(instruction.arg)
    if getattr(target, "source", None) is not None:
        # (3.12's inlined comprehension resumed after a break: its list came in from outside)
        append = attributes.get_attribute(frame.session, target, "append")
        semantics.call(frame, append, [value], {})
        return
    target.items.append(value)


@handler("SET_ADD")
def _set_add(frame: Frame, instruction: Instruction) -> None:
    value = frame.pop()
    target = frame.peek(instruction.arg)
    _made_here(target)
    if not any(semantics.identical(value, item, frame.session) or
               semantics.equal_constants(value, item)
               for item in target.items):
        target.items.append(value)


@handler("MAP_ADD")
def _map_add(frame: Frame, instruction: Instruction) -> None:
    value = frame.pop()
    key = frame.pop()
    target = frame.peek(instruction.arg)
    _made_here(target)
    target.items[semantics.key_of(key)] = value


def _made_here(target: Value) -> None:
    """A comprehension's set or dict must be one the captured code made (3.12 inlines
    comprehensions: resumed after a break, one from outside would need its writes replayed)."""
    if getattr(target, "source", None) is not None:
        raise Unsupported("a set or dict comprehension resumed after a graph break")


@handler("LIST_EXTEND")
def _list_extend(frame: Frame, instruction: Instruction) -> None:
    values = semantics.unpack(frame.session, frame.pop())
    frame.peek(instruction.arg).items.extend(values)


@handler("SET_UPDATE")
def _set_update(frame: Frame, instruction: Instruction) -> None:
    values = semantics.unpack(frame.session, frame.pop())
    target = frame.peek(instruction.arg)
    for value in values:
        if not any(semantics.equal_constants(value, item) for item in target.items):
            target.items.append(value)


@handler("DICT_UPDATE", "DICT_MERGE")
def _dict_update(frame: Frame, instruction: Instruction) -> None:
    source = frame.pop()
    if not isinstance(source, DictValue):
        raise Unsupported("** of a non-dict value")
    target = frame.peek(instruction.arg)
    if instruction.opname == "DICT_MERGE":
        for key in source.items:
            if key in target.items:
                raise Unsupported(f"keyword argument {key!r} given twice")
    target.items.update(source.items)


@handler("UNPACK_SEQUENCE")
def _unpack_sequence(frame: Frame, instruction: Instruction) -> None:
    items = semantics.unpack(frame.session, frame.pop())
    if len(items) != instruction.arg:
        raise Unsupported(f"cannot unpack {len(items)} values into {instruction.arg}")
    for item in reversed(items):
        frame.push(item)


@handler("UNPACK_EX")
def _unpack_ex(frame: Frame, instruction: Instruction) -> None:
    before, after = instruction.arg & 0xFF, instruction.arg >> 8
    items = semantics.unpack(frame.session, frame.pop())
    if len(items) < before + after:
        raise Unsupported("not enough values to unpack")
    middle = SequenceValue(list(items[before:len(items) - after]), list)
    for item in reversed([*items[:before], middle, *items[len(items) - after:]]):
        frame.push(item)


# -- match statements ---------------------------------------------------------------------
def _is(frame: Frame, value: Value, classes: type | tuple[type, ...]) -> bool:
    """isinstance(value, classes), as the captured code's isinstance() answers it."""
    return semantics.python_value(call_rules[isinstance](frame.session, value, Const(classes)))


@handler("GET_LEN")
def _get_len(frame: Frame, instruction: Instruction) -> None:
    frame.push(call_rules[len](frame.session, frame.peek()))


@handler("MATCH_SEQUENCE")
def _match_sequence(frame: Frame, instruction: Instruction) -> None:
    subject = frame.peek()
    frame.push(Const(_is(frame, subject, collections.abc.Sequence) and
                     not _is(frame, subject, (str, bytes, bytearray))))


@handler("MATCH_MAPPING")
def _match_mapping(frame: Frame, instruction: Instruction) -> None:
    frame.push(Const(_is(frame, frame.peek(), collections.abc.Mapping)))


@handler("MATCH_KEYS")
def _match_keys(frame: Frame, instruction: Instruction) -> None:
    keys = semantics.python_value(frame.peek())
    subject = frame.peek(2)
    if not isinstance(subject, DictValue):
        raise Unsupported("a mapping pattern on a mapping ember does not track")
    found = [subject.items.get(semantics.key_of(Const(k)), None) for k in keys]
    frame.push(Const(None) if any(v is None for v in found) else SequenceValue(found, tuple))


# builtin classes (and their subclasses without __match_args__) whose single positional
# sub-pattern is the subject itself
_SELF_MATCHING = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)


@handler("MATCH_CLASS")
def _match_class(frame: Frame, instruction: Instruction) -> None:
    names = semantics.python_value(frame.pop())
    cls = semantics.python_value(frame.pop())
    subject = frame.pop()
    if not _is(frame, subject, cls):
        frame.push(Const(None))
        return
    count = instruction.arg
    wanted = getattr(cls, "__match_args__", None)
    if count and wanted is None and issubclass(cls, _SELF_MATCHING):
        if count > 1:
            raise Unsupported(f"{cls.__name__}() takes one positional sub-pattern")
        positional = [subject]
    else:
        wanted = wanted or ()
        if count > len(wanted):
            raise Unsupported(f"{cls.__name__}() accepts {len(wanted)} positional sub-patterns")
        positional = [attributes.get_attribute(frame.session, subject, name)
                      for name in wanted[:count]]
    keywords = [attributes.get_attribute(frame.session, subject, name) for name in names]
    frame.push(SequenceValue([*positional, *keywords], tuple))
