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
from ember.schedule.expr import Expr, Var
from ember.schedule.indexing import Index

# Positions a table holds at most, and the ops cheap enough to compute again where they are
# used (a table's load costs about as much)
_TABLE_LIMIT = 4096
_CHEAP = frozenset({Op.NEG, Op.STOP_GRADIENT, Op.ABS, Op.ADD, Op.SUB, Op.MUL, Op.MAXIMUM,
                    Op.MINIMUM, Op.WHERE, Op.CAST, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE,
                    Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR, Op.LOGICAL_NOT,
                    Op.BITWISE_NOT, Op.SIGN, Op.COPYSIGN, Op.ISNAN, Op.ISINF})


class LaneTables:
    """The CKernelWriter's tables (its state: root, extents, simd_loop, tables,
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
        if self.root is None:
            return None
        names = set().union(*(e.variables() for e in index))
        found = [n for n in names if self.defined_at.get(n) is scope]
        if len(found) != 1:
            return None
        (name,) = found
        loop = scope
        if self.column is None:  # (a table before the kernel's loops, of the loop's extent)
            extent = self.extents.get(name)
            if len(names) != 1 or name != self.simd_loop or loop.depth < 2 or \
                    not isinstance(extent, int) or not 1 < extent <= _TABLE_LIMIT:
                return None
            where, size, bound = self.root, extent, str(extent)
        else:  # (a table of the block's lanes, in the block, before the loops inside it;
            # the other positions its index names are the block's and those around it)
            block = self.block_scope
            if not name.startswith("l") or block is None or loop.depth <= block.depth + 1 or \
                    any(self.defined_at[n].depth > block.depth for n in names - {name}):
                return None
            where, size, bound = block, self.column, "lanes"
        # (the same value at the same positions, asked for in another loop over the lanes —
        # a layer norm's mean in its variance's loop and in its normalizing loop — is read
        # from the one table)
        var = Var(name, size)
        key = (id(node), id(where),
               tuple(e.substitute({var: Expr.of(Var("lane", size))}) for e in index))
        kind = compute_type(node.dtype)
        table = self.tables.get(key)
        if table is not None:
            position = self.fresh("v")
            self.emit(scope, f"{kind} {position} = {table}[{name}];")
            return position
        if not self._tabulable(node):
            return None
        table, position = self.fresh("t"), self.fresh("v")
        self.tables[key] = table
        body = Scope(where, where.depth + 1)
        self.defined_at[name] = body
        try:
            value = self.generate(node, index, body)
        finally:
            self.defined_at[name] = loop
        self.emit(where, f"{kind} {table}[{size}];")
        self.emit(where, "#pragma omp simd")
        self.emit(where, f"for (int64_t {name} = 0; {name} < {bound}; {name}++) {{")
        for line in body.lines + [f"{table}[{name}] = {value};"]:
            self.emit(where, "    " + line)
        self.emit(where, "}")
        self.emit(scope, f"{kind} {position} = {table}[{name}];")
        return position

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
