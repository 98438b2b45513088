"""What calling through ember costs when ember gives up: µs per call of a tiny function and a
tiny nn.Module that ember cannot capture (they run eagerly), called directly and through
`ember.compile`. `python -m ember.bench.overhead` prints the table.

Timings only: tests assert the eager fast path's behaviour (tests/test_eager_fast_path.py),
never these numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import timeit
from collections.abc import Callable
from typing import Any

import torch


def uncapturable(x: torch.Tensor) -> torch.Tensor:
    try:  # (ember does not capture id() and cannot break inside try: the frame runs eagerly)
        id(x)
    except TypeError:
        pass
    return x


class Uncapturable(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            id(x)
        except TypeError:
            pass
        return x


@dataclasses.dataclass
class Overhead:
    name: str
    direct_us: float     # µs per call, called as it is
    compiled_us: float   # µs per call, through ember.compile

    @property
    def added_us(self) -> float:
        return self.compiled_us - self.direct_us


def per_call_us(calls: list[Callable[[], Any]], number: int = 20_000, repeat: int = 9
                ) -> list[float]:
    """µs per call of each of `calls`: the best of `repeat` runs of `number` calls, the runs
    of the calls taking turns (the best, and in turns: the other processes of a shared
    machine only ever add time, and add it to all of them alike)."""
    best = [math.inf] * len(calls)
    for call in calls:
        call()
    for _ in range(repeat):
        for index, call in enumerate(calls):
            best[index] = min(best[index], timeit.timeit(call, number=number))
    return [seconds / number * 1e6 for seconds in best]


def measure(number: int = 20_000, repeat: int = 9) -> list[Overhead]:
    import ember

    x = torch.ones(4)
    rows = []
    for name, target in (("function", uncapturable), ("nn.Module", Uncapturable())):
        compiled = ember.compile(target)
        for _ in range(64):  # past the capture, and past any warm-up the fast path waits for
            compiled(x)
        direct, through = per_call_us([functools.partial(target, x),
                                       functools.partial(compiled, x)], number, repeat)
        rows.append(Overhead(name, direct, through))
    return rows


def main() -> None:
    print(f"{'uncapturable':<12} {'direct µs':>10} {'ember µs':>10} {'added µs':>10}")
    for row in measure():
        print(f"{row.name:<12} {row.direct_us:>10.3f} {row.compiled_us:>10.3f} "
              f"{row.added_us:>10.3f}")


if __name__ == "__main__":
    main()
