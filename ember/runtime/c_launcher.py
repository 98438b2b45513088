"""Ember's caller of generated C kernels (c_launcher.c), a Python extension built with the C
compiler once per machine into ember's disk cache.

A kernel called through ctypes cost ~0.56 us a call on the CPU host, its two data_ptr()
reads included (its argument conversions and libffi); through a Kernel of this extension
~0.2 us. A decoding step of a small GPT-2 on the CPU launches ~60 kernels; a tiny graph's
whole call is a few microseconds. Where the extension cannot be built (no Python headers,
a compiler that fails), cannot take a kernel (more than 64 arguments) or is switched off
(EMBER_C_LAUNCHER=0), kernels are called through ctypes, as before.
"""

from __future__ import annotations

import ctypes
import threading
import types
from pathlib import Path
from typing import Any

from ember import config, logs

_lock = threading.Lock()
_builder: threading.Thread | None = None
_built: list[types.ModuleType | None] = []  # (the module, or None once it failed)


def start() -> None:
    """Load the launcher at once where the disk cache holds it, else build it on a thread of
    its own (the compiler is a subprocess: it runs beside the graph's own C build)."""
    global _builder
    with _lock:
        if _builder is not None or not config.settings.c_launcher:
            return
        from ember.runtime import build

        source, link = _source()
        cached = build.is_built(source, link)
        _builder = threading.Thread(target=_build_and_load, name="ember-c-launcher",
                                    daemon=True)
        if cached:  # (a dlopen: no thread)
            _builder.run()
            return
        _builder.start()


def launcher(wait: bool = True) -> types.ModuleType | None:
    """The loaded launcher, or None: switched off, not buildable here (said once on
    EMBER_LOGS=perf), or (not `wait`) still building."""
    if not config.settings.c_launcher:
        return None
    start()
    assert _builder is not None
    if wait and _builder.is_alive():
        _builder.join()
    return _built[0] if _built else None


def kernel(function: Any, count: int, release_gil: bool, wait: bool = True) -> Any:
    """`function` (a ctypes function of a kernel taking `count` 64-bit arguments) as a
    Kernel of the launcher, or `function` itself where the launcher does not serve."""
    module = launcher(wait)
    if module is None or count > module.MAX_ARGUMENTS:
        return function
    fast = module.Kernel(ctypes.cast(function, ctypes.c_void_p).value, count, release_gil)
    fast.function = function  # (keeps its library loaded; what a warm-start entry names)
    fast.__name__ = function.__name__
    return fast


def is_kernel(value: Any) -> bool:
    module = _built[0] if _built else None
    return module is not None and type(value) is module.Kernel


def _build_and_load() -> None:
    try:
        module = load()
    except Exception as error:  # noqa: BLE001 (ctypes serves instead)
        logs.channel("perf").info("ember's C kernel launcher is not available (%s: %s): "
                                  "kernels are called through ctypes",
                                  type(error).__name__, error)
        module = None
    _built.append(module)


def _source() -> tuple[str, list[str]]:
    from ember.runtime import build

    source = Path(__file__).with_name("c_launcher.c").read_text()
    cases = ["        case 0: return ((int (*)(void))address)();"]
    for count in range(1, 65):
        types_ = ", ".join(["i64"] * count)
        values = ", ".join(f"a[{i}]" for i in range(count))
        cases.append(f"        case {count}: return ((int (*)({types_}))address)({values});")
    source = source.replace("/* CASES */", "\n".join(cases))
    return build.extension_source(source)


def load() -> types.ModuleType:
    """Build (or find) the launcher and import it."""
    from ember.runtime import build

    return build.extension("ember_c_launcher", *_source())
