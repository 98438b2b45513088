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
import threading
import types
from collections.abc import Iterable
from pathlib import Path

from ember import config, logs

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


_lock = threading.Lock()
_builder: threading.Thread | None = None
_built: list[types.ModuleType | None] = []  # (the module, or None once it failed)


def start() -> None:
    """Build (or find in the disk cache) and load the launcher in a thread of its own; the
    compiler is a subprocess, so the build runs beside the capture."""
    global _builder
    with _lock:
        if _builder is not None or not config.settings.triton_launcher:
            return
        _builder = threading.Thread(target=_build_and_load, name="ember-cuda-launcher",
                                    daemon=True)
        _builder.start()


def launcher() -> types.ModuleType | None:
    """The loaded launcher (waiting for its build), or None: switched off, or not buildable
    here (said once on EMBER_LOGS=perf)."""
    if not config.settings.triton_launcher:
        return None
    start()
    assert _builder is not None
    _builder.join()
    return _built[0] if _built else None


def built() -> types.ModuleType:
    """The launcher loaded before (for a kernel loaded for it, whatever the settings now)."""
    return _built[0]


def _build_and_load() -> None:
    try:
        module = load()
    except Exception as error:  # noqa: BLE001 (Triton's launchers serve instead)
        logs.channel("perf").info("ember's Triton launcher is not available (%s: %s): "
                                  "Triton builds one per argument list",
                                  type(error).__name__, error)
        module = None
    _built.append(module)


def load() -> types.ModuleType:
    """Build (or find) the launcher and import it."""
    from ember.runtime import build

    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        raise ImportError("triton is not installed")
    cuda_headers = Path(spec.origin).parent / "backends" / "nvidia" / "include"
    source, flags = build.extension_source(
        Path(__file__).with_name("cuda_launcher.c").read_text())
    return build.extension("ember_cuda_launcher", source, [*flags, f"-I{cuda_headers}"])
