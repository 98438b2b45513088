"""Ember's one launcher for compiled Triton kernels (cuda_launcher.c), built with the C
compiler once per machine into ember's disk cache, in the background from Triton's warm-up.

Triton builds a launcher per kernel signature; on a cold cache each new argument list costs a
compiler run on the first call's path (0.2-0.3 s each on the H200's host; a BERT training
step has 22 of them, run beside the kernels' own compiles). With every launcher of a BERT
training step already built, its first call took 3.00 s against 3.70 (the forward's kernels
0.57 s against 1.11), ViT-B/16's inference 1.77 s against 1.94 (2026-12-04, H200).

Where this launcher cannot serve a kernel (scratch buffers, clusters of CTAs, tensor
descriptors, an argument type it does not know), or cannot be built, the kernel takes
Triton's own launcher, as before.
"""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Iterable
from pathlib import Path

from ember import config
from ember.runtime import build

# Triton's argument types → the launcher's codes (cuda_launcher.c)
_CODES = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "B", "u8": "B",
          "u16": "H", "u32": "I", "u64": "L", "fp16": "e", "bf16": "g", "fp32": "f",
          "f32": "f", "fp64": "d", "constexpr": "x"}


def type_codes(signature: Iterable[str]) -> str | None:
    """The launcher's type string for a kernel's argument types, or None where one has no
    code (a tensor descriptor, a tuple)."""
    codes = []
    for kind in signature:
        if not isinstance(kind, str):
            return None
        code = "p" if kind.startswith("*") else _CODES.get(kind)
        if code is None:
            return None
        codes.append(code)
    return "".join(codes)


def _source() -> tuple[str, list[str]]:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        raise ImportError("triton is not installed")
    cuda_headers = Path(spec.origin).parent / "backends" / "nvidia" / "include"
    source, flags = build.extension_source(
        Path(__file__).with_name("cuda_launcher.c").read_text())
    return source, [*flags, f"-I{cuda_headers}"]


_extension = build.Extension("ember_cuda_launcher", "Triton launcher", _source,
                             "Triton builds one per argument list")


def start() -> None:
    """Build (or find in the disk cache) and load the launcher, on a thread of its own where
    it is to be built; the compiler is a subprocess, so the build runs beside the capture."""
    if config.settings.triton_launcher:
        _extension.start()


def launcher() -> types.ModuleType | None:
    """The loaded launcher (waiting for its build), or None: switched off, or not buildable
    here (said once on EMBER_LOGS=perf)."""
    return _extension.module() if config.settings.triton_launcher else None


def built() -> types.ModuleType:
    """The launcher loaded before (for a kernel loaded for it, whatever the settings now)."""
    return _extension.loaded()


def load() -> types.ModuleType:
    """Build (or find) the launcher and import it."""
    return _extension.load()
