"""Every switch of ember, declared once: its name, environment variable, default and help.

Code reads `config.settings.<name>`; nothing else in ember looks at os.environ. Tests change a
setting for a block with `config.override(name=value)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _words(text: str) -> frozenset[str]:
    return frozenset(w.strip() for w in text.replace(";", ",").split(",") if w.strip())


def _flag(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


def _optional_path(text: str) -> Path | None:
    return Path(text).expanduser() if text.strip() else None


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str
    env: str
    default: str
    parse: Callable[[str], Any]
    help: str


FLAGS: tuple[Flag, ...] = (
    Flag("logs", "EMBER_LOGS", "", _words,
         "comma-separated log channels to print: graph_breaks, recompiles, guards, ir, kernels, "
         "perf, fallbacks (or 'all')"),
    Flag("dump_dir", "EMBER_DUMP", "", _optional_path,
         "directory where every stage's text is written: captured graph, IR after each pass, "
         "kernel sources, wrapper"),
    Flag("cache_dir", "EMBER_CACHE_DIR", "~/.cache/ember", lambda t: Path(t).expanduser(),
         "directory of the content-addressed cache of built kernels"),
    Flag("disable", "EMBER_DISABLE", "0", _flag,
         "run every compiled function eagerly (compile nothing)"),
    Flag("backend", "EMBER_BACKEND", "", str.strip,
         "kernel backend: c, triton or interp (IR interpreter); empty picks by device"),
    Flag("cc", "EMBER_CC", "", str.strip,
         "C compiler for CPU kernels; empty means $CC, then cc, gcc, clang"),
    Flag("cflags", "EMBER_CFLAGS", "-O3 -march=native -fno-math-errno -fwrapv -fopenmp",
         str.split, "flags for the C compiler (never -ffast-math: it breaks inf and NaN)"),
    Flag("parallel_threshold", "EMBER_PARALLEL_THRESHOLD", "32768", int,
         "elements a CPU kernel must touch before it opens an OpenMP parallel region"),
    Flag("recompile_limit", "EMBER_RECOMPILE_LIMIT", "8", int,
         "compiled versions kept per function before it runs eagerly with a warning"),
    Flag("shape_compiles", "EMBER_SHAPE_COMPILES", "8", int,
         "a graph with symbolic sizes is still compiled per concrete shape by ember's "
         "backend (issue 18, stage 1): how many shapes' compiled versions each keeps, least "
         "recently used dropped"),
    Flag("dependent_launch", "EMBER_DEPENDENT_LAUNCH", "1", _flag,
         "Triton on Hopper and later: launch kernels as programmatic dependent launches "
         "(each starts while the one before it finishes; see codegen/triton.write_module)"),
    Flag("triton_file_key", "EMBER_TRITON_FILE_KEY", "1", _flag,
         "Triton: key its compile cache on its files' names, sizes and times instead of a "
         "hash of their contents (a 400 MB library: ~0.6 s of a process's first compile; "
         "see runtime/triton_launch.file_key)"),
    Flag("matmul_epilogue", "EMBER_MATMUL_EPILOGUE", "1", _flag,
         "Triton: compute small matmuls (up to 4M multiply-adds) inside the pointwise kernel "
         "that reads them (0: always cuBLAS + a kernel; see notes/device-runs.md)"),
    Flag("shape_padding", "EMBER_SHAPE_PADDING", "auto", str.strip,
         "pad a large half-precision matmul's sizes that are not a multiple of 16 bytes "
         "(cuBLAS's fast kernels need them): auto (on CUDA), always, never "
         "(see passes/matmul_operands.aligned_matmuls)"),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    logs: frozenset[str]
    dump_dir: Path | None
    cache_dir: Path
    disable: bool
    backend: str
    cc: str
    cflags: list[str]
    parallel_threshold: int
    recompile_limit: int
    shape_compiles: int
    dependent_launch: bool
    triton_file_key: bool
    matmul_epilogue: bool
    shape_padding: str


def load(environ: dict[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    values = {flag.name: flag.parse(environ.get(flag.env, flag.default)) for flag in FLAGS}
    return Settings(**values)


settings: Settings = load()


def reload() -> Settings:
    """Re-read the environment (tests and long-lived processes that change it)."""
    global settings
    settings = load()
    return settings


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[Settings]:
    global settings
    saved = settings
    settings = dataclasses.replace(settings, **changes)
    try:
        yield settings
    finally:
        settings = saved


def describe() -> str:
    """The help text of every switch, as the README and `python -m ember --help` show it."""
    lines = []
    for flag in FLAGS:
        default = flag.default or "(empty)"
        lines.append(f"{flag.env:<26} default {default}\n    {flag.help}")
    return "\n".join(lines)
