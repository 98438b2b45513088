"""The tracer's memory model: each tensor's storage (the root value every view of it is
computed from, and whether it is a graph input's) and the chain of view nodes from that root;
views and in-place writes lowered on it (a mixin of ember/lower/tracer.py's Tracer). An
in-place op gives the root a new value, scattered through the chain; graph inputs whose root
changed are written back after the graph (Tracer.finish).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ember.ir.graph import Node
from ember.ir.ops import VIEWS, Op
from ember.lower import meta_results
from ember.lower.mutation import (
    CloneAndCall,
    dense_storage,
    functional_variant,
    returns_written_last,
    same_elements,
    storage_view,
    view_variant,
    with_defaults,
)
from ember.lower.registry import Decline, Unsupported, find_rule
from ember.trees import leaves

ViewChain = tuple[tuple[Op, dict[str, Any]], ...]
_AS_STRIDED_IN_PLACE = torch.ops.aten.as_strided_.default


@dataclasses.dataclass(eq=False)
class Storage:
    """One aliasing group: a root value that every view of it is computed from."""

    value: Node
    input_index: int | None
    version: int = 0
    holders: int = 0  # tensors ever bound to it (so > 1: other tensors see its memory)


@dataclasses.dataclass(eq=False)
class TensorState:
    storage: Storage
    chain: ViewChain | None  # view steps from the root; None: a view ember cannot re-derive
    node: Node
    version: int


def _view_chain(result: Node, base: Node) -> ViewChain | None:
    steps = []
    while result is not base:
        if result.op not in VIEWS:
            return None
        steps.append((result.op, dict(result.attrs)))
        result = result.inputs[0]
    return tuple(reversed(steps))


class ViewsAndWrites:
    """The Tracer's lowering of views and of in-place writes (its state: graph, builder,
    states; bind, state, current, assign and _lower are the Tracer's)."""

    # -- views ----------------------------------------------------------------------------
    def _lower_view(self, func, args, kwargs, template_kwargs, out) -> None:
        base = args[0]
        if self.stops and base.dtype.is_floating_point and any(
                t.dtype != base.dtype and t.dtype.to_real() != base.dtype
                for t in leaves(out)):
            # (the compiled graph's results reinterpret memory outside autograd's sight; but
            # eager's view_as_complex of a value that requires grad is differentiable, and so
            # are the compiled graph's: library calls, and OutputSpec.view_of's views)
            raise Unsupported(f"{func} views a value that may require grad as another dtype")
        base_state = self.state(base)
        base_node = self.current(base)
        result = self._lower(func, args, kwargs, template_kwargs, out)
        flat_out = leaves(out)
        if self._counts_from_storage(func, args, kwargs):
            self.from_storage_start.update(id(t) for t in flat_out)
        flat_result = leaves(result)
        for meta, node in zip(flat_out, flat_result):
            steps = _view_chain(node, base_node)
            chain = None if steps is None or base_state.chain is None \
                else base_state.chain + steps
            self.bind(meta, node, base_state.storage, chain)

    def _restride(self, func, args, kwargs, out, geometry: tuple) -> None:
        """An in-place view op (x.squeeze_(0), x.t_(), x.as_strided_(...)): the tensor becomes
        a view of itself. `geometry`: the tensor's shape, strides and offset before."""
        base = args[0]
        if self.symbols is not None:
            raise Unsupported(f"{func} restrides a tensor in place in a graph with symbolic "
                              f"sizes (issue 18, stage 3)")
        view = view_variant(func)
        rule = find_rule(view) if view is not None else None
        if rule is None and func is not _AS_STRIDED_IN_PLACE:
            raise Unsupported(f"{func} changes a tensor's shape or strides in place")
        if id(base) in self.input_metas:
            # (the caller's tensor changes shape: the graph's outputs cannot say so)
            raise Unsupported(f"{func} changes the shape or strides of an input in place")
        state = self.state(base)
        before = self.current(base)
        if func is _AS_STRIDED_IN_PLACE:
            result, chain = self._as_strided(func, base, geometry)
        else:
            try:
                result = rule(self.builder, *self.to_nodes(args), **self.to_nodes(kwargs))
            except Decline as reason:
                raise Unsupported(f"{func} in place: {reason}") from None
            steps = _view_chain(result, before)
            chain = None if steps is None or state.chain is None else state.chain + steps
        if not self._matches(result, out):
            raise Unsupported(f"{func} in place: the view disagrees with eager's")
        self.states[id(base)] = TensorState(state.storage, chain, result, state.storage.version)
        if result.strides is None and result.op not in (Op.INPUT, Op.FULL) and base.ndim:
            result.strides = tuple(base.stride())

    def _as_strided(self, func, base: torch.Tensor, geometry: tuple) -> tuple[Node, ViewChain]:
        """x.as_strided_(size, stride, offset): the tensor's node and chain from then on.
        adaptive_avg_pool2d(x, 1) on a channels_last x calls it on its fresh mean to give the
        result channels_last strides; only size-1 dims' strides change, so the value stays."""
        state = self.state(base)
        if same_elements(geometry, self._geometry(base)):
            return self.current(base), state.chain
        storage = state.storage
        root = self._root_tensor(storage)
        # (the root may be `base` itself, whose meta tensor has its new geometry already)
        root_geometry = geometry if root is base else None if root is None else \
            self._geometry(root)
        if storage.input_index is not None or root_geometry is None or \
                not dense_storage(*root_geometry, base.untyped_storage().nbytes(),
                                  base.element_size()):
            raise Unsupported(f"{func} restrides memory ember does not lay out itself")
        result = storage_view(self.builder, storage.value, root_geometry[1],
                              tuple(base.shape), tuple(base.stride()), base.storage_offset())
        return result, _view_chain(result, storage.value)

    # -- mutation -------------------------------------------------------------------------
    def _lower_mutation(self, func, args, kwargs, template_kwargs, out, written) -> None:
        targets = self._written_tensors(written, args, kwargs)
        if any(stride == 0 and size > 1 for t in targets for size, stride in
               zip(t.shape, t.stride())):
            # (an expanded tensor: eager raises "more than one element of the written-to
            # tensor refers to a single memory location"; a write-back would pick one)
            raise Unsupported(f"{func} writes into an expanded tensor: eager raises here")
        # tensors the op returns besides those it writes (rrelu_with_noise writes `noise` and
        # returns a new tensor)
        fresh = [t for t in leaves(out) if isinstance(t, torch.Tensor)
                 and not any(t is target for target in targets)]
        out_names = {argument.name for _, argument in written if argument.kwarg_only}
        functional = functional_variant(func)
        if functional is not None:
            # (the dispatcher leaves out arguments equal to their defaults — bernoulli_'s
            # p=0.5 — which the functional overload may not have: bernoulli.p)
            given = set(kwargs)
            args, kwargs = with_defaults(func, args, kwargs, out_names)
            template_kwargs = {**template_kwargs,
                               **{k: v for k, v in kwargs.items() if k not in given}}
            f_kwargs = {k: v for k, v in kwargs.items() if k not in out_names}
            f_template = {k: v for k, v in template_kwargs.items() if k not in out_names}
            try:
                f_out = meta_results.call(functional, args, f_kwargs)
            except Exception as error:
                raise Unsupported(f"{functional} cannot run on meta tensors: {error}") from error
            values = leaves(self._lower(functional, args, f_kwargs, f_template, f_out))
            if returns_written_last(functional):
                results, values = values[:len(fresh)], values[len(fresh):]
            else:
                results, values = [], values[:len(targets)]
        else:
            names = [argument.name for _, argument in written]
            positions = [position for position, _ in written]
            wrapper = CloneAndCall(func, positions, names)
            stand_ins = (*(t.clone() for t in targets), *fresh)  # meta stand-ins for results
            values = leaves(self._lower(wrapper, args, kwargs, template_kwargs, stand_ins))
            results, values = values[len(targets):], values[:len(targets)]
        for target, value in zip(targets, values):
            if self.stops and not torch.is_grad_enabled() and value.dtype.is_floating_point \
                    and self.state(target).storage.input_index is not None:
                # written under torch.no_grad() into an input (an EMA of the weights): eager's
                # write is not tracked, so the backward must not reach through it. (A value
                # made in the graph keeps its history in eager: its gradient still flows.)
                value = self.builder.unary(Op.STOP_GRADIENT, value)
            self.assign(target, value)
        if len(results) != len(fresh):
            raise Unsupported(f"{func} returns tensors ember cannot match to its results")
        for meta, node in zip(fresh, results):
            self.bind(meta, node)
