"""What a benchmark report must say about where it ran: CPU, cores, memory, load, versions.

`describe()` gathers it as a flat dict of strings and numbers; it reads /proc where it exists
and never fails (a missing piece becomes "unknown").
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def load_average() -> float | None:
    """The one-minute load average: above about half the usable cores, timings are noisy."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def usable_cores() -> int:
    from ember.runtime.build import usable_cores as cores

    return cores()


def c_compiler() -> str:
    from ember.runtime.build import BuildError, compiler_identity, find_compiler

    try:
        return compiler_identity(find_compiler())
    except BuildError:
        return "none found (ember runs every graph eagerly)"


def ember_commit() -> str:
    folder = Path(__file__).resolve().parent
    try:
        result = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--",
                                str(folder.parent)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if result.returncode != 0:
        return "unknown"
    return result.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def describe() -> dict[str, Any]:
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": memory_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "c_compiler": c_compiler(),
        "ember_commit": ember_commit(),
        "load_average_start": load_average(),
    }
