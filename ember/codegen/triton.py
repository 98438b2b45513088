"""Kernel → Triton: the same scheduled kernels the C backend renders, as blocks of a GPU grid.

A kernel's iteration space splits into the kept dims, flattened into one index `x`, and the
reduced dims, flattened into `r`. Each program of the grid takes XBLOCK consecutive values of
`x`: a pointwise kernel is a 1-D block; a reduction kernel is a 2-D tile [XBLOCK, RBLOCK] that
either holds a whole row (*persistent*: every value of the row is loaded once and stays in
registers, so softmax reads its input once) or walks the row in RBLOCK steps (*looped*: one
loop per reduction, each keeping RBLOCK partial accumulators). Values are computed on demand
where used and memoized per scope, as in the C writer; a value is hoisted out of a loop when it
does not depend on the loop's index.

The tile is chosen (ember/codegen/triton_tiling.py) from the kernel's memory accesses, which
a first writing collects; the kernel is then written again with it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import keyword
import math

import torch

from ember.codegen.text import Scope
from ember.codegen.triton_indexing import IndexingWriting
from ember.codegen.triton_matmul import MatmulWriting
from ember.codegen.triton_reductions import ReductionWriting, render
from ember.codegen.triton_rules import (
    SIGNATURE_TYPES,
    compute_type,
    literal,
    load,
    store,
    triton_rules,
)
from ember.codegen.triton_sizes import SYMBOL, ceil_div, grid_product, size_type
from ember.codegen.triton_split import SplitWriting, Workspace
from ember.codegen.triton_tiling import Tiling, divides
from ember.ir.graph import Node
from ember.ir.ops import Kind, Op
from ember.ir.sizes import Dim
from ember.schedule.expr import ZERO, Expr, Var, unravel
from ember.schedule.fuse import store_index
from ember.schedule.indexing import Index, index_rules
from ember.schedule.plan import Buffer, Kernel, Plan

# Ops whose Triton form takes Python constants as operands as they are (operators, where).
_LITERAL_OPERANDS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.EQ, Op.NE, Op.LT, Op.LE,
                               Op.GT, Op.GE, Op.WHERE})


@dataclasses.dataclass
class TritonKernel:
    """One rendered @triton.jit function and what launching it needs."""

    name: str
    text: str
    arguments: list[Buffer | Workspace]
    signature: dict[str, str]
    # a symbolic graph's grid holds Python expressions over its symbols, computed per call
    grid: tuple[int | str, int | str, int | str]
    num_warps: int
    checks: bool  # asserts that gathered indices are in range (compiled with debug on)
    num_stages: int = 1  # software pipelining of a loop's loads (a matmul's steps over k)
    # launched as a programmatic dependent launch (see triton_module.write_module)
    dependent_launch: bool = False
    # the graph's symbols the kernel takes after its pointers (plain ints: see size_type)
    sizes: list[str] = dataclasses.field(default_factory=list)
    # the kernel this one repeats on other buffers (codegen/kernel_reuse.py): the module
    # holds that one's function only, taking these arguments in the same order
    same_as: str | None = None


@dataclasses.dataclass
class KernelLaunches:
    """What one scheduled kernel becomes: one Triton kernel, or for a split reduction one per
    stage (partial results into workspaces, then the finishing kernel)."""

    name: str
    kernels: list[TritonKernel]
    workspaces: list[Workspace]
    # the length of the rows it reduces (a symbolic one: its class chooses the tile, see
    # triton_tiling.row_class), None for a kernel that does not reduce
    row: Dim | None = None

    @property
    def arguments(self) -> list[Buffer]:
        """The plan's buffers the kernels touch (workspaces aside)."""
        seen: list[Buffer] = []
        for kernel in self.kernels:
            seen += [b for b in kernel.arguments if isinstance(b, Buffer) and b not in seen]
        return seen

    @property
    def grid(self) -> tuple[int | str, int | str, int | str]:
        return self.kernels[-1].grid


def as_tensor(value: str, dtype: torch.dtype, unit: str = "[]") -> str:
    """`value` as a Triton tensor: a Python constant becomes a one-element tensor of `dtype`'s
    compute type (so methods like .to() apply, and integer constants keep their width)."""
    if value.startswith("tl.full([], "):
        return value.replace("[]", unit, 1)
    if value.isidentifier() or value.startswith("tl.full("):
        return value
    return f"tl.full({unit}, {value}, {compute_type(dtype)})"


class TritonKernelWriter(ReductionWriting, SplitWriting, MatmulWriting, IndexingWriting):
    def __init__(self, kernel: Kernel, plan: Plan, tiling: Tiling | None, stage: int = 0,
                 workspaces: dict | None = None, dependent_launch: bool = False,
                 wide: bool = False, gathering: bool = False):
        self.kernel = kernel
        # a symbolic graph's int64 build: every index int64 (the wrapper runs it when a
        # call's sizes take an offset past int32)
        self.wide = wide
        self.symbols = plan.graph.symbols
        self.dependent_launch = dependent_launch
        # a split reduction is written once per stage: stage k (1..) stores the partial
        # results of the reductions of level k; stage 0 finishes them all and stores.
        # `gathering`: stage k's gathering stage, which finishes level k's reductions, one
        # program per row block, for the later stages to load (gathered_levels)
        self.stage = stage
        self.gathering = gathering
        self.workspaces: dict[Node, list[Workspace]] = workspaces if workspaces is not None \
            else {}
        self.members = set(kernel.members)
        self.buffer_of = plan.buffer_of
        self.arguments: dict[Buffer, str] = {}
        self.counter = itertools.count()
        self.made = 0  # values written (how much each element computes)
        self.loops = itertools.count()
        self.tiling = tiling
        self.analysis = tiling is None  # a first writing, only to collect the accesses
        self.uses_checks = False
        self.defined_at: dict[str, Scope] = {}
        self.deps: dict[str, frozenset[str]] = {}   # a value's name -> "x"/"r" it varies on
        # half-precision values loaded from memory: exact in float32 already, where a value
        # computed in float32 for a half node must be rounded before it leaves that type
        self.exact_halves: set[str] = set()
        self.masks: dict[str, str] = {}              # block variable -> its mask, if needed
        self.accesses: list[Expr] = []
        shape, axes = kernel.shape, kernel.axes
        self.outer_dims = [d for d, n in enumerate(shape) if d not in axes and n != 1]
        self.inner_dims = [d for d in axes if shape[d] != 1]
        self.xnumel = math.prod(shape[d] for d in self.outer_dims)
        self.rnumel = math.prod(shape[d] for d in self.inner_dims)
        self.reduces = bool(axes)
        self.matmul = kernel.matmul
        self.reads_product_elsewhere = False
        # the shape of a one-element block
        self.unit = "[1, 1]" if self.reduces or self.matmul else "[1]"

    # -- names ----------------------------------------------------------------------------
    def fresh(self, prefix: str = "v") -> str:
        self.made += 1
        return f"{prefix}{next(self.counter)}"

    def argument(self, buffer: Buffer | Workspace) -> str:
        root = buffer.root()
        if root not in self.arguments:
            self.arguments[root] = f"p_{root.name}"
        return self.arguments[root]

    @property
    def split(self) -> bool:
        return self.tiling is not None and self.tiling.parts > 1

    def emit(self, scope: Scope, line: str) -> None:
        scope.lines.append(line)

    def temp(self, dtype: torch.dtype, expression: str, scope: Scope | None = None,
             deps: frozenset[str] = frozenset()) -> str:
        scope = scope or self.current
        name = self.fresh("t")
        self.emit(scope, f"{name} = {expression}")
        self.deps[name] = deps or self.current_deps
        return name

    # -- shapes ---------------------------------------------------------------------------
    def block_shape(self, deps: frozenset[str]) -> str:
        if self.matmul is not None:
            return "[BLOCK_M, BLOCK_N]"
        if not self.reduces:
            return "[XBLOCK]"
        return "[XBLOCK, RBLOCK]" if "r" in deps else "[XBLOCK, 1]"

    def deps_of(self, *values: str) -> frozenset[str]:
        found: frozenset[str] = frozenset()
        for value in values:
            found |= self.deps.get(value, frozenset())
        return found

    def index_deps(self, exprs) -> frozenset[str]:
        names: set[str] = set()
        for expr in exprs:
            for name in expr.variables():
                names.add(name)
        found: set[str] = set()
        for name in names:
            if name in self.var_level:
                found.add(self.var_level[name])
            elif name in self.deps:
                found |= self.deps[name]
        return frozenset(found)

    def mask_for(self, exprs) -> str | None:
        """The lanes whose block positions exist, for an access at these expressions."""
        names: set[str] = set()
        for expr in exprs:
            names |= expr.variables()
        masks = [self.masks[name] for name in sorted(names) if name in self.masks]
        return " & ".join(masks) if masks else None

    def full_block(self, value: str, dtype: torch.dtype) -> str:
        """`value` broadcast to the whole [XBLOCK, RBLOCK] tile."""
        deps = self.deps_of(value)
        if deps == frozenset({"x", "r"}):
            return value
        if not deps and (not value.isidentifier() or keyword.iskeyword(value)):
            # a literal (True and False are identifiers too): broadcast_to takes tensors
            return f"tl.full([XBLOCK, RBLOCK], {value}, {compute_type(dtype)})"
        return f"tl.broadcast_to({value}, [XBLOCK, RBLOCK])"

    # -- scopes ---------------------------------------------------------------------------
    def scope_for(self, index: Index, scope: Scope) -> Scope:
        names = set()
        for expr in index:
            names |= expr.variables()
        best = None
        for name in names:
            defined = self.defined_at.get(name)
            if defined is not None and (best is None or defined.depth > best.depth):
                best = defined
        if best is None:
            *_, best = scope.chain()
        return best

    # -- values ---------------------------------------------------------------------------
    def value(self, node: Node, index: Index, scope: Scope) -> str:
        if node.op is Op.FULL:
            # (a wide scalar is held in float32: ember/lower/builder.Builder.full)
            return literal(node.attrs["value"],
                           torch.float32 if node.attrs.get("wide") else node.dtype)
        target = self.scope_for(index, scope)
        key = (id(node), index)
        for ancestor in target.chain():
            if key in ancestor.memo:
                return ancestor.memo[key]
        saved = self.current, self.current_deps
        self.current, self.current_deps = target, self.index_deps(index)
        try:
            result = self.generate(node, index, target)
        finally:
            self.current, self.current_deps = saved
        target.memo[key] = result
        return result

    def define(self, scope: Scope, expression: str, deps: frozenset[str]) -> str:
        name = self.fresh()
        self.emit(scope, f"{name} = {expression}")
        self.deps[name] = deps
        return name

    def offset(self, buffer: Buffer, index: Index) -> Expr:
        offset = Expr.of(buffer.offset)
        for position, stride in zip(index, buffer.strides):
            if stride:
                offset = offset + position * stride
        self.accesses.append(offset)
        return offset

    def load(self, buffer: Buffer, index: Index, scope: Scope, dtype: torch.dtype) -> str:
        offset = self.offset(buffer, index)
        if self.matmul is not None and buffer.root() is self.matmul.result:
            return self.product(offset)
        pointer = f"{self.argument(buffer)} + {render(offset)}"
        if not self.index_deps([offset]):
            # one element for every lane: a [1] block rather than a 0-d value (Triton's
            # interpreter mistypes comparisons between 0-d values)
            pointer += f" + tl.zeros({self.unit}, tl.int32)"
        mask = self.mask_for([offset])
        text = f"tl.load({pointer}, mask={mask}, other=0)" if mask else f"tl.load({pointer})"
        name = self.define(scope, load(dtype, text), self.index_deps([offset]))
        if dtype in (torch.float16, torch.bfloat16):
            self.exact_halves.add(name)
        return name

    def generate(self, node: Node, index: Index, scope: Scope) -> str:
        buffer = self.buffer_of.get(node)
        # an alias is a view: computed through its index map from its base (which this very
        # kernel may be computing), never loaded
        if buffer is not None and node not in self.members and buffer.role != "alias":
            return self.load(buffer, index, scope, node.dtype)
        kind = node.kind
        if kind is Kind.POINTWISE:
            args = [self.value(source, index, scope) for source in node.inputs]
            if node.op not in _LITERAL_OPERANDS:
                # functions and methods want tensors: constants become 0-d tensors
                args = [as_tensor(a, source.dtype, self.unit)
                        for a, source in zip(args, node.inputs)]
            deps = self.deps_of(*args)
            self.current_deps = deps
            return self.define(scope, triton_rules[node.op](node, args, self), deps)
        if kind is Kind.VIEW:
            return self.value(node.inputs[0], index_rules[node.op](node, index), scope)
        if kind is Kind.REDUCTION:
            return self.reduction(node, index, scope)
        if node.op is Op.IOTA:
            a = node.attrs
            position = index[a["dim"]]
            if position.is_constant:
                return literal(a["start"] + a["step"] * position.const, node.dtype)
            expression = f"({a['start']} + {a['step']} * {render(position)})"
            return self.define(scope, f"{expression}.to({compute_type(node.dtype)})",
                               self.index_deps([position]))
        if node.op is Op.PAD:
            return self.pad(node, index, scope)
        if node.op is Op.CAT:
            return self.cat(node, index, scope)
        if node.op in (Op.TAKE, Op.GATHER):
            return self.take(node, index, scope)
        raise AssertionError(f"{node!r} ({node.op.value}) has no buffer in {self.kernel.name}")

    def memory_order(self) -> list[int]:
        """The kernel's outer dims, outermost first, in the order its stored buffer lays
        them out: consecutive `x` then write consecutive addresses (a channels_last result
        walked in NCHW order would put 32 lanes of a warp on 32 lines). Reductions and
        matmul tiles keep the logical order."""
        if self.reduces or self.matmul:
            return self.outer_dims
        shape = self.kernel.shape
        for stored in self.kernel.stores:
            buffer = stored.buffer
            if tuple(buffer.shape) == tuple(shape) and buffer.role != "alias":
                return sorted(self.outer_dims, key=lambda d: -buffer.strides[d])
        return self.outer_dims

    # -- the kernel -----------------------------------------------------------------------
    def write(self) -> TritonKernel | None:
        kernel = self.kernel
        shape, axes = kernel.shape, kernel.axes
        space = (shape, axes)
        self.root = root = Scope(None, 0)
        self.current, self.current_deps = root, frozenset()
        self.var_level: dict[str, str] = {}
        if self.analysis:
            self.outer_index = {d: Expr.of(Var(f"i{d}", shape[d])) for d in self.outer_dims}
        else:
            self.var_level["x"] = "x"
            self.defined_at["x"] = root
            order = self.memory_order()
            self.outer_index = dict(zip(order, unravel(Expr.of(Var("x", self.xnumel)),
                                                       tuple(shape[d] for d in order))))
            self.header(root)
        canonical = {f"i{d}": d for d in range(len(shape))}

        def placed(node: Node, dims: dict[int, Expr]) -> Index:
            index = store_index(node.shape, space)
            mapping = {Var(name, shape[d]): dims.get(d, ZERO)
                       for name, d in canonical.items() if shape[d] != 1}
            return tuple(e.substitute(mapping) for e in index)

        if self.split and self.stage:
            # a partial stage: only this level's reductions, each into its workspace (or a
            # gathering stage: each finished from those, into its finished workspace)
            for node in kernel.members:
                if node.kind is Kind.REDUCTION and self.levels[node] == self.stage:
                    if self.gathering:
                        self.store_finished(node, root)
                    else:
                        self.value(node, placed(node, self.outer_index), root)
            return self.finish_kernel(root)
        # Every value is computed before anything is stored (as in the C writer): a kernel
        # that writes an input in place reads it first, and the row loop below reads inputs
        # that this level's stores into them would overwrite: those wait for it.
        full_stores = self.full_stores
        row = bool(full_stores and self.rnumel)

        def computed(items: list, dims: dict[int, Expr], scope: Scope) -> list:
            """(item, where, value) for each item, every value computed before any store."""
            values = []
            for item in items:
                at = placed(item.node, dims)
                values.append((item, at, self.value(item.node, at, scope)))
            return values

        waiting = []
        for item, at, value in computed([item for item in kernel.stores
                                         if item not in full_stores], self.outer_index, root):
            if row and item.buffer.root().role == "input":
                waiting.append((item, at, value))
            else:
                self.store(root, item, at, value, "x")
        if row:
            outer = tuple(self.outer_index.get(d, ZERO) for d in range(len(shape)))
            body, full = self.open_row(root, outer)
            dims = {d: full[d] for d in range(len(shape))}
            for item, at, value in computed(full_stores, dims, body):
                self.store(body, item, at, value, "r")
            self.close_row(body)
        for item, at, value in waiting:
            self.store(root, item, at, value, "x")
        if self.analysis:
            return None
        return self.finish_kernel(root)

    def header(self, root: Scope) -> None:
        tiling = self.tiling
        if self.matmul is not None:
            self.matmul_header(root)
            return
        if self.split and not self.gathering:
            if tiling.chunk_per_call:  # whole tiles per chunk, `parts` chunks cover the row
                self.emit(root, f"chunk_length = (({self.rnumel} + {tiling.parts - 1}) // "
                                f"{tiling.parts} + RBLOCK - 1) // RBLOCK * RBLOCK")
                self.emit(root, "chunk = tl.program_id(1) * chunk_length")
            else:
                self.emit(root, f"chunk = tl.program_id(1) * {tiling.chunk}")
        pid = "tl.program_id(0).to(tl.int64)" if tiling.int64 else "tl.program_id(0)"
        if self.reduces:
            self.emit(root, f"x = ({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]")
        else:
            self.emit(root, f"x = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        self.deps["x"] = frozenset({"x"})
        if not divides(tiling.xblock, self.xnumel):
            self.masks["x"] = "xmask"
            self.emit(root, f"xmask = x < {self.xnumel}")
        if self.reduces and tiling.persistent:
            rtype = ".to(tl.int64)" if tiling.int64 else ""
            self.emit(root, f"r = tl.arange(0, RBLOCK)[None, :]{rtype}")
            self.var_level["r"] = "r"
            self.defined_at["r"] = root
            if not divides(tiling.rblock, self.rnumel):
                self.masks["r"] = "rmask"
                self.emit(root, f"rmask = r < {self.rnumel}")

    def store(self, scope: Scope, item, index: Index, value: str, level: str) -> None:
        offset = self.offset(item.buffer, index)
        pointer = f"{self.argument(item.buffer)} + {render(offset)}"
        if self.analysis:
            return
        wanted = frozenset({"x"}) if level == "x" else frozenset({"x", "r"})
        if not self.reduces:
            wanted = frozenset({"x"})
        if self.index_deps([offset]) != wanted:
            shape = self.block_shape(wanted)
            pointer = f"tl.broadcast_to({pointer}, {shape})"
        names = ["x"] + ([scope.row or "r"] if level == "r" else [])
        masks = [self.masks[n] for n in names if n in self.masks]
        if self.split and level == "x" and self.final_grid_parts() > 1:
            masks.append("(tl.program_id(1) == 0)")  # one chunk stores each row's values
        mask = f", mask={' & '.join(masks)}" if masks else ""
        value = store(item.node.dtype, as_tensor(value, item.node.dtype, self.unit))
        self.emit(scope, f"tl.store({pointer}, {value}{mask})")

    def finish_kernel(self, root: Scope) -> TritonKernel:
        tiling = self.tiling
        params = list(self.arguments.values())
        signature = {name: SIGNATURE_TYPES[buffer.dtype]
                     for buffer, name in self.arguments.items()}
        sizes = self.sizes_used(root)
        params += sizes
        signature.update((name, size_type(self.wide)) for name in sizes)
        if self.matmul is not None:
            m, n = self.kernel.shape
            grid = (grid_product(ceil_div(m, tiling.block_m), ceil_div(n, tiling.block_n)),
                    1, 1)
        else:
            rows = ceil_div(self.xnumel, tiling.xblock)
            if self.gathering:
                grid = (rows, 1, 1)
            else:
                grid = (rows, tiling.parts if self.stage else self.final_grid_parts(), 1)
        described = ", ".join(f"{name}: {kind}" for name, kind in signature.items())
        stages = f", num_stages={tiling.num_stages}" if tiling.num_stages != 1 else ""
        shown = ", ".join(map(str, grid))
        lines = [f"# grid ({shown}), num_warps={tiling.num_warps}{stages}; {described}",
                 "@triton.jit" + ("(debug=True)" if self.uses_checks else ""),
                 f"def {self.kernel_name()}({', '.join(params)}):"]
        if self.matmul is not None:
            lines += [f"    BLOCK_M: tl.constexpr = {tiling.block_m}",
                      f"    BLOCK_N: tl.constexpr = {tiling.block_n}",
                      f"    BLOCK_K: tl.constexpr = {tiling.block_k}"]
        else:
            lines.append(f"    XBLOCK: tl.constexpr = {tiling.xblock}")
        if self.reduces:
            lines.append(f"    RBLOCK: tl.constexpr = {tiling.rblock}")
        if self.dependent_launch:
            # started before the kernel ahead of it on the stream has finished: wait for it
            # (and its writes) before reading anything, and let the next one start likewise
            lines += ["    tl.extra.cuda.gdc_wait()",
                      "    tl.extra.cuda.gdc_launch_dependents()"]
        lines += ["    " + line for line in root.lines]
        return TritonKernel(self.kernel_name(), "\n".join(lines), list(self.arguments),
                            signature, grid, tiling.num_warps, self.uses_checks,
                            tiling.num_stages, self.dependent_launch, sizes)

    def sizes_used(self, root: Scope) -> list[str]:
        """The graph's symbols the kernel's text names: its size parameters, in order."""
        if not self.symbols:
            return []
        used = set(SYMBOL.findall("\n".join(root.lines)))
        return [name for name in self.symbols if name in used]

    def kernel_name(self) -> str:
        if self.gathering:
            return f"{self.kernel.name}_gather{self.stage}"
        return f"{self.kernel.name}_stage{self.stage}" if self.stage else self.kernel.name

    @functools.cached_property
    def full_stores(self) -> list:
        """The kernel's stores of whole rows (their index varies along the reduced dims)."""
        space = (self.kernel.shape, self.kernel.axes)
        return [item for item in self.kernel.stores
                if any(f"i{d}" in e.variables()
                       for e in store_index(item.node.shape, space) for d in self.kernel.axes)]


def row_length(kernel: Kernel) -> Dim | None:
    """The length of the rows a kernel reduces (None for one that does not reduce, or that
    computes a matmul first), as TritonKernelWriter flattens them."""
    if not kernel.axes or kernel.matmul is not None:
        return None
    return math.prod(kernel.shape[d] for d in kernel.axes if kernel.shape[d] != 1)
