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
from pathlib import Path
from typing import Any

from ember import config
from ember.runtime import build


def _source() -> tuple[str, list[str]]:
    source = Path(__file__).with_name("c_launcher.c").read_text()
    cases = ["        case 0: return ((int (*)(void))address)();"]
    for count in range(1, 65):
        types_ = ", ".join(["i64"] * count)
        values = ", ".join(f"a[{i}]" for i in range(count))
        cases.append(f"        case {count}: return ((int (*)({types_}))address)({values});")
    return build.extension_source(source.replace("/* CASES */", "\n".join(cases)))


_extension = build.Extension("ember_c_launcher", "C kernel launcher", _source,
                             "kernels are called through ctypes")


def start() -> None:
    """Load the launcher at once where the disk cache holds it, else build it beside the
    graph's own C build (switched off: nothing)."""
    if config.settings.c_launcher:
        _extension.start()


def launcher(wait: bool = True) -> Any:
    """The loaded launcher, or None: switched off, not buildable here (said once on
    EMBER_LOGS=perf), or (not `wait`) still building."""
    return _extension.module(wait) if config.settings.c_launcher else None


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
    module = _extension.loaded()
    return module is not None and type(value) is module.Kernel


def load() -> Any:
    """Build (or find) the launcher and import it."""
    return _extension.load()
