"""The compiles ember runs beside the calls (a training graph's backward for every output,
started with its first call or deferred to its next; Triton kernels, counted in
compile_plan.kernels_compiling): what a benchmark's steady state, the warm-start keep and a
breaking function's eager trial wait for."""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from collections.abc import Callable
from typing import Any

# compiles that run on while the first calls do (a training graph's backward for every
# output), until done
_background: set[concurrent.futures.Future] = set()
# compiles to start on demand, not started yet (a graph dropped unstarted drops its own,
# which nothing then waits for)
_deferred: weakref.WeakSet[Deferred] = weakref.WeakSet()


def in_background(job: concurrent.futures.Future) -> concurrent.futures.Future:
    _background.add(job)
    job.add_done_callback(_background.discard)
    return job


class Deferred:
    """A compile that starts on demand (`start()`, at most once) on a thread of its own (not
    a daemon: a process waits for it at exit); `future` holds its result."""

    def __init__(self, work: Callable[[], Any]):
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._work: Callable[[], Any] | None = work
        self._lock = threading.Lock()
        _deferred.add(self)

    def start(self) -> None:
        with self._lock:
            work, self._work = self._work, None
        _deferred.discard(self)
        if work is None:
            return
        in_background(self.future)  # (waited for once started, not before: see _deferred)

        def run() -> None:
            self.future.set_running_or_notify_cancel()
            try:
                self.future.set_result(work())
            except BaseException as error:  # (the caller's result() raises it)
                self.future.set_exception(error)

        threading.Thread(target=run, name="ember-backward").start()


def compiling_beside() -> bool:
    """Is a compile that ember started beside the calls still running (a backward, Triton
    kernels)? Deferred ones not yet started do not count."""
    from ember.compile_plan import kernels_compiling

    return any(not job.done() for job in (*_background.copy(), *kernels_compiling.copy()))


def wait_for_background_compiles(timeout: float | None = None, start_deferred: bool = True
                                 ) -> None:
    """Return once the compiles that ember runs on beside the first calls are done, Triton
    kernels included (a benchmark's steady state starts then: they share the host with the
    calls it times, and calls that come while kernels compile run eagerly); those deferred
    until a graph's next call are started first (`start_deferred`), or left as they are."""
    from ember.compile_plan import kernels_compiling

    if start_deferred:
        for deferred in list(_deferred):
            deferred.start()
    concurrent.futures.wait([*_background.copy(), *kernels_compiling.copy()], timeout)
