"""Fusion decisions: which nodes get buffers, which share a kernel, in what order.

Every node is inlined into its consumers (computed where it is used, through index maps)
unless it is *realized* (ember/schedule/realize.py decides which, and their buffers' layouts).
Realized nodes are then grouped greedily into kernels: a node joins an earlier kernel when their
iteration spaces agree (the same shape; a reduction's (shape, axes); a pointwise node over the
reduced shape or the kept shape) and every value it reads from that kernel is read at the very
index the kernel computes it (so the read never waits on another iteration).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from ember.ir.graph import Graph, Node
from ember.ir.library import returns_views
from ember.ir.ops import Kind, Op
from ember.schedule.expr import ZERO
from ember.schedule.indexing import Index, index_rules, reads
from ember.schedule.layout import lies_as, row_major, view_geometry
from ember.schedule.plan import Buffer, Copy, Kernel, LibraryCall, Plan, Step, Store
from ember.schedule.realize import (  # noqa: F401  (natural_space: re-exported)
    Realizing,
    Space,
    natural_space,
    space_index,
)

# How many earlier steps a node may be fused back into.
LOOKBACK = 8


def store_index(shape: tuple[int, ...], space: Space) -> Index | None:
    """Index of a node of `shape` stored in a kernel over `space`, or None if it does not fit.

    A node fits when its shape is the space's shape, or the shape with the reduced axes kept
    as size 1 (or either of those with size-1 dims added or removed)."""
    full_shape, axes = space
    full = space_index(full_shape)
    kept = tuple(ZERO if d in axes else i for d, i in enumerate(full))
    kept_shape = tuple(1 if d in axes else n for d, n in enumerate(full_shape))
    for target_shape, index in ((full_shape, full), (kept_shape, kept)):
        if shape == target_shape:
            return index
        dims = [d for d, n in enumerate(target_shape) if n != 1]
        if [n for n in shape if n != 1] == [target_shape[d] for d in dims]:
            vars_ = iter(index[d] for d in dims)
            return tuple(next(vars_) if n != 1 else ZERO for n in shape)
    return None


class Scheduler(Realizing):
    def __init__(self, graph: Graph):
        self.graph = graph
        self.users = graph.users()
        self.realized: set[Node] = set()
        self.aliases: dict[Node, Node] = {}    # view node -> base it is a strided view of
        # library calls' operands -> eager's strides of them (None where not recorded)
        self.operands: dict[Node, tuple[int, ...] | None] = {}
        self.steps: list[Step] = []
        self.step_of: dict[Node, int] = {}
        self.buffer_of: dict[Node, Buffer] = {}
        self.buffers: list[Buffer] = []
        self._names = itertools.count()
        self._decided = False  # (every realized node known: temps may inherit a layout)
        self._reads: dict[tuple[Node, Space], tuple[tuple[Node, Index], ...]] = {}
        self._inherited: dict[Node, tuple[int, ...] | None] = {}
        self._held_in: dict[Node, frozenset[Node]] = {}  # (_roots_of's answers, per node)


    # -- reads ----------------------------------------------------------------------------
    def is_boundary(self, node: Node) -> bool:
        # NOTE: an alias (a strided view of a realized base) is read through its index map:
        # a kernel that reads it reads the base, which may be computed in that same kernel.
        return node in self.realized and node not in self.aliases

    def reads_of(self, node: Node, space: Space) -> tuple[tuple[Node, Index], ...]:
        """The (boundary node, index) pairs computing `node` over `space` reads. Once every
        realized node is decided these never change, and grouping asks for the same pairs
        again and again (merges, the needs of a later kernel): kept per (node, space)
        (a BERT-base backward's schedule, 0.54-0.67 s on the CPU, spent 56% here)."""
        key = (node, space)
        found = self._reads.get(key) if self._decided else None
        if found is None:
            found = tuple(self._reads_now(node, space))
            if self._decided:
                self._reads[key] = found
        return found

    def _reads_now(self, node: Node, space: Space) -> Iterator[tuple[Node, Index]]:
        if node.kind is Kind.REDUCTION:
            source, at = node.inputs[0], space_index(space[0])
            if self.is_boundary(source):
                return iter([(source, at)])
            return reads(source, at, self.is_boundary)
        index = store_index(node.shape, space)
        assert index is not None
        return reads(node, index, self.is_boundary)

    def canonical_index(self, node: Node, space: Space) -> Index | None:
        if node.kind is Kind.REDUCTION:
            full = space_index(space[0])
            return tuple(ZERO if d in space[1] else i for d, i in enumerate(full))
        return store_index(node.shape, space)

    # -- grouping -------------------------------------------------------------------------
    def merged_space(self, kernel: Kernel, node: Node) -> Space | None:
        shape, axes = kernel.shape, kernel.axes
        node_shape, node_axes = natural_space(node)
        if node.kind is Kind.REDUCTION:
            if node_shape != shape:
                return None
            if axes in ((), node_axes):
                return node_shape, node_axes
            return None
        if store_index(node.shape, (shape, axes)) is not None:
            return shape, axes
        return None

    def try_merge(self, kernel: Kernel, node: Node, node_reads) -> bool:
        space = self.merged_space(kernel, node)
        if space is None:
            return False
        members = set(kernel.members)
        for source, at in self.reads_of(node, space):
            source, at = self.through_alias(source, at)
            if source in members and at != self.canonical_index(source, space):
                return False
        if space != (kernel.shape, kernel.axes):
            # members keep their indices only if the space only gains reduced axes
            for member in kernel.members:
                if self.canonical_index(member, space) is None:
                    return False
        kernel.shape, kernel.axes = space
        kernel.members.append(node)
        return True

    def through_alias(self, node: Node, index: Index) -> tuple[Node, Index]:
        """A read of a view that aliases a buffer is a read of that buffer's node."""
        while node in self.aliases:
            base = self.aliases[node]
            while node is not base:
                index = index_rules[node.op](node, index)
                node = node.inputs[0]
        return node, index

    def place(self, node: Node) -> None:
        space = natural_space(node)
        node_reads = self.reads_of(node, space)
        positions = [self.step_of.get(self.through_alias(source, at)[0], -1)
                     for source, at in node_reads]
        lowest = max(positions, default=-1)
        first = max(lowest, len(self.steps) - LOOKBACK, 0)
        for position in range(len(self.steps) - 1, first - 1, -1):
            step = self.steps[position]
            if isinstance(step, Kernel) and position >= lowest \
                    and self.try_merge(step, node, node_reads):
                self.step_of[node] = position
                return
        kernel = Kernel(f"kernel{len(self.kernels())}", space[0], space[1], [node], [])
        self.steps.append(kernel)
        self.step_of[node] = len(self.steps) - 1

    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    # -- buffers --------------------------------------------------------------------------
    def new_buffer(self, node: Node, role: str, strides: tuple[int, ...] | None = None,
                   prefix: str = "buf") -> Buffer:
        strides = tuple(strides) if strides is not None else row_major(node.shape)
        buffer = Buffer(f"{prefix}{next(self._names)}", node.shape, strides, node.dtype, role)
        self.buffers.append(buffer)
        return buffer

    def alias_buffer(self, node: Node) -> Buffer:
        base = self.aliases[node]
        if base not in self.buffer_of and base in self.aliases:
            self.buffer_of[base] = self.alias_buffer(base)
        base_buffer = self.buffer_of[base]
        geometry = view_geometry(node, base, (base_buffer.shape, base_buffer.strides, 0))
        if geometry is None:
            return None
        shape, strides, offset = geometry
        buffer = Buffer(f"view{next(self._names)}", shape, strides, node.dtype, "alias",
                        base=base_buffer, offset=offset)
        self.buffers.append(buffer)
        return buffer

    def run(self) -> Plan:
        graph = self.graph
        inputs = []
        for node in graph.inputs:
            buffer = Buffer(f"in{node.attrs['index']}", node.shape,
                            node.strides or row_major(node.shape), node.dtype, "input",
                            input_index=node.attrs["index"])
            inputs.append(buffer)
            self.buffer_of[node] = buffer
        self.decide_realized()
        library_steps: dict[Node, int] = {}
        for node in graph.nodes:
            if node not in self.realized or node.op is Op.INPUT or node in self.aliases:
                continue
            if node.op is Op.LIBRARY:
                self.steps.append(LibraryCall(node, [], []))
                library_steps[node] = len(self.steps) - 1
                self.step_of[node] = len(self.steps) - 1
            elif node.op is Op.ITEM:
                self.step_of[node] = library_steps[node.inputs[0]]
            else:
                self.place(node)
        for view, base in self.aliases.items():
            self.step_of[view] = self.step_of.get(base, -1)
        outputs = self.assign_buffers()
        for step in self.steps:
            if isinstance(step, Kernel):
                # a kernel that writes an input in place stores there last: every value the
                # kernel computes from the input's old contents (a reduction over it, another
                # output at the same position) is read before it is overwritten
                step.stores.sort(key=lambda item: item.buffer.root().role == "input")
        plan = Plan(graph, self.steps, self.buffer_of, inputs, outputs, self.buffers)
        plan.frees = self.lifetimes(plan)
        plan.reuse = reuse_memory(plan)
        return plan

    def assign_buffers(self) -> list[Buffer]:
        graph = self.graph
        needs: set[Node] = set()
        for step in self.steps:
            if isinstance(step, Kernel):
                members = set(step.members)
                space = (step.shape, step.axes)
                for member in step.members:
                    needs.update(s for s, _ in self.reads_of(member, space) if s not in members)
            elif isinstance(step, LibraryCall):
                needs.update(step.node.inputs)
        needs.update(self.aliases.values())  # a view passed on as an alias needs its base stored
        # Outputs claim their buffers first, with eager's strides.
        outputs: list[Buffer] = []
        claimed: set[Node] = set()
        for position, (node, strides) in enumerate(zip(graph.outputs, graph.output_strides)):
            shared = self.saved_output_buffer(position, node, tuple(strides), claimed)
            outputs.append(shared or self.output_buffer(node, tuple(strides), claimed))
            claimed.add(node)
        # Library results.
        for step in self.steps:
            if isinstance(step, LibraryCall):
                self.assign_library(step)
        # Write-backs: in place when nothing reads the old value afterwards, else a copy.
        for index, node in graph.writebacks:
            self.assign_writeback(index, node)
        # Temporaries.
        for step in self.steps:
            if isinstance(step, Kernel):
                for member in step.members:
                    if member in needs and member not in self.buffer_of:
                        self.buffer_of[member] = self.new_buffer(member, "temp",
                                                                 self.temp_strides(member))
                        step.stores.append(Store(member, self.buffer_of[member]))
        for view in self.aliases:
            if view not in self.buffer_of:
                self.buffer_of[view] = self.alias_buffer(view)
        for step in self.steps:
            if isinstance(step, LibraryCall):
                step.inputs = [self.buffer_of[n] for n in step.node.inputs]
        self.operands_from_output_copies()
        return outputs

    def operands_from_output_copies(self) -> None:
        """A library operand that eager lays out otherwise than its buffer is copied into
        eager's layout before the call (the wrapper's `relaid`). Where an output is that very
        copy — a decoder's key and value, returned as its cache and then attended to — the
        output's copy kernel runs before the call and the call reads the output: one copy,
        as eager makes (it attends to the cache it concatenated)."""
        copies = {step.stores[0].node: step for step in self.steps
                  if isinstance(step, Kernel) and not step.members and len(step.stores) == 1}
        for step in list(self.steps):
            if not isinstance(step, LibraryCall):
                continue
            wanted = step.node.attrs.get("operand_strides") or ()
            for i, (node, strides) in enumerate(zip(step.node.inputs, wanted)):
                buffer, copy = step.inputs[i], copies.get(node)
                if strides is None or copy is None or lies_as(buffer, strides) or \
                        not lies_as(copy.stores[0].buffer, strides):
                    continue
                here, there = self.steps.index(step), self.steps.index(copy)
                if there > here:
                    self.steps.insert(here, self.steps.pop(there))
                step.inputs[i] = copy.stores[0].buffer

    def saved_output_buffer(self, position: int, node: Node, strides: tuple[int, ...],
                            claimed: set[Node]) -> Buffer | None:
        """A training forward's value saved for the backward that is also an output the
        caller gets, in the same layout (a model's logits that the loss read): that output's
        buffer, stored once (runtime/training.py: the backward reads it with its version
        checked, so an in-place write of the caller's before the backward is an error there,
        not a wrong gradient). None where it needs a buffer of its own."""
        saved_from = self.shared_saved_from
        if saved_from is None or position < saved_from or node not in claimed:
            return None
        buffer = self.buffer_of.get(node)
        if buffer is None or buffer.strides != strides or buffer.role not in ("output",
                                                                              "library"):
            return None
        return buffer

    def output_buffer(self, node: Node, strides: tuple[int, ...], claimed: set[Node]) -> Buffer:
        # NOTE: outputs at different positions never share memory here (eager's own sharing
        # is rebuilt from the tracer's output specs): a node that is two outputs (merged by
        # CSE) gets a second buffer, stored by its kernel or copied.
        if node in self.aliases and node not in claimed:
            base = self.aliases[node]
            if base not in self.buffer_of:
                step = self.steps[self.step_of[base]]
                if isinstance(step, LibraryCall):  # (a view of a library result: its buffer)
                    self.assign_library(step)
                else:
                    self.buffer_of[base] = self.new_buffer(base, "temp")
                    step.stores.append(Store(base, self.buffer_of[base]))
            buffer = self.alias_buffer(node)
            self.buffer_of[node] = buffer
            if buffer.strides == strides or node.numel <= 1:
                return buffer
            # a view passed to a library call as an alias, returned in another layout
            return self.copied_output(node, strides)
        position = self.step_of.get(node)
        step = self.steps[position] if position is not None and position >= 0 else None
        if isinstance(step, Kernel) and node in step.members:
            buffer = self.new_buffer(node, "output", strides, prefix="out")
            step.stores.append(Store(node, buffer))
            self.buffer_of.setdefault(node, buffer)
            return buffer
        # a library result that views an operand's memory is copied: eager's output here is a
        # fresh tensor (else the tracer would have returned a view of that operand)
        library = node.inputs[0] if node.op is Op.ITEM else node
        if isinstance(step, LibraryCall) and node not in claimed and \
                not returns_views(library.attrs):
            result_strides = self.library_result(node)[2]
            if tuple(result_strides) == strides:
                return self.library_buffer(node)
        # an input, or a library result in another layout
        return self.copied_output(node, strides)

    def copied_output(self, node: Node, strides: tuple[int, ...]) -> Buffer:
        """A fresh output buffer that a copy kernel at the end fills with `node`."""
        buffer = self.new_buffer(node, "output", strides, prefix="out")
        copy = Kernel(f"kernel{len(self.kernels())}", node.shape, (), [], [Store(node, buffer)])
        self.steps.append(copy)
        return buffer

    def library_result(self, node: Node):
        if node.op is Op.ITEM:
            return node.inputs[0].attrs["results"][node.attrs["index"]]
        return node.attrs["results"][0]

    def library_buffer(self, node: Node) -> Buffer:
        if node not in self.buffer_of:
            shape, dtype, strides = self.library_result(node)
            buffer = Buffer(f"lib{next(self._names)}", tuple(shape), tuple(strides), dtype,
                            "library")
            self.buffers.append(buffer)
            self.buffer_of[node] = buffer
        return self.buffer_of[node]

    def assign_library(self, step: LibraryCall) -> None:
        node = step.node
        if node.attrs["tuple_result"]:
            items = {user.attrs["index"]: user for user in self.users[node]
                     if user.op is Op.ITEM}
            step.outputs = [self.library_buffer(items[i]) if i in items else None
                            for i in range(len(node.attrs["results"]))]
        else:
            step.outputs = [self.library_buffer(node)]

    def assign_writeback(self, index: int, node: Node) -> None:
        target = self.buffer_of[self.graph.inputs[index]]
        if node is self.graph.inputs[index]:
            return
        source_node = self.graph.inputs[index]
        position = self.step_of.get(node, -1)
        step = self.steps[position] if position >= 0 else None
        if isinstance(step, Kernel) and node in step.members and \
                self._in_place_ok(step, position, node, source_node):
            step.stores.append(Store(node, target))
            self.buffer_of.setdefault(node, target)
            return
        if node not in self.buffer_of:
            if isinstance(step, Kernel) and node in step.members:
                self.buffer_of[node] = self.new_buffer(node, "temp")
                step.stores.append(Store(node, self.buffer_of[node]))
            elif node.op in (Op.LIBRARY, Op.ITEM):
                self.library_buffer(node)
            elif node in self.aliases:
                self.buffer_of[node] = self.alias_buffer(node)
        self.steps.append(Copy(self.buffer_of[node], target))

    def _in_place_ok(self, kernel: Kernel, position: int, node: Node, source: Node) -> bool:
        """Can `node` be stored straight into input `source`'s memory?"""
        space = (kernel.shape, kernel.axes)
        target = self.canonical_index(node, space)
        for member in kernel.members:
            for read, at in self.reads_of(member, space):
                if (read is source and at != target) or \
                        (read is not source and self._reaches(read, source)):
                    return False
        for later in self.steps[position + 1:]:
            if isinstance(later, LibraryCall) and any(self._reaches(n, source)
                                                      for n in later.node.inputs):
                return False
            if isinstance(later, Kernel):
                later_space = (later.shape, later.axes)
                for member in later.members or [s.node for s in later.stores]:
                    nodes = self.reads_of(member, later_space) if later.members \
                        else [(member, None)]
                    if any(self._reaches(read, source) for read, _ in nodes):
                        return False
        if source in self.aliases.values():
            return False
        return True

    def _reaches(self, node: Node, target: Node) -> bool:
        """Is `node` held in `target`'s memory, target being a graph input: target itself, a
        view of it, or the result of a library op that returns a view of its operands?"""
        return node is target or target in self._roots_of(node)

    def _roots_of(self, node: Node) -> frozenset[Node]:
        """The nodes at the ends of the chains of views, items and library ops returning
        views of their operands that hold `node` (itself where none does), kept per node:
        the in-place check asks of every later step's reads for each input written (a
        ResNet-50 training graph's 159 batch-norm statistics: 0.5 s walked anew each time).
        Only the ends are kept, so a long chain costs no more than its length."""
        held_in = self._held_in
        stack = [node]  # (no recursion: a long chain of views is a long walk)
        while stack:
            current = stack[-1]
            if current in held_in:
                stack.pop()
                continue
            if current.kind is Kind.VIEW or current.op is Op.ITEM:
                held = current.inputs[:1]
            elif current.op is Op.LIBRARY and returns_views(current.attrs):
                held = current.inputs
            else:
                held = ()
            missing = [n for n in held if n not in held_in]
            if missing:
                stack.extend(missing)
                continue
            held_in[current] = frozenset().union(*(held_in[n] for n in held)) if held \
                else frozenset([current])
            stack.pop()
        return held_in[node]

    # -- lifetimes ------------------------------------------------------------------------
    def lifetimes(self, plan: Plan) -> list[list[Buffer]]:
        last_use: dict[Buffer, int] = {}
        # NOTE: a library op may return a view of its operands (as_strided, view(dtype)):
        # while its result lives, their memory must stay, neither freed nor reused.
        holds: dict[Buffer, list[Buffer]] = {}
        for step in plan.steps:
            if isinstance(step, LibraryCall) and returns_views(step.node.attrs):
                for output in step.outputs:
                    if output is not None:
                        holds[output] = list(step.inputs)

        def memory_of(buffer: Buffer | None) -> Iterator[Buffer]:
            stack, seen = [buffer], set()
            while stack:
                buffer = stack.pop()
                if buffer is not None and buffer not in seen:
                    seen.add(buffer)
                    yield buffer
                    stack += [buffer.base, *holds.get(buffer, ())]

        def touch(buffers: Iterable[Buffer | None], position: int) -> None:
            for buffer in buffers:
                for held in memory_of(buffer):
                    last_use[held] = position

        for position, step in enumerate(plan.steps):
            if isinstance(step, Kernel):
                space = (step.shape, step.axes)
                members = set(step.members)
                used = [s.buffer for s in step.stores]
                for member in step.members or [s.node for s in step.stores]:
                    if member in members:
                        used += [self.buffer_of.get(n) for n, _ in self.reads_of(member, space)
                                 if n not in members]
                    else:
                        used.append(self.buffer_of.get(member))
                touch(used, position)
            elif isinstance(step, LibraryCall):
                touch(step.inputs + step.outputs, position)
            else:
                touch([step.source, step.target], position)
        # (a call whose operands and results autograd keeps for the backward, a taped call of
        # autodiff/tape.py, holds their memory past the graph's end, as outputs are held)
        holding = [buffer for step in plan.steps if isinstance(step, LibraryCall)
                   and step.node.attrs.get("keeps_operands") for buffer in step.inputs
                   + step.outputs]
        kept = {held for buffer in plan.outputs + holding for held in memory_of(buffer)}
        frees: list[list[Buffer]] = [[] for _ in plan.steps]
        for buffer, position in last_use.items():
            if buffer.role in ("temp", "library", "alias") and buffer not in kept:
                frees[position].append(buffer)
        return frees


def reuse_memory(plan: Plan) -> dict[Buffer, Buffer]:
    """Let each new temporary take the memory of a temporary that died at an earlier step (same
    dtype and span: the bytes from its first element to its last, which for a temporary laid
    out as a slice of a larger tensor exceed its elements'), instead of allocating. Outputs get
    memory of their own: one in a reused buffer would reach the caller as a view of another
    tensor, where eager's result is not a view (autograd and FSDP treat views differently)."""
    first_use: dict[Buffer, int] = {}
    for position, step in enumerate(plan.steps):
        touched = [s.buffer for s in step.stores] if isinstance(step, Kernel) else \
            [step.source, step.target] if isinstance(step, Copy) else []
        for buffer in touched:
            first_use.setdefault(buffer, position)
    born: dict[int, list[Buffer]] = {}
    for buffer, position in first_use.items():
        if buffer.role == "temp":
            born.setdefault(position, []).append(buffer)
    pool: dict[tuple, list[Buffer]] = {}
    reuse: dict[Buffer, Buffer] = {}
    for position in range(len(plan.steps)):
        for buffer in born.get(position, []):
            free = pool.get((buffer.dtype, buffer.nbytes))
            if free:
                reuse[buffer] = free.pop()
        for dead in plan.frees[position]:
            if dead.role == "temp" and dead.base is None:
                pool.setdefault((dead.dtype, dead.nbytes), []).append(dead)
    return reuse


def schedule(graph: Graph) -> Plan:
    return Scheduler(graph).run()
