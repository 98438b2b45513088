"""Triton compiles in worker processes, so that a graph's kernels compile side by side.

Compiling a Triton kernel is mostly Python (the frontend that turns the kernel's AST into
Triton's IR, the pass pipeline's bindings, the launcher's metadata), so threads of one
process queue on the interpreter lock: on the H200's host sixteen threads compiling a BERT
training step's kernels took 1.5–2.5 s for each one, an 18-line kernel among them (2026-12,
`python -m ember.bench.zoo_first_call bert --mode train`). Workers (runtime/triton_worker.py,
started with Triton's warm-up, before lowering) compile each distinct kernel into Triton's disk
cache; the graph's own compile of that kernel then finds it there (about a millisecond) and
loads it. A worker that fails or is not ready costs nothing: the kernel compiles in the
process as before.

EMBER_TRITON_WORKERS sets how many (0: none). Eight, not sixteen, on the H200's 16-core host:
sixteen starting beside the capture slowed it (GPT-2's first inference call 2.19-2.99 s
with sixteen, 1.43 s with eight; its training step's 3.93 s against 3.35; 2026-12-04).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

from ember import config, logs
from ember.runtime import triton_worker

_WORKER = Path(triton_worker.__file__)


class CompilePool:
    """`count` worker processes, each fed by a thread of this process from one queue."""

    def __init__(self, count: int, file_key: bool, target: tuple | None = None):
        """`target` (backend, arch, warp size): each worker first compiles a small kernel for
        it, paying Triton's one-time costs before the graph's kernels arrive. Each worker is
        started by its own thread: sixteen process spawns stay off the asking thread, which
        captures the graph meanwhile."""
        self.tasks: queue.Queue = queue.Queue()
        self.processes: list[subprocess.Popen] = []
        self.threads: list[threading.Thread] = []
        self.command = [sys.executable, str(_WORKER)] + (["file-key"] if file_key else []) + \
            ([f"warm={','.join(str(part) for part in target)}"] if target else [])
        for index in range(count):
            thread = threading.Thread(target=self._serve, args=(index, target is not None),
                                      daemon=True, name=f"ember-triton-worker-{index}")
            thread.start()
            self.threads.append(thread)

    def submit(self, path: str, name: str, signature: dict, attrs: dict, options: dict,
               target: tuple) -> concurrent.futures.Future:
        """Compile kernel `name` of the module file at `path` into the Triton cache this
        process reads now (TRITON_CACHE_DIR as it is set at this call)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        cache = os.environ.get("TRITON_CACHE_DIR")
        self.tasks.put(((path, name, signature, attrs, options, target, cache), future))
        return future

    def _serve(self, index: int, warming: bool) -> None:
        """Start worker `index` and hand it tasks; once it is gone (or never started), answer
        the tasks this thread takes with why, so the asking process compiles them itself."""
        gone = ""
        try:
            process = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.processes.append(process)
        except OSError as error:
            gone = f"worker not started: {error}"
        if warming and not gone:
            try:
                _, done, said = triton_worker._read(process.stdout)
            except (OSError, ValueError, TypeError) as error:  # (the worker died)
                done, said = False, f"worker gone: {error}"
            logs.channel("perf").info("Triton worker %d: %s", index,
                                      f"warmed up in {said:.3f} s" if done
                                      else f"not warmed up ({said})")
        while True:
            task, future = self.tasks.get()
            if task is None:
                if not gone:  # (a worker started after close() was called)
                    process.stdin.close()
                return
            reply = None
            if not gone:
                try:
                    triton_worker._write(process.stdin, task)
                    reply = triton_worker._read(process.stdout)
                except (OSError, ValueError) as error:  # (the worker died)
                    gone = f"worker gone: {error}"
            if reply is None:
                gone = gone or "worker gone"
                reply = (False, gone)
            future.set_result(reply)

    def close(self, wait: float = 0.0) -> None:
        """Stop the workers once the queue is done; `wait`: seconds to wait for each worker's
        thread to finish (its warm-up said, its last reply read); at exit, none."""
        for _ in self.threads:
            self.tasks.put((None, None))
        for process in list(self.processes):
            try:
                process.stdin.close()
            except OSError:
                pass
        for thread in self.threads if wait else ():
            thread.join(wait)


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def start(target: tuple | None = None) -> CompilePool | None:
    """The process's pool, started on first use (its workers warmed up for `target`, a GPU's
    (backend, arch, warp size), where given); None where there are to be no workers."""
    global _pool
    count = config.settings.triton_workers
    if count <= 0:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = CompilePool(min(count, os.cpu_count() or 1),
                                config.settings.triton_file_key, target)
            atexit.register(_pool.close)
        return _pool

