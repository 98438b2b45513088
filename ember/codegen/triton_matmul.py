"""A matmul computed inside a Triton kernel, before its pointwise work (the epilogue fusion of
ember/schedule/epilogue.py): the program's output tile, the product of that tile accumulated
in float32 over BLOCK_K steps, and the product's value where the kernel reads it.

A mixin of the kernel writer (ember/codegen/triton.py), which owns the scopes, the masks and
the tiling (its block_m, block_n, block_k and precision come from ember/codegen/triton_tiling.py).
"""

from __future__ import annotations

import torch

from ember.codegen.text import Scope
from ember.codegen.triton_reductions import render
from ember.codegen.triton_tiling import divides
from ember.ir.sizes import Size, Undecided
from ember.schedule.expr import Expr


class MatmulWriting:
    """The kernel writer's part that writes a kernel's matmul (`self.matmul`)."""

    def product(self, offset: Expr) -> str:
        """The product's value at this point of the tile: the accumulator, when read where
        the kernel's own position is (anything else would need other tiles' values)."""
        here = tuple(self.outer_index[d] for d in (0, 1))
        expected = Expr.of(self.matmul.result.offset)
        for position, stride in zip(here, self.matmul.result.strides):
            expected = expected + position * stride
        if render(offset) != render(expected):
            self.reads_product_elsewhere = True
            if not self.analysis:
                raise AssertionError(f"{self.kernel.name} reads its matmul's result elsewhere "
                                     f"than at its own position")
        return "acc"

    def matmul_header(self, root: Scope) -> None:
        """Program -> (row tile, column tile); the product of that tile accumulated in fp32;
        x, the flat position the pointwise work indexes by, as a [BLOCK_M, BLOCK_N] block."""
        mm, tiling = self.matmul, self.tiling
        m, n = self.kernel.shape
        k = mm.a.shape[1]
        a, b = self.argument(mm.a), self.argument(mm.b)
        sa_m, sa_k = mm.a.strides
        sb_k, sb_n = (mm.b.strides[1], mm.b.strides[0]) if mm.b_transposed else mm.b.strides
        if isinstance(n, Size):  # (tiles are numbered row by row: a symbolic width would
            raise Undecided(f"a matmul tile over a symbolic width {n}")  # need it per call)
        columns = -(-n // tiling.block_n)
        row_tile = f"(tl.program_id(0) // {columns})" if columns > 1 else "tl.program_id(0)"
        lines = [f"rm = {row_tile} * BLOCK_M + tl.arange(0, BLOCK_M)",
                 f"rn = (tl.program_id(0) % {columns}) * BLOCK_N + tl.arange(0, BLOCK_N)"
                 if columns > 1 else "rn = tl.arange(0, BLOCK_N)",
                 f"x = rm[:, None] * {n} + rn[None, :]",
                 "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)",
                 f"for k0 in range(0, {k}, BLOCK_K):",
                 "    rk = k0 + tl.arange(0, BLOCK_K)"]
        def bounds(*checks: tuple[str, int, int]) -> str:
            """The mask of the lanes inside the matrix, for the dims a tile can overrun."""
            return " & ".join(f"({index} < {extent})" for index, extent, block in checks
                              if not divides(block, extent))

        a_mask = bounds(("rm[:, None]", m, tiling.block_m), ("rk[None, :]", k, tiling.block_k))
        b_mask = bounds(("rk[:, None]", k, tiling.block_k), ("rn[None, :]", n, tiling.block_n))
        a_load = _pointer(a, mm.a.offset, ("rm[:, None]", sa_m), ("rk[None, :]", sa_k))
        b_load = _pointer(b, mm.b.offset, ("rk[:, None]", sb_k), ("rn[None, :]", sb_n))
        lines.append(f"    a = tl.load({a_load}" + (f", mask={a_mask}, other=0)" if a_mask
                                                      else ")"))
        lines.append(f"    b = tl.load({b_load}" + (f", mask={b_mask}, other=0)" if b_mask
                                                      else ")"))
        # float32 operands: exact products as cuBLAS's (no TF32); half: tensor cores
        precision = f', input_precision="{tiling.precision}"' \
            if mm.a.dtype is torch.float32 else ""
        lines.append(f"    acc += tl.dot(a, b{precision})")
        if mm.result.dtype is torch.float16:  # eager's product is rounded to half
            lines.append("acc = acc.to(tl.float16).to(tl.float32)")
        for line in lines:
            self.emit(root, line)
        self.deps["x"] = self.deps["acc"] = frozenset({"x"})
        if not divides(tiling.block_m, m) or not divides(tiling.block_n, n):
            self.masks["x"] = "xmask"
            self.emit(root, f"xmask = (rm[:, None] < {m}) & (rn[None, :] < {n})")


def _pointer(base: str, offset: int, *terms: tuple[str, int]) -> str:
    parts = [base] + ([str(offset)] if offset else [])
    parts += [f"{index} * {stride}" if stride != 1 else index for index, stride in terms]
    return " + ".join(parts)
