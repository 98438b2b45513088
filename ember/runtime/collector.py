"""Python's cyclic garbage collector held off while ember captures and compiles a call.

A compile makes and drops hundreds of thousands of objects (fake tensors, FX and IR nodes,
index expressions). Each time the youngest generation fills, CPython collects, and every
so often a full collection walks every object in the process — the model's, torch's and
the libraries' included. BERT-base's training forward compiled on the CPU in 0.69-0.74 s
with the collector off against 0.86-1.12 s with it on (its autodiff stage 0.17-0.19 s
against 0.31-0.38; 2026-12-04). What a compile leaves unreachable is collected at the
collector's next turn after it.

Paused for a capture and its compile (api._miss, a graph torch.compile hands over, a
backward compiled when a first backward asks for it: TrainingGraph.backward_for), not for
the run that follows (a compiled function may run a whole training loop); threads that
compile in the background (the backward built ahead) leave it as they find it: a pause
never outlasts the compile that asked for it. A collector the program turned off stays
off.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0          # calls inside paused(), all threads
_restore = False      # whether the first of them found the collector on


@contextlib.contextmanager
def paused() -> Iterator[None]:
    global _holders, _restore
    with _lock:
        if _holders == 0:
            _restore = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _restore:
                gc.enable()
