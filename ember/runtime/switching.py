"""Quick handoffs of the interpreter lock while a GPU graph's first call compiles.

A first call on CUDA runs beside threads of ember's own that run Python: Triton's warm-up (its
import, its driver), the loads of compiled kernels. Each op the calling thread dispatches
releases the GIL (torch's bindings do) and then waits to take it back; with a thread of
Python beside it, that wait lasts until the other thread's switch interval ends, 5 ms by
default. On an H100 a cold MobileNetV3 first call took 6.99 s at Python's interval and 3.75
s at 0.2 ms (2026-12-06, device call 117c, one process each, the compile then running 46
convolutions on stand-ins beside Triton's start). So while a call captures and compiles for
CUDA (api.CompiledFunction._entry_for), and while a call runs eagerly beside its graph's
kernels compiling (compiled.eager_beside_the_compile), the interval is 0.2 ms; Python's (or
the program's own) comes back after. Calls that find their compiled graph never touch it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

QUICK = 0.0002  # seconds

_lock = threading.Lock()
_depth = 0
_saved = 0.0
_set: float | None = None  # (the interval as Python keeps it, once set: not QUICK exactly)


@contextlib.contextmanager
def quick() -> Iterator[None]:
    """The switch interval at QUICK (where it is longer) until the outermost of the threads
    inside leaves; then what it was."""
    global _depth, _saved, _set
    with _lock:
        if _depth == 0:
            _saved, _set = sys.getswitchinterval(), None
            if _saved > QUICK:
                sys.setswitchinterval(QUICK)
                _set = sys.getswitchinterval()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            # (a program that set its own interval meanwhile keeps it)
            if _depth == 0 and _set is not None and sys.getswitchinterval() == _set:
                sys.setswitchinterval(_saved)
