"""Rules for itertools, which library Python uses for small bookkeeping (torch's own
`_pair(0)` is `tuple(repeat(0, 2))`, called by every convolution with a padding mode): each
call is run at capture time over the items it is given, as the builtins zip and map are
(ember/capture/builtin_rules.py). The endless ones (count, cycle, repeat without a count)
give an EndlessIteratorValue whose items are made as the code takes them.
"""

from __future__ import annotations

import itertools
import operator
from typing import TYPE_CHECKING, Any

from ember.capture import semantics
from ember.capture.calls import call_value, rule
from ember.capture.errors import Unsupported
from ember.capture.semantics import python_value, unpack
from ember.capture.values import (
    BuiltinValue,
    Const,
    EndlessIteratorValue,
    IteratorValue,
    SequenceValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.session import Session


_NONE, _ZERO, _ONE, _TWO = Const(None), Const(0), Const(1), Const(2)  # (defaults)


def _number(value: Value, what: str) -> Any:
    if not isinstance(value, Const) or not isinstance(value.value, (int, float)):
        raise Unsupported(f"{what} of {value.describe()} (ember counts in Python numbers "
                          "known at capture time)")
    return value.value


def _count_argument(value: Value | None, what: str) -> int | None:
    if value is None or semantics.is_none(value):
        return None
    count = python_value(value)
    if not isinstance(count, int):
        raise Unsupported(f"{what} of {value.describe()}")
    return count


def _tuples(rows: Any) -> list[Value]:
    return [SequenceValue(list(row), tuple) for row in rows]


@rule(itertools.repeat)
def _repeat(session: Session, item: Value, times: Value | None = None, **_: Any) -> Value:
    count = _count_argument(times, "itertools.repeat's count")
    if count is None:
        return EndlessIteratorValue([], make=lambda k: item, what="itertools.repeat")
    return IteratorValue([item] * max(count, 0))


@rule(itertools.count)
def _count(session: Session, start: Value = _ZERO, step: Value = _ONE, **_: Any) -> Value:
    # (a real count makes the items, in order: its sums of floats round as eager's do)
    real = itertools.count(_number(start, "itertools.count"), _number(step, "itertools.count"))
    return EndlessIteratorValue([], make=lambda k: Const(next(real)), what="itertools.count")


@rule(itertools.cycle)
def _cycle(session: Session, iterable: Value, **_: Any) -> Value:
    items = unpack(session, iterable)
    if not items:
        return IteratorValue([])
    return EndlessIteratorValue([], make=lambda k: items[k % len(items)],
                                what="itertools.cycle")


@rule(itertools.chain)
def _chain(session: Session, *iterables: Value, **_: Any) -> Value:
    return IteratorValue([item for it in iterables for item in unpack(session, it)])


@rule(itertools.chain.from_iterable)
def _chain_from_iterable(session: Session, iterables: Value, **_: Any) -> Value:
    return IteratorValue([item for it in unpack(session, iterables)
                          for item in unpack(session, it)])


@rule(itertools.islice)
def _islice(session: Session, iterable: Value, *bounds: Value, **_: Any) -> Value:
    """islice(it, stop) / islice(it, start, stop[, step]): an iterator is advanced only as far
    as the slice reads it (`first = list(islice(it, 2))`, then the rest of `it`)."""
    if not 1 <= len(bounds) <= 3:
        raise Unsupported(f"itertools.islice takes 2 to 4 arguments ({len(bounds) + 1} given)")
    numbers = [_count_argument(b, "itertools.islice's bound") for b in bounds]
    start, stop, step = (0, numbers[0], 1) if len(numbers) == 1 else \
        (numbers[0] or 0, numbers[1], numbers[2] if len(numbers) == 3 and numbers[2] else 1)
    if isinstance(iterable, IteratorValue):
        if stop is None:
            if isinstance(iterable, EndlessIteratorValue):
                raise Unsupported(f"an endless islice of {iterable.what}")
            items = unpack(session, iterable)
        else:
            session.side_effects.changed(iterable)
            items = iterable.take(stop)
    else:
        items = unpack(session, iterable)
    return IteratorValue(list(itertools.islice(items, start, stop, step)))


@rule(itertools.product)
def _product(session: Session, *iterables: Value, repeat: Value = _ONE, **_: Any) -> Value:
    pools = [unpack(session, it) for it in iterables]
    return IteratorValue(_tuples(itertools.product(*pools,
                                                   repeat=_count_argument(repeat, "repeat"))))


@rule(itertools.zip_longest)
def _zip_longest(session: Session, *iterables: Value, fillvalue: Value = _NONE,
                 **_: Any) -> Value:
    columns = [unpack(session, it) for it in iterables]
    return IteratorValue(_tuples(itertools.zip_longest(*columns, fillvalue=fillvalue)))


@rule(itertools.accumulate)
def _accumulate(session: Session, iterable: Value, func: Value | None = None, *,
                initial: Value | None = None, frame: Any = None, **_: Any) -> Value:
    function = func if func is not None and not semantics.is_none(func) \
        else BuiltinValue(operator.add)
    items = unpack(session, iterable)
    if initial is not None and not semantics.is_none(initial):
        items = [initial, *items]
    totals = items[:1]
    for item in items[1:]:
        totals.append(call_value(session, function, [totals[-1], item], {}, frame))
    return IteratorValue(totals)


@rule(itertools.starmap)
def _starmap(session: Session, function: Value, iterable: Value, frame: Any = None,
             **_: Any) -> Value:
    return IteratorValue([call_value(session, function, unpack(session, row), {}, frame)
                          for row in unpack(session, iterable)])


@rule(itertools.pairwise)
def _pairwise(session: Session, iterable: Value, **_: Any) -> Value:
    return IteratorValue(_tuples(itertools.pairwise(unpack(session, iterable))))


def _choosing(choose: Any):
    """The rule of combinations, combinations_with_replacement or permutations."""
    def rule_(session: Session, iterable: Value, r: Value | None = None, **_: Any) -> Value:
        items = unpack(session, iterable)
        count = _count_argument(r, f"itertools.{choose.__name__}'s length")
        rows = choose(items, count) if count is not None or choose is itertools.permutations \
            else choose(items)
        return IteratorValue(_tuples(rows))
    return rule_


for _choose in (itertools.combinations, itertools.combinations_with_replacement,
                itertools.permutations):
    rule(_choose)(_choosing(_choose))


@rule(itertools.compress)
def _compress(session: Session, data: Value, selectors: Value, **_: Any) -> Value:
    return IteratorValue([item for item, keep in zip(unpack(session, data),
                                                     unpack(session, selectors))
                          if semantics.truth(session, keep)])


def _tested(session: Session, predicate: Value, item: Value, frame: Any) -> bool:
    return semantics.truth(session, call_value(session, predicate, [item], {}, frame))


@rule(itertools.takewhile)
def _takewhile(session: Session, predicate: Value, iterable: Value, frame: Any = None,
               **_: Any) -> Value:
    kept = []
    for item in unpack(session, iterable):
        if not _tested(session, predicate, item, frame):
            break
        kept.append(item)
    return IteratorValue(kept)


@rule(itertools.dropwhile)
def _dropwhile(session: Session, predicate: Value, iterable: Value, frame: Any = None,
               **_: Any) -> Value:
    items = unpack(session, iterable)
    for index, item in enumerate(items):
        if not _tested(session, predicate, item, frame):
            return IteratorValue(items[index:])
    return IteratorValue([])


@rule(itertools.filterfalse)
def _filterfalse(session: Session, predicate: Value, iterable: Value, frame: Any = None,
                 **_: Any) -> Value:
    items = unpack(session, iterable)
    if semantics.is_none(predicate):
        return IteratorValue([i for i in items if not semantics.truth(session, i)])
    return IteratorValue([i for i in items if not _tested(session, predicate, i, frame)])


@rule(itertools.tee)
def _tee(session: Session, iterable: Value, n: Value = _TWO, **_: Any) -> Value:
    items = unpack(session, iterable)
    return SequenceValue([IteratorValue(list(items))
                          for _ in range(_count_argument(n, "itertools.tee's count"))], tuple)
