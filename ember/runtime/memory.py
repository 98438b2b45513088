"""Allocation of a compiled graph's large CPU buffers.

Fresh memory from the OS costs a page fault per 4 KiB page on first touch: for a 64 MB output
that is ~17 ms on these CPUs, more than the kernel that fills it. Asking the kernel for
transparent huge pages (madvise(MADV_HUGEPAGE), before the first touch) makes it one fault
per 2 MiB: the same buffer costs ~5 ms. Nothing is reused or kept, so nothing can alias.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import torch

# Below this the allocator's free lists usually serve memory that is already mapped.
MIN_BYTES = 4 << 20
_HUGE = 2 << 20
_MADV_HUGEPAGE = 14


@functools.cache
def _madvise():
    """libc's madvise when transparent huge pages can be asked for, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        setting = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    if "[never]" in setting:
        return None
    # (the process's own symbols, libc's among them: find_library("c") would run ldconfig
    # or a compiler, 6-200 ms of a first call)
    function = ctypes.CDLL(None, use_errno=True).madvise
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def empty_cpu(shape: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty_strided on the CPU, backed by huge pages when it is large."""
    tensor = torch.empty_strided(shape, strides, dtype=dtype)
    size = tensor.untyped_storage().nbytes()
    madvise = _madvise() if size >= MIN_BYTES else None
    if madvise is not None:
        start = tensor.untyped_storage().data_ptr()
        aligned = (start + _HUGE - 1) & ~(_HUGE - 1)
        length = (start + size - aligned) & ~(_HUGE - 1)
        if length > 0:
            madvise(aligned, length, _MADV_HUGEPAGE)  # a hint: failure changes nothing
    return tensor
