"""C source → loaded shared library, through a content-addressed disk cache.

The cache key hashes the source, the compiler's identity and the flags; a hit skips the
compiler entirely (a warm start costs a file check and a dlopen). Builds write to a temporary
name and rename, so concurrent processes never load a half-written library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ember import config

CACHE_VERSION = "ember-c-1"


class BuildError(RuntimeError):
    """The C compiler is missing or rejected a generated file (the message says which)."""


def find_compiler() -> str:
    """The C compiler to use: EMBER_CC when set (and then only it), else $CC, cc, gcc, clang.
    Looked up once per setting: a changed EMBER_CC (config.override) takes effect at once."""
    return _find_compiler(config.settings.cc, os.environ.get("CC", ""))


@functools.cache
def _find_compiler(requested: str, environment: str) -> str:
    if requested:
        # an explicit choice is never silently replaced by another compiler
        found = shutil.which(requested)
        if found is None:
            raise BuildError(f"EMBER_CC={requested} is not a program that can be run; "
                             f"set EMBER_CC to a C compiler (or leave it empty to use cc)")
        return found
    for candidate in (environment, "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise BuildError("no C compiler found (looked for $EMBER_CC, $CC, cc, gcc, clang); "
                     "install gcc, or set EMBER_CC to a C compiler")


@functools.cache
def compiler_identity(compiler: str) -> str:
    """Which compiler binary this is, without running it (a process start costs ~30 ms on a
    cold first call): its resolved path, size and modification time."""
    path = os.path.realpath(compiler)
    try:
        status = os.stat(path)
    except OSError:
        return path
    return f"{path}:{status.st_size}:{int(status.st_mtime)}"


def cache_key(source: str, flags: list[str], compiler: str) -> str:
    digest = hashlib.sha256()
    for part in (CACHE_VERSION, compiler_identity(compiler), " ".join(flags), source):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


_WITHOUT_SLP = "-fno-tree-slp-vectorize"


def build(source: str, link: list[str]) -> tuple[Path, bool]:
    """Compile `source` into a shared library; return (path, whether it came from the cache)."""
    compiler = find_compiler()
    flags = list(config.settings.cflags) + ["-shared", "-fPIC"]
    key = cache_key(source, flags + link, compiler)
    folder = config.settings.cache_dir / "c" / key[:2]
    library = folder / f"{key}.so"
    if library.exists():
        return library, True
    folder.mkdir(parents=True, exist_ok=True)
    source_path = folder / f"{key}.c"
    # (written whole, then moved into place: a graph's forward and backward build side by
    # side, and one source in both must never be read half rewritten)
    handle, partial = tempfile.mkstemp(suffix=".c", dir=folder)
    with os.fdopen(handle, "w") as file:
        file.write(source)
    os.replace(partial, source_path)
    handle, temporary = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(handle)
    command = [compiler, *flags, "-o", temporary, str(source_path), *link]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0 and "internal compiler error" in result.stderr:
            # a compiler bug, not the source's: GCC 12 crashes in its SLP vectorizer on some
            # small OpenMP-simd reductions; the same source builds without that pass
            command[1:1] = [_WITHOUT_SLP]
            result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as error:
        os.unlink(temporary)
        raise BuildError(f"could not run {compiler} on {source_path}: {error}") from error
    if result.returncode != 0:
        os.unlink(temporary)
        raise BuildError(f"{compiler} failed on generated kernel source {source_path}:\n"
                         f"{result.stderr.strip()[:4000]}")
    os.replace(temporary, library)
    return library, False


@functools.cache
def load(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


def kernel_function(library: ctypes.CDLL, name: str, arity: int):
    function = getattr(library, name)
    function.argtypes = [ctypes.c_void_p] * arity
    function.restype = ctypes.c_int
    return function
