"""How a Triton kernel maps onto the GPU's grid: its tile, warps and index width.

The choice is made from a first writing of the kernel (ember/codegen/triton.py), which collects
its extents, its memory accesses and how many values it computes:

- pointwise kernels are 1-D blocks of XBLOCK elements, at least 8 bytes per thread per tensor;
  long chains (compute-bound) hold fewer elements per thread on more warps;
- reductions whose kept dim is the contiguous one (a reduction over a strided dim) take a wide
  XBLOCK and a short RBLOCK, so each load is coalesced across `x`;
- rows up to `persistent_max` are held whole in registers (persistent), longer ones are walked
  in RBLOCK steps (looped); too few programs with too much work each are split;
- kernels that compute a small matmul first take tl.dot tiles;
- offsets that can reach 2**31 make every index int64.

The numbers are `Heuristics`; the GPU bench (ember/bench/gpu.py) times alternatives by swapping
the module's HEURISTICS.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ember.ir.sizes import Dim, Size, guess
from ember.schedule.expr import Div, Expr, Mod, Var

if TYPE_CHECKING:
    from ember.codegen.triton import TritonKernelWriter

INT32_LIMIT = 2 ** 31


@dataclasses.dataclass(frozen=True)
class Tiling:
    """How a kernel maps onto the grid."""

    xblock: int
    rblock: int = 0            # 0: a pointwise kernel
    persistent: bool = False   # the whole row in one tile
    num_warps: int = 4
    int64: bool = False
    parts: int = 1             # a split reduction: each row in `parts` chunks of `chunk`
    chunk: int = 0
    block_m: int = 0           # a kernel that computes a matmul first: its tile (and the
    block_n: int = 0           # depth of one step over k)
    block_k: int = 0
    precision: str = "ieee"    # of a float32 matmul's tl.dot
    num_stages: int = 1        # loads in flight ahead of a matmul's step over k
    # a split reduction over a symbolic row: each chunk's length is computed in the kernel
    # from the row's length (`chunk` is then 0), `parts` chunks whatever the length
    chunk_per_call: bool = False


@dataclasses.dataclass(frozen=True)
class Heuristics:
    """The tile sizes ember picks (ember/bench's GPU script times alternatives)."""

    pointwise_block: int = 1024       # elements per program of a large pointwise kernel
    pointwise_warps: int = 4          # 8 elements (32 bytes of float32) per thread
    # long pointwise chains (compute-bound: S2's 20 erf-gelus) want more threads with fewer
    # elements each: on the H200 (2026-11-29) 4 elements per thread (1024 on 8 warps) took
    # 0.385 ms against 0.406 for 8 (2048 on 8) and 0.443 for 8 on 4 warps, and half the
    # compile time (the chain is unrolled once per element a thread holds)
    heavy_values: int = 64
    heavy_block: int = 1024
    heavy_warps: int = 8
    persistent_max: int = 8192        # longest row held whole in registers
    persistent_elements: int = 4096   # elements per program of a persistent tile
    looped_rblock: int = 2048
    # symbolic rows (triton_sizes.RowClasses): shorter ones share one build (a tile of 64
    # with its tail masked costs little more than a tighter one: such kernels are short), and
    # a symbol is promised its divisibility only where the kernels of its rows hold this
    # many elements (below, a kernel is done in a few microseconds: vector loads gain nothing
    # there, and each divisibility met would be another build)
    shortest_class: int = 64
    aligned_elements: int = 2 ** 20
    split_min_row: int = 16384        # programs of at least this many elements may be split ...
    split_target_programs: int = 512  # ... when fewer programs than this would run
    split_max_parts: int = 256
    split_exact_chunks: bool = True   # chunks that divide the row where a count near the aim does
    # a split reduction whose later stage runs one program per chunk (a batch norm's normalize,
    # the next level's partial stage) has every such program load every chunk's partials:
    # past this many bytes so loaded in all (a ResNet-50 batch norm's: 64 MB beside its 102 MB
    # activation), a stage of its own finishes each row's partials once, for one more launch
    gather_stage_bytes: int = 2 ** 23
    # strided reductions: short rows, wide coalesced x. 64 rows a step: on an H100
    # (2026-12-06, ember/bench/tile_ab.py) a channels-last batch norm's training step over
    # [32, 256, 56, 56] took 0.556 ms against 0.629 with 32 (eager 0.490), a Linear's and a
    # LayerNorm's bias gradients over [8192, 768] 0.189 against 0.207
    column_rblock: int = 64
    column_xblock: int = 64
    # kernels that compute a small matmul first: on the H200 (S4's 64x256x256 Linear+Tanh
    # layers) 16x16 tiles over 64-deep steps on 2 warps with three-pass TF32 took 5.7 us per
    # layer against 7.6 for cuBLAS + a tanh kernel and 23 for the first 64x32x32 "ieee" tiles;
    # with three steps' loads in flight (num_stages=3) 4.2 us (the 2026-11-30 sweep: 1 stage
    # 5.5, 2 stages 4.7, 128-deep steps 4.4-4.9, one 256-deep step 49: registers spill)
    matmul_block_m: int = 16
    matmul_block_n: int = 16
    matmul_block_k: int = 64
    matmul_warps: int = 2
    matmul_stages: int = 3
    # float32 tl.dot: "tf32x3" splits each operand into two TF32 parts and sums three tensor
    # core products (float32-level error, as cuBLAS's float32 results have); "ieee": exact
    # products on the CUDA cores (slower)
    matmul_precision: str = "tf32x3"


HEURISTICS = Heuristics()


def pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def divides(block: int, extent: Dim) -> bool:
    """Does `block` divide `extent` at every size its symbols may take (then the blocks need
    no mask)? A symbolic extent does only where every coefficient is a multiple (768*s0 by
    256): otherwise its tail is masked, whatever the call's size."""
    if isinstance(extent, Size):
        return all(coefficient % block == 0 for _, coefficient in extent.terms)
    return extent % block == 0


def wide_enough(extent: Dim) -> bool:
    """Is this static extent or bound past int32? Symbolic ones are not decided here: a
    symbolic graph's kernels index in int32 while the wrapper's per-call check says that
    every offset fits, else its int64 build runs (ember/codegen/triton_sizes.py)."""
    if isinstance(extent, Size):
        return False
    return extent >= INT32_LIMIT


def row_class(length: int, heuristics: Heuristics | None = None) -> int:
    """The class of a symbolic row's length that a build of its kernel serves: the least power
    of two that holds it (at least `shortest_class`), up to the longest row held in
    registers; 0 for longer rows (walked in steps, whatever their length). The wrapper
    computes it per call (ember/compile_plan.py)."""
    heuristics = heuristics or HEURISTICS
    if length > heuristics.persistent_max:
        return 0
    return max(pow2(length), heuristics.shortest_class)


def choose_tiling(writer: TritonKernelWriter, heuristics: Heuristics | None = None,
                  rows: Mapping[Dim, int] | None = None) -> Tiling:
    """Tile sizes from the kernel's extents and the first writing's memory accesses, by
    `heuristics` or else the module's HEURISTICS as they are now (the GPU bench swaps them).
    `rows`: a build for one class of each symbolic row length (`row_class`); a row whose
    class is a power of two is held whole as a static row of that length would be."""
    heuristics = heuristics or HEURISTICS
    # (heuristics read a symbolic extent at its guess; masks and loop bounds use its value)
    xnumel, rnumel = guess(writer.xnumel), guess(writer.rnumel)
    longest = None  # (the bound of a symbolic row's length in this build)
    if isinstance(writer.rnumel, Size):
        longest = writer.rnumel.bounds()[1]
        served = rows.get(writer.rnumel) if rows is not None else None
        if served:
            longest = min(longest, served)
        elif served == 0:  # (a build for rows too long to hold)
            rnumel = max(rnumel, heuristics.persistent_max + 1)
    int64 = writer.wide or wide_enough(writer.xnumel * max(writer.rnumel, 1)) or any(
        needs_int64(offset) for offset in writer.accesses)
    if writer.matmul is not None:
        m, n = map(guess, writer.kernel.shape)
        k = guess(writer.matmul.a.shape[1])
        return Tiling(0, num_warps=heuristics.matmul_warps, int64=int64,
                      block_m=max(16, min(pow2(m), heuristics.matmul_block_m)),
                      block_n=max(16, min(pow2(n), heuristics.matmul_block_n)),
                      block_k=max(16, min(pow2(k), heuristics.matmul_block_k)),
                      precision=heuristics.matmul_precision,
                      num_stages=heuristics.matmul_stages)
    if not writer.reduces:
        heavy = writer.made >= heuristics.heavy_values
        block = min(pow2(xnumel), heuristics.heavy_block if heavy else
                    heuristics.pointwise_block)
        per_thread = 4 if heavy else 8  # elements each thread holds, at least
        warps = max(1, min(heuristics.heavy_warps if heavy else heuristics.pointwise_warps,
                           block // (32 * per_thread)))
        return Tiling(block, num_warps=warps, int64=int64)
    if kept_dim_is_contiguous(writer):
        if longest is not None:
            rnumel = int(min(rnumel, longest))
        rblock = min(pow2(rnumel), heuristics.column_rblock)
        xblock = min(pow2(xnumel), heuristics.column_xblock)
        # (a symbolic row: held whole only where its range or its class keeps it within the
        # tile)
        persistent = (longest if longest is not None else rnumel) <= rblock
        warps = max(1, min(8, xblock * rblock // 256))
        return maybe_split(Tiling(xblock, rblock, persistent, warps, int64), writer,
                            heuristics)
    if longest is not None:
        # a row of symbolic length is held whole only where its range (a mark_dynamic max)
        # or this build's class bounds it: else the row is walked in RBLOCK steps, its tail
        # masked
        if longest <= heuristics.persistent_max:
            rnumel = int(longest)
        else:
            rblock = min(heuristics.looped_rblock, max(pow2(rnumel), 16))
            return maybe_split(Tiling(1, rblock, False, max(1, min(16, rblock // 256)), int64),
                               writer, heuristics)
    if rnumel <= heuristics.persistent_max:
        rblock = pow2(rnumel)
        xblock = max(1, min(pow2(xnumel), heuristics.persistent_elements // rblock))
        warps = max(1, min(16, xblock * rblock // 512))
        return Tiling(xblock, rblock, True, warps, int64)
    rblock = heuristics.looped_rblock
    return maybe_split(Tiling(1, rblock, False, max(1, min(16, rblock // 256)), int64),
                        writer, heuristics)


def maybe_split(tiling: Tiling, writer: TritonKernelWriter, heuristics: Heuristics) -> Tiling:
    """Too few programs to fill the GPU, each with much work (a long row, or a tile of
    columns as long as a bias gradient's batch): split every row into chunks, one program per
    chunk, and combine the chunks' partial results in a second pass."""
    programs = -(-guess(writer.xnumel) // tiling.xblock)
    rnumel = guess(writer.rnumel)
    if isinstance(writer.rnumel, Size) and writer.rnumel.bounds()[1] >= \
            heuristics.split_min_row * heuristics.split_max_parts:
        # a row of symbolic length may be as long as any: with too few programs it is split
        # whatever its guess (a short row's extra chunks are empty: a launch and a few
        # masked loads), else one program would walk a long one alone
        rnumel = max(rnumel, heuristics.split_min_row * heuristics.split_max_parts)
    if rnumel * tiling.xblock < heuristics.split_min_row or \
            programs >= heuristics.split_target_programs:
        return tiling
    parts = min(heuristics.split_max_parts, pow2(heuristics.split_target_programs // programs),
                pow2(-(-rnumel // (2 * tiling.rblock))))
    if parts < 2:
        return tiling
    if isinstance(writer.rnumel, Size):  # (the chunks' length follows the call's row)
        return dataclasses.replace(tiling, persistent=False, parts=parts, chunk=0,
                                   chunk_per_call=True)
    tiles = -(-rnumel // tiling.rblock)
    exact = next((d for d in range(parts, parts // 2, -1) if tiles % d == 0), None) \
        if rnumel % tiling.rblock == 0 and heuristics.split_exact_chunks else None
    if exact is not None:
        # as many chunks (near the aim) as divide the row's whole tiles: no chunk reaches
        # past the row's end, and no element needs a mask (ResNet-50's 100352 rows of 32:
        # 112 chunks of 28 tiles, not 126 of 25 with every load, sum and store masked)
        parts = exact
    chunk = -(-tiles // parts) * tiling.rblock  # whole tiles per chunk
    parts = -(-rnumel // chunk)
    return dataclasses.replace(tiling, persistent=False, parts=parts, chunk=chunk)


def kept_dim_is_contiguous(writer: TritonKernelWriter) -> bool:
    """Do the accesses that walk memory contiguously along the innermost kept dim touch more
    elements than those contiguous along a reduced dim? Then loads coalesce across x, and the
    tile is wide in x, short in r. Each access weighs what it touches: a row's result or a
    per-row operand is one element a row, not the row (a row reduction with two results per
    row, the max and the sum of a loss's logits, is walked along its rows; a layer norm's
    parameter gradients, which read each row's mean, across them)."""
    if not writer.outer_dims:
        return False
    shape = writer.kernel.shape
    last = writer.outer_dims[-1]
    kept = [Var(f"i{d}", shape[d]) for d in writer.outer_dims]
    reduced = [Var(f"r{d}", shape[d]) for d in writer.inner_dims]
    rows, row = max(guess(writer.xnumel), 1), max(guess(writer.rnumel), 1)
    along_kept = along_reduced = 0
    for offset in writer.accesses:
        touched = (rows if any(offset.coefficient(i) != 0 for i in kept) else 1) * \
            (row if any(offset.coefficient(r) != 0 for r in reduced) else 1)
        if offset.coefficient(kept[-1]) == 1:
            along_kept += touched
        if any(offset.coefficient(r) == 1 for r in reduced):
            along_reduced += touched
    return along_kept > along_reduced and guess(shape[last]) >= 16


def needs_int64(expr: Expr) -> bool:
    """Can this offset pass int32? (Bounds made infinite by a symbolic extent are left to the
    wrapper's per-call check: see `wide_enough`.)"""
    low, high = expr.bounds()
    if math.isinf(high) or math.isinf(low):
        return any(needs_int64(atom.expr) for atom, _ in expr.terms
                   if isinstance(atom, (Div, Mod)))
    if high >= INT32_LIMIT or low < -INT32_LIMIT:
        return True
    return any(needs_int64(atom.expr) for atom, _ in expr.terms if isinstance(atom, (Div, Mod)))
