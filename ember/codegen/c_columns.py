"""Column mode of the C kernel writer: reductions whose kept innermost dim is the contiguous
one walk blocks of `column` positions, every per-position value an array over the block's
lanes, so the innermost loop runs along contiguous memory (vectorized across the kept dim).
A mixin of `CKernelWriter` (ember/codegen/c.py), which holds the state these methods use."""

from __future__ import annotations

import math

from ember.codegen.c_rules import compute_type
from ember.codegen.text import Scope, c_int, render_c
from ember.ir.graph import Node
from ember.ir.ops import Kind
from ember.ir.sizes import Size
from ember.schedule.expr import ZERO, Expr, Var, ravel, unravel
from ember.schedule.indexing import Index


class ColumnMode:
    def open_lanes(self, parent: Scope) -> tuple[Scope, Expr, tuple]:
        """A loop over the lanes of the current column block."""
        name = self.fresh("l")
        scope = Scope(parent, parent.depth + 1)
        self.defined_at[name] = scope
        return scope, Expr.of(Var(name, self.column)), (scope, name, "lanes")

    def column_index(self, lane: Expr) -> dict[int, Expr]:
        group = self.outer_groups[-1]
        position = self.block_base + lane
        return dict(zip(group, unravel(position, tuple(self.kernel.shape[d] for d in group))))

    def lane_of(self, index: Index) -> Expr | None:
        """In column mode, the lane an index of a per-position value refers to."""
        dim = self.outer_groups[-1][-1]
        group = self.outer_groups[-1]
        position = index[dim] if len(group) == 1 else None
        if position is None:
            position = ravel([index[d] for d in group], tuple(self.kernel.shape[d] for d in group))
        lane = position - self.block_base
        if len(lane.terms) == 1 and lane.const == 0 and lane.terms[0][1] == 1 \
                and isinstance(lane.terms[0][0], Var) and lane.terms[0][0].name.startswith("l"):
            return lane
        return None

    def column_reduction(self, node: Node, index: Index, lane: Expr, scope: Scope) -> str:
        group = self.outer_groups[-1]
        key = (id(node), tuple(ZERO if d in group else e for d, e in enumerate(index)))
        if key not in self.column_arrays:
            self.column_arrays[key] = self.column_accumulate(node, index)
        acc, position, _nan = self.column_arrays[key]
        at = render_c(lane)
        if position:
            return f"{position}[{at}]"
        return self.define(scope, node.dtype, f"({compute_type(node.dtype)}){acc}[{at}]")

    def column_accumulate(self, node: Node, index: Index) -> tuple[str, str | None, str | None]:
        """Accumulator arrays over the block's lanes, filled by loops over the reduced dims
        with the lane loop innermost (contiguous, vectorized)."""
        block, width = self.block_scope, self.column
        op, source = node.op, node.inputs[0]
        acc_type, acc, nan, position = self.accumulators(node)
        init = [f"{acc}[l] = {self.initial(op, source.dtype)};"]
        self.emit(block, f"{acc_type} {acc}[{width}];")
        if nan:
            self.emit(block, f"int {nan}[{width}];")
            init.append(f"{nan}[l] = 0;")
        if position:
            self.emit(block, f"int64_t {position}[{width}];")
            init.append(f"{position}[l] = 0;")
        self.emit(block, f"for (int64_t l = 0; l < {width}; l++) {{ {' '.join(init)} }}")
        body, inner_index, loops = self.open_loops(block, self.inner_groups,
                                                   f"r{next(self.loops)}_")
        lanes, lane, lane_loop = self.open_lanes(body)
        dims = {**inner_index, **self.column_index(lane)}
        full = tuple(dims[d] if d in dims else (ZERO if d in self.kernel.axes else index[d])
                     for d in range(len(self.kernel.shape)))
        value = self.value(source, full, lanes)
        at = render_c(lane)
        for line in self.combine(node, f"{acc}[{at}]", f"{nan}[{at}]" if nan else None,
                                 f"{position}[{at}]" if position else None, value, full):
            self.emit(lanes, line)
        self.store_early(full, lanes)
        status = " reduction(|:status)" if self.checks else ""
        self.close_loops([*loops, lane_loop], [""] * len(loops) + ["#pragma omp simd" + status])
        if nan:
            self.emit(block, f"for (int64_t l = 0; l < {width}; l++) "
                             f"{{ if ({nan}[l]) {acc}[l] = NAN; }}")
        return acc, position, nan

    def needs_reduction(self, node: Node) -> bool:
        """Does `node` read a reduction this kernel computes (through anything it computes
        inline: members and unrealized nodes alike)?"""
        seen, stack = set(), [node]
        while stack:
            current = stack.pop()
            buffer = self.buffer_of.get(current)
            # (what is loaded was computed elsewhere; an alias is a view computed from its
            # base, as generate() does, which may be this kernel's reduction)
            loaded = buffer is not None and current not in self.members and \
                buffer.role != "alias"
            if current in seen or loaded:
                continue
            seen.add(current)
            if current.kind is Kind.REDUCTION:
                return True
            stack.extend(current.inputs)
        return False

    def open_column(self, outer: Scope, outer_index: dict[int, Expr], outer_loops: list):
        """The block loop over the last outer group, and the lanes loop of the epilogue."""
        group, width = self.outer_groups[-1], self.column
        extent = math.prod(self.kernel.shape[d] for d in group)
        if isinstance(extent, Size):  # (the block count is no polynomial; `extent` bounds it)
            blocks, bound = extent, f"({extent.render_c()} + {width - 1}) / {width}"
        else:
            blocks = -(-extent // width)
            bound = c_int(blocks)
        name = f"b{group[0]}"
        block = Scope(outer, outer.depth + 1)
        self.defined_at[name] = block
        outer_loops.append((block, name, bound))
        self.block_scope = block
        self.block_base = Expr.of(Var(name, blocks)) * width
        self.emit(block, f"int64_t lanes = {c_int(extent)} - {name} * {width} < {width} ? "
                         f"{c_int(extent)} - {name} * {width} : {width};")
        lanes, lane, loop = self.open_lanes(block)
        return lanes, {**outer_index, **self.column_index(lane)}, loop
