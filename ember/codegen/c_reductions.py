"""Reductions in C kernels (a mixin of ember/codegen/c.py's CKernelWriter): a reduction used
per outer point is an inner loop at that point, its accumulator initialized before and
folded in after; OpenMP's reduction clauses vectorize it (and share it across cores where
the kernel's outer loops do not); a long float sum adds in float blocks folded into a double
total; the whole-space values a reduction's loop walks past are stored from inside it
(store_early). Column mode's reductions are ember/codegen/c_columns.py's.
"""

from __future__ import annotations

import math
import re

import torch

from ember import config
from ember.codegen.c_loops import at_run_time
from ember.codegen.c_rules import compute_type, literal, store
from ember.codegen.text import Scope
from ember.codegen.text import render_c as render
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.ir.sizes import Dim, Size
from ember.schedule.expr import ZERO
from ember.schedule.indexing import Index

# Elements a long float sum adds in float before folding into its double total (close_blocked_sum)
SUM_BLOCK = 1024

_OMP_REDUCTION = {Op.SUM: "+", Op.PROD: "*", Op.MAX: "max", Op.MIN: "min", Op.ANY: "|",
                  Op.ALL: "&"}


class Reductions:
    """The reduction methods of CKernelWriter (its attributes are that class's)."""

    def reduction(self, node: Node, index: Index, scope: Scope) -> str:
        if self.column is not None:
            lane = self.lane_of(index)
            if lane is not None:
                return self.column_reduction(node, index, lane, scope)
        op, source, dtype = node.op, node.inputs[0], node.dtype
        acc_type, acc, nan, position = self.accumulators(node)
        self.emit(scope, f"{acc_type} {acc} = {self.initial(op, source.dtype)};")
        if nan:
            self.emit(scope, f"int {nan} = 0;")
        if position:
            self.emit(scope, f"int64_t {position} = 0;")
        body, inner_index, loops = self.open_loops(scope, self.inner_groups,
                                                   f"r{next(self.loops)}_")
        full = tuple(inner_index.get(d, ZERO) if d in self.kernel.axes else index[d]
                     for d in range(len(self.kernel.shape)))
        value = self.value(source, full, body)
        count = math.prod(source.shape[d] for d in node.attrs["axes"])
        threshold = config.settings.parallel_threshold
        count_if = at_run_time(count, threshold)
        across_cores = scope.depth == 0 and self.parallel and (count_if or count >= threshold)
        # (a symbolic count too: its rows may be short, or long; a double accumulator
        # throughout ran a softmax over 64 symbolic columns 1.7x slower than the static one)
        blocked = acc_type == "double" and op is Op.SUM and compute_type(dtype) == "float" \
            and len(loops) == 1 and not across_cores
        folded = f"{acc}_block" if blocked else acc
        for line in self.combine(node, folded, nan, position, value, full):
            self.emit(body, line)
        self.store_early(full, body)
        pragmas = [""] * len(loops)
        if loops and op in _OMP_REDUCTION:
            clause = f"reduction({_OMP_REDUCTION[op]}:{folded})"
            if nan:
                clause += f" reduction(|:{nan})"
            if self.checks:
                clause += " reduction(|:status)"
            pragmas[-1] = f"#pragma omp simd {clause}"
            if across_cores:
                condition = " && ".join(c for c in (self.parallel_if, count_if) if c)
                clause += f" if(parallel: {condition})" if condition else ""
                pragmas[0] = (f"#pragma omp parallel for simd {clause}" if len(loops) == 1
                              else f"#pragma omp parallel for {clause}") + self.threads()
        if blocked:
            self.close_blocked_sum(loops[0], pragmas[0], acc, folded, count)
        else:
            self.close_loops(loops, pragmas)
        if nan:
            self.emit(scope, f"if ({nan}) {acc} = NAN;")
        if position:
            return position
        return self.define(scope, dtype, f"({compute_type(dtype)}){acc}")

    def store_early(self, full: Index, scope: Scope) -> None:
        """Store the whole-space values that need no reduction of this kernel in the first
        reduction loop, which walks the whole space anyway, instead of a loop of their own
        that would compute them again (a depthwise convolution stored beside its pooled
        mean: each output's taps once, not twice)."""
        if self.checks:  # (a failed index check would have stored some of them)
            return
        items = [item for item in self.early_stores if item not in self.stored_early]
        # (every value before any store, as store_lines: an input written in place is read
        # first; and an input's stores wait for the whole kernel's reads of it in any case)
        if any(item.buffer.root().role == "input" for item in items):
            return
        values = [(item, self.placed(item.node, dict(enumerate(full)))) for item in items]
        values = [(item, at, self.value(item.node, at, scope)) for item, at in values]
        for item, at, stored in values:
            self.emit(scope, f"{self.offset(item.buffer, at)} = {store(item.node.dtype, stored)};")
            self.stored_early.add(item)
            if tuple(item.node.shape) == tuple(self.kernel.shape) and \
                    item.buffer.role != "alias":
                self.reloadable[item.node] = (item.buffer, self.kept_positions(at))

    def kept_positions(self, index: Index) -> tuple[str, ...]:
        """The kept dims' positions of a whole-space index, a lane of column mode's any lane:
        a value stored at them by an earlier loop of this kernel was stored by the thread
        that reads it now (the threads share out the kept positions, never the reduced)."""
        return tuple(re.sub(r"\bl\d+\b", "lane", render(index[d])) for d in self.outer_dims)

    @staticmethod
    def close_blocked_sum(loop: tuple[Scope, str, str], pragma: str, acc: str, block: str,
                          count: Dim) -> None:
        """A long float sum in blocks: each block sums in float across SIMD lanes, the blocks
        add up in double. As accurate as eager's cascade sum for these lengths, and the
        vector loop stays in float (a double accumulator halves its lanes and converts every
        element: a vocabulary's log-sum-exp ran 1.6x slower). `count` may be symbolic (the
        loop's bound, rendered, is the count)."""
        scope, name, bound = loop
        start = f"{name}_block"
        end = f"{start} + {SUM_BLOCK}" if isinstance(count, int) and count % SUM_BLOCK == 0 \
            else f"({start} + {SUM_BLOCK} < {bound} ? {start} + {SUM_BLOCK} : {bound})"
        text = [f"for (int64_t {start} = 0; {start} < {bound}; {start} += {SUM_BLOCK}) {{",
                f"    float {block} = 0;",
                f"    {pragma}",
                f"    for (int64_t {name} = {start}; {name} < {end}; {name}++) {{"]
        text += ["        " + line for line in scope.lines]
        text += ["    }", f"    {acc} += {block};", "}"]
        scope.parent.lines.extend(text)

    def accumulators(self, node: Node) -> tuple[str, str, str | None, str | None]:
        """(accumulator C type, accumulator, NaN flag or None, argmax position or None)."""
        op, source, dtype = node.op, node.inputs[0], node.dtype
        count = math.prod(source.shape[d] for d in node.attrs["axes"])
        # long float sums accumulate in double: eager's cascade summation is that accurate
        wide = dtype.is_floating_point and op in (Op.SUM, Op.PROD) and \
            (isinstance(count, Size) or count > 4096)
        acc_type = "double" if wide else compute_type(dtype)
        if op in (Op.ARGMAX, Op.ARGMIN):
            acc_type = compute_type(source.dtype)
        nan = self.fresh("nan") if op in (Op.MAX, Op.MIN) and dtype.is_floating_point else None
        position = self.fresh("pos") if op in (Op.ARGMAX, Op.ARGMIN) else None
        return acc_type, self.fresh("acc"), nan, position

    def combine(self, node: Node, acc: str, nan: str | None, position: str | None, value: str,
                full: Index) -> list[str]:
        """C statements folding `value` into the accumulator."""
        op = node.op
        if op is Op.SUM:
            return [f"{acc} += {value};"]
        if op is Op.PROD:
            return [f"{acc} *= {value};"]
        if op in (Op.ANY, Op.ALL):
            return [f"{acc} {'|=' if op is Op.ANY else '&='} {value};"]
        if op in (Op.MAX, Op.MIN):
            better = ">" if op is Op.MAX else "<"
            lines = [f"{acc} = {value} {better} {acc} ? {value} : {acc};"]
            if nan:
                lines.append(f"{nan} |= ({value} != {value});")
            return lines
        # argmax/argmin: the first extreme wins; the first NaN beats everything
        better = ">" if op is Op.ARGMAX else "<"
        (axis,) = node.attrs["axes"]
        found = f"{value} {better} {acc}"
        if node.inputs[0].dtype.is_floating_point:
            found = f"!({acc} != {acc}) && ({found} || {value} != {value})"
        return [f"if ({found}) {{ {acc} = {value}; {position} = {render(full[axis])}; }}"]

    @staticmethod
    def initial(op: Op, dtype: torch.dtype) -> str:
        if op is Op.SUM:
            return "0"
        if op is Op.PROD:
            return "1"
        if op is Op.ANY:
            return "false"
        if op is Op.ALL:
            return "true"
        low = op in (Op.MAX, Op.ARGMAX)
        if dtype.is_floating_point:
            return "-INFINITY" if low else "INFINITY"
        if dtype is torch.bool:
            return "false" if low else "true"
        info = torch.iinfo(dtype)
        return literal(info.min if low else info.max, dtype)
