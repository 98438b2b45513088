"""A Triton compile worker: a process that compiles kernels into Triton's disk cache.

Run as a script (`python .../triton_worker.py [file-key]`), not as a module of the ember
package: it imports Triton only (no torch, no ember), so it starts in well under a second.
Requests and replies are pickles, each preceded by its length (8 bytes, little-endian), on
stdin and stdout:

    request  (path, name, signature, attrs, options, target)   a kernel in the module file
    reply    (True, seconds) | (False, "Error: message")

The compiled kernel lands in Triton's cache (TRITON_CACHE_DIR, inherited); the process that
asked compiles the same source again and finds it there.
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
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if len(sys.argv) > 1 and sys.argv[1] == "file-key":
        import triton_key  # (this file's folder is the script's: the module beside it)

        triton_key.install_file_key()
    modules = {}
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # (nothing Triton prints may reach the reply stream)
    while True:
        request = _read(requests)
        if request is None:
            return
        path, name, signature, attrs, options, target = request
        started = time.perf_counter()
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


if __name__ == "__main__":
    main()
