"""Making in-place ops functional: functional variants, scatter through view chains.

`x[:, 0].add_(1)` becomes: new_x = scatter(x, slice+squeeze chain, x[:, 0] + 1). Each view op
has a `scatter_rules` entry that puts a new value of the view back into its base, built from
pad, where and views, so the write fuses like any other pointwise op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ember import torch_internals
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.lower.builder import Builder
from ember.lower.registry import Unsupported

ScatterRule = Callable[[Builder, Node, Node, dict[str, Any]], Node]
scatter_rules: dict[Op, ScatterRule] = {}


def _scatter(op: Op):
    def register(fn: ScatterRule) -> ScatterRule:
        scatter_rules[op] = fn
        return fn

    return register


def scatter_through(builder: Builder, root: Node, chain, value: Node) -> Node:
    """The root's new value after writing `value` into the view `chain` of it."""
    bases = [root]
    for op, attrs in chain[:-1]:
        bases.append(builder.graph.add(op, (bases[-1],), **attrs))
    for (op, attrs), base in reversed(list(zip(chain, bases))):
        rule = scatter_rules.get(op)
        if rule is None:
            raise Unsupported(f"an in-place write through a {op.value} view")
        value = rule(builder, base, value, attrs)
    return value


@_scatter(Op.SLICE)
def _slice_scatter(b: Builder, base: Node, value: Node, attrs: dict[str, Any]) -> Node:
    dim, start, step = attrs["dim"], attrs["start"], attrs["step"]
    pads = [(0, 0, 0)] * base.ndim
    count = value.shape[dim]
    covered = (count - 1) * step + 1 if count else 0
    pads[dim] = (start, base.shape[dim] - start - covered, step - 1)
    if count == 0:
        return base
    placed = b.pad(value, pads, 0)
    mask = b.pad(b.full(True, torch.bool, value.shape), pads, False)
    return b.where(mask, placed, base)


@_scatter(Op.SQUEEZE)
def _squeeze_scatter(b: Builder, base: Node, value: Node, attrs: dict[str, Any]) -> Node:
    return b.reshape(value, base.shape)


@_scatter(Op.UNSQUEEZE)
def _unsqueeze_scatter(b: Builder, base: Node, value: Node, attrs: dict[str, Any]) -> Node:
    return b.reshape(value, base.shape)


@_scatter(Op.RESHAPE)
def _reshape_scatter(b: Builder, base: Node, value: Node, attrs: dict[str, Any]) -> Node:
    return b.reshape(value, base.shape)


@_scatter(Op.PERMUTE)
def _permute_scatter(b: Builder, base: Node, value: Node, attrs: dict[str, Any]) -> Node:
    perm = attrs["perm"]
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return b.permute(value, inverse)


@_scatter(Op.FLIP)
def _flip_scatter(b: Builder, base: Node, value: Node, attrs: dict[str, Any]) -> Node:
    return b.graph.add(Op.FLIP, (value,), dims=attrs["dims"])


@_scatter(Op.AS_STRIDED)
def _as_strided_scatter(b: Builder, base: Node, value: Node, attrs: dict[str, Any]) -> Node:
    # Positions in the base's row-major order: write each, the rest keep the base's value.
    # Done as a library call: as_strided views may overlap, which no index map inverts.
    from ember.ir.library import Slot

    flat = b.reshape(base, (base.numel,))
    node = b.graph.add(
        Op.LIBRARY, (flat, value), target=torch.ops.aten.as_strided_scatter.default,
        args=(Slot(0), Slot(1), list(attrs["shape"]), list(attrs["strides"]), attrs["offset"]),
        kwargs={}, results=(((base.numel,), base.dtype, (1,)),), tuple_result=False)
    return b.reshape(node, base.shape)


def functional_variant(func: Any) -> Any | None:
    """aten.add_.Tensor → aten.add.Tensor; aten.add.out → aten.add.Tensor;
    aten.rrelu_with_noise → aten.rrelu_with_noise_functional (see `returns_written_last`);
    else None."""
    schema = torch_internals.schema_of(func)
    name = schema.name.split("::")[-1]
    namespace = getattr(torch.ops, schema.name.split("::")[0])
    overload = torch_internals.overload_name(func)
    if name.endswith("_") and not name.startswith("_"):
        # the overload of the functional op taking the same arguments (pow_.Scalar is
        # pow_(Tensor, Scalar), whose functional form is pow.Tensor_Scalar, not pow.Scalar)
        packet = getattr(namespace, name[:-1], None)
        if packet is None:
            return None
        wanted = _signature(schema)
        names = [overload] + [o for o in packet.overloads() if o != overload]
        for candidate in (getattr(packet, o) for o in names if o in packet.overloads()):
            if _signature(torch_internals.schema_of(candidate)) == wanted:
                return candidate
        return None
    out_names = {a.name for a in schema.arguments if a.kwarg_only and a.alias_info is not None
                 and a.alias_info.is_write}
    if not out_names:
        packet = getattr(namespace, f"{name}_functional", None)
        if packet is not None and overload in packet.overloads():
            return getattr(packet, overload)
        return None
    wanted = [a.name for a in schema.arguments if a.name not in out_names]
    packet = getattr(namespace, name)
    for candidate_name in packet.overloads():
        candidate = getattr(packet, candidate_name)
        arguments = torch_internals.schema_of(candidate).arguments
        if any(a.alias_info is not None and a.alias_info.is_write for a in arguments):
            continue
        if [a.name for a in arguments] == wanted:
            return candidate
    return None


def _signature(schema: Any) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments]


# in-place restriding ops whose view op has another overload name
_VIEW_OF_RESTRIDE = {torch.ops.aten.transpose_.default: torch.ops.aten.transpose.int}


def view_variant(func: Any) -> Any | None:
    """aten.squeeze_.dim → aten.squeeze.dim: the view op an in-place restriding op applies to
    its tensor (squeeze_, unsqueeze_, t_, transpose_, ...), else None."""
    if func in _VIEW_OF_RESTRIDE:
        return _VIEW_OF_RESTRIDE[func]
    schema = torch_internals.schema_of(func)
    name = schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    namespace = getattr(torch.ops, schema.name.split("::")[0])
    packet = getattr(namespace, name[:-1], None)
    overload = torch_internals.overload_name(func)
    if packet is None or overload not in packet.overloads():
        return None
    view = getattr(packet, overload)
    returns = torch_internals.schema_of(view).returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return view
    return None


def same_elements(before: tuple, after: tuple) -> bool:
    """Do two geometries (shape, strides, offset) put every element at the same place? The
    strides of size-1 dims address nothing, so they may differ."""
    (shape, strides, offset), (new_shape, new_strides, new_offset) = before, after
    if shape != new_shape:
        return False
    if math.prod(shape) == 0:
        return True
    return offset == new_offset and all(
        n == 1 or s == t for n, s, t in zip(shape, strides, new_strides))


def dense_storage(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, nbytes: int,
                  element_size: int) -> bool:
    """Is a tensor of this geometry all of its storage (`nbytes`), each element once (a fresh
    result: its memory order is the order of its strides)?"""
    step = 1
    for n, s in sorted(((n, s) for n, s in zip(shape, strides) if n != 1),
                       key=lambda pair: pair[1]):
        if s != step:
            return False
        step *= n
    return offset == 0 and nbytes == math.prod(shape) * element_size


def storage_view(builder: Builder, root: Node, root_strides: tuple[int, ...],
                 shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Node:
    """as_strided(shape, strides, offset) over the memory of `root`, a dense buffer laid out
    by `root_strides`: the root permuted into its memory order, then viewed element by
    element (AS_STRIDED counts in its input's row-major order)."""
    order = sorted(range(root.ndim), key=lambda d: -root_strides[d])  # (ties: size-1 dims)
    in_memory = builder.permute(root, order)
    return builder.graph.add(Op.AS_STRIDED, (in_memory,), shape=shape, strides=strides,
                             offset=offset)


def with_defaults(func, args: tuple, kwargs: dict, skip: set[str]) -> tuple[tuple, dict]:
    """`args` and `kwargs` of `func` with the arguments left out given their defaults."""
    args, kwargs = tuple(args), dict(kwargs)
    arguments = torch_internals.schema_of(func).arguments
    for argument in [a for a in arguments if not a.kwarg_only][len(args):]:
        if argument.name in kwargs or not argument.has_default_value():
            break
        args = (*args, argument.default_value)
    for argument in arguments:
        if argument.kwarg_only and argument.name not in kwargs and \
                argument.name not in skip and argument.has_default_value():
            kwargs[argument.name] = argument.default_value
    return args, kwargs


def returns_written_last(functional: Any) -> bool:
    """A `<op>_functional` variant returns the op's own results first, then the new values of
    the tensors the op writes (where `add` returns only the new value of what `add_` writes)."""
    return torch_internals.schema_of(functional).name.endswith("_functional")


class CloneAndCall:
    """Run an in-place op on clones of the tensors it writes; return the clones, then the
    tensors the op returns that are none of them (the op's own results).

    The generic functional form of an op that has no functional variant.
    """

    def __init__(self, func: Any, positions: Sequence[int], names: Sequence[str]):
        self.func = func
        self.positions = list(positions)
        self.names = list(names)
        self.__name__ = f"functional_{getattr(func, '__name__', func)}"

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        args = list(args)
        clones = []
        for position, name in zip(self.positions, self.names):
            if position < len(args):
                args[position] = args[position].clone()
                clones.append(args[position])
            else:
                kwargs[name] = kwargs[name].clone()
                clones.append(kwargs[name])
        result = self.func(*args, **kwargs)
        fresh = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)
                 and not any(t is clone for clone in clones)]
        return (*clones, *fresh)
