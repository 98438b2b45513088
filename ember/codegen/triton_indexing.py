"""Ops that choose where to read in Triton kernels: pad, cat, take and gather (a mixin of the
kernel writer, ember/codegen/triton.py, which owns the scopes, the values and the masks).
Each keeps its reads inside the tensor it reads: positions are clamped, and a gathered index
out of range fails a device assert, as eager raises."""

from __future__ import annotations

from ember.codegen.text import Scope
from ember.codegen.triton_reductions import render
from ember.codegen.triton_rules import literal
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.ir.sizes import Dim
from ember.schedule.expr import ZERO, Expr, Opaque, proved, symbolic_range
from ember.schedule.indexing import Index, cat_pieces_reached, pad_source, take_source


class IndexingWriting:
    """The pad, cat and take methods of TritonKernelWriter."""

    def clamp(self, expr: Expr, size: Dim, scope: Scope) -> Expr:
        low, high = symbolic_range(expr)
        if proved(lambda: low >= 0 and high <= size - 1):
            return expr
        name = self.fresh("t")
        # (a symbolic size renders as its expression over the kernel's size arguments)
        self.emit(scope, f"{name} = tl.minimum(tl.maximum({render(expr)}, 0), {size - 1})")
        self.defined_at[name] = scope
        self.deps[name] = self.index_deps([expr])
        return Expr.of(Opaque(name, 0, size - 1))

    def pad(self, node: Node, index: Index, scope: Scope) -> str:
        source_index, checks = pad_source(node, index)
        if not checks:
            return self.value(node.inputs[0], source_index, scope)
        conditions = []
        clamped = list(source_index)
        sizes = node.inputs[0].shape
        for relative, size, step in checks:
            text = render(relative)
            conditions.append(f"({text} >= 0) & ({text} < {size * step})")
            if step > 1:
                conditions.append(f"({text} % {step} == 0)")
        for d, size in enumerate(sizes):
            clamped[d] = self.clamp(source_index[d], size, scope) if size else source_index[d]
        inner = self.value(node.inputs[0], tuple(clamped), scope)
        padding = literal(node.attrs["value"], node.dtype)
        condition = " & ".join(f"({c})" for c in conditions)
        deps = self.deps_of(inner) | self.index_deps(index)
        return self.define(scope, f"tl.where({condition}, {inner}, {padding})", deps)

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
            expression = f"tl.where({position} < {end}, {value}, {expression})"
        deps = self.deps_of(*(value for value, _ in choices)) | self.index_deps([index[dim]])
        return self.define(scope, expression, deps)

    def take(self, node: Node, index: Index, scope: Scope) -> str:
        x, selector = node.inputs
        dim = node.attrs["dim"]
        size = x.shape[dim]
        if node.op is Op.TAKE:
            index_at, _ = take_source(node, index, ZERO)
        else:
            index_at = index
        raw = self.value(selector, index_at, scope)
        deps = self.deps_of(raw)
        itype = "tl.int64" if self.tiling and self.tiling.int64 else "tl.int32"
        name = self.fresh("t")
        self.emit(scope, f"{name} = {raw}.to(tl.int64)")
        if node.op is Op.TAKE and node.attrs["wrap"]:
            self.emit(scope, f"{name} = tl.where({name} < 0, {name} + {size}, {name})")
        self.uses_checks = True
        mask = self.mask_for(index_at)
        condition = f"({name} >= 0) & ({name} < {size})"
        mask_argument = f", mask={mask}" if mask else ""
        self.emit(scope, f'tl.device_assert({condition}, "index out of range in ember kernel '
                         f'{self.kernel.name}"{mask_argument})')
        self.emit(scope, f"{name} = tl.minimum(tl.maximum({name}, 0), {max(size - 1, 0)})"
                         f".to({itype})")
        self.defined_at[name] = scope
        self.deps[name] = deps
        selected = Expr.of(Opaque(name, 0, max(size - 1, 0)))
        if node.op is Op.TAKE:
            _, x_at = take_source(node, index, selected)
        else:
            x_at = index[:dim] + (selected,) + index[dim + 1:]
        return self.value(x, x_at, scope)
