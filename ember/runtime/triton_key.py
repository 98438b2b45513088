"""What Triton's compile cache is keyed on, for ember's processes and its compile workers
(runtime/triton_pool.py), which must key every kernel alike. Imports neither torch nor ember
(a worker runs this file's folder as its own, to start fast)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def file_key() -> str:
    """What Triton's compile cache is keyed on, from its files' names, sizes and modification
    times rather than their contents.

    Triton keys every compiled kernel on a hash of its own files' contents (`triton_key`),
    its 400 MB library among them: ~0.6 s of the first compile in every process, before any
    compiling starts, to learn what a stat of its 350 files tells as surely (a reinstall or an
    edit changes a size or a time). The key differs from Triton's own, so a kernel that a
    process without ember put in the disk cache compiles again once; never a stale binary."""
    import triton

    root = Path(triton.__file__).parent
    digest = hashlib.sha256(triton.__version__.encode())
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(folder, name)
            try:
                status = os.stat(path)
            except FileNotFoundError:  # (a file another process is replacing)
                continue
            digest.update(f"{os.path.relpath(path, root)}:{status.st_size}:"
                          f"{status.st_mtime_ns}:{status.st_ino}\n".encode())
    return f"{triton.__version__}-files-{digest.hexdigest()}"


def install_file_key() -> None:
    """Make Triton's compile cache use `file_key` (its `get_cache_key` reads the module global
    `triton_key`). Other users of `triton_key` in the process (torch.compile's own cache keys)
    keep Triton's."""
    from triton.runtime import cache

    if getattr(cache.triton_key, "ember_file_key", False):
        return
    key = file_key()

    def triton_key() -> str:
        return key

    triton_key.ember_file_key = True
    cache.triton_key = triton_key
