"""Reference interpreter: runs an IR graph with eager torch ops (`interpret_rules`).

It is the oracle of the tests: a lowering is right when interpreting its IR gives what eager
PyTorch gives, and a kernel is right when it gives what the interpreter gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.ir import library, sizes
from ember.ir.dtypes import is_float
from ember.ir.graph import Graph, Node
from ember.ir.ops import Op
from ember.torch_internals import tree_map

Rule = Callable[[Node, list[Any]], Any]
interpret_rules: dict[Op, Rule] = {}


def _rule(*ops: Op):
    def register(fn: Rule) -> Rule:
        for op in ops:
            interpret_rules[op] = fn
        return fn

    return register


def _simple(op: Op, fn: Callable[..., torch.Tensor]) -> None:
    interpret_rules[op] = lambda node, args: fn(*args)


for _op, _fn in {
    Op.STOP_GRADIENT: torch.clone,
    Op.NEG: torch.neg, Op.ABS: torch.abs, Op.EXP: torch.exp, Op.EXP2: torch.exp2,
    Op.EXPM1: torch.expm1, Op.LOG: torch.log, Op.LOG2: torch.log2, Op.LOG10: torch.log10,
    Op.LOG1P: torch.log1p, Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt, Op.SIN: torch.sin,
    Op.COS: torch.cos, Op.TAN: torch.tan, Op.ASIN: torch.asin, Op.ACOS: torch.acos,
    Op.ATAN: torch.atan, Op.SINH: torch.sinh, Op.COSH: torch.cosh, Op.TANH: torch.tanh,
    Op.ASINH: torch.asinh, Op.ACOSH: torch.acosh, Op.ATANH: torch.atanh, Op.ERF: torch.erf,
    Op.ERFC: torch.erfc, Op.SIGMOID: torch.sigmoid, Op.FLOOR: torch.floor, Op.CEIL: torch.ceil,
    Op.ROUND: torch.round, Op.TRUNC: torch.trunc, Op.SIGN: torch.sign,
    Op.RECIPROCAL: torch.reciprocal, Op.BITWISE_NOT: torch.bitwise_not,
    Op.LOGICAL_NOT: torch.logical_not, Op.ISNAN: torch.isnan, Op.ISINF: torch.isinf,
    Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.REMAINDER: torch.remainder,
    Op.FMOD: torch.fmod, Op.POW: torch.pow, Op.MAXIMUM: torch.maximum, Op.MINIMUM: torch.minimum,
    Op.ATAN2: torch.atan2, Op.HYPOT: torch.hypot, Op.COPYSIGN: torch.copysign,
    Op.BITWISE_AND: torch.bitwise_and, Op.BITWISE_OR: torch.bitwise_or,
    Op.BITWISE_XOR: torch.bitwise_xor, Op.SHIFT_LEFT: torch.bitwise_left_shift,
    Op.SHIFT_RIGHT: torch.bitwise_right_shift, Op.EQ: torch.eq, Op.NE: torch.ne, Op.LT: torch.lt,
    Op.LE: torch.le, Op.GT: torch.gt, Op.GE: torch.ge, Op.WHERE: torch.where,
}.items():
    _simple(_op, _fn)


@_rule(Op.DIV)
def _div(node, args):
    a, b = args
    return torch.div(a, b) if is_float(node.dtype) else torch.div(a, b, rounding_mode="trunc")


@_rule(Op.FLOORDIV)
def _floordiv(node, args):
    return torch.div(*args, rounding_mode="floor")


@_rule(Op.INPUT)
def _input(node, args):
    raise AssertionError("inputs are bound before interpretation")


@_rule(Op.FULL)
def _full(node, args):
    # (a wide scalar is float32: the op reading it computes in float32, then rounds to its
    # own dtype, as eager's kernel does with a scalar; see `interpret`)
    dtype = torch.float32 if node.attrs.get("wide") else node.dtype
    return torch.full(node.shape, node.attrs["value"], dtype=dtype)


@_rule(Op.IOTA)
def _iota(node, args):
    dim, start, step = node.attrs["dim"], node.attrs["start"], node.attrs["step"]
    values = torch.arange(node.shape[dim], dtype=torch.int64) * step + start
    view = [1] * len(node.shape)
    view[dim] = node.shape[dim]
    return values.to(node.dtype).reshape(view).expand(node.shape).clone()


@_rule(Op.CAST)
def _cast(node, args):
    return args[0].to(node.dtype)


def _reduce_each(fn: Callable[..., torch.Tensor], x: torch.Tensor, axes) -> torch.Tensor:
    for axis in axes:
        x = fn(x, axis, keepdim=True)
    return x


@_rule(Op.SUM)
def _sum(node, args):
    return torch.sum(args[0], dim=node.attrs["axes"], keepdim=True) if node.attrs["axes"] \
        else args[0].clone()


@_rule(Op.PROD)
def _prod(node, args):
    return _reduce_each(torch.prod, args[0], node.attrs["axes"])


@_rule(Op.MAX)
def _max(node, args):
    return torch.amax(args[0], dim=node.attrs["axes"], keepdim=True) if node.attrs["axes"] \
        else args[0].clone()


@_rule(Op.MIN)
def _min(node, args):
    return torch.amin(args[0], dim=node.attrs["axes"], keepdim=True) if node.attrs["axes"] \
        else args[0].clone()


@_rule(Op.ARGMAX)
def _argmax(node, args):
    return torch.argmax(args[0], dim=node.attrs["axes"][0], keepdim=True)


@_rule(Op.ARGMIN)
def _argmin(node, args):
    return torch.argmin(args[0], dim=node.attrs["axes"][0], keepdim=True)


@_rule(Op.ANY)
def _any(node, args):
    return _reduce_each(torch.any, args[0], node.attrs["axes"])


@_rule(Op.ALL)
def _all(node, args):
    return _reduce_each(torch.all, args[0], node.attrs["axes"])


@_rule(Op.RESHAPE)
def _reshape(node, args):
    return args[0].reshape(node.shape)


@_rule(Op.PERMUTE)
def _permute(node, args):
    return args[0].permute(node.attrs["perm"])


@_rule(Op.EXPAND)
def _expand(node, args):
    return args[0].expand(node.shape)


@_rule(Op.SLICE)
def _slice(node, args):
    a = node.attrs
    index = [slice(None)] * node.ndim
    index[a["dim"]] = slice(a["start"], a["stop"], a["step"])
    return args[0][tuple(index)]


@_rule(Op.SQUEEZE)
def _squeeze(node, args):
    return args[0].reshape(node.shape)


@_rule(Op.UNSQUEEZE)
def _unsqueeze(node, args):
    return args[0].unsqueeze(node.attrs["dim"])


@_rule(Op.FLIP)
def _flip(node, args):
    return torch.flip(args[0], node.attrs["dims"])


@_rule(Op.AS_STRIDED)
def _as_strided(node, args):
    a = node.attrs
    return args[0].contiguous().as_strided(a["shape"], a["strides"], a["offset"])


@_rule(Op.PAD)
def _pad(node, args):
    (x,) = args
    out = torch.full(node.shape, node.attrs["value"], dtype=node.dtype)
    index = tuple(slice(lo, lo + (n - 1) * (mid + 1) + 1, mid + 1) if n else slice(lo, lo)
                  for n, (lo, _hi, mid) in zip(x.shape, node.attrs["pads"]))
    out[index] = x
    return out


@_rule(Op.CAT)
def _cat(node, args):
    return torch.cat(args, dim=node.attrs["dim"])


def _wrap(index: torch.Tensor, size: int) -> torch.Tensor:
    index = index.to(torch.int64)
    return torch.where(index < 0, index + size, index)


@_rule(Op.TAKE)
def _take(node, args):
    x, index = args
    dim = node.attrs["dim"]
    index = _wrap(index, x.shape[dim]) if node.attrs["wrap"] else index.to(torch.int64)
    flat = torch.index_select(x, dim, index.reshape(-1))
    return flat.reshape(node.shape)


@_rule(Op.GATHER)
def _gather(node, args):
    x, index = args
    dim = node.attrs["dim"]
    return torch.gather(x, dim, index.to(torch.int64))


@_rule(Op.LIBRARY)
def _library(node, args):
    return library.call(node.attrs, args)


@_rule(Op.ITEM)
def _item(node, args):
    return args[0][node.attrs["index"]]


def interpret(graph: Graph, inputs: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor],
                                                                     list[torch.Tensor]]:
    """Run the graph; return (outputs, new values of the written-back inputs). A symbolic
    graph's sizes take their values from the inputs (`bindings`)."""
    values: dict[Node, Any] = dict(zip(graph.inputs, inputs))
    bindings = {name: inputs[index].shape[dim] for name, (index, dim) in graph.symbols.items()}
    for node in graph.nodes:
        if node.op is not Op.INPUT:
            rule_node = _bound(node, bindings) if bindings else node
            value = interpret_rules[node.op](rule_node, [values[s] for s in node.inputs])
            if any(s.op is Op.FULL and s.attrs.get("wide") for s in node.inputs):
                value = value.to(node.dtype)
            values[node] = value
    return [values[n] for n in graph.outputs], [values[n] for _, n in graph.writebacks]


def _bound(node: Node, bindings: dict[str, int]) -> Node:
    """`node` with its shape and attributes at the symbols' values."""
    def value(item: Any) -> Any:
        return sizes.evaluate(item, bindings) if isinstance(item, sizes.Size) else item

    attrs = {key: tree_map(value, item) for key, item in node.attrs.items()}
    return dataclasses.replace(node, shape=tuple(value(d) for d in node.shape), attrs=attrs)
