"""Reductions in Triton kernels: the accumulating tile of a row, and rows.

A mixin of the kernel writer (ember/codegen/triton.py), which owns the scopes, the values
memoized per scope, the masks and the tiling; this part writes what a reduction node becomes
there: a persistent row reduced at once, or a looped row folded into RBLOCK partial
accumulators (a split reduction's chunk too: its partial results are stored and combined by
the methods of triton_split.py). It must not decide the tiling.
"""

from __future__ import annotations

import functools

import torch

from ember.codegen.text import Scope, render_sum
from ember.codegen.triton_rules import compute_type
from ember.codegen.triton_tiling import divides
from ember.ir.graph import Node
from ember.ir.ops import Kind, Op
from ember.ir.patterns import broadcast_mean
from ember.schedule.expr import ZERO, Div, Expr, Mod, Opaque, Var, unravel
from ember.schedule.indexing import Index


def render(expr: Expr) -> str:
    return render_sum(expr, _render_atom, _number)


def _number(value) -> str:
    """A coefficient or constant: an int, or a symbolic size over the kernel's size
    arguments, parenthesized (`(s1 - 1) * x`, not `s1 - 1 * x`)."""
    return str(value) if isinstance(value, int) else f"({value})"


def _render_atom(atom) -> str:
    if isinstance(atom, (Var, Opaque)):
        return atom.name
    # Triton's // and % on integers truncate, as C's do; index expressions are never negative
    # where they are used (a pad's checks guard the reads where they could be)
    # (a symbolic divisor such as 2*s1 is parenthesized: x % 2*s1 would be (x % 2) * s1)
    divisor = _number(atom.divisor)
    if isinstance(atom, Div):
        return f"({render(atom.expr)} // {divisor})"
    if isinstance(atom, Mod):
        return f"({render(atom.expr)} % {divisor})"
    raise TypeError(atom)



def _exp_less(value: Node, maximum: Node) -> bool:
    """Is `value` exp(x - maximum), x the maximum's own source, the maximum broadcast back
    over the rows it reduced (kept dims, expanded; detached or not)?"""
    if value.op is not Op.EXP or value.inputs[0].op is not Op.SUB:
        return False
    source, subtracted = value.inputs[0].inputs
    if source is not maximum.inputs[0]:
        return False
    while subtracted.op in (Op.EXPAND, Op.STOP_GRADIENT):
        subtracted = subtracted.inputs[0]
    return subtracted is maximum and len(maximum.shape) == len(source.shape)


def _centered_square_sum(squares: Node) -> Node | None:
    """The sum of x that `squares` centers x by, where `squares` sums (x - mean(x))**2 over
    the same dims (the mean broadcast back: ember/ir/patterns.py) in float32 or float64."""
    if squares.kind is not Kind.REDUCTION or squares.op is not Op.SUM or \
            squares.dtype not in (torch.float32, torch.float64):
        return None
    product = squares.inputs[0]
    if product.op is not Op.MUL or product.inputs[0] is not product.inputs[1]:
        return None
    deviation = product.inputs[0]
    if deviation.op is not Op.SUB:
        return None
    total = broadcast_mean(deviation.inputs[1])
    if total is None or total.inputs[0] is not deviation.inputs[0] or \
            total.dtype != squares.dtype or deviation.dtype != squares.dtype:
        return None
    return total


class ReductionWriting:
    """The reduction methods of TritonKernelWriter (see there for the attributes they use)."""

    # -- reductions -----------------------------------------------------------------------
    def reduction(self, node: Node, index: Index, scope: Scope) -> str:
        op, source = node.op, node.inputs[0]
        if self.analysis:
            body, full = self.open_row(scope, index)
            self.value(source, full, body)
            self.close_row(body)
            return self.define(scope, "0", frozenset({"x"}))
        tiling = self.tiling
        acc_type = self.accumulator_type(node)
        init = self.initial(op, source.dtype, acc_type)
        if self.split and (self.stage == 0 or self.levels[node] < self.stage):
            return self.gather_partials(node, scope)
        if self.rnumel == 0:  # an empty row: the reduction's identity, nothing is read
            return self.finish(node, scope, f"tl.full([XBLOCK, RBLOCK], {init}, {acc_type})",
                               None)
        position = None
        if tiling.persistent:
            body, full = self.open_row(scope, index)
            value = self.reduced_value(node, self.value(source, full, body))
            mask = self.masks.get("r")
            if op in (Op.ARGMAX, Op.ARGMIN):
                position = self.full_block(self.position(node, full, body), torch.int64)
            if mask:
                value = f"tl.where({mask}, {value}, {init})"
            return self.finish(node, scope, value, position)
        walked = self.online_maxima.get(node) or self.centered_means.get(node)
        if walked is not None:  # (folded in the walk of the maximum or mean it depends on)
            self.value(walked, index, scope)
            for ancestor in scope.chain():
                if (id(node), index) in ancestor.memo:
                    return ancestor.memo[(id(node), index)]
        # the kernel's other reductions of this level walk the same rows: one loop folds
        # them all (a layer norm's two parameter gradients read the row once, not twice)
        group = [node] + self.siblings(node, index, scope)
        accumulators = []
        for member in group:
            acc = self.fresh("acc")
            member_init = self.initial(member.op, member.inputs[0].dtype,
                                       self.accumulator_type(member))
            self.emit(scope, f"{acc} = tl.full([XBLOCK, RBLOCK], {member_init}, "
                             f"{self.accumulator_type(member)})")
            position = None
            if member.op in (Op.ARGMAX, Op.ARGMIN):
                position = self.fresh("pos")
                self.emit(scope, f"{position} = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
            accumulators.append((member, member_init, acc, position))
        totals = {}  # (the running sums folded in a maximum's walk, by that maximum)
        for member in group:
            if member in self.online_sums:
                totals[member] = self.fresh("total")
                self.emit(scope, f"{totals[member]} = tl.full([XBLOCK, RBLOCK], 0, "
                                 f"{self.accumulator_type(member)})")
        welford = {}  # (each lane's running mean, squares' sum and count, by mean)
        for member in group:
            if member in self.centered_squares:
                welford[member] = tuple(self.fresh(name) for name in ("mean", "m2", "count"))
                for lanes in welford[member]:
                    self.emit(scope, f"{lanes} = tl.full([XBLOCK, RBLOCK], 0, "
                                     f"{self.accumulator_type(member)})")
        body, full = self.open_row(scope, index)
        for member, member_init, acc, position in accumulators:
            value = self.reduced_value(member, self.value(member.inputs[0], full, body))
            mask = self.masks.get(body.row)
            if member in welford:
                self.emit_welford_step(body, welford[member], value, mask)
            if mask:
                value = f"tl.where({mask}, {value}, {member_init})"
            before = None
            if member in totals:  # (the value read twice more, the maximum before it)
                named, before = self.fresh("v"), self.fresh("before")
                self.emit(body, f"{named} = {value}")
                self.emit(body, f"{before} = {acc}")
                value = named
            for line in self.combine(member, acc, position, value, full, body):
                self.emit(body, line)
            if member in totals:
                self.emit_online_step(body, totals[member], acc, before, value)
        self.close_row(body)
        results = [self.store_partials(member, scope, acc, position) if self.split else
                   self.finish(member, scope, acc, position)
                   for member, _, acc, position in accumulators]
        for member, result in zip(group[1:], results[1:]):
            scope.memo[(id(member), index)] = result
        for (member, _, acc, _), result in zip(accumulators, results):
            if member in totals:
                total = self.online_sums[member]
                scope.memo[(id(total), index)] = self.finish_online(
                    scope, total, totals[member], acc, result)
            if member in welford:
                squares = self.centered_squares[member]
                scope.memo[(id(squares), index)] = self.finish_welford(
                    scope, squares, welford[member])
        return results[0]

    # -- a sum of exp(x - max(x)) folded in the maximum's walk ------------------------------
    @functools.cached_property
    def online_sums(self) -> dict[Node, Node]:
        """The kernel's maxima whose walk also folds a sum of exp(x - that maximum) over the
        same rows (a softmax's or a loss's statistics: one pass over the row, not two —
        GPT-2's loss over 50257 logits a row, 212 us against torch.compile's 174 on the
        H200), {maximum: sum}. Only rows walked in a loop (not split), in float32 or
        float64."""
        pairs: dict[Node, Node] = {}
        if self.tiling.persistent or self.split:
            return pairs
        maxima = [m for m in self.kernel.members if m.kind is Kind.REDUCTION and m.op is Op.MAX
                  and m.dtype in (torch.float32, torch.float64)
                  and m.inputs[0].dtype == m.dtype]
        for total in self.kernel.members:
            if total.kind is not Kind.REDUCTION or total.op is not Op.SUM:
                continue
            for maximum in maxima:
                if maximum not in pairs and total.dtype == maximum.dtype and \
                        total.shape == maximum.shape and \
                        total.attrs.get("axes") == maximum.attrs.get("axes") and \
                        _exp_less(total.inputs[0], maximum):
                    pairs[maximum] = total
                    break
        return pairs

    @functools.cached_property
    def online_maxima(self) -> dict[Node, Node]:
        """{sum: maximum} of online_sums."""
        return {total: maximum for maximum, total in self.online_sums.items()}

    def emit_online_step(self, body: Scope, total: str, acc: str, before: str,
                         value: str) -> None:
        """total, the running sum of exp(x - m) as m (acc) grows: rescaled by exp(before - m)
        (1 where m did not move: -inf and inf too), and exp(x - m) added (0 for x = -inf:
        masked lanes, and -inf elements before a finite maximum)."""
        self.emit(body, f"{total} = {total} * tl.where({before} == {acc}, 1.0, "
                        f"tl.exp({before} - {acc})) + tl.where({value} == float(\"-inf\"), 0.0, "
                        f"tl.exp({value} - {acc}))")

    def finish_online(self, scope: Scope, total: Node, lanes: str, acc: str,
                      maximum: str) -> str:
        """The row's sum from each lane's running sum and maximum: rescaled to the row's
        maximum and added. A row whose maximum is -inf sums exp(-inf - -inf), NaN, in eager."""
        acc_type = self.accumulator_type(total)
        summed = self.define(scope, f"tl.sum({lanes} * tl.where({acc} == {maximum}, 1.0, "
                                    f"tl.exp({acc} - {maximum})), axis=1, keep_dims=True)",
                             frozenset({"x"}))
        return self.define(scope, f"tl.where({maximum} == float(\"-inf\"), "
                                  f"tl.full([XBLOCK, 1], float(\"nan\"), {acc_type}), {summed})",
                           frozenset({"x"}))

    # -- a sum of (x - mean(x))**2 folded in the mean's walk (Welford) ----------------------
    @functools.cached_property
    def centered_squares(self) -> dict[Node, Node]:
        """The kernel's sums of x whose walk also folds the sum of squares of x less their
        mean over the same rows, as Welford's running statistics (each lane's mean, its
        squares' sum about it and its count, lanes and chunks combined by Chan's formula):
        a batch norm's or a long row's statistics in one pass over the row, not two — where
        the row is walked in a loop, or split (then both are one level); a persistent row is
        read once either way and keeps the exact two passes. {mean's sum: squares' sum}."""
        pairs: dict[Node, Node] = {}
        if self.tiling is None or self.tiling.persistent:
            return pairs
        for squares in self.kernel.members:
            total = _centered_square_sum(squares)
            if total is not None and total in self.members and \
                    total.attrs.get("axes") == squares.attrs.get("axes") and \
                    total.shape == squares.shape and total not in pairs:
                pairs[total] = squares
        return pairs

    @functools.cached_property
    def centered_means(self) -> dict[Node, Node]:
        """{squares' sum: mean's sum} of centered_squares."""
        return {squares: total for total, squares in self.centered_squares.items()}

    def emit_welford_step(self, body: Scope, lanes: tuple[str, str, str], value: str,
                          mask: str | None) -> None:
        """Each lane's running mean and sum of squared deviations, one element more (none
        where the row's mask is off)."""
        mean, m2, count = lanes
        delta = self.fresh("delta")
        if mask:
            self.emit(body, f"{count} = {count} + tl.where({mask}, 1.0, 0.0)")
            self.emit(body, f"{delta} = tl.where({mask}, {value} - {mean}, 0.0)")
            self.emit(body, f"{mean} = {mean} + {delta} / tl.maximum({count}, 1.0)")
            self.emit(body, f"{m2} = {m2} + tl.where({mask}, {delta} * ({value} - {mean}), "
                            f"0.0)")
        else:
            self.emit(body, f"{count} = {count} + 1.0")
            self.emit(body, f"{delta} = {value} - {mean}")
            self.emit(body, f"{mean} = {mean} + {delta} / {count}")
            self.emit(body, f"{m2} = {m2} + {delta} * ({value} - {mean})")

    def finish_welford(self, scope: Scope, squares: Node, lanes: tuple[str, str, str]) -> str:
        """The row's sum of squared deviations from its lanes (a split reduction's chunk: its
        partial statistics, stored)."""
        combined = self.combine_welford(scope, list(lanes))
        if self.split:
            mask = f", mask={self.masks['x']}" if "x" in self.masks else ""
            at = f"tl.program_id(1) * {self.xnumel} + x"
            for space, name in zip(self.workspaces_of(squares), combined):
                self.emit(scope, f"tl.store({self.argument(space)} + {at}, {name}{mask})")
        return combined[1]

    def gather_welford(self, squares: Node, scope: Scope) -> str:
        """A split row's sum of squared deviations from its chunks' statistics."""
        # (in its own float32 or float64: the accumulator's type)
        return self.combine_welford(scope, self.load_partials(squares, scope, ["0"] * 3))[1]

    def combine_welford(self, scope: Scope, statistics: list[str]) -> list[str]:
        """(mean, squares' sum, count) of the groups whose statistics' tiles are given,
        combined along the tiles' second axis."""
        combined = [self.fresh("v") for _ in statistics]
        self.emit(scope, f"{', '.join(combined)} = tl.reduce(({', '.join(statistics)}), 1, "
                         f"ember_welford_combine, keep_dims=True)")
        for name in combined:
            self.deps[name] = frozenset({"x"})
        return combined

    def siblings(self, node: Node, index: Index, scope: Scope) -> list[Node]:
        """The kernel's reductions that can fold in `node`'s loop: of its level (neither reads
        the other), its shape and axes, not yet computed at this index."""
        level = self.levels[node]
        return [member for member in self.kernel.members
                if member is not node and member.kind is Kind.REDUCTION and
                member not in self.centered_means and
                self.levels[member] == level and member.shape == node.shape and
                member.attrs.get("axes") == node.attrs.get("axes") and
                not any((id(member), index) in s.memo for s in scope.chain())]

    def reduced_value(self, node: Node, value: str) -> str:
        """The value folded into the accumulator: the whole tile, in the accumulator's type."""
        block = self.full_block(value, node.inputs[0].dtype)
        if node.op in (Op.ANY, Op.ALL) or node.inputs[0].dtype is torch.bool:
            return f"({block} != 0).to(tl.int32)"
        acc_type = self.accumulator_type(node)
        if compute_type(node.inputs[0].dtype) != acc_type:
            return f"{block}.to({acc_type})"
        return block

    def position(self, node: Node, full: Index, scope: Scope) -> str:
        (axis,) = node.attrs["axes"]
        expr = full[axis]
        return self.define(scope, f"{render(expr)}.to(tl.int64)" if expr.terms else "0",
                           self.index_deps([expr]))

    def combine(self, node: Node, acc: str, position: str | None, value: str, full: Index,
                body: Scope) -> list[str]:
        op = node.op
        if op is Op.SUM:
            return [f"{acc} = {acc} + {value}"]
        if op is Op.PROD:
            return [f"{acc} = {acc} * {value}"]
        if op in (Op.MAX, Op.MIN, Op.ANY, Op.ALL):
            return [f"{acc} = {self.pairwise(node, acc, value)}"]
        here = self.full_block(self.position(node, full, body), torch.int64)
        which = "argmax" if op is Op.ARGMAX else "argmin"
        return [f"{acc}, {position} = ember_{which}_combine({acc}, {position}, {value}, {here})"]

    def pairwise(self, node: Node, a: str, b: str) -> str:
        high = node.op in (Op.MAX, Op.ANY)
        if self.accumulator_type(node) in ("tl.float32", "tl.float64"):
            return f"ember_{'max' if high else 'min'}_nan({a}, {b})"
        return f"tl.{'maximum' if high else 'minimum'}({a}, {b})"

    def finish(self, node: Node, scope: Scope, tile: str, position: str | None,
               raw: bool = False):
        """The row's result from a tile of partial results. `raw`: the accumulator's value
        (and position) as a split reduction stores it, not yet in the node's dtype."""
        op = node.op
        if op is Op.SUM:
            result = f"tl.sum({tile}, axis=1, keep_dims=True)"
        elif op is Op.PROD:
            result = f"tl.reduce({tile}, 1, ember_mul, keep_dims=True)"
        elif op in (Op.ARGMAX, Op.ARGMIN):
            which = "argmax" if op is Op.ARGMAX else "argmin"
            value, name = self.fresh("v"), self.fresh("v")
            self.emit(scope, f"{value}, {name} = tl.reduce(({tile}, {position}), 1, "
                             f"ember_{which}_combine, keep_dims=True)")
            self.deps[name] = self.deps[value] = frozenset({"x"})
            return (value, name) if raw else name
        else:
            high = op in (Op.MAX, Op.ANY)
            if self.accumulator_type(node) in ("tl.float32", "tl.float64"):
                combine = f"ember_{'max' if high else 'min'}_nan"
                result = f"tl.reduce({tile}, 1, {combine}, keep_dims=True)"
            else:
                result = f"tl.{'max' if high else 'min'}({tile}, axis=1, keep_dims=True)"
        if raw:
            return (self.define(scope, result, frozenset({"x"})),)
        if op in (Op.ANY, Op.ALL) or node.dtype is torch.bool:
            result = f"({result} != 0)"
        elif self.accumulator_type(node) != compute_type(node.dtype):
            result = f"{result}.to({compute_type(node.dtype)})"
        return self.define(scope, result, frozenset({"x"}))

    def accumulator_type(self, node: Node) -> str:
        source = node.inputs[0].dtype
        if node.op in (Op.ANY, Op.ALL) or source is torch.bool:
            return "tl.int32"
        if node.op in (Op.ARGMAX, Op.ARGMIN):
            return compute_type(source)
        return compute_type(node.dtype)

    def initial(self, op: Op, dtype: torch.dtype, acc_type: str) -> str:
        if op is Op.SUM:
            return "0"
        if op is Op.PROD:
            return "1"
        if op is Op.ANY:
            return "0"
        if op is Op.ALL:
            return "1"
        low = op in (Op.MAX, Op.ARGMAX)
        if dtype is torch.bool:
            return "0" if low else "1"
        if dtype.is_floating_point:
            return 'float("-inf")' if low else 'float("inf")'
        info = torch.iinfo(dtype)
        return str(info.min if low else info.max)

    # -- rows -----------------------------------------------------------------------------
    def open_row(self, scope: Scope, index: Index) -> tuple[Scope, Index]:
        """The scope in which a row's elements are computed, and the full index there. A
        persistent tile has one row index for the whole kernel (so values are shared between
        reductions); a looped tile opens a new loop per use."""
        shape = self.kernel.shape
        if self.analysis:
            body = Scope(scope, scope.depth + 1)
            dims = {d: Expr.of(Var(f"r{d}", shape[d])) for d in self.inner_dims}
        elif self.tiling.persistent:
            body = self.root
            dims = dict(zip(self.inner_dims, unravel(Expr.of(Var("r", self.rnumel)),
                                                    tuple(shape[d] for d in self.inner_dims))))
        else:
            name = f"r{next(self.loops)}"
            body = Scope(scope, scope.depth + 1, row=name)
            self.defined_at[name] = body
            self.var_level[name] = "r"
            rtype = ".to(tl.int64)" if self.tiling.int64 else ""
            start = "chunk + " if self.split else ""
            self.emit(body, f"{name} = ({start}{name}_offset + tl.arange(0, RBLOCK)[None, :])"
                            f"{rtype}")
            # (a split row's chunks may reach past its end: 6,304 rows in 50 chunks of 128;
            # chunks computed per call from a symbolic row always may)
            reach = self.tiling.parts * self.tiling.chunk if self.split else self.rnumel
            if not divides(self.tiling.rblock, self.rnumel) or self.tiling.chunk_per_call or \
                    (self.split and reach > self.rnumel):
                self.masks[name] = f"{name}_mask"
                self.emit(body, f"{name}_mask = {name} < {self.rnumel}")
            if self.split:  # this program's chunk of the row
                length = "chunk_length" if self.tiling.chunk_per_call else self.tiling.chunk
                body.header = f"for {name}_offset in range(0, {length}, RBLOCK):"
            else:
                body.header = f"for {name}_offset in range(0, {self.rnumel}, RBLOCK):"
            dims = dict(zip(self.inner_dims, unravel(Expr.of(Var(name, self.rnumel)),
                                                    tuple(shape[d] for d in self.inner_dims))))
        full = tuple(dims[d] if d in dims else (ZERO if d in self.kernel.axes else index[d])
                     for d in range(len(shape)))
        return body, full

    def close_row(self, body: Scope) -> None:
        if body is self.root or not body.lines:
            return
        body.parent.lines.append(body.header)
        body.parent.lines.extend("    " + line for line in body.lines)
