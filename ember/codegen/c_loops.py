"""Loop planning for C kernels, from the memory accesses of a first writing: which adjacent
dims share one loop (every access affine across them), which loops are merged so the parallel
one has enough iterations, and when a reduction runs in column mode (vectorized across the
contiguous kept dim); where a vectorized loop is cut into pieces (split_loop); and when
the parallel decision waits for the run's sizes (at_run_time)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.ir.sizes import Dim, Size, guess
from ember.schedule.expr import Expr, Var

if TYPE_CHECKING:
    from ember.codegen.c import CKernelWriter


def plan_groups(writer: CKernelWriter) -> tuple[list[list[int]], list[list[int]]]:
    """Order a pointwise kernel's loops as its stored buffer lays the dims out; merge dims
    adjacent in that order whose every access is affine across them; then, for parallel
    kernels, merge leading outer loops until the outermost one has enough iterations."""
    shape = writer.kernel.shape

    def mergeable(a: int, b: int) -> bool:
        for offset in writer.accesses + writer.tested:
            for prefix in _prefixes(offset):
                va, vb = Var(f"{prefix}{a}", shape[a]), Var(f"{prefix}{b}", shape[b])
                ca, cb = offset.coefficient(va), offset.coefficient(vb)
                if ca is None or cb is None or ca != cb * shape[b]:
                    return False
        return True

    def merge(dims: list[int]) -> list[list[int]]:
        groups: list[list[int]] = []
        for d in dims:
            if groups and mergeable(groups[-1][-1], d):
                groups[-1].append(d)
            else:
                groups.append([d])
        return groups

    outer = merge(writer.outer_dims if writer.kernel.axes else memory_order(writer))
    inner = merge(writer.inner_dims)
    column = None
    if writer.kernel.axes and outer and _kept_dim_is_contiguous(writer, outer[-1][-1]):
        tuning = writer.tuning
        width = tuning.column if tuning is not None and tuning.column else COLUMN_WIDTH
        column = min(width, guess(math.prod(shape[d] for d in outer[-1])))
    keep_last = not writer.kernel.axes or column is not None
    while writer.parallel and len(outer) > (2 if keep_last else 1) and \
            guess(math.prod(shape[d] for d in outer[0])) < 256 and \
            not writer.padded_dims & set(outer[1]):
        outer[0:2] = [outer[0] + outer[1]]
    return outer, inner, column


def memory_order(writer: CKernelWriter) -> list[int]:
    """A pointwise kernel's dims, outermost first, in the order its stored buffer of the
    kernel's whole shape lays them out: a channels-last result walked in NCHW order reads
    and writes with a stride of C floats in the vectorized loop (ResNet's batch-norm + relu
    kernels), walked in its own order it streams (as Triton's kernels walk it)."""
    shape = writer.kernel.shape
    for stored in writer.kernel.stores:
        buffer = stored.buffer
        if tuple(buffer.shape) == tuple(shape) and buffer.role != "alias":
            return sorted(writer.outer_dims, key=lambda d: -buffer.strides[d])
    return writer.outer_dims


# Lanes per block in column mode: accumulators stay in L1, each row chunk is a long stream.
COLUMN_WIDTH = 256


def _kept_dim_is_contiguous(writer: CKernelWriter, dim: int) -> bool:
    """Do more accesses walk memory contiguously along kept dim `dim` than along a reduced
    dim? Then a reduction loop should vectorize across `dim` (column mode). Only memory
    votes: a pad's tests of its positions (a depthwise convolution's taps, each tested along
    the reduced dims) outvoted the taps' loads, which stream along the channels, and left a
    channels-last batch norm's statistics reading across the grain (6x slower)."""
    shape = writer.kernel.shape
    along_kept = along_reduced = 0
    for offset in writer.accesses:
        # (only accesses that stream along the reduced dims vote: a per-channel value read
        # once per kept position is loaded outside the reduction loop either way; a stride
        # of 2 along a reduced dim, a strided window's taps, is nearly contiguous there)
        strides = [offset.coefficient(Var(f"{prefix}{d}", shape[d]))
                   for prefix in _prefixes(offset) for d in writer.inner_dims]
        if not any(strides):
            continue
        # (nor do reads of one small vector the same for every kept position, a layer
        # norm's weight along the channels it normalizes: it stays in L1, where the image
        # streams)
        if not any(offset.coefficient(Var(f"i{d}", shape[d])) for d in writer.outer_dims):
            continue
        if offset.coefficient(Var(f"i{dim}", shape[dim])) == 1:
            along_kept += 1
        if any(stride in (1, 2) for stride in strides):
            along_reduced += 1
    return along_kept > along_reduced and guess(shape[dim]) >= 8


def _prefixes(offset: Expr) -> set[str]:
    prefixes = set()
    for name in offset.variables():
        stripped = name.rstrip("0123456789")
        prefixes.add(stripped)
    return prefixes


# A loop is cut into at most this many: its body is written once per piece.
MAX_PIECES = 4


def split_loop(tests: list[tuple[str, int | None, int]] | None, bound: str, pragma: str,
               lines: list[str]) -> list[tuple[str, str, list[str]]]:
    """The pieces of a vectorized loop (first, end, body) between the positions where a pad's
    or a cat's test of its variable changes (`tests`: CKernelWriter.splits of the loop's
    variable; a split's or a narrow's gradient, a pad or a cat along the innermost dim:
    RoPE's rotate_half): in each the test is written as the constant it is there, and the
    compiler drops the loads and arithmetic of the side not taken (and a cat's clamps, the
    piece's bounds known). Under the test, a load is conditional, and gcc vectorizes no loop
    holding one that is strided (no masked gather on AVX2) or that feeds a vector math call:
    gMLP's gated-unit gradient ran scalar, 0.88 ms a call; cut, its strided loads gathered
    (CKernelWriter.offset), 0.13 ms (2026-12-07). Loops of a symbolic extent, and parallel
    ones, stay whole."""
    whole = [("0", bound, lines)]
    if not tests or "omp simd" not in pragma or "parallel" in pragma or not bound.isdigit():
        return whole
    extent = int(bound)
    cuts = sorted({0, extent} | {min(max(p, 0), extent) for _, low, high in tests
                                  for p in (low, high) if p is not None})
    pieces = list(zip(cuts, cuts[1:]))
    if len(pieces) < 2 or len(pieces) > MAX_PIECES:
        return whole
    result = []
    for first, end in pieces:
        body = lines
        for test, low, high in tests:
            # (else it fails over the whole piece)
            holds = (low is None or low <= first) and end <= high
            body = [line.replace(test, "1" if holds else "0") for line in body]
        result.append((str(first), str(end), body))
    return result


def at_run_time(work: Dim, threshold: int) -> str:
    """The C condition `work >= threshold` where the symbols' ranges leave it open, else ""
    (the static decision stands)."""
    if not isinstance(work, Size):
        return ""
    low, high = work.bounds()
    if low >= threshold or high < threshold:
        return ""
    return f"{work.render_c()} >= {threshold}"
