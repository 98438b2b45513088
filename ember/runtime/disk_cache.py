"""The disk cache's guarantees, for every kind of entry it holds (C libraries, Triton modules).

Takes an entry's kind, key and suffix; gives its path, locked for one builder at a time
(threads and processes), a verdict on whether a binary found there may be loaded, and
temporaries that never outlive a failed build. It must never hand out a binary it has not
checked: a truncated library crashes the process that maps it (SIGBUS), another key's library
computes the wrong thing.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ember import config, logs

try:
    import fcntl
except ImportError:  # (not on Windows: there only threads are kept apart)
    fcntl = None


class CacheUnusable(OSError):
    """Neither the cache directory nor a temporary one could be written (the message says
    what to do)."""


# -- where entries live ---------------------------------------------------------------------
# configured cache directory -> the process-private folder used instead, when it cannot be
# written (a read-only or full file system, a directory owned by another user)
_replacements: dict[Path, Path] = {}
_replacing = threading.Lock()


def entry_path(kind: str, key: str, suffix: str) -> Path:
    """Where the entry would be: under EMBER_CACHE_DIR, or under its replacement once that was
    found unwritable in this process."""
    root = Path(config.settings.cache_dir)
    root = _replacements.get(root, root)
    return root / kind / key[:2] / f"{key}{suffix}"


def writable_folder(kind: str) -> Path:
    """The folder of one kind of entry, created; a process-private one when the cache cannot
    be written (said once)."""
    root = Path(config.settings.cache_dir)
    folder = _replacements.get(root, root) / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    except OSError as error:
        return _replace_root(root, error) / kind


def _replace_root(root: Path, error: OSError) -> Path:
    with _replacing:
        if root not in _replacements:
            try:
                replacement = Path(tempfile.mkdtemp(prefix="ember-cache-"))
            except OSError as second:
                raise CacheUnusable(
                    f"the kernel cache EMBER_CACHE_DIR={root} cannot be written ({error}), and "
                    f"neither can a temporary directory ({second}): free disk space, or set "
                    f"EMBER_CACHE_DIR to a writable directory") from error
            _replacements[root] = replacement
            atexit.register(shutil.rmtree, replacement, ignore_errors=True)
            logs.channel("fallbacks").warning(
                "the kernel cache EMBER_CACHE_DIR=%s cannot be written (%s): kernels are built "
                "in %s for this process only; set EMBER_CACHE_DIR to a writable directory to "
                "keep them", root, error, replacement)
    replacement = _replacements[root]
    replacement.mkdir(parents=True, exist_ok=True)
    return replacement


# -- one builder per entry ------------------------------------------------------------------
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def building(kind: str, key: str, suffix: str) -> Iterator[Path]:
    """The entry's path, held for this thread and process while the body builds it (others
    wait, then find it built). Moves to the process's own folder when the cache directory
    cannot be written."""
    path = entry_path(kind, key, suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 (held for the body)
    except OSError as error:
        _replace_root(Path(config.settings.cache_dir), error)
        path = entry_path(kind, key, suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(path.with_suffix(".lock"), "a")  # noqa: SIM115
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(str(path), threading.Lock())
    with thread_lock, lock_file:
        if fcntl is not None:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)  # (released when the file closes)
        kind_folder = path.parent.parent
        if kind_folder in _swept:
            remove_stale(path.parent, key)
        else:  # (once per process, every key's folder: a killed build of a key never built
            _swept.add(kind_folder)  # again, by another compiler, say)
            remove_stale(kind_folder, key, everywhere=True)
        yield path


@contextlib.contextmanager
def temporary(folder: Path, suffix: str, key: str = "") -> Iterator[Path]:
    """A fresh temporary file in `folder`, removed when the body leaves by any exception
    (KeyboardInterrupt included) or without moving it into place. Its name carries `key`,
    so that a later builder of that key can tell it from another's (remove_stale)."""
    handle, name = tempfile.mkstemp(prefix=f"{PARTIAL}{key}-" if key else PARTIAL,
                                    suffix=suffix, dir=folder)
    os.close(handle)
    path = Path(name)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


# -- what a killed build leaves ------------------------------------------------------------
PARTIAL = ".partial-"
# A temporary of no key this old is a dead writer's (writes take milliseconds)
STALE_SECONDS = 600


_swept: set[Path] = set()  # kinds' folders this process has swept whole


def remove_stale(folder: Path, held: str = "", everywhere: bool = False) -> list[Path]:
    """Remove the temporaries in `folder` that a build killed outright (SIGKILL, a power cut:
    no `finally` ran) left behind; returns them. A temporary of the key `held` (whose lock
    this process holds, before it makes its own) is stale; one of another key is stale when
    that key's lock can be taken at once (no builder is running); one of no key when it is
    older than STALE_SECONDS. `everywhere`: in `folder`'s subfolders too. Such files are never
    loaded either way: this only frees the disk."""
    removed = []
    for partial in (folder.rglob if everywhere else folder.glob)(PARTIAL + "*"):
        key = partial.name[len(PARTIAL):].split("-", 1)[0]
        if len(key) == 64:  # (a key's: build.cache_key is a sha256)
            stale = key == held or _unlocked(partial.parent / f"{key}.lock")
        else:
            stale = _older_than(partial, STALE_SECONDS)
        if not stale:
            continue
        with contextlib.suppress(OSError):
            partial.unlink()
            removed.append(partial)
    if removed:
        logs.channel("fallbacks").info("removed %d temporaries that killed builds left in %s",
                                       len(removed), folder)
    return removed


def _unlocked(lock: Path) -> bool:
    """Can the lock of a key be taken without waiting (nobody builds the key)?"""
    if fcntl is None:  # (no process locks: another process may be building it)
        return False
    if not lock.exists():
        return True
    try:
        with open(lock, "a") as file:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except OSError:
        return False


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


# -- what may be loaded ---------------------------------------------------------------------
class IncompleteBuild(ValueError):
    """The compiler reported success but left a binary that cannot be whole."""


def _digest(key: str, data: bytes) -> str:
    """Covers the key too: a valid library moved under another key does not pass."""
    return "sha256:" + hashlib.sha256(key.encode() + b"\0" + data).hexdigest()


def commit(built: Path, path: Path, key: str) -> None:
    """Move a finished build into place, its digest first (a reader that finds the binary
    finds the digest that vouches for it)."""
    data = built.read_bytes()
    problem = incomplete(data)
    if problem is not None:
        raise IncompleteBuild(problem)
    with temporary(path.parent, ".digest", key) as partial:
        partial.write_text(_digest(key, data) + "\n")
        os.replace(partial, path.with_suffix(".digest"))
    os.replace(built, path)


def problem_with(path: Path, key: str) -> str | None:
    """Why the cached binary at `path` must not be loaded, or None when it may be."""
    try:
        data = path.read_bytes()
        recorded = path.with_suffix(".digest").read_text().strip()
    except FileNotFoundError as error:
        return f"{Path(error.filename).name} is missing"
    except OSError as error:
        return f"it cannot be read ({error})"
    if recorded != _digest(key, data):
        return "its contents do not match the digest written when it was built (cut short, " \
               "overwritten, or built from another source)"
    return incomplete(data)


def usable(path: Path, key: str) -> bool:
    """Is there a cached binary at `path` that may be loaded? One that fails its check is
    removed (it is rebuilt) and said on EMBER_LOGS=fallbacks."""
    if not path.exists():
        return False
    problem = problem_with(path, key)
    if problem is None:
        return True
    logs.channel("fallbacks").info("the cached kernel library %s fails its check (%s): it is "
                                   "rebuilt", path, problem)
    for stale in (path, path.with_suffix(".digest")):
        with contextlib.suppress(OSError):
            stale.unlink()
    return False


def incomplete(data: bytes) -> str | None:
    """Why `data` cannot be a whole shared library, or None. Checks what the loader will map:
    an ELF file's headers and segments must lie inside the file (a truncated one is mapped
    past its end, and touching that page kills the process with SIGBUS)."""
    if not sys.platform.startswith("linux"):
        return None if data else "the file is empty"
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return f"not a shared library ({len(data)} bytes, no ELF header)"
    if data[4] != 2 or data[5] != 1:
        return None  # (not 64-bit little-endian: left to the loader)
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return f"cut short: {len(data)} bytes, its headers reach past the end"
    for index in range(phnum):
        offset, filesz = struct.unpack_from("<8xQ16xQ", data, phoff + index * phentsize)
        if offset + filesz > len(data):
            return f"cut short: {len(data)} bytes, a segment ends at byte {offset + filesz}"
    return None
