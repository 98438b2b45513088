"""A Triton compile worker: a process that compiles kernels into Triton's disk cache.

Run as a script (`python .../triton_worker.py [file-key] [warm=cuda,90,32]`), not as a module
of the ember package: it imports Triton only (no torch, no ember), so it starts in well under a
second. Requests and replies are pickles, each preceded by its length (8 bytes, little-endian),
on stdin and stdout:

    request  (path, name, signature, attrs, options, target, cache)   a kernel in the module
             file, compiled into the Triton cache folder `cache` (the asking process's
             TRITON_CACHE_DIR now, None for Triton's default)
    reply    (True, seconds) | (False, "Error: message")

With `warm=<target>` the worker first compiles a small kernel for that target and says so in
one message before any reply: ("warm", True, seconds) | ("warm", False, "Error: message").
A process's first Triton compile pays one-time costs (loading the compiler's libraries, the
assembler's first run): a small kernel took 0.20 s as a worker's first and 0.12 s after the
warm-up on a 2-core machine (2026-12; not yet measured on the H200's host). Paid while the
asking process captures and lowers the graph, they are off its first kernels' path. The warm
kernel compiles into a cache folder of its own, deleted after: a cache hit would pay none of
those costs, and the user's cache stays clean.

The compiled kernel lands in the asking process's Triton cache (its TRITON_CACHE_DIR when it
asked: a process that points the variable elsewhere after the workers started, as the
benchmark does for each workload, must not have them compile into the old folder, where it
never looks: then it compiled every kernel again itself, BERT's training step after GPT-2's
on an H100 spending 90 s of its threads' time on them, 2026-12-06); the process that asked
compiles the same source again and finds it there.
"""

import importlib.util
import os
import pickle
import struct
import sys
import time


def _read(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def _write(stream, value) -> None:
    data = pickle.dumps(value)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def main() -> None:
    # (below the asking process's priority: its capture and lowering, while the workers
    # start and warm up, are the first call's path — sixteen workers starting beside them
    # on the H200's 16-core host doubled them, 0.54 s against 1.07 for GPT-2's capture)
    try:
        os.nice(10)
    except OSError:
        pass
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "file-key" in sys.argv[1:]:
        import triton_key  # (this file's folder is the script's: the module beside it)

        triton_key.install_file_key()
    modules = {}
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # (nothing Triton prints may reach the reply stream)
    for argument in sys.argv[1:]:
        if argument.startswith("warm="):
            backend, arch, warp_size = argument[len("warm="):].split(",")
            _write(replies, ("warm", *_warm(GPUTarget(backend, int(arch), int(warp_size)))))
    while True:
        request = _read(requests)
        if request is None:
            return
        path, name, signature, attrs, options, target, cache = request
        started = time.perf_counter()
        if cache is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = cache
        try:
            module = modules.get(path)
            if module is None:  # (the module's name as the asking process has it)
                stem = os.path.splitext(os.path.basename(path))[0]
                spec = importlib.util.spec_from_file_location(stem, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[stem] = module
                spec.loader.exec_module(module)
                modules[path] = module
            source = ASTSource(getattr(module, name), signature, {}, attrs)
            triton.compile(source, target=GPUTarget(*target), options=options)
            reply = (True, time.perf_counter() - started)
        except Exception as error:  # noqa: BLE001 (the asking process compiles it again)
            reply = (False, f"{type(error).__name__}: {error}")
        _write(replies, reply)


def _warm(target) -> tuple:
    """Compile the warm kernel for `target` in a cache folder of its own: (True, seconds) or
    (False, why)."""
    import shutil
    import tempfile

    import triton
    import triton_warm_kernel  # (beside this file, as triton_key)
    from triton.compiler import ASTSource

    started = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="ember-triton-warm-")
    saved = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = folder
    try:
        source = ASTSource(triton_warm_kernel.warm, {"x": "*fp32", "n": "i32",
                                                     "VALUE": "constexpr"}, {"VALUE": 1.0})
        triton.compile(source, target=target, options={"num_warps": 4})
        return True, time.perf_counter() - started
    except Exception as error:  # noqa: BLE001 (a warm-up that fails costs nothing more)
        return False, f"{type(error).__name__}: {error}"
    finally:
        if saved is None:
            del os.environ["TRITON_CACHE_DIR"]
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
