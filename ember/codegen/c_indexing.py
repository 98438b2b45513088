"""Values read through ember's data ops in C kernels (a mixin of ember/codegen/c.py's
CKernelWriter): a pad's input read under its condition (masked loads, which vectorize), a
cat's pieces, an index clamped where it may leave its buffer, a take's or gather's selected
position checked at run time. Each tells the loop plan what it tests (`accesses`,
`padded_dims`): dims merged across such a test would cost a division per element."""

from __future__ import annotations

import re

from ember.codegen.c_rules import literal, select
from ember.codegen.text import Scope
from ember.codegen.text import c_int as _int
from ember.codegen.text import render_c as render
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.ir.sizes import Dim, Size
from ember.schedule.expr import ZERO, Expr, Opaque, Var, proved, symbolic_range
from ember.schedule.indexing import (
    Index,
    cat_pieces_reached,
    pad_checks,
    take_source,
)


class IndexedReads:
    """The CKernelWriter's reads through pads, cats, clamps and takes (its state: guard,
    padded_dims, accesses, defined_at, uses_checks; value, define, emit, fresh and scope_for
    are the writer's)."""

    def under_guard(self, index: Index) -> bool:
        """Does a value at `index` under a pad move with the pad's tested positions? Then
        it may read outside its buffers where the pad reads nothing: its loads are masked
        by the pad's condition. (What does not move with them reads in bounds; nothing it
        reads can move with them either: an index map only drops or combines positions.)"""
        return self.guard is not None and \
            bool(self.guard[1] & set().union(*(e.variables() for e in index)))

    def clamp(self, expr: Expr, size: Dim, scope: Scope) -> Expr:
        low, high = symbolic_range(expr)
        if proved(lambda: low >= 0 and high <= size - 1):
            return expr
        # (tested, for the loop plan: the clamped index is the loop variables' index, and
        # dims merged across it would take a division and a remainder per element)
        self.tested.append(expr)
        # (in the loop where its indices are defined, once: a clamp of outer indices inside
        # the innermost loop keeps gcc from seeing the loads it places as affine there)
        scope = self.scope_for((expr,), scope)
        key = ("clamp", render(expr), _int(size))
        for ancestor in scope.chain():
            if key in ancestor.memo:
                return ancestor.memo[key]
        name = self.fresh("t")
        self.emit(scope, f"int64_t {name} = ember_clamp_index({render(expr)}, {_int(size)});")
        self.defined_at[name] = scope
        scope.memo[key] = clamped = Expr.of(Opaque(name, 0, size - 1))
        return clamped

    def pad(self, node: Node, index: Index, scope: Scope) -> str:
        """The input where the position falls inside it, else the pad's value. What the
        input reads from buffers is read under that condition (`guard`): a masked load at
        the position's own index, which vectorizes, where a clamped index made every load a
        gather (a padded image's kernel 3.6x slower)."""
        source_index, checks = pad_checks(node, index)
        if not checks:
            return self.value(node.inputs[0], source_index, scope)
        if all(step == 1 and self.scope_for((relative,), scope) is not scope
               for _, relative, _, step in checks):
            return self._pad_of_outer_positions(node, source_index, checks, scope)
        conditions = []
        variables: set[str] = set()
        for _, relative, size, step in checks:
            text = render(relative)
            conditions.append(f"({text} >= 0 && {text} < {_int(size * step)})")
            if step > 1:
                conditions.append(f"({text} % {step} == 0)")
            else:
                self._splits_at(relative, conditions[-1], 0, size)
            variables |= relative.variables()
            self.tested.append(relative)  # (for the loop plan, as a clamp is)
            for name in relative.variables():  # (i2, r0: the dim a loop variable walks)
                dim = re.search(r"\d+$", name)
                if dim:
                    self.padded_dims.add(int(dim.group()))
        condition = f"({' && '.join(conditions)})"
        guard = (condition, frozenset(variables), tuple(r for _, r, _, _ in checks))
        outer = self.guard
        # A pad inside a pad whose position moves with the outer pad's tested positions: its
        # loads are under both conditions. One whose position does not (a fixed slice of the
        # outer's input, pad_sequence's rows) reads in bounds as far as the outer pad goes,
        # and its values are memoized as the outer's unguarded ones are, for every context:
        # they take its own condition only (both would mask its loads with the outer's
        # condition, which fails where another context reads them: wrong zeros).
        if outer is not None and self.under_guard(index):
            guard = (f"({outer[0]} && {condition})", guard[1] | outer[1], guard[2] + outer[2])
        self.guard = guard
        try:
            inner = self.value(node.inputs[0], source_index, scope)
        finally:
            self.guard = outer
        padding = literal(node.attrs["value"], node.dtype)
        return self.define(scope, node.dtype, select(condition, inner, padding, node.dtype))

    def _pad_of_outer_positions(self, node: Node, source_index: Index,
                                checks: list[tuple[int, Expr, int, int]], scope: Scope) -> str:
        """A pad whose tested positions are all fixed inside the loop reading it (an image
        read channels-last, the loop over its channels innermost: a window's taps test the
        row and column only): its input is read at the positions clamped into it, in bounds,
        in the loop where they are defined, and the pad's value selected in where they fall
        outside. A load under such a condition kept the loop scalar — gcc unswitches a loop
        on one invariant condition, not on a window's nine: timm's PVT-v2 depthwise
        convolution over a transposed view took 1.3 ms a call, 0.29 once vectorized
        (2026-12-07)."""
        source = node.inputs[0]
        read, conditions = list(source_index), []
        for dim, relative, size, _step in checks:
            text = render(relative)
            conditions.append(f"({text} >= 0 && {text} < {_int(size)})")
            read[dim] = self.clamp(relative, size, scope)
        inner = self.value(source, tuple(read), scope)
        padding = literal(node.attrs["value"], node.dtype)
        return self.define(scope, node.dtype,
                           select(f"({' && '.join(conditions)})", inner, padding, node.dtype))

    def cat(self, node: Node, index: Index, scope: Scope) -> str:
        dim = node.attrs["dim"]
        choices = []
        for source, local, _first, end in cat_pieces_reached(node, index):
            local = list(local)
            local[dim] = self.clamp(local[dim], source.shape[dim], scope)
            choices.append((self.value(source, tuple(local), scope), end))
        expression = choices[-1][0]
        position = render(index[dim])
        for value, end in reversed(choices[:-1]):
            test = f"({position} < {_int(end)})"
            self._splits_at(index[dim], test, None, end)
            expression = select(test, value, expression, node.dtype)
        return self.define(scope, node.dtype, expression)

    def _splits_at(self, position: Expr, test: str, first: Dim | None, end: Dim) -> None:
        """Note `test` (first <= position < end, written as the text given; no first: below
        end only) for the loop over `position`'s variable, where that position is the
        variable plus a constant: the loop is cut where it changes (c_loops.split_loop)."""
        if not (len(position.terms) == 1 and isinstance(position.terms[0][0], Var) and
                position.terms[0][1] == 1 and isinstance(position.const, int) and
                isinstance(end, int) and isinstance(first, (int, type(None)))):
            return
        low = None if first is None else first - position.const
        self.splits.setdefault(position.terms[0][0].name, []).append(
            (test, low, end - position.const))

    def take(self, node: Node, index: Index, scope: Scope) -> str:
        x, selector = node.inputs
        dim = node.attrs["dim"]
        size = x.shape[dim]
        if node.op is Op.TAKE:
            index_at, _ = take_source(node, index, ZERO)
        else:
            index_at = index
        raw = self.value(selector, index_at, scope)
        name = self.fresh("t")
        self.emit(scope, f"int64_t {name} = (int64_t){raw};")
        if node.op is Op.TAKE and node.attrs["wrap"]:
            self.emit(scope, f"{name} = {name} < 0 ? {name} + {_int(size)} : {name};")
        self.uses_checks = True
        out_of_range = f"({name} < 0) | ({name} >= {_int(size)})"
        if self.under_guard(index):  # (where a pad reads nothing, no index is taken)
            out_of_range = f"({self.guard[0]}) & ({out_of_range})"
        self.emit(scope, f"status |= {out_of_range};")
        self.emit(scope, f"{name} = ember_clamp_index({name}, {_int(size)});")
        self.defined_at[name] = scope
        highest = size - 1 if isinstance(size, Size) else max(size - 1, 0)
        selected = Expr.of(Opaque(name, 0, highest))
        if node.op is Op.TAKE:
            _, x_at = take_source(node, index, selected)
        else:
            x_at = index[:dim] + (selected,) + index[dim + 1:]
        return self.value(x, x_at, scope)
