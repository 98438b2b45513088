"""Split a forward IR graph into the forward to run now and the backward to run later.

    differentiate(graph, wrt) -> Split
        forward   the graph itself, its outputs extended by the values the backward needs
        backward  inputs: gradients of the forward's outputs, saved values, forward inputs;
                  outputs: the gradients of the forward inputs in `wrt`

The backward is built by walking the forward in reverse and applying each node's vjp rule
(vjp.py). Every forward value a rule asks for (`primal`) is either recomputed inside the
backward — pointwise ops, views, constants and data movement are cheap to recompute and fuse
into the backward's kernels — or saved by the forward: matmul and other library results,
reductions, gathers. Forward inputs are passed to the backward as they are. Library calls run
as they were in the forward, never again, so a random op (dropout's mask) is the same in both.

NOTE: a value used twice (or two equal values CSE merged) gets its gradients summed before its
vjp runs; eager runs the vjp per use and sums after. The two agree to rounding, except where
infinities meet (inf - inf: NaN in one order, a signed inf in the other).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ember import torch_internals
from ember.autodiff.broadcast_sums import broadcast_sum
from ember.autodiff.centering import centering_subtractions
from ember.autodiff.convolution import convolution_vjp
from ember.autodiff.library_rules import library_rule
from ember.autodiff.tape import TapedCall, planned_layout, taped_call, taped_vjp
from ember.autodiff.vjp import NO_GRADIENT, library_vjp, vjp_rules
from ember.ir import dtypes
from ember.ir.graph import Graph, Node, row_major
from ember.ir.library import Slot, returns_views
from ember.ir.ops import Kind, Op
from ember.ir.patterns import grown_axes
from ember.ir.sizes import Size, any_symbolic
from ember.lower.builder import Builder
from ember.lower.layout import like_strides
from ember.lower.registry import Unsupported

CONVOLUTION = torch.ops.aten.convolution.default

RECOMPUTED = frozenset({Kind.POINTWISE, Kind.VIEW, Kind.LEAF, Kind.DATA})


@dataclasses.dataclass
class Split:
    forward: Graph
    saved: list[Node]                    # forward values appended to forward.outputs
    backward: Graph
    # what each backward input is: ("grad", forward output position), ("saved", position in
    # `saved`) or ("input", forward input index)
    backward_inputs: list[tuple[str, int]]
    wrt: list[int]                       # forward inputs whose gradients backward returns
    differentiable_outputs: list[int]    # forward outputs that carry a gradient
    tapes: int = 0                       # library calls taped by the forward (autodiff/tape.py)


@dataclasses.dataclass(frozen=True, eq=False)
class LibraryCallSpec:
    """A forward library call, as library_vjp gets it (an opaque value, not an argument list
    whose slots would be filled)."""

    target: Any
    args: tuple
    kwargs: dict
    tuple_result: bool


def differentiate(graph: Graph, wrt: list[int], reached_in_eager: set[int] | None = None,
                  tracked_in_eager: set[int] | None = None, taping: bool = True) -> Split:
    """The forward and backward of `graph` with respect to its inputs `wrt`.
    `reached_in_eager`: the inputs eager's autograd would reach from the outputs (where the
    IR's data flow reaches fewer of `wrt`, those get zeros, not None). `tracked_in_eager`: the
    outputs eager's autograd tracks (they require grad); the rest are not differentiable,
    even where the IR's data flow reaches them (layer norm's mean and rstd), and these are,
    even where it does not (fill's result). None: the IR's data flow decides both.
    `taping`: library calls without a rule keep eager's autograd record from the forward
    (autodiff/tape.py); off, their backward runs them again (for CUDA graphs, whose replays
    run no Python)."""
    return _Differentiator(graph, wrt, reached_in_eager, tracked_in_eager, taping).run()


class _Differentiator:
    def __init__(self, graph: Graph, wrt: list[int], reached_in_eager: set[int] | None,
                 tracked_in_eager: set[int] | None, taping: bool):
        self.graph = graph
        self.taping = taping
        self.tapes = 0
        self.wrt = wrt
        self.reached_in_eager = reached_in_eager
        self.tracked_in_eager = tracked_in_eager
        self.backward = Graph(graph.device)
        self.b = Builder(self.backward)
        self.primals: dict[Node, Node] = {}
        self.saved: list[Node] = []
        self.backward_inputs: list[tuple[str, int]] = []
        self.needs = self._needs_gradient()
        self.realized = self._library_operands() | self._kept_across_library_calls()
        self._users: dict[Node, list[Node]] | None = None  # (the forward's, when asked)
        for index, value in graph.writebacks:
            if value in self.needs and index not in wrt:
                # (eager's in-place op makes such an input require grad from then on, with
                # the op in its history; a write-back of the value cannot)
                raise Unsupported("an in-place op writes a value that requires grad into an "
                                  "input that does not (training runs this graph eagerly)")

    def _needs_gradient(self) -> set[Node]:
        """Forward nodes whose value depends differentiably on an input in `wrt`."""
        wanted = set(self.wrt)
        needs: set[Node] = set()
        for node in self.graph.nodes:
            if node.op is Op.LIBRARY and node.attrs["tuple_result"]:  # (its ITEMs carry dtypes)
                if any(s in needs for s in node.inputs):
                    needs.add(node)
                continue
            if not (node.dtype.is_floating_point or node.dtype.is_complex):
                continue
            if node.op is Op.INPUT:
                if node.attrs["index"] in wanted:
                    needs.add(node)
            elif node.op is Op.STOP_GRADIENT:
                continue  # (eager's detached values require no grad)
            elif any(s in needs for s in node.inputs):
                if node.op not in (Op.LIBRARY, Op.ITEM) and (node.dtype.is_complex or any(
                        s.dtype.is_complex for s in node.inputs if s in needs)):
                    # NOTE: complex values are differentiated only through library calls
                    # (and their results' ITEMs), whose backward is torch's own (library_vjp:
                    # complex derivatives conjugate); the rules here are real ones
                    raise Unsupported("a complex value in a training graph outside a library "
                                      "call (training runs this graph eagerly)")
                needs.add(node)  # (NO_GRADIENT ops too: their outputs require grad, as eager's)
            elif node.op is Op.ITEM and node.inputs[0] in needs:
                needs.add(node)
        return needs

    def _library_operands(self) -> set[Node]:
        """Pointwise and data values the forward realizes for a library call (a matmul's
        input, seen through views): saved for the backward, not recomputed — their memory is
        written by the forward anyway, eager's autograd keeps them too, and recomputing them
        chained each layer's recomputation to the one before it (BERT's backward recomputed
        all twelve layers' residual stream in one 50-output kernel that took Triton 3.6 s to
        compile)."""
        found: set[Node] = set()
        for node in self.graph.nodes:
            if node.op is not Op.LIBRARY:
                continue
            for operand in node.inputs:
                while operand.kind is Kind.VIEW:
                    operand = operand.inputs[0]
                if operand.kind in (Kind.POINTWISE, Kind.DATA):
                    found.add(operand)
        return found

    def _kept_across_library_calls(self) -> set[Node]:
        """Pointwise and data values that a node reads together with a library result
        computed from them: the forward stores them (they live across that call), so the
        backward reads them saved rather than recomputing them. A residual stream is such a
        chain — each layer's sum read again after the layer's matmuls — and recomputed, every
        layer's sum went back to the embeddings: ViT-B/16's backward began with one kernel
        that read 26 saved matmul results and wrote 25 sums (471 us on the H200)."""
        nodes = self.graph.nodes
        bit = {node: 1 << k for k, node in enumerate(n for n in nodes if n.op is Op.LIBRARY)}
        if not bit:
            return set()
        upstream: dict[Node, int] = {}  # the library calls a node's value depends on
        for node in nodes:
            mask = bit.get(node, 0)
            for source in node.inputs:
                mask |= upstream[source]
            upstream[node] = mask
        readers = self.graph.users()
        downstream: dict[Node, int] = {}  # the library calls that depend on a node's value
        for node in reversed(nodes):
            mask = 0
            for reader in readers[node]:
                mask |= downstream[reader] | bit.get(reader, 0)
            downstream[node] = mask
        return {node for node in nodes if node.kind in (Kind.POINTWISE, Kind.DATA) and
                downstream[node] and
                any(upstream[reader] & downstream[node] for reader in readers[node]
                    if reader.op is not Op.LIBRARY)}

    def _saved_layout(self, node: Node) -> tuple[int, ...]:
        """A saved value's strides: a library result's or an input's own; those a library
        call of the forward takes it with (a channels-last convolution's input, saved
        row-major, was copied into channels-last for the call on every step); a computed
        value's, those of the library result or input it is computed from (eager's layout of
        it is only a hint: ember lays convolutions out channels-last where eager's model is
        not); else eager's, else row-major."""
        if node.strides is not None and node.op in _LAID_OUT:
            return node.strides
        if self._users is None:
            self._users = self.graph.users()
        for user in self._users.get(node, ()):
            if user.op is Op.LIBRARY and user.attrs.get("operand_strides"):
                for operand, strides in zip(user.inputs, user.attrs["operand_strides"]):
                    if operand is node and strides is not None:
                        return tuple(strides)
        return _inherited_layout(node) or node.strides or row_major(node.shape)

    def _broadcast_sum(self, node: Node, g: Node) -> Node | None:
        """The gradient of what `node` broadcasts, the cotangent's zero terms left out of its
        sum (where it broadcasts a mean subtracted from its own operand: centering.py) and its
        factors constant along the sum taken out (broadcast_sums.py), or None where neither
        applies."""
        if self._users is None:
            self._users = self.graph.users()
        centered = {self.primals[sub] for sub in centering_subtractions(node, self._users)
                    if sub in self.primals}
        return broadcast_sum(self.b, g, grown_axes(node), centered)

    # -- forward values inside the backward ----------------------------------------------
    def primal(self, node: Node) -> Node:
        found = self.primals.get(node)
        if found is not None:
            return found
        if node.op is Op.INPUT:
            made = self._input(("input", node.attrs["index"]), node)
        elif node.kind in RECOMPUTED and node not in self.realized:
            made = self.backward.add(node.op, [self.primal(s) for s in node.inputs],
                                     **node.attrs)
        else:
            saved = self._savable(node)
            self.saved.append(saved)
            made = self._input(("saved", len(self.saved) - 1), node, self._saved_layout(saved))
        self.primals[node] = made
        return made

    def _savable(self, node: Node) -> Node:
        """`node`, or a copy of it by torch where a forward output of it would be copied by a
        kernel that cannot hold its dtype (a complex view that a library call returned)."""
        library = node.inputs[0] if node.op is Op.ITEM else node
        if node.dtype in dtypes.SUPPORTED or library.op is not Op.LIBRARY or \
                not returns_views(library.attrs):
            return node
        copy = self.graph.add(
            Op.LIBRARY, (node,), target=torch.ops.aten.clone.default, args=(Slot(0),),
            kwargs={"memory_format": torch.contiguous_format},
            results=((node.shape, node.dtype, row_major(node.shape)),), tuple_result=False)
        copy.strides = row_major(node.shape)
        return copy

    def _input(self, what: tuple[str, int], like: Node,
               strides: tuple[int, ...] | None = None) -> Node:
        """A backward input like `like` (gradients come row-major: the caller makes them so)."""
        self.backward_inputs.append(what)
        return self.backward.add_input(like.shape, like.dtype, strides or like.strides)

    # -- the reverse walk ---------------------------------------------------------------
    def run(self) -> Split:
        graph, b = self.graph, self.b
        grads: dict[Node, Node] = {}
        outputs = [i for i, node in enumerate(graph.outputs) if node in self.needs] \
            if self.tracked_in_eager is None else sorted(self.tracked_in_eager)
        for position in outputs:
            node = graph.outputs[position]
            cotangent = self._input(("grad", position), node, row_major(node.shape))
            grads[node] = self._sum(grads[node], cotangent) if node in grads else cotangent
        item_grads: dict[Node, dict[int, Node]] = {}
        for node in reversed(graph.nodes):
            g = grads.get(node)
            if node.op is Op.ITEM:
                if g is not None:
                    item_grads.setdefault(node.inputs[0], {})[node.attrs["index"]] = g
                continue
            if node not in self.needs or node.op is Op.INPUT or node.op in NO_GRADIENT:
                continue
            if node.op is Op.LIBRARY and node.attrs["tuple_result"]:
                found = library_rule(b, node, self.primal, item_grads.get(node, {}),
                                     lambda k, node=node: self._item(node, k))
                if found is NotImplemented:
                    found = self._library(node, item_grads.get(node, {}))
            elif g is None:
                continue
            elif node.op is Op.LIBRARY and node.attrs["target"] is CONVOLUTION:
                found = convolution_vjp(b, node, self.primal, g,
                                        [source in self.needs for source in node.inputs])
                if found is NotImplemented:
                    found = self._library(node, {0: g})
            elif node.op is Op.EXPAND and (summed := self._broadcast_sum(node, g)) is not None:
                found = [summed]
            else:
                rule = vjp_rules.get(node.op)
                found = rule(b, node, self.primal, g) if rule is not None else NotImplemented
                if found is NotImplemented and node.op is Op.LIBRARY:
                    found = self._library(node, {0: g})
                if found is NotImplemented:
                    raise Unsupported(f"no derivative rule for {node.op.value} (training runs "
                                      f"this graph eagerly)")
            for source, grad in zip(node.inputs, found):
                if grad is None or source not in self.needs:
                    continue
                grad = self._like(grad, source)
                grads[source] = self._sum(grads[source], grad) if source in grads else grad
        # inputs no differentiable output reaches get no gradient (None, as eager's autograd
        # never visits them); the ones reached through piecewise-constant ops get zeros, and
        # so do those lowering cut off where eager's autograd graph still reaches them
        reached = self._reached([graph.outputs[i] for i in outputs])
        wrt = [index for index in self.wrt if graph.inputs[index] in reached]
        if len(wrt) < len(self.wrt):
            eager = self.reached_in_eager or set()
            wrt = [index for index in self.wrt if index in eager or index in wrt]
        if self.reached_in_eager is not None:
            # and inputs the data flow reaches where eager's autograd does not get None too:
            # a tensor inside a list handed to a custom Function's apply (a library call
            # here, every operand an edge) is no input of eager's autograd node
            wrt = [index for index in wrt if index in self.reached_in_eager]
        results = []
        for index in wrt:
            node = graph.inputs[index]
            grad = grads.get(node)
            results.append(self._like(grad, node) if grad is not None
                           else self._zeros(node.dtype, node.shape))
        self.backward.outputs = results
        self.backward.output_strides = [_gradient_layout(graph.inputs[i]) for i in wrt]
        self._drop_unread_inputs()
        self._bind_symbols()
        graph.saved_from = len(graph.outputs)
        graph.outputs = list(graph.outputs) + self.saved
        graph.output_strides = list(graph.output_strides) + [
            self._saved_layout(node) for node in self.saved]
        return Split(graph, self.saved, self.backward, self.backward_inputs, wrt, outputs,
                     self.tapes)

    def _drop_unread_inputs(self) -> None:
        """Backward inputs nothing reads — a rule asked for a forward value whose gradient
        then went nowhere (`x * c` with a constant c asks for x): the forward neither saves
        them (their memory would live until the backward) nor hands them over."""
        backward = self.backward
        read = set(backward.live_nodes()) - set(backward.inputs)
        used = {source for node in read for source in node.inputs} | set(backward.roots())
        keep = [k for k, node in enumerate(backward.inputs) if node in used]
        if len(keep) == len(backward.inputs):
            return
        dropped = {node for k, node in enumerate(backward.inputs) if k not in keep}
        saved_kept = [k for kind, k in (self.backward_inputs[i] for i in keep) if kind == "saved"]
        renumbered = {old: new for new, old in enumerate(saved_kept)}
        self.saved = [self.saved[k] for k in saved_kept]
        self.backward_inputs = [(kind, renumbered[k] if kind == "saved" else k)
                                for kind, k in (self.backward_inputs[i] for i in keep)]
        backward.inputs = [backward.inputs[k] for k in keep]
        for index, node in enumerate(backward.inputs):
            node.attrs["index"] = index
        backward.nodes = [node for node in backward.live_nodes() if node not in dropped]

    def _bind_symbols(self) -> None:
        """The backward's sizes are the forward's symbols (issue 18): each is read from a
        backward input that has it as a dim — a gradient or a saved value, which the same
        call's forward made — else from the forward input the forward reads it from, handed
        over as it is (a reference kept until the backward, no copy)."""
        backward = self.backward
        for name, (index, dim) in self.graph.symbols.items():
            found = next(((k, d) for k, node in enumerate(backward.inputs)
                          for d, size in enumerate(node.shape) if _is_symbol(size, name)), None)
            if found is None:
                self._input(("input", index), self.graph.inputs[index])
                found = (len(backward.inputs) - 1, dim)
            backward.symbols[name] = found

    def _reached(self, roots: list[Node]) -> set[Node]:
        """The nodes that need a gradient from which `roots` are computed."""
        reached: set[Node] = set()
        stack = [node for node in roots if node in self.needs]
        while stack:
            node = stack.pop()
            if node in reached:
                continue
            reached.add(node)
            stack.extend(s for s in node.inputs if s in self.needs and s not in reached)
        return reached

    def _item(self, node: Node, index: int) -> Node:
        """The forward's result `index` of a tuple library call (made if it was unused)."""
        for user in self.graph.nodes:
            if user.op is Op.ITEM and user.inputs[0] is node and user.attrs["index"] == index:
                return user
        return self.graph.add(Op.ITEM, (node,), index=index)

    def _sum(self, a: Node, other: Node) -> Node:
        """Two gradient contributions added (complex ones by torch: kernels hold real values)."""
        if a.dtype.is_complex or other.dtype.is_complex:
            return self.b.library(torch.ops.aten.add.Tensor, [a, other], a.shape, a.dtype)
        return self.b.add(a, other)

    def _zeros(self, dtype: torch.dtype, shape: tuple[int, ...]) -> Node:
        if dtype.is_complex:
            node = self.backward.add(
                Op.LIBRARY, (), target=torch.ops.aten.zeros.default, args=(list(shape),),
                kwargs={"dtype": dtype, "device": self.backward.device},
                results=((tuple(shape), dtype, row_major(shape)),), tuple_result=False)
            node.strides = row_major(shape)
            return node
        return self.b.full(0.0, dtype, shape)

    def _like(self, grad: Node, source: Node) -> Node:
        """A gradient in its source's dtype and shape (broadcasts were explicit in the
        forward, so shapes agree except for rank-0 and size-1 bookkeeping)."""
        b = self.b
        if (grad.dtype.is_complex or source.dtype.is_complex) and (
                grad.dtype != source.dtype or grad.shape != source.shape):
            raise Unsupported("a complex gradient that needs a cast or reshape (training runs "
                              "this graph eagerly)")
        if grad.dtype != source.dtype:
            grad = b.cast(grad, source.dtype)
        if grad.shape != source.shape:
            grad = b.reshape(grad, source.shape)
        return grad

    def _library(self, node: Node, grads: dict[int, Node]) -> list[Node | None]:
        """torch's own backward of a library call (library_vjp), as a library call of the
        backward graph with one result per input that needs a gradient."""
        attrs = node.attrs
        differentiable = tuple(s in self.needs for s in node.inputs)
        if not any(differentiable):
            return [None] * len(node.inputs)
        if self.taping and not _writes(attrs["target"]) and not _functional(attrs["target"]):
            return self._taped(node, grads, differentiable)
        refused = _refused(attrs["target"], attrs["args"], attrs["kwargs"])
        if refused:
            raise Unsupported(f"{getattr(attrs['target'], '__name__', attrs['target'])} "
                              f"{refused}: its backward cannot run it again (training runs "
                              f"this graph eagerly)")
        results = attrs["results"]
        outs = [grads.get(i) if grads.get(i) is not None
                else self._zeros(dtype, shape) for i, (shape, dtype, _) in enumerate(results)]
        operands = [self.primal(s) for s in node.inputs] + outs
        spec = LibraryCallSpec(attrs["target"], attrs["args"], attrs["kwargs"],
                               attrs["tuple_result"])
        wanted = [s for s, flag in zip(node.inputs, differentiable) if flag]
        template = (spec, differentiable, len(node.inputs),
                    *[Slot(i) for i in range(len(operands))])
        call = self.backward.add(
            Op.LIBRARY, tuple(operands), target=library_vjp, args=template, kwargs={},
            results=tuple((s.shape, s.dtype, row_major(s.shape)) for s in wanted),
            tuple_result=True,
            # (the forward's operands as eager laid them out: its kernels may rely on it)
            operand_strides=tuple(attrs.get("operand_strides") or (None,) * len(node.inputs))
            + (None,) * len(outs))
        items = iter(self.backward.add(Op.ITEM, (call,), index=k) for k in range(len(wanted)))
        return [next(items) if flag else None for flag in differentiable]


    def _taped(self, node: Node, grads: dict[int, Node],
               differentiable: tuple[bool, ...]) -> list[Node | None]:
        """The forward's call taped (autodiff/tape.py), its backward one library call of the
        backward graph that hands the tape's record the results' gradients."""
        attrs = node.attrs
        call = TapedCall(attrs["target"], attrs["args"], attrs["kwargs"], attrs["tuple_result"],
                         differentiable, self.tapes,
                         tuple(planned_layout(shape, strides)
                               for shape, _, strides in attrs["results"]))
        self.tapes += 1
        # (autograd keeps the call's operands and results for its backward: their memory is
        # never given to a later value of the forward, schedule/fuse.py)
        attrs.update(target=taped_call, kwargs={}, keeps_operands=True,
                     args=(call, *[Slot(i) for i in range(len(node.inputs))]))
        outs = [grads.get(i) if grads.get(i) is not None else self._zeros(dtype, shape)
                for i, (shape, dtype, _) in enumerate(attrs["results"])]
        wanted = [s for s, flag in zip(node.inputs, differentiable) if flag]
        backward = self.backward.add(
            Op.LIBRARY, tuple(outs), target=taped_vjp,
            args=(call.index, *[Slot(i) for i in range(len(outs))]), kwargs={},
            results=tuple((s.shape, s.dtype, row_major(s.shape)) for s in wanted),
            tuple_result=True, operand_strides=(None,) * len(outs))
        items = iter(self.backward.add(Op.ITEM, (backward,), index=k)
                     for k in range(len(wanted)))
        return [next(items) if flag else None for flag in differentiable]


def _is_symbol(size: Any, name: str) -> bool:
    """Is this dim exactly the symbol `name` (not a multiple or a sum of it)?"""
    if not isinstance(size, Size) or len(size.terms) != 1:
        return False
    (monomial, coefficient), = size.terms
    return coefficient == 1 and len(monomial) == 1 and monomial[0].name == name


# Nodes whose strides are their memory's (the others' are eager's layout of the value, a hint)
_LAID_OUT = (Op.INPUT, Op.LIBRARY, Op.ITEM)


def _inherited_layout(node: Node, limit: int = 64) -> tuple[int, ...] | None:
    """The layout of the library result or input of the same shape that a saved computed
    value is computed from (a channels-last convolution's result through batch norm and an
    activation): saved in another order, the kernel computing it wrote across the grain of
    what it read, and the backward's kernels read both (EfficientNet's batch-norm backward
    4x slower on the CPU). None where none is found within `limit` nodes."""
    if node.op in _LAID_OUT or any_symbolic(node.shape):
        return None
    stack, seen = [node], set()
    while stack and len(seen) < limit:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op in _LAID_OUT:
            if current.strides is not None and tuple(current.shape) == tuple(node.shape) \
                    and not any_symbolic(current.strides) and _dense(node.shape, current.strides):
                return tuple(current.strides)
            continue
        if current.kind in (Kind.POINTWISE, Kind.VIEW, Kind.DATA):
            # (through a pad's and a depthwise convolution's taps to the image they read)
            stack.extend(current.inputs)
    return None


def _gradient_layout(node: Node) -> tuple[int, ...]:
    """The strides of an input's gradient: the input's own, as empty_like would keep them —
    not where they overlap (an expanded input, stride 0: each element's gradient would be
    written over the others' in one place; found with a torch.distributions.Normal whose
    scale is broadcast over a batch)."""
    if node.strides is None:
        return row_major(node.shape)
    if any_symbolic((*node.shape, *node.strides)):  # (no meta tensor takes symbols)
        return tuple(node.strides) if _dense(node.shape, node.strides) \
            else row_major(node.shape)
    return like_strides(torch.empty_strided(node.shape, node.strides, dtype=node.dtype,
                                            device="meta"))


def _dense(shape: Sequence[Any], strides: Sequence[Any]) -> bool:
    """Do these (maybe symbolic) strides lay the elements out densely, without overlap, in
    some order of the dims? (each dim's stride the product of the sizes inside it)"""
    left = [d for d in range(len(shape)) if isinstance(shape[d], Size) or shape[d] != 1]
    step: Any = 1
    while left:
        inner = next((d for d in left if strides[d] == step), None)
        if inner is None:
            return False
        left.remove(inner)
        step = step * shape[inner]
    return True


def _writes(target: Any) -> bool:
    """Does this library call write one of its inputs (autograd refuses that on a leaf)?"""
    return torch_internals.is_op_overload(target) and any(
        a.alias_info is not None and a.alias_info.is_write
        for a in torch_internals.schema_of(target).arguments)


def _functional(target: Any) -> bool:
    """Is this call functionalization's variant of an op that writes an input (its autograd
    formula is the original's and may read that input as written: rrelu_with_noise_functional's
    gradient reads the noise it was given, zeros, not the noise it drew)?"""
    return torch_internals.is_op_overload(target) and \
        target.name().split("::")[-1].split(".")[0].endswith("_functional")


def _refused(target: Any, args: tuple, kwargs: dict[str, Any]) -> str | None:
    """Why torch's backward of this library call cannot be taken by running it again."""
    if not torch_internals.is_op_overload(target):
        return None
    schema = torch_internals.schema_of(target)
    if torch.Tag.nondeterministic_seeded in target.tags and \
            _argument(schema, args, kwargs, "dropout_p", 1.0) != 0.0:
        # (an op random only through its dropout, as attention is, draws nothing without it)
        return "is random"
    if _writes(target):
        return "writes its inputs"
    return None


def _argument(schema: Any, args: tuple, kwargs: dict[str, Any], name: str,
              missing: Any) -> Any:
    """The value a call passes for `name` (its default if it passes none; `missing` if the op
    has no such argument)."""
    for position, argument in enumerate(schema.arguments):
        if argument.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[position] if position < len(args) else argument.default_value
    return missing
