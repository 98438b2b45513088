"""Symbolic sizes in Triton kernels (issue 18, stage 4): how a kernel takes them, how its grid
follows them, and the per-call check that lets its indices stay int32.

A symbolic graph's kernels take the graph's symbols (s0, s1, ...) as integer arguments after
their pointers; masks and loop bounds are expressions over them; the wrapper computes each
grid per call. Offsets are bounded only by the call's sizes, so the kernels are written twice
from one plan: int32 indices (the usual build) and int64 ones (`wide`, built on the first call
that needs it); the wrapper runs the wide build when `index_reach(plan)` reaches
`INT32_SAFE`. Nothing here decides a tile (triton_tiling.py does, from the sizes' guesses).

A reduction over a row of symbolic length is tiled like a static row of the same class
(`RowClasses`): each build serves one power-of-two class of each such length (rows of up to
that many values held whole in registers, as softmax wants them; longer ones walked in steps)
and one answer per symbol in those lengths to "a multiple of 16?" (promised to Triton, whose
loads along a row whose stride is that symbol are then vectorized). The wrapper computes the
call's classes and sends it to the build for them, made on the first call that needs it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping

from ember.codegen import triton_tiling
from ember.codegen.triton_tiling import Heuristics, row_class
from ember.ir.sizes import GUESS, Dim, Size, Symbol, evaluate

# A symbol's name in kernel text (ember names them s0, s1, ...; no generated name is one:
# values are v/t/acc/pos/part..., pointers p_...).
SYMBOL = re.compile(r"\bs\d+\b")

# Offsets, positions and loop counters of a narrow build stay below this: the reach summed
# below bounds each of them, with room for a block past the end (a tile's last lanes, the
# chunks of a split row rounded up to whole tiles).
INT32_SAFE = 2 ** 30


def size_type(wide: bool) -> str:
    """Sizes are plain integer arguments, never specialized: not on 1 (a symbol is >= 2; sizes
    0 and 1 specialize in capture) nor on divisibility by 16 (a constant factor keeps its
    divisibility in Triton's analysis, 768*s0 is a multiple of 256; a row whose length is a
    bare symbol loses vector loads: a per-call variant is left for later). int32, unless the
    call's offsets pass int32 (`wide`)."""
    return "i64" if wide else "i32"


def ceil_div(extent: Dim, block: int) -> int | str:
    """How many blocks cover `extent`: an int, or for a symbolic extent the Python expression
    the wrapper computes per call."""
    if not isinstance(extent, Size):
        return -(-extent // block)
    if all(coefficient % block == 0 for _, coefficient in extent.terms):
        return (extent // block).render_python() if block > 1 else extent.render_python()
    return f"(({extent.render_python()} + {block - 1}) // {block})"


def grid_product(a: int | str, b: int | str) -> int | str:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if b == 1:
        return a
    return f"{a} * {b}"


def index_reach(plan, launches) -> Dim:
    """A bound on every offset and position the plan's kernels compute: the sum of each
    buffer's span (its last element + 1), each workspace's size and each iteration space.
    Symbolic when the graph's sizes are; the wrapper compares it with INT32_SAFE per call
    (a sum, one comparison: conservative, since each part alone must fit)."""
    total: Dim = 0
    seen: set[int] = set()
    for buffer in [*plan.inputs, *plan.outputs, *plan.buffers]:
        if buffer.root() is not buffer or not buffer.shape or id(buffer) in seen:
            continue
        seen.add(id(buffer))
        if buffer.strides is None:  # (a library result laid out by the call)
            total = total + math.prod(buffer.shape)
        else:
            # (a symbolic stride is a product of sizes: never negative)
            total = total + buffer.offset + 1 + sum(
                (n - 1) * (s if isinstance(s, Size) else abs(s))
                for n, s in zip(buffer.shape, buffer.strides))
    for kernel in plan.kernels:
        total = total + math.prod(kernel.shape)
    for launch in launches:
        for space in launch.workspaces:
            total = total + math.prod(space.shape)
    return total



@dataclasses.dataclass(frozen=True)
class RowClasses:
    """The symbolic row lengths of a plan's reductions, the symbols in them and the elements
    those kernels cover: what a call's build key is made of (see the module's docstring).
    A key: each row's class (triton_tiling.row_class), then the divisibility of each symbol
    (the largest power of two up to 16 that divides it; all 1 where the kernels hold fewer
    than `aligned_elements`)."""

    rows: tuple[Size, ...]
    symbols: tuple[Symbol, ...]
    elements: Dim

    @staticmethod
    def of(kernels: Iterable[tuple[Dim | None, Dim]]) -> RowClasses | None:
        """From each kernel's row length (None: it does not reduce) and iteration space;
        None when no row is symbolic."""
        found = [(row, space) for row, space in kernels if isinstance(row, Size)]
        if not found:
            return None
        rows = tuple(dict.fromkeys(row for row, _ in found))
        symbols = sorted({s for row in rows for s in row.symbols()},
                         key=lambda s: (len(s.name), s.name))
        return RowClasses(rows, tuple(symbols), sum(space for _, space in found))

    def key_text(self, heuristics: Heuristics | None = None) -> str:
        """The call's key as a Python expression over the symbols (the wrapper's text; its
        namespace holds `row_class`)."""
        heuristics = heuristics or triton_tiling.HEURISTICS
        aligned = ", ".join(f"min({s.name} & -{s.name}, 16)" for s in self.symbols)
        ones = ", ".join("1" for _ in self.symbols)
        elements = self.elements.render_python() if isinstance(self.elements, Size) \
            else str(self.elements)
        parts = [f"row_class({row.render_python()})" for row in self.rows]
        parts.append(f"(({aligned},) if {elements} >= {heuristics.aligned_elements} "
                     f"else ({ones},))")
        return "(" + ", ".join(parts) + ")"

    def key(self, values: Mapping[str, int], heuristics: Heuristics | None = None) -> tuple:
        heuristics = heuristics or triton_tiling.HEURISTICS
        large = evaluate(self.elements, values) >= heuristics.aligned_elements
        aligned = tuple(min(values[s.name] & -values[s.name], 16) if large else 1
                        for s in self.symbols)
        return (*(row_class(row.evaluate(values)) for row in self.rows), aligned)

    def names(self) -> set[str]:
        """Every symbol the key reads (the rows', and those of the kernels' sizes)."""
        found = {s.name for s in self.symbols}
        if isinstance(self.elements, Size):
            found |= {s.name for s in self.elements.symbols()}
        return found

    def guessed(self) -> tuple:
        """The key at the symbols' guesses (where no call's sizes are known)."""
        symbols = set(self.symbols)
        if isinstance(self.elements, Size):
            symbols |= self.elements.symbols()
        return self.key({s.name: min(max(s.low, GUESS), s.high or GUESS) for s in symbols})

    def build(self, key: tuple) -> tuple[dict[Dim, int], dict[str, int]]:
        """The build for `key`: each row's class, and the divisibility promised of each
        symbol (where more than 1)."""
        classes = dict(zip(self.rows, key))
        divisible = {s.name: d for s, d in zip(self.symbols, key[-1]) if d > 1}
        return classes, divisible
