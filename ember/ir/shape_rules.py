"""Shape and dtype of every op's result, keyed by Op (`shape_rules`).

A rule takes the op, the input nodes and the attributes and returns (shape, dtype), raising IRError
when the node would be ill-formed. `Graph.add` and the verifier both go through `infer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.ir import dtypes
from ember.ir.graph import IRError, Node, Shape
from ember.ir.ops import BINARY, BOOL_RESULT, COMPARISONS, FLOAT_ONLY, UNARY, Op
from ember.ir.sizes import Size

Rule = Callable[[Op, Sequence[Node], dict[str, Any]], tuple[Shape, torch.dtype]]
shape_rules: dict[Op, Rule] = {}


def infer(op: Op, inputs: Sequence[Node], attrs: dict[str, Any]) -> tuple[Shape, torch.dtype]:
    try:
        rule = shape_rules[op]
    except KeyError:
        raise IRError(f"no shape rule for {op.value}") from None
    return rule(op, inputs, attrs)


def _rule(*ops: Op):
    def register(fn: Rule) -> Rule:
        for op in ops:
            shape_rules[op] = fn
        return fn

    return register


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise IRError(message)


def _arity(inputs: Sequence[Node], count: int, op: str) -> None:
    _check(len(inputs) == count, f"{op} takes {count} inputs, got {len(inputs)}")


@_rule(Op.INPUT, Op.FULL, Op.IOTA)
def _leaf(op, inputs, attrs):
    _check(not inputs, "leaf nodes take no inputs")
    shape = tuple(attrs["shape"])
    _check(all((isinstance(d, int) and d >= 0) or isinstance(d, Size) for d in shape),
           f"bad shape {shape}")
    return shape, attrs["dtype"]


@_rule(*UNARY)
def _unary(op, inputs, attrs):
    (x,) = inputs
    if op in FLOAT_ONLY:
        _check(dtypes.is_float(x.dtype), f"{op.value} needs a floating input, got {x.dtype}")
    if op is Op.BITWISE_NOT:
        _check(dtypes.is_integral(x.dtype, include_bool=True), "bitwise_not needs integers")
    if op is Op.LOGICAL_NOT:
        _check(x.dtype is torch.bool, "logical_not needs a bool input")
    return x.shape, torch.bool if op in BOOL_RESULT else x.dtype


@_rule(*BINARY)
def _binary(op, inputs, attrs):
    _arity(inputs, 2, op.value)
    a, b = inputs
    _check(a.shape == b.shape, f"{op.value}: shapes differ {a.shape} vs {b.shape}")
    _check(a.dtype == b.dtype, f"{op.value}: dtypes differ {a.dtype} vs {b.dtype}")
    if op in FLOAT_ONLY:
        _check(dtypes.is_float(a.dtype), f"{op.value} needs floating inputs")
    return a.shape, torch.bool if op in COMPARISONS else a.dtype


@_rule(Op.WHERE)
def _where(op, inputs, attrs):
    _arity(inputs, 3, "where")
    cond, a, b = inputs
    _check(cond.dtype is torch.bool, "where: condition must be bool")
    _check(cond.shape == a.shape == b.shape, "where: shapes differ")
    _check(a.dtype == b.dtype, "where: branch dtypes differ")
    return a.shape, a.dtype


@_rule(Op.CAST)
def _cast(op, inputs, attrs):
    (x,) = inputs
    return x.shape, attrs["dtype"]


def _reduced_shape(shape: Shape, axes: Sequence[int]) -> Shape:
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


@_rule(Op.SUM, Op.PROD, Op.MAX, Op.MIN, Op.ANY, Op.ALL, Op.ARGMAX, Op.ARGMIN)
def _reduction(op, inputs, attrs):
    (x,) = inputs
    axes = tuple(attrs["axes"])
    _check(axes == tuple(sorted(set(axes))), f"{op.value}: axes must be sorted and unique")
    _check(all(0 <= a < x.ndim for a in axes), f"{op.value}: axes {axes} out of range")
    if op in (Op.ARGMAX, Op.ARGMIN):
        _check(len(axes) == 1, f"{op.value} reduces exactly one axis")
        return _reduced_shape(x.shape, axes), torch.int64
    if op in (Op.ANY, Op.ALL):
        _check(x.dtype is torch.bool, f"{op.value} needs a bool input")
    if op in (Op.MAX, Op.MIN):
        _check(all(x.shape[a] > 0 for a in axes), f"{op.value} of an empty dim has no identity")
    return _reduced_shape(x.shape, axes), x.dtype


@_rule(Op.RESHAPE)
def _reshape(op, inputs, attrs):
    (x,) = inputs
    shape = tuple(attrs["shape"])
    _check(math.prod(shape) == x.numel, f"reshape {x.shape} -> {shape} changes the size")
    return shape, x.dtype


@_rule(Op.PERMUTE)
def _permute(op, inputs, attrs):
    (x,) = inputs
    perm = tuple(attrs["perm"])
    _check(sorted(perm) == list(range(x.ndim)), f"permute: {perm} is not a permutation")
    return tuple(x.shape[p] for p in perm), x.dtype


@_rule(Op.EXPAND)
def _expand(op, inputs, attrs):
    (x,) = inputs
    shape = tuple(attrs["shape"])
    _check(len(shape) == x.ndim, "expand keeps the rank")
    _check(all(a == b or a == 1 for a, b in zip(x.shape, shape)),
           f"expand {x.shape} -> {shape}: only size-1 dims grow")
    return shape, x.dtype


@_rule(Op.SLICE)
def _slice(op, inputs, attrs):
    (x,) = inputs
    dim, start, stop, step = attrs["dim"], attrs["start"], attrs["stop"], attrs["step"]
    _check(0 <= dim < x.ndim, "slice: dim out of range")
    _check(step >= 1 and 0 <= start <= stop <= x.shape[dim], f"slice: bad bounds {attrs}")
    shape = list(x.shape)
    shape[dim] = (stop - start + step - 1) // step
    return tuple(shape), x.dtype


@_rule(Op.SQUEEZE)
def _squeeze(op, inputs, attrs):
    (x,) = inputs
    dims = tuple(attrs["dims"])
    _check(all(0 <= d < x.ndim and x.shape[d] == 1 for d in dims), "squeeze: dims must be size 1")
    return tuple(n for d, n in enumerate(x.shape) if d not in dims), x.dtype


@_rule(Op.UNSQUEEZE)
def _unsqueeze(op, inputs, attrs):
    (x,) = inputs
    dim = attrs["dim"]
    _check(0 <= dim <= x.ndim, "unsqueeze: dim out of range")
    return x.shape[:dim] + (1,) + x.shape[dim:], x.dtype


@_rule(Op.FLIP)
def _flip(op, inputs, attrs):
    (x,) = inputs
    _check(all(0 <= d < x.ndim for d in attrs["dims"]), "flip: dims out of range")
    return x.shape, x.dtype


@_rule(Op.AS_STRIDED)
def _as_strided(op, inputs, attrs):
    (x,) = inputs
    shape, strides, offset = tuple(attrs["shape"]), tuple(attrs["strides"]), attrs["offset"]
    _check(len(shape) == len(strides) and offset >= 0, "as_strided: bad geometry")
    if math.prod(shape) > 0:
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
        _check(all(s >= 0 for s in strides) and last < x.numel,
               f"as_strided reaches element {last} of {x.numel}")
    return shape, x.dtype


@_rule(Op.PAD)
def _pad(op, inputs, attrs):
    (x,) = inputs
    pads = tuple(tuple(p) for p in attrs["pads"])
    _check(len(pads) == x.ndim, "pad: one (low, high, interior) per dim")
    _check(all(min(p) >= 0 for p in pads), "pad: amounts must be >= 0 (slice to cut)")
    shape = tuple(lo + hi + n + max(n - 1, 0) * mid for n, (lo, hi, mid) in zip(x.shape, pads))
    return shape, x.dtype


@_rule(Op.CAT)
def _cat(op, inputs, attrs):
    dim = attrs["dim"]
    _check(len(inputs) >= 1, "cat needs inputs")
    first = inputs[0]
    _check(all(x.ndim == first.ndim and x.dtype == first.dtype for x in inputs),
           "cat: ranks and dtypes must agree")
    _check(0 <= dim < first.ndim, "cat: dim out of range")
    for x in inputs:
        _check(all(a == b for d, (a, b) in enumerate(zip(x.shape, first.shape)) if d != dim),
               "cat: sizes differ outside the cat dim")
    shape = list(first.shape)
    shape[dim] = sum(x.shape[dim] for x in inputs)
    return tuple(shape), first.dtype


@_rule(Op.TAKE)
def _take(op, inputs, attrs):
    _arity(inputs, 2, "take")
    x, index = inputs
    dim = attrs["dim"]
    _check(index.dtype in (torch.int64, torch.int32), "take: index must be int32 or int64")
    _check(0 <= dim < x.ndim, "take: dim out of range")
    return x.shape[:dim] + index.shape + x.shape[dim + 1:], x.dtype


@_rule(Op.GATHER)
def _gather(op, inputs, attrs):
    _arity(inputs, 2, "gather")
    x, index = inputs
    dim = attrs["dim"]
    _check(index.dtype in (torch.int64, torch.int32), "gather: index must be int32 or int64")
    _check(index.ndim == x.ndim and 0 <= dim < x.ndim, "gather: ranks must agree")
    _check(all(i <= n for d, (i, n) in enumerate(zip(index.shape, x.shape)) if d != dim),
           "gather: index larger than input outside dim")
    return index.shape, x.dtype


@_rule(Op.LIBRARY)
def _library(op, inputs, attrs):
    results = attrs["results"]
    if attrs["tuple_result"]:
        return (), torch.uint8  # the tuple itself holds no data; ITEM nodes pick its parts
    (shape, dtype, _strides), = results
    return tuple(shape), dtype


@_rule(Op.ITEM)
def _item(op, inputs, attrs):
    (source,) = inputs
    _check(source.op is Op.LIBRARY and source.attrs["tuple_result"], "item of a non-tuple")
    shape, dtype, _strides = source.attrs["results"][attrs["index"]]
    return tuple(shape), dtype
