"""The tiles mode="max-autotune" tries for a Triton kernel besides the heuristics' one
(ember/codegen/triton_tiling.py): at most five, each a small step from the default in block
size, warps or pipeline stages, and each valid for the kernel as the default is (a
persistent tile still holds the whole row; a split reduction keeps its chunks).

Takes the first writing of a kernel and its default tiling; gives label -> Tiling. Choosing
among them is ember/runtime/tune_triton.py's work.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ember.codegen.triton_tiling import Tiling, pow2
from ember.ir.sizes import guess

if TYPE_CHECKING:
    from ember.codegen.triton import TritonKernelWriter

# (block_m, block_n, block_k, warps, stages) of a kernel that computes a matmul first, each
# clipped to the product's extents (tl.dot takes blocks of at least 16)
MATMUL_TILES = ((32, 32, 64, 4, 3), (16, 32, 64, 2, 3), (32, 16, 32, 2, 4),
                (64, 64, 32, 4, 3), (16, 16, 32, 2, 4))
MAX_WARPS = 16
MAX_TILE = 16384  # elements of a reduction's [XBLOCK, RBLOCK] tile held at once


def candidate_tilings(writer: TritonKernelWriter, default: Tiling) -> dict[str, Tiling]:
    """Other tiles for the kernel `writer` wrote first, by label (what differs from the
    default), the default itself left out."""
    found: dict[str, Tiling] = {}

    def add(**changes: int) -> None:
        changes["num_warps"] = max(1, min(MAX_WARPS, changes.get("num_warps",
                                                                 default.num_warps)))
        tiling = dataclasses.replace(default, **changes)
        if tiling != default and tiling not in found.values() and len(found) < 5:
            found[label(tiling, default)] = tiling

    warps, stages = default.num_warps, default.num_stages
    if writer.matmul is not None:
        m, n = map(guess, writer.kernel.shape)
        k = guess(writer.matmul.a.shape[1])
        for block_m, block_n, block_k, tile_warps, tile_stages in MATMUL_TILES:
            add(block_m=_fit(block_m, m), block_n=_fit(block_n, n), block_k=_fit(block_k, k),
                num_warps=tile_warps, num_stages=tile_stages)
        return found
    x, xnumel, rnumel = default.xblock, guess(writer.xnumel), guess(writer.rnumel)
    wider = min(2 * x, pow2(xnumel))
    if not writer.reduces:
        for xblock, tile_warps in ((x, 2 * warps), (x, warps // 2), (wider, warps),
                                   (max(x // 2, 32), warps), (wider, 2 * warps)):
            add(xblock=xblock, num_warps=tile_warps)
        return found
    if default.parts > 1 or default.persistent:
        # (a split reduction's chunks are whole tiles of RBLOCK: only the rows per tile and
        # the warps change; a persistent tile holds the whole row: its RBLOCK stays)
        for xblock, tile_warps in ((x, 2 * warps), (x, warps // 2), (wider, warps),
                                   (max(x // 2, 1), warps), (wider, 2 * warps)):
            if xblock * default.rblock <= max(MAX_TILE, x * default.rblock):
                add(xblock=xblock, num_warps=tile_warps)
        return found
    r = default.rblock  # a looped row: RBLOCK steps
    for rblock, tile_warps, tile_stages in ((r, 2 * warps, stages), (r, warps // 2, stages),
                                            (min(2 * r, max(pow2(rnumel), 16)), warps, stages),
                                            (max(r // 2, 16), warps, stages),
                                            (r, warps, 2)):
        if x * rblock <= max(MAX_TILE, x * r):
            add(rblock=rblock, num_warps=tile_warps, num_stages=tile_stages)
    return found


def _fit(block: int, extent: int) -> int:
    return max(16, min(pow2(extent), block))


_NAMES = {"xblock": "xblock", "rblock": "rblock", "block_m": "block_m", "block_n": "block_n",
          "block_k": "block_k", "num_warps": "warps", "num_stages": "stages"}


def label(tiling: Tiling, default: Tiling) -> str:
    """What differs from the default, as `xblock=2048 warps=8`."""
    return " ".join(f"{name}={getattr(tiling, field)}" for field, name in _NAMES.items()
                    if getattr(tiling, field) != getattr(default, field))
