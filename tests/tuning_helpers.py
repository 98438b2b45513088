"""What the max-autotune tests share: a timer that makes a chosen candidate win (each
candidate is then built into the graph and compared with eager), and a fresh disk cache."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ember import config, tuning


@contextlib.contextmanager
def winning(index: int, monkeypatch) -> Iterator[None]:
    """Timings in which each kernel's candidate number `index` (its last, if it has fewer;
    0 is the default) is the fastest by far: nothing is really timed."""

    def measure(runs, synchronize, samples=tuning.SAMPLES, apart=frozenset(), timer=None):
        labels = list(runs)
        winner = labels[min(index, len(labels) - 1)]
        tuning.counts["timings"] += len(labels)
        return {label: 1.0 if label == winner else 2.0 for label in labels}

    with monkeypatch.context() as patch:
        patch.setattr(tuning, "measure", measure)
        yield


@contextlib.contextmanager
def tuned(cache_dir) -> Iterator[list]:
    """max-autotune on, a disk cache of its own; yields the outcomes of this block."""
    start = len(tuning.history)
    outcomes: list = []
    with config.override(max_autotune=True, cache_dir=cache_dir):
        yield outcomes
    outcomes.extend(tuning.history[start:])
