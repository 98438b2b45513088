"""What calling through ember costs when ember gives up: µs per call of a tiny function, a
tiny nn.Module and a small MLP that ember cannot capture (they run eagerly), called directly
and through `ember.compile`. `python -m ember.bench.overhead` prints the table.

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
    try:  # (a raise that its own handler catches: ember runs the frame eagerly)
        raise ValueError
    except ValueError:
        pass
    return x


class Uncapturable(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            raise ValueError
        except ValueError:
            pass
        return x


class UncapturableMLP(torch.nn.Module):
    """Three 64-wide layers (tens of µs eagerly on a CPU): the overhead as a share of a
    model's time."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                          torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                          torch.nn.Linear(64, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            raise ValueError
        except ValueError:
            pass
        return self.layers(x)


@dataclasses.dataclass
class Overhead:
    name: str
    direct_us: float     # µs per call, called as it is
    compiled_us: float   # µs per call, through ember.compile

    @property
    def added_us(self) -> float:
        return self.compiled_us - self.direct_us

    @property
    def added_percent(self) -> float:
        return 100 * self.added_us / self.direct_us


def per_call_us(calls: list[Callable[[], Any]], repeat: int = 9, seconds: float = 0.05
                ) -> list[float]:
    """µs per call of each of `calls`: the best of `repeat` runs of about `seconds` each, the
    runs of the calls taking turns (the best, and in turns: the other processes of a shared
    machine only ever add time, and add it to all of them alike)."""
    for call in calls:
        call()
    once = timeit.timeit(calls[0], number=10) / 10
    number = max(10, int(seconds / max(once, 1e-8)))
    best = [math.inf] * len(calls)
    for _ in range(repeat):
        for index, call in enumerate(calls):
            best[index] = min(best[index], timeit.timeit(call, number=number))
    return [total / number * 1e6 for total in best]


def measure(repeat: int = 9) -> list[Overhead]:
    import ember

    rows = []
    for name, target, x in (("function", uncapturable, torch.ones(4)),
                            ("nn.Module", Uncapturable(), torch.ones(4)),
                            ("MLP", UncapturableMLP().eval(), torch.ones(8, 64))):
        compiled = ember.compile(target)
        for _ in range(64):  # past the capture, and past any warm-up the fast path waits for
            compiled(x)
        direct, through = per_call_us([functools.partial(target, x),
                                       functools.partial(compiled, x)], repeat)
        rows.append(Overhead(name, direct, through))
    return rows


def main() -> None:
    print(f"{'uncapturable':<12} {'direct µs':>10} {'ember µs':>10} {'added µs':>10} "
          f"{'added %':>8}")
    torch.set_num_threads(1)  # (steadier on a machine busy with other work)
    with torch.no_grad():
        rows = measure()
    for row in rows:
        print(f"{row.name:<12} {row.direct_us:>10.3f} {row.compiled_us:>10.3f} "
              f"{row.added_us:>10.3f} {row.added_percent:>8.1f}")


if __name__ == "__main__":
    main()
