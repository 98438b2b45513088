"""C source → loaded shared library, through a content-addressed disk cache.

The cache key hashes the source, the compiler's identity and the flags; a hit skips the
compiler entirely (a warm start costs a digest check and a dlopen). Builds write to a
temporary name and rename, one builder per key (disk_cache), so no process ever loads a
half-written, truncated or foreign library.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ember import config, logs
from ember.runtime import disk_cache

CACHE_VERSION = "ember-c-2"  # (2: entries carry a digest)


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


@functools.cache
def cpu_identity() -> str:
    """Which processor the libraries are built for (-march=native): a cache shared between
    machines must not hand one CPU's instructions to another."""
    try:
        with open("/proc/cpuinfo") as file:
            lines = [line for line in file if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + ":" + hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def cache_key(source: str, flags: list[str], compiler: str) -> str:
    digest = hashlib.sha256()
    for part in (CACHE_VERSION, cpu_identity(), compiler_identity(compiler), " ".join(flags),
                 source):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


_WITHOUT_SLP = "-fno-tree-slp-vectorize"


def build(source: str, link: list[str]) -> tuple[Path, bool]:
    """Compile `source` into a shared library; return (path, whether it came from the cache).
    A cached library is loaded only after its digest checks (disk_cache.usable); one that
    fails is rebuilt. One thread or process builds a key at a time; the others wait for it."""
    library, cached = _build(source, link)
    built_from[str(library)] = (source, list(link))
    if not cached:
        disk_cache.enforce_cap(keep=library)
    return library, cached


def extension_source(source: str) -> tuple[str, list[str]]:
    """A Python extension's C source as built for this interpreter (its version and ABI
    named in it: they key the cache too), and the flags that find Python's headers."""
    abi = f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}"
    return f"/* for {abi} */\n" + source, [f"-I{sysconfig.get_paths()['include']}"]


def extension(name: str, source: str, flags: list[str]) -> types.ModuleType:
    """Build (or find in the disk cache) the Python extension module `name` of `source`
    (extension_source's) and import it."""
    library, _ = build(source, flags)
    loader = importlib.machinery.ExtensionFileLoader(name, str(library))
    spec = importlib.util.spec_from_file_location(name, library, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class Extension:
    """One of ember's Python extensions (its launchers), loaded once per process: at once
    where the disk cache holds its build (a dlopen), else built on a thread of its own (the
    compiler is a subprocess: it runs beside other work). `source()` gives its source and
    flags (extension_source's; it may raise: the extension is then not available, said once
    on EMBER_LOGS=perf as `title`'s, with `instead`, what serves in its place)."""

    def __init__(self, name: str, title: str, source: Callable[[], tuple[str, list[str]]],
                 instead: str):
        self.name = name
        self.title = title
        self.source = source
        self.instead = instead
        self._lock = threading.Lock()
        self._builder: threading.Thread | None = None
        self._built: list[types.ModuleType | None] = []  # (the module, or None: it failed)

    def start(self) -> None:
        with self._lock:
            if self._builder is not None:
                return
            try:
                cached = is_built(*self.source())
            except Exception:  # noqa: BLE001 (the build says why, on its thread)
                cached = False
            self._builder = threading.Thread(target=self._build_and_load,
                                             name=f"ember-{self.name}", daemon=True)
            if cached:
                self._builder.run()
            else:
                self._builder.start()

    def module(self, wait: bool = True) -> types.ModuleType | None:
        """The loaded extension, or None: not buildable here, or (not `wait`) still
        building."""
        self.start()
        assert self._builder is not None
        if wait and self._builder.is_alive():
            self._builder.join()
        return self.loaded()

    def loaded(self) -> types.ModuleType | None:
        """The extension if it is loaded by now (no wait, no build started)."""
        return self._built[0] if self._built else None

    def load(self) -> types.ModuleType:
        """Build (or find) the extension and import it, here."""
        return extension(self.name, *self.source())

    def _build_and_load(self) -> None:
        try:
            module = self.load()
        except Exception as error:  # noqa: BLE001 (`instead` serves)
            logs.channel("perf").info("ember's %s is not available (%s: %s): %s", self.title,
                                      type(error).__name__, error, self.instead)
            module = None
        self._built.append(module)


def is_built(source: str, link: list[str]) -> bool:
    """Is a library of `source` in the disk cache? (Its check is build's, when it is loaded:
    one that fails it is built again there.)"""
    return _library(source, link)[0].exists()


def _library(source: str, link: list[str]) -> tuple[Path, str, str, list[str]]:
    """Where the library of `source` lies in the disk cache: its path, key, compiler, flags."""
    compiler = find_compiler()
    flags = list(config.settings.cflags) + ["-shared", "-fPIC"]
    key = cache_key(source, flags + link, compiler)
    return disk_cache.entry_path("c", key, ".so"), key, compiler, flags


class PendingFunction:
    """A C kernel that a graph's first calls may call while its library still builds (on a
    thread: compile_plan's `compiled_later`): a call waits for it, then calls it."""

    def __init__(self, loaded: Any):
        self.loaded = loaded  # (a Future of the kernel's function, once built and loaded)

    def __call__(self, *args: Any) -> Any:
        from ember.runtime.wrappers import KernelsNotBuilt

        try:
            function = self.loaded.result()
        except Exception as error:  # (the build's own error, said by the graph)
            raise KernelsNotBuilt.because(error) from error
        return function(*args)


# library path -> (source, link flags) of each library built or found in this process: what
# a warm-start entry keeps to find the library again (or rebuild it, once evicted)
built_from: dict[str, tuple[str, list[str]]] = {}


def _build(source: str, link: list[str]) -> tuple[Path, bool]:
    library, key, compiler, flags = _library(source, link)
    if disk_cache.usable(library, key):
        return library, True
    try:
        with disk_cache.building("c", key, ".so") as library:
            if disk_cache.usable(library, key):  # (built while this one waited)
                return library, True
            _compile(compiler, flags, link, source, library, key)
    except disk_cache.CacheUnusable as error:
        raise BuildError(str(error)) from error
    except OSError as error:
        raise BuildError(f"the kernel cache at {library.parent} cannot be written ({error}): "
                         f"free disk space, or set EMBER_CACHE_DIR to a writable "
                         f"directory") from error
    return library, False


# Where a translation unit may begin in a generated source (codegen/c.py puts one before each
# kernel). A large library builds as several units at once, a compiler process each, then
# links: MobileNetV3's training forward (77 kernels, 214 KB of C) took 5.6 s as one unit and
# 3.9 s as two on a 2-core host (2026-12-06); a compiler's -O3 time grows with the source.
UNIT_BREAK = "\n/* ember: a translation unit may begin here */\n"
_UNIT_BYTES = 32_768  # (a share smaller than this: not worth a compiler process of its own)
_MAX_UNITS = 8


def units(source: str, cores: int | None = None) -> list[str]:
    """The translation units to build `source` as: itself, or (a source of several kernels,
    on several cores) the part before the first break with each share of the kernels, the
    shares balanced by length."""
    prelude, *kernels = source.split(UNIT_BREAK)
    cores = usable_cores() if cores is None else cores
    count = min(cores, len(kernels), len(source) // _UNIT_BYTES, _MAX_UNITS)
    if count < 2:
        return [source]
    shares: list[list[str]] = [[] for _ in range(count)]
    lengths = [0] * count
    for _, kernel in sorted(enumerate(kernels), key=lambda item: (-len(item[1]), item[0])):
        least = lengths.index(min(lengths))
        shares[least].append(kernel)
        lengths[least] += len(kernel)
    return [prelude + "".join(UNIT_BREAK + kernel for kernel in share) for share in shares]


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _compile(compiler: str, flags: list[str], link: list[str], source: str, library: Path,
             key: str) -> None:
    folder = library.parent
    source_path = library.with_suffix(".c")
    # (written whole, then moved into place: the file a compiler error names is always whole)
    with disk_cache.temporary(folder, ".c", key) as partial:
        partial.write_text(source)
        os.replace(partial, source_path)
    parts = units(source)
    # the compiler writes a temporary, removed on any exception (an interrupt included):
    # only a whole library that passed its check is ever moved to the entry's name
    with disk_cache.temporary(folder, ".so", key) as temporary, \
            contextlib.ExitStack() as unit_files:
        if len(parts) == 1:
            _run([compiler, *flags, "-o", str(temporary), str(source_path), *link], compiler,
                 source_path)
        else:
            objects = []
            commands = []
            unit_flags = [flag for flag in flags if flag != "-shared"] + ["-c"]
            for index, part in enumerate(parts):
                unit = unit_files.enter_context(disk_cache.temporary(folder, f".{index}.c", key))
                unit.write_text(part)
                objects.append(unit_files.enter_context(
                    disk_cache.temporary(folder, f".{index}.o", key)))
                commands.append([compiler, *unit_flags, "-o", str(objects[-1]), str(unit)])
            with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
                # (an error names the whole source, which stays; its unit's file does not)
                for done in [pool.submit(_run, command, compiler, source_path)
                             for command in commands]:
                    done.result()
            _run([compiler, *flags, "-o", str(temporary), *map(str, objects), *link], compiler,
                 source_path)
        try:
            disk_cache.commit(temporary, library, key)
        except disk_cache.IncompleteBuild as error:
            raise BuildError(f"{compiler} reported success on {source_path} but left an "
                             f"incomplete library ({error}); is the disk full?") from error


def _run(command: list[str], compiler: str, source: Path) -> None:
    """Run the compiler; a failure names the generated source it was given."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0 and "internal compiler error" in result.stderr:
            # a compiler bug, not the source's: GCC 12 crashes in its SLP vectorizer on
            # some small OpenMP-simd reductions; the same source builds without that pass
            command = [command[0], _WITHOUT_SLP, *command[1:]]
            result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as error:
        raise BuildError(f"could not run {compiler} on {source}: {error}") from error
    if result.returncode != 0:
        raise BuildError(f"{compiler} failed on generated kernel source {source}:\n"
                         f"{result.stderr.strip()[:4000]}")


@functools.cache
def load(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


def kernel_function(library: ctypes.CDLL, name: str, arity: int, sizes: int = 0,
                    release_gil: bool = True, wait: bool = True):
    """A kernel: `arity` data pointers, then `sizes` int64 sizes (a symbolic kernel's), called
    through ember's C launcher where it serves (`wait`: for its build, where it is not in the
    disk cache), else through ctypes. `release_gil`: may the kernel run long (a parallel
    region)? Then other threads take the GIL while it runs."""
    from ember.runtime import c_launcher

    function = getattr(library, name)
    function.argtypes = [ctypes.c_void_p] * arity + [ctypes.c_int64] * sizes
    function.restype = ctypes.c_int
    function.library_path = library._name  # (for a warm-start entry: runtime/warm_cache.py)
    return c_launcher.kernel(function, arity + sizes, release_gil, wait)
