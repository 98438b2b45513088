"""Which nodes of a graph get buffers of their own, and how those buffers are laid out: the
first half of the fusion decisions (ember/schedule/fuse.py's Scheduler groups the realized
nodes into kernels).

Graph inputs, outputs and write-backs, reductions, library calls and their operands are
realized; so are pointwise values that several realized nodes (or one, at several positions)
would recompute at a high cost, and values a pass marked `realize` (a weight relaid once).
A computed buffer takes the order of the largest operand of its rank that is neither
broadcast nor a permuted view (channels-last after a channels-last convolution), else
row-major.
"""

from __future__ import annotations

import math

from ember import config
from ember.ir.graph import Node
from ember.ir.library import returns_views
from ember.ir.ops import Kind, Op
from ember.ir.sizes import guess
from ember.schedule.expr import ZERO, Expr, Var
from ember.schedule.indexing import Index, input_indices
from ember.schedule.layout import dense_order, row_major, strides_in_order, view_geometry

Space = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, reduced axes)


def space_index(shape: tuple[int, ...]) -> Index:
    return tuple(Expr.of(Var(f"i{d}", n)) if n != 1 else ZERO for d, n in enumerate(shape))

# A pointwise value inlined into several realized nodes is computed once into a buffer when its
# inlined cost (pointwise ops) reaches this many, or when it reads this many buffers of its own
# size: a residual stream (x + attention + mlp + ...) inlined into each layer's norm would have
# the last layer's kernel read every layer's output again (ViT-B: 60 µs kernels, not 10).
SHARED_COST_LIMIT = 12
SHARED_READS_LIMIT = 2
# A pointwise value that one realized node reads at several positions (a window's taps) is
# computed once into a buffer when its inlined cost (pointwise ops, not its pad's) times
# the positions beyond the first reaches this many: batch norm and SiLU before a 3x3
# depthwise convolution (about 12 ops, 8 more taps) is; x * 2 + 1 before a 3x3 max pool (3)
# is not.
REREAD_COST_LIMIT = 32
# A pointwise value of at least BROADCAST_OPS ops that a reduction reads broadcast (its
# space this many times the value's size, less one, times the value's inlined cost) is
# computed once into a buffer; a layer norm's backward reading rsqrt(var + eps) per row
# (two ops) keeps its one kernel.
BROADCAST_COST_LIMIT = 64
BROADCAST_OPS = 4
# (and of this many elements: a loss's per-row scale, six values, is no kernel of its own)
BROADCAST_ELEMENTS = 1024


def natural_space(node: Node) -> Space:
    if node.kind is Kind.REDUCTION:
        return node.inputs[0].shape, tuple(node.attrs["axes"])
    return node.shape, ()


class Realizing:
    """The Scheduler's realization and layout decisions (its state: graph, users, realized,
    aliases, operands, _decided, _inherited; reads_of and library_result are the
    Scheduler's)."""

    _callers_outputs: set[Node] | None = None  # (see _seen_by_caller)

    # -- realization ----------------------------------------------------------------------
    def decide_realized(self) -> None:
        graph = self.graph
        realized = self.realized
        for node in graph.nodes:
            if node.op in (Op.INPUT, Op.LIBRARY, Op.ITEM) or node.kind is Kind.REDUCTION or \
                    node.attrs.get("realize"):
                realized.add(node)
        realized.update(graph.outputs)
        realized.update(node for _, node in graph.writebacks)
        copied: list[Node] = []  # operands that are no strided view of their chain's base
        for node in graph.nodes:
            if node.op is Op.LIBRARY:
                layouts = node.attrs.get("operand_strides") or (None,) * len(node.inputs)
                for operand, strides in zip(node.inputs, layouts):
                    if self.operands.get(operand) is None:
                        self.operands[operand] = strides
                    if not self._realize_operand(operand):
                        copied.append(operand)
        for index, node in enumerate(graph.outputs):
            if node.kind is Kind.VIEW:
                self._try_output_alias(node, graph.output_strides[index])
        # (in the graph's order: an operand that views another's copy views it once aliased)
        position = {node: index for index, node in enumerate(graph.nodes)}
        for node in sorted(copied, key=position.__getitem__):
            if not self._realize_operand(node):
                self._view_computed_value(node)
        self._realize_shared()
        self._realize_reread()
        self._realize_broadcast()
        self._decided = True

    def _chain_base(self, node: Node) -> Node:
        while node.kind is Kind.VIEW and node not in self.aliases:
            node = node.inputs[0]
        return node

    def _realize_operand(self, node: Node) -> bool:
        """A library call's operand: a buffer, or a strided view of one (as eager passes).
        False where it is a view but no strided view of its chain's base (a flip, a reshape
        that copies): computed into a buffer of its own (see _view_computed_value)."""
        self.realized.add(node)
        if node.kind is not Kind.VIEW or node in self.aliases:
            return True  # not a view, or already an alias (an operand of an earlier call too)
        base = self._chain_base(node)
        if base.kind is Kind.LEAF and base.op is not Op.INPUT:
            return True
        base_geometry = self.planned_geometry(base)
        if base_geometry is None or view_geometry(node, base, base_geometry) is None:
            return False
        self.realized.add(base)
        self.aliases[node] = base
        return True

    def _view_computed_value(self, node: Node) -> None:
        """A library operand that is no strided view of its chain's base, where eager asks no
        layout of it, is a view of the chain's nearest value it densely views, stored as
        computed. Written in its own order, a transposed operand was written across the
        grain (ViT's qkv gradient, stored transposed for its weight's product: 110 us a layer
        on the H200, against 27 stored as computed and read transposed by cuBLAS).

        NOTE: decided after every other alias and operand layout, from the layout the viewed
        value is then planned to have: it may be an output in eager's strides, or a view of
        its own base passed to a later call (taken as row-major, a transpose that a later
        product read as an alias made this operand no strided view at all: no buffer)."""
        if node in self.aliases or self.operands.get(node) is not None or \
                node.attrs.get("realize"):
            return
        current = node.inputs[0]
        while current.kind is Kind.VIEW and current not in self.aliases and \
                current not in self.operands:
            geometry = self.planned_geometry(current)
            viewed = None if geometry is None else view_geometry(node, current, geometry)
            if viewed is not None and dense_order(viewed[0], viewed[1]) is not None:
                self.realized.add(current)
                self.aliases[node] = current
                return
            current = current.inputs[0]

    def planned_geometry(self, node: Node) -> tuple | None:
        """(shape, strides, offset) `node`'s buffer will have, or None when not strided:
        inputs and library results keep eager's layout, outputs and library operands take
        eager's strides, every other buffer is row-major."""
        if node in self.aliases:
            base = self.aliases[node]
            base_geometry = self.planned_geometry(base)
            return None if base_geometry is None else view_geometry(node, base, base_geometry)
        if node.op is Op.INPUT:
            return node.shape, node.strides or row_major(node.shape), 0
        if node in self.graph.outputs:
            position = self.graph.outputs.index(node)
            return node.shape, tuple(self.graph.output_strides[position]), 0
        if node.op in (Op.LIBRARY, Op.ITEM):
            result = self.library_result(node)
            return tuple(result[0]), tuple(result[2]), 0
        return node.shape, self.temp_strides(node), 0

    def temp_strides(self, node: Node) -> tuple[int, ...]:
        """Row-major, except for a library call's operand: eager's layout of that operand,
        since an op such as as_strided reads memory by its strides, not by its values'
        positions (eager's operand may be a copy laid out unlike the value it copies)."""
        strides = self.operands.get(node)
        if strides is not None and len(strides) == node.ndim:
            return tuple(strides)
        if node not in self._inherited:
            self._inherited[node] = self._inherited_strides(node)
        return self._inherited[node] or row_major(node.shape)

    def _inherited_strides(self, node: Node) -> tuple[int, ...] | None:
        """The layout of the largest buffer of `node`'s rank that computing it reads, where
        that is not row-major: a value computed from a channels-last convolution's result
        is stored channels-last, and its kernel streams both (row-major, it read across the
        grain: a batch norm after a channels-last convolution 5x slower). Decided once the
        realized nodes are (a base that a library call views keeps row-major: its views'
        strides were planned from it)."""
        if not self._decided or node.ndim < 2 or node.kind is not Kind.POINTWISE and \
                node.op is not Op.PAD or node in self.aliases.values() or \
                any(type(n) is not int for n in node.shape):
            return None
        best, size = None, 0
        for source, _ in self.reads_of(node, natural_space(node)):
            geometry = self.planned_geometry(source) if source is not node else None
            # (a broadcast operand's order says nothing of the dims it is broadcast along:
            # ViT's position embedding, 1 x tokens x width, made the residual stream
            # batch-innermost, and every layer norm read it across the grain, 2.5x slower;
            # a pad's image, smaller than the pad, lends its order)
            if geometry is None or len(geometry[0]) != node.ndim or any(
                    m == 1 and n != 1 for m, n in zip(geometry[0], node.shape)) or \
                    self._permuted(source):
                continue
            order = dense_order(geometry[0], geometry[1])
            numel = math.prod(geometry[0]) if order is not None else 0
            if numel > size:
                best, size = order, numel
        if best is None or best == sorted(best):
            return None
        return strides_in_order(node.shape, best)

    def _permuted(self, node: Node) -> bool:
        """Is `node` a view that reads its base in another order (a transpose, a permute)?
        Its strides are then the base's layout read another way, not a grain of its own."""
        if node.kind is not Kind.VIEW:
            return False
        base = self._chain_base(node)
        geometries = self.planned_geometry(node), self.planned_geometry(base)
        if None in geometries or len(geometries[0][0]) != len(geometries[1][0]):
            return True
        return dense_order(*geometries[0][:2]) != dense_order(*geometries[1][:2])

    def _try_output_alias(self, node: Node, strides: tuple[int, ...]) -> None:
        """An output that views a value in eager's layout is that value's buffer, not a copy
        of it: a computed value's (row-major), or a library result's (a linear's output
        reshaped: a model's logits) unless that result views the call's operands."""
        base = self._chain_base(node)
        if base.op is Op.INPUT or base.kind is Kind.LEAF or base.kind is Kind.VIEW or \
                self._seen_by_caller(base):
            return
        if any(self.aliases.get(output) is base for output in self.graph.outputs):
            return  # another output already views this memory: eager's outputs are separate
        if base.op in (Op.LIBRARY, Op.ITEM):
            library = base.inputs[0] if base.op is Op.ITEM else base
            if returns_views(library.attrs):
                return
            shape, _, base_strides = self.library_result(base)
            geometry = view_geometry(node, base, (tuple(shape), tuple(base_strides), 0))
        else:
            geometry = view_geometry(node, base, (base.shape, row_major(base.shape), 0))
        if geometry is not None and geometry[1] == tuple(strides) and geometry[2] == 0:
            self.realized.add(base)
            self.aliases[node] = base

    @property
    def shared_saved_from(self) -> int | None:
        """Where a training forward's outputs saved for its backward begin, when a caller's
        output may share their memory (the logits a loss reads again in the backward: stored
        once, not twice; runtime/training.py keeps an in-place write to that output from
        reaching the saved value unseen); else None."""
        return self.graph.saved_from if config.settings.saved_outputs else None

    def _seen_by_caller(self, node: Node) -> bool:
        """Is `node` an output the caller gets (not only a value saved for the backward)?"""
        if self._callers_outputs is None:
            self._callers_outputs = set(self.graph.outputs[:self.shared_saved_from])
        return node in self._callers_outputs

    def _realize_shared(self) -> None:
        """Realize costly pointwise values that several realized nodes would recompute."""
        inliners: dict[Node, set[Node]] = {}
        for root in self.graph.nodes:
            if root not in self.realized or root.op in (Op.INPUT, Op.LIBRARY, Op.ITEM):
                continue
            stack, seen = list(root.inputs), set()
            while stack:
                node = stack.pop()
                if node in seen or node in self.realized:
                    continue
                seen.add(node)
                inliners.setdefault(node, set()).add(root)
                stack.extend(node.inputs)
        for node in self.graph.nodes:
            if len(inliners.get(node, ())) >= 2:
                cost, reads = self._inline_cost(node)
                if cost >= SHARED_COST_LIMIT or reads >= SHARED_READS_LIMIT:
                    self.realized.add(node)

    def _realize_reread(self) -> None:
        """Realize pointwise values that a realized node reads at several positions (a
        convolution's or a pooling's taps) where computing them again at each position
        costs more than a buffer: a depthwise convolution's image, batch norm and SiLU of
        another convolution, computed once instead of once per tap (9-49 times). The
        topmost such value of a chain is realized first (the zero-padded image, where the
        taps read one); what it reads is then read once."""
        for _ in range(4):
            positions: dict[Node, set[Index]] = {}
            parents: dict[Node, set[Node]] = {}
            for root in self.graph.nodes:
                if root not in self.realized or root.op in (Op.INPUT, Op.LIBRARY, Op.ITEM):
                    continue
                if root.kind is Kind.REDUCTION:
                    stack = [(root.inputs[0], space_index(root.inputs[0].shape), root)]
                else:
                    stack = [(source, at, root) for source, at in
                             input_indices(root, space_index(root.shape))]
                seen: set[tuple[int, Index]] = set()
                while stack:
                    node, at, parent = stack.pop()
                    if node in self.realized:
                        continue
                    parents.setdefault(node, set()).add(parent)
                    if (id(node), at) in seen:
                        continue
                    seen.add((id(node), at))
                    positions.setdefault(node, set()).add(at)
                    stack.extend((source, index, node) for source, index
                                 in input_indices(node, at))
            candidates = {node for node, found in positions.items()
                          if len(found) > 1 and (node.kind is Kind.POINTWISE or
                                                 node.op is Op.PAD) and
                          (len(found) - 1) * self._reread_cost(node) >= REREAD_COST_LIMIT}
            topmost = [node for node in candidates
                       if not self._below(node, candidates, parents)]
            if not topmost:
                return
            self.realized.update(topmost)

    def _realize_broadcast(self) -> None:
        """Realize pointwise values that a reduction reads broadcast, where computing them
        again at every point of its larger space costs more than a buffer: Mamba-2's
        chunked scan sums products of SiLU(x)·dt and exp(segment sums) over a space 128 times
        the values' own size (the two exp a value, 128 times each: 7.7 ms of a 17 ms call,
        eager's 9). The topmost such value of a chain first, as _realize_reread."""
        for _ in range(4):
            parents: dict[Node, set[Node]] = {}
            factor: dict[Node, float] = {}
            for root in self.graph.nodes:
                if root not in self.realized or root.kind is not Kind.REDUCTION:
                    continue  # (a pointwise kernel's loops hoist what they do not vary)
                space = guess(math.prod(natural_space(root)[0]))
                stack = [(source, root) for source in root.inputs]
                while stack:
                    node, parent = stack.pop()
                    if node in self.realized:
                        continue
                    parents.setdefault(node, set()).add(parent)
                    if node in factor:
                        continue
                    factor[node] = space / max(guess(node.numel), 1)
                    stack.extend((source, node) for source in node.inputs)
            candidates = {node for node, times in factor.items()
                          if node.kind is Kind.POINTWISE and times >= 2 and
                          guess(node.numel) >= BROADCAST_ELEMENTS and
                          self._broadcast_cost(node, times) >= BROADCAST_COST_LIMIT}
            topmost = [node for node in candidates
                       if not self._below(node, candidates, parents)]
            if not topmost:
                return
            self.realized.update(topmost)

    def _broadcast_cost(self, node: Node, times: float) -> float:
        """What computing `node` again at each of `times` points per element costs, in ops;
        0 for a value of fewer than BROADCAST_OPS ops."""
        ops = self._inline_cost(node)[0]
        return (times - 1) * ops if ops >= BROADCAST_OPS else 0

    def _reread_cost(self, node: Node) -> int:
        """What computing `node` again costs: a pad's own test is a masked load either way
        (a padded input alone is read where it lies, not copied)."""
        return self._inline_cost(node)[0] - (node.op is Op.PAD)

    @staticmethod
    def _below(node: Node, candidates: set[Node], parents: dict[Node, set[Node]]) -> bool:
        """Is `node` computed inside another candidate (one of its inlined readers, or
        theirs)?"""
        stack, seen = list(parents.get(node, ())), set()
        while stack:
            current = stack.pop()
            if current in candidates:
                return True
            if current in seen:
                continue
            seen.add(current)
            stack.extend(parents.get(current, ()))
        return False

    def _inline_cost(self, node: Node) -> tuple[int, int]:
        """(pointwise ops, buffers of at least half its size read) of computing `node` where
        it is read."""
        cost, reads, stack, seen = 0, 0, [node], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current in self.realized and current is not node:
                reads += 2 * guess(current.numel) >= guess(node.numel)
                continue
            if current.kind in (Kind.POINTWISE, Kind.DATA):
                cost += 1
            stack.extend(current.inputs)
        return cost, reads
