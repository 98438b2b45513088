"""Lane tables in C kernels (a mixin of ember/codegen/c.py's CKernelWriter): a costly value
of the vectorized loop's position alone, computed once per position before the loops.

A batch norm in eval over a channels-last image scales each pixel by `w / sqrt(var + eps)`,
one value per channel; the channel loop is the innermost (it walks contiguous memory), so the
scale, computed where it is used, would cost a square root and a division per pixel (ResNet-
50's stem at tiny sizes: 130 us a call against 35 with a table; 2026-12-06). The table is
filled by a loop over that position before the kernel's loops (and its OpenMP region: the
threads read it), with the same expressions in the same order: the same values.
"""

from __future__ import annotations

from ember.codegen.c_rules import compute_type
from ember.codegen.text import Scope
from ember.ir.graph import Node
from ember.ir.ops import Kind, Op
from ember.schedule.expr import Expr, Opaque, Var
from ember.schedule.indexing import Index

# Positions a table holds at most, and the ops cheap enough to compute again where they are
# used (a table's load costs about as much)
_TABLE_LIMIT = 4096
_CHEAP = frozenset({Op.NEG, Op.STOP_GRADIENT, Op.ABS, Op.ADD, Op.SUB, Op.MUL, Op.MAXIMUM,
                    Op.MINIMUM, Op.WHERE, Op.CAST, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE,
                    Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR, Op.LOGICAL_NOT,
                    Op.BITWISE_NOT, Op.SIGN, Op.COPYSIGN, Op.ISNAN, Op.ISINF})


class LaneTables:
    """The CKernelWriter's tables (its state: root, simd_loop, tables,
    defined_at, column, block_scope, buffer_of, members, reloadable; emit, fresh and
    generate are the writer's)."""

    def table(self, node: Node, index: Index, scope: Scope) -> str | None:
        """A costly value of the vectorized loop's position alone, that loop inside others (a
        batch norm's per-channel scale, `w / sqrt(var + eps)`, in a channels-last image's
        loop over channels; in column mode a layer norm's per-position `1 / sqrt(var + eps)`
        in its lanes' loop inside the loop over the channels it normalizes), computed once
        per position into a table before those loops and read from it inside: computed where
        it is used, the inner loop would repeat its square root and division for every
        element. The same expressions in the same order: the same values. None where that
        does not apply (the value is computed in place)."""
        lanes = self.column is not None  # (column mode: a table of the block's lanes)
        where = self.block_scope if lanes else self.root
        if where is None or scope.depth <= where.depth + 1 or \
                (not lanes and scope is not self.defined_at.get(self.simd_loop)):
            return None  # (no loop between the table's place and the value's)
        atoms = {atom for e in index for atom in e.atoms() if isinstance(atom, (Var, Opaque))}
        own = [a for a in atoms if isinstance(a, Var) and self.defined_at.get(a.name) is scope]
        if len(own) != 1 or (lanes and not own[0].name.startswith("l")):
            return None
        var = own[0]
        # (the other positions it names are those of the table's place and around it)
        if any(a is not var and (isinstance(a, Opaque) or a.name not in self.defined_at or
                                 self.defined_at[a.name].depth > where.depth) for a in atoms):
            return None
        if not isinstance(var.extent, int) or not 1 < var.extent <= _TABLE_LIMIT:
            return None
        # (the same value at the same positions, asked for in another loop over the lanes —
        # a layer norm's mean in its variance's loop and in its normalizing loop — is read
        # from the one table)
        key = (id(node), id(where),
               tuple(e.substitute({var: Expr.of(Var("lane", var.extent))}) for e in index))
        table = self.tables.get(key)
        if table is None:
            if not self._tabulable(node):
                return None
            table = self.tables[key] = self._fill(node, index, var, where,
                                                  "lanes" if lanes else str(var.extent))
        position = self.fresh("v")
        self.emit(scope, f"{compute_type(node.dtype)} {position} = {table}[{var.name}];")
        return position

    def _fill(self, node: Node, index: Index, var: Var, where: Scope, bound: str) -> str:
        """A table of `node` at `index` over `var`'s positions, filled by a loop emitted into
        `where` (before the loops inside it); its name."""
        table = self.fresh("t")
        body = Scope(where, where.depth + 1)
        loop = self.defined_at[var.name]
        self.defined_at[var.name] = body
        try:
            value = self.generate(node, index, body)
        finally:
            self.defined_at[var.name] = loop
        name = var.name
        self.emit(where, f"{compute_type(node.dtype)} {table}[{var.extent}];")
        self.emit(where, "#pragma omp simd")
        self.emit(where, f"for (int64_t {name} = 0; {name} < {bound}; {name}++) {{")
        for line in body.lines + [f"{table}[{name}] = {value};"]:
            self.emit(where, "    " + line)
        self.emit(where, "}")
        return table

    def _tabulable(self, node: Node) -> bool:
        """Is `node` computed from loads and constants by pointwise ops and views alone (and
        in column mode the reductions, arrays over the lanes), one of them costlier than an
        add or a multiply?"""
        costly, stack, seen = False, [node], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            buffer = self.buffer_of.get(current)
            if current.op is Op.FULL or (buffer is not None and current not in self.members
                                         and buffer.role != "alias"
                                         and current not in self.reloadable):
                continue
            if current.kind is Kind.POINTWISE:
                costly = costly or current.op not in _CHEAP
            elif current.kind is Kind.REDUCTION and self.column is not None:
                continue  # (its array, filled before: column_reduction)
            elif current.kind is not Kind.VIEW:
                return False
            stack.extend(current.inputs)
        return costly
