"""Kernel → C: loops over the iteration space, OpenMP across cores, SIMD within a core.

A kernel's stores are emitted inside loops over its space; every value is computed on demand
where it is used (`value`), memoized per loop scope and hoisted to the outermost loop whose
variables it depends on. A reduction used per outer point becomes an inner loop at that point;
so softmax over rows is one kernel: per row, a max loop, a sum loop, a store loop.

Adjacent dims are merged into one loop when every memory access is affine across them (a
contiguous 4000x4000 chain becomes one 16M loop), and the outer loops run in parallel when the
kernel touches enough elements.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re

import torch

from ember import config
from ember.codegen import kernel_reuse
from ember.codegen.c_columns import ColumnMode
from ember.codegen.c_indexing import IndexedReads
from ember.codegen.c_loops import at_run_time, plan_groups, split_loop
from ember.codegen.c_reductions import Reductions
from ember.codegen.c_rules import (
    INCLUDES,
    PRELUDE,
    STORAGE_TYPES,
    c_rules,
    cast_exact,
    compute_type,
    literal,
    load,
    store,
    vector_math_declarations,
)
from ember.codegen.c_tables import LaneTables
from ember.codegen.text import SYMBOL_NAME, Scope
from ember.codegen.text import c_int as _int
from ember.codegen.text import render_c as render
from ember.ir.graph import Node
from ember.ir.ops import Kind, Op
from ember.runtime.build import UNIT_BREAK
from ember.schedule.expr import ZERO, Expr, Var, unravel
from ember.schedule.fuse import store_index
from ember.schedule.indexing import Index, index_rules
from ember.schedule.plan import Buffer, Kernel, Plan


@dataclasses.dataclass
class KernelSource:
    name: str
    text: str
    arguments: list[Buffer]
    checks: bool  # returns nonzero when an index was out of range
    sizes: list[str] = dataclasses.field(default_factory=list)  # symbols, after the pointers
    # the kernel this one repeats on other buffers (codegen/kernel_reuse.py): the file holds
    # that one's function only, taking these arguments in the same order
    same_as: str | None = None


@dataclasses.dataclass(frozen=True)
class CTuning:
    """A kernel's configuration other than the heuristics' (mode="max-autotune" times these:
    ember/runtime/tune_c.py). `threads`: 1 runs it serially, n > 1 in parallel on n threads
    (0: as the heuristics say); `column`: lanes per block in column mode (0: COLUMN_WIDTH)."""

    threads: int = 0
    column: int = 0


# Math calls that cost tens of cycles per element (the rest of a kernel's arithmetic costs ~1):
# a kernel of such calls goes parallel over fewer elements (tanh(x + b) over 64x256 on 2
# cores: ~9.5 against ~10.3 us per call, within this VM's noise; S4 5.35 -> 5.07 ms once)
_COSTLY_CALL = re.compile(r"\b(?:ember_\w+|(?:exp|expm1|exp2|log|log1p|log2|log10|tanh|sinh|"
                          r"cosh|sin|cos|tan|asin|acos|atan|atan2|asinh|acosh|atanh|erf|erfc|"
                          r"pow|lgamma|tgamma|cbrt|hypot)f?)\(")
COSTLY_CALL_WEIGHT = 8


class CKernelWriter(IndexedReads, ColumnMode, LaneTables, Reductions):
    def __init__(self, kernel: Kernel, plan: Plan, groups=None, checks: bool = False,
                 column: int | None = None, costly_calls: int = 0,
                 tuning: CTuning | None = None):
        self.kernel = kernel
        self.tuning = tuning
        self.symbols = plan.graph.symbols
        self.members = set(kernel.members)
        self.buffer_of = plan.buffer_of
        self.arguments: dict[Buffer, str] = {}
        self.counter = itertools.count()
        self.loops = itertools.count()
        self.checks = checks
        self.uses_checks = False
        self.defined_at: dict[str, Scope] = {}
        self.accesses: list[Expr] = []  # (the offsets of loads and stores)
        # index expressions the kernel tests or clamps (a pad's, a gather's): not memory,
        # but dims merged across them would cost a division and a remainder each
        self.tested: list[Expr] = []
        # half-precision values loaded from memory: exact in float already, where a value
        # computed in float for a half node must be rounded before it leaves that type
        self.exact_halves: set[str] = set()
        shape, axes = kernel.shape, kernel.axes
        self.outer_dims = [d for d, n in enumerate(shape) if d not in axes and n != 1]
        self.inner_dims = [d for d in axes if shape[d] != 1]
        if groups is None:
            groups = ([[d] for d in self.outer_dims], [[d] for d in self.inner_dims])
        self.outer_groups, self.inner_groups = groups
        threshold = config.settings.parallel_threshold
        work = math.prod(shape) * (1 + COSTLY_CALL_WEIGHT * costly_calls)
        # symbolic work: parallel when the call's sizes make enough of it (OpenMP's `if`)
        self.parallel_if = at_run_time(work, threshold)
        self.parallel = bool(self.parallel_if) or work >= threshold
        if tuning is not None and tuning.threads:
            self.parallel = tuning.threads > 1
        self.costly_calls = 0  # (counted while writing: what a second writing is given)
        # Column mode (reductions whose kept innermost dim is the contiguous one): the last
        # outer loop walks blocks of `column` positions, and every per-position value is an
        # array over the block's lanes, so the innermost loop runs along contiguous memory.
        self.column = column
        self.block_scope: Scope | None = None
        self.block_base: Expr | None = None
        self.column_arrays: dict = {}
        # column mode: whole-space stores that need no reduction of this kernel, written by
        # the first reduction loop (which computes their values anyway) instead of a loop of
        # their own that would compute them again
        self.early_stores: list = []
        self.stored_early: set = set()
        # whole-space values stored early, by node: (their buffer, the kept dims' positions
        # they were stored at): a later reduction loop of the same positions loads them
        self.reloadable: dict[Node, tuple[Buffer, tuple[str, ...]]] = {}
        # dims whose positions a pad tests (the loop plan keeps them out of the merged
        # parallel loop: a test of a merged index is a division and a remainder per element)
        self.padded_dims: set[int] = set()
        # a pad's or a cat's tests of one loop variable plus a constant, by the variable: (the
        # test as written, the variable's first position where it holds or None for every
        # one below the end, and its end); the loop is cut where they change (c_loops.split_loop)
        self.splits: dict[str, list[tuple[str, int | None, int]]] = {}
        # inside a pad: (the condition that its input is read, the loop variables it names,
        # the index expressions it tests)
        self.guard: tuple[str, frozenset[str], Index] | None = None
        # lane tables: values of the innermost loop's position alone, computed before the
        # loops (see table)
        self.root: Scope | None = None
        self.tables: dict[tuple, str] = {}  # (a value at its positions -> its table)
        last = self.inner_groups[-1:] if kernel.axes else self.outer_groups[-1:]
        self.simd_loop = f"{'j' if kernel.axes else 'i'}{last[0][0]}" if last else None

    # -- names ----------------------------------------------------------------------------
    def fresh(self, prefix: str = "v") -> str:
        return f"{prefix}{next(self.counter)}"

    def argument(self, buffer: Buffer) -> str:
        root = buffer.root()
        if root not in self.arguments:
            self.arguments[root] = f"a_{root.name}"
        return self.arguments[root]

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
        if best is None:  # the outermost scope
            *_, best = scope.chain()
        return best

    def open_loops(self, parent: Scope, groups: list[list[int]], prefix: str
                   ) -> tuple[Scope, dict[int, Expr], list[tuple[Scope, str, int]]]:
        """Nested loops over `groups` of dims; returns the innermost scope, each dim's index
        and the open loops (to close in reverse)."""
        shape = self.kernel.shape
        index: dict[int, Expr] = {}
        loops = []
        scope = parent
        for group in groups:
            extent = math.prod(shape[d] for d in group)
            name = f"{prefix}{group[0]}"
            scope = Scope(scope, scope.depth + 1)
            self.defined_at[name] = scope
            var = Expr.of(Var(name, extent))
            for d, position in zip(group, unravel(var, tuple(shape[d] for d in group))):
                index[d] = position
            loops.append((scope, name, _int(extent)))
        return scope, index, loops

    def close_loops(self, loops, pragmas: list[str]) -> None:
        """Render loops innermost first into their parents; pragmas[i] goes on loop i."""
        for (scope, name, bound), pragma in reversed(list(zip(loops, pragmas))):
            if not scope.lines:
                continue  # nothing to do per iteration
            text = []
            for first, end, lines in split_loop(self.splits.get(name), bound, pragma,
                                                scope.lines):
                if pragma:
                    text.append(pragma)
                text.append(f"for (int64_t {name} = {first}; {name} < {end}; {name}++) {{")
                text += ["    " + line for line in lines]
                text.append("}")
            scope.parent.lines.extend(text)

    def emit(self, scope: Scope, line: str) -> None:
        scope.lines.append(line)

    # -- values ---------------------------------------------------------------------------
    def value(self, node: Node, index: Index, scope: Scope) -> str:
        if node.op is Op.FULL:
            # (a wide scalar is held in float32: ember/lower/builder.Builder.full)
            return literal(node.attrs["value"],
                           torch.float32 if node.attrs.get("wide") else node.dtype)
        # (a value that moves with a pad's tested positions is computed under its condition:
        # kept apart from the same value elsewhere, and where the condition can be tested)
        guarded = self.under_guard(index)
        target = self.scope_for(index + (self.guard[2] if guarded else ()), scope)
        key = (id(node), index, self.guard[0] if guarded else None)
        for ancestor in target.chain():
            if key in ancestor.memo:
                return ancestor.memo[key]
        result = None if guarded else self.table(node, index, target)
        if result is None:
            result = self.generate(node, index, target)
        target.memo[key] = result
        return result

    def define(self, scope: Scope, dtype: torch.dtype, expression: str) -> str:
        self.costly_calls += len(_COSTLY_CALL.findall(expression))
        name = self.fresh()
        self.emit(scope, f"{compute_type(dtype)} {name} = {expression};")
        return name

    # Elements apart from one lane to the next beyond which a load is gathered (offset)
    GATHERED_STRIDE = 16

    def offset(self, buffer: Buffer, index: Index, load: bool = False) -> str:
        offset = Expr.of(buffer.offset)
        for position, stride in zip(index, buffer.strides):
            if stride:
                offset = offset + position * stride
        self.accesses.append(offset)
        text = render(offset)
        if load and any(isinstance(atom, Var) and atom.name == self.simd_loop and
                        isinstance(step, int) and abs(step) >= self.GATHERED_STRIDE
                        for atom, step in offset.terms):
            # gcc (12) vectorizes no simd loop holding a load whose lanes lie 16 or more
            # elements apart (a transposed operand read along its rows), as a gather it
            # does: its index is hidden from the affine analysis
            text = f"ember_gathered({text})"
        return f"{self.argument(buffer)}[{text}]"

    def generate(self, node: Node, index: Index, scope: Scope) -> str:
        buffer = self.buffer_of.get(node)
        stored = self.reloadable.get(node)
        if stored is not None and stored[1] == self.kept_positions(index):
            # (stored by an earlier reduction loop of this kernel at these kept positions —
            # batch norm's mean, then its variance, of a depthwise convolution's taps:
            # loaded, not computed once per loop)
            buffer = stored[0]
            node_is_member = False
        else:
            node_is_member = node in self.members
        # an alias is a view: computed through its index map from its base (which this very
        # kernel may be computing), never loaded
        if buffer is not None and not node_is_member and buffer.role != "alias":
            loaded = load(node.dtype, self.offset(buffer, index, load=True))
            if self.under_guard(index):  # (a masked load where a pad reads its input)
                loaded = f"({self.guard[0]}) ? {loaded} : {literal(0, node.dtype)}"
            name = self.define(scope, node.dtype, loaded)
            if node.dtype in (torch.float16, torch.bfloat16):
                self.exact_halves.add(name)
            return name
        kind = node.kind
        if kind is Kind.POINTWISE:
            args = [self.value(source, index, scope) for source in node.inputs]
            if node.op is Op.CAST and args[0] in self.exact_halves:
                # (a half value loaded from memory is exact in float: nothing to round)
                return self.define(scope, node.dtype, cast_exact(node, args))
            return self.define(scope, node.dtype, c_rules[node.op](node, args))
        if kind is Kind.VIEW:
            return self.value(node.inputs[0], index_rules[node.op](node, index), scope)
        if kind is Kind.REDUCTION:
            return self.reduction(node, index, scope)
        if node.op is Op.IOTA:
            a = node.attrs
            position = render(index[a["dim"]])
            return self.define(scope, node.dtype, f"({compute_type(node.dtype)})"
                               f"({_int(a['start'])} + {a['step']} * {position})")
        if node.op is Op.PAD:
            return self.pad(node, index, scope)
        if node.op is Op.CAT:
            return self.cat(node, index, scope)
        if node.op in (Op.TAKE, Op.GATHER):
            return self.take(node, index, scope)
        raise AssertionError(f"{node!r} ({node.op.value}) has no buffer in {self.kernel.name}")

    # -- the kernel -----------------------------------------------------------------------
    def write(self) -> KernelSource:
        kernel = self.kernel
        space = (kernel.shape, kernel.axes)
        root = self.root = Scope(None, 0)
        groups = self.outer_groups[:-1] if self.column else self.outer_groups
        outer, outer_index, outer_loops = self.open_loops(root, groups, "i")
        epilogue = None
        if self.column:
            outer, outer_index, epilogue = self.open_column(outer, outer_index, outer_loops)
        full_stores = [item for item in kernel.stores
                       if any(f"i{d}" in e.variables()
                              for e in store_index(item.node.shape, space) for d in kernel.axes)]
        self.early_stores = [item for item in full_stores if not self.needs_reduction(item.node)]
        # Every value is computed before anything is stored: a kernel that writes an input in
        # place reads it first (x1.add_(x0); x0.zero_() adds the old x0), and the inner loop
        # below reads inputs that the outer level's stores would overwrite: those wait for it.
        lines = self.store_lines([item for item in kernel.stores if item not in full_stores],
                                 outer_index, outer)
        waiting = []
        for item, line in lines:
            if item.buffer.root().role == "input" and full_stores and not self.column:
                waiting.append(line)
            else:
                self.emit(outer, line)
        status = " reduction(|:status)" if self.checks else ""
        if epilogue is not None:
            self.close_loops([epilogue], ["#pragma omp simd" + status])
        full_stores = [item for item in full_stores if item not in self.stored_early]
        if full_stores:
            parent = self.block_scope if self.column else outer
            inner, inner_index, inner_loops = self.open_loops(parent, self.inner_groups, "j")
            dims = {**outer_index, **inner_index}
            if self.column:
                inner, lane, lane_loop = self.open_lanes(inner)
                dims.update(self.column_index(lane))
                inner_loops.append(lane_loop)
            for _, line in self.store_lines(full_stores, dims, inner):
                self.emit(inner, line)
            pragmas = [""] * len(inner_loops)
            if inner_loops:
                pragmas[-1] = "#pragma omp simd" + status
                if parent.depth == 0 and self.parallel:
                    # no outer loop to share out (a full reduction and its epilogue): the
                    # threads split the store loop instead
                    pragmas[0] = "#pragma omp parallel for" + (
                        " simd" if len(inner_loops) == 1 else "") + status + self.when() + \
                        self.threads()
            self.close_loops(inner_loops, pragmas)
        for line in waiting:
            self.emit(outer, line)
        self.close_loops(outer_loops, self.outer_pragmas(outer_loops))
        signature = ", ".join(
            f"{STORAGE_TYPES[b.dtype]}* restrict {name}" for b, name in self.arguments.items())
        body = ["    int64_t status = 0;"] + ["    " + line for line in root.lines]
        sizes = self.sizes_used(body)
        signature += "".join(f", int64_t {name}" for name in sizes)
        text = "\n".join([f"int {kernel.name}({signature}) {{", *body,
                          "    return (int)(status != 0);", "}"])
        return KernelSource(kernel.name, text, list(self.arguments), self.uses_checks, sizes)

    def sizes_used(self, body: list[str]) -> list[str]:
        """The graph's symbols the kernel's text names: its size parameters, in order."""
        symbols = self.symbols
        if not symbols:
            return []
        used = {name for line in body for name in SYMBOL_NAME.findall(line)}
        return [name for name in symbols if name in used]

    def threads(self) -> str:
        """The `num_threads` clause of a parallel pragma, where the kernel's tuning sets it."""
        tuning = self.tuning
        return f" num_threads({tuning.threads})" if tuning and tuning.threads > 1 else ""

    def when(self) -> str:
        """The `if` clause of a parallel pragma whose work is symbolic. It names the parallel
        construct: an unmodified `if` on `parallel for simd` binds the simd construct too,
        and a false condition then runs the loop one lane at a time (a symbolic gelu over
        512 floats: 7.2 us against 0.55, gcc 12)."""
        return f" if(parallel: {self.parallel_if})" if self.parallel_if else ""

    def store_lines(self, items: list, dims: dict[int, Expr], scope: Scope) -> list:
        """(item, its store statement) for each item, every value computed first."""
        values = []
        for item in items:
            at = self.placed(item.node, dims)
            values.append((item, at, self.value(item.node, at, scope)))
        return [(item, f"{self.offset(item.buffer, at)} = {store(item.node.dtype, value)};")
                for item, at, value in values]

    def placed(self, node: Node, dims: dict[int, Expr]) -> Index:
        """The index where `node`'s value is stored, with the kernel's dims at `dims`."""
        shape = self.kernel.shape
        index = store_index(node.shape, (shape, self.kernel.axes))
        mapping = {Var(f"i{d}", shape[d]): dims.get(d, ZERO)
                   for d in range(len(shape)) if shape[d] != 1}
        return tuple(e.substitute(mapping) for e in index)

    def outer_pragmas(self, loops) -> list[str]:
        pragmas = [""] * len(loops)
        if not loops:
            return pragmas
        status = " reduction(|:status)" if self.checks else ""
        innermost_is_simd = not self.kernel.axes
        if innermost_is_simd:
            pragmas[-1] = "#pragma omp simd" + status
        if self.parallel:
            if len(loops) == 1 and innermost_is_simd:
                pragmas[0] = "#pragma omp parallel for simd" + status + self.when()
            else:
                pragmas[0] = "#pragma omp parallel for" + status + self.when()
            pragmas[0] += self.threads()
        return pragmas


def write_kernel(kernel: Kernel, plan: Plan, tuning: CTuning | None = None) -> KernelSource:
    """Write once to see every memory access, plan the loops from them, write again
    (`tuning`: a configuration of max-autotune's instead of the heuristics')."""

    first = CKernelWriter(kernel, plan, tuning=tuning)
    first.write()
    outer, inner, column = plan_groups(first)
    return CKernelWriter(kernel, plan, (outer, inner), checks=first.uses_checks,
                         column=column, costly_calls=first.costly_calls, tuning=tuning).write()


def write_source(plan: Plan, tunings: dict[str, CTuning] | None = None
                 ) -> tuple[str, list[KernelSource]]:
    """One C file holding every kernel of the plan (`tunings`: max-autotune's choices by
    kernel name; the others as the heuristics say)."""
    tunings = tunings or {}
    # (a kernel of a structure written before is renamed from it: see kernel_reuse.py)
    sources = kernel_reuse.write_all(
        plan.kernels, plan, lambda kernel: write_kernel(kernel, plan, tunings.get(kernel.name)),
        "a_", set(tunings))
    # (each kernel may begin a translation unit of its own: runtime/build.units)
    text = "\n\n".join([INCLUDES.strip(), vector_math_declarations(), PRELUDE.strip()]) + \
        "".join(UNIT_BREAK + source.text for source in sources if source.same_as is None) + "\n"
    return text, sources
