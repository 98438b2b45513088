"""Vector-Jacobian products of the IR's primitives, one rule per Op.

A rule gets the backward graph's builder, the forward node, `primal` (a forward value as a node
of the backward graph: recomputed there or saved by the forward) and the gradient of the node's
output; it returns one gradient per input (None: no gradient flows there). Formulas follow
eager's derivatives (tools/autograd/derivatives.yaml in PyTorch): the same products in the same
order, so results agree to rounding.

Ops without a rule (prod, as_strided, bitwise ops on floats, ...) make the graph train eagerly;
library nodes other than matmuls, convolutions and the few in library_rules.py keep eager's own
autograd record from the forward (tape.py), or run again in the backward (library_vjp).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ember.autodiff.tape import owned_gradients
from ember.ir.graph import Node
from ember.ir.library import Slot, fill
from ember.ir.ops import Op
from ember.lower.builder import Builder

Primal = Callable[[Node], Node]
Rule = Callable[[Builder, Node, Primal, Node], list[Node | None]]
vjp_rules: dict[Op, Rule] = {}
aten = torch.ops.aten

# Ops whose outputs carry no gradient (piecewise constant, integer or boolean results).
NO_GRADIENT = frozenset({
    Op.STOP_GRADIENT,
    Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC, Op.SIGN, Op.BITWISE_NOT, Op.LOGICAL_NOT, Op.ISNAN,
    Op.ISINF, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.ARGMAX, Op.ARGMIN, Op.ANY, Op.ALL,
    Op.FLOORDIV, Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR, Op.SHIFT_LEFT, Op.SHIFT_RIGHT,
    Op.FULL, Op.IOTA,
})


def rule(*ops: Op):
    def register(fn: Rule) -> Rule:
        for op in ops:
            vjp_rules[op] = fn
        return fn

    return register


def _unary(derivative: Callable[[Builder, Node, Node], Node]) -> Rule:
    """g * f'(x), where derivative(b, x, y) is f'(x) (y = f(x))."""
    def vjp(b: Builder, node: Node, primal: Primal, g: Node) -> list[Node | None]:
        x = node.inputs[0]
        return [b.mul(g, derivative(b, primal(x), primal(node)))]

    return vjp


for _op, _derivative in {
    Op.EXP: lambda b, x, y: y,
    Op.EXP2: lambda b, x, y: b.mul(y, math.log(2.0)),
    Op.EXPM1: lambda b, x, y: b.add(y, 1.0),
    Op.LOG: lambda b, x, y: b.unary(Op.RECIPROCAL, x),
    Op.LOG2: lambda b, x, y: b.unary(Op.RECIPROCAL, b.mul(x, math.log(2.0))),
    Op.LOG10: lambda b, x, y: b.unary(Op.RECIPROCAL, b.mul(x, math.log(10.0))),
    Op.LOG1P: lambda b, x, y: b.unary(Op.RECIPROCAL, b.add(x, 1.0)),
    Op.SIN: lambda b, x, y: b.unary(Op.COS, x),
    Op.COS: lambda b, x, y: b.unary(Op.NEG, b.unary(Op.SIN, x)),
    Op.TAN: lambda b, x, y: b.add(b.mul(y, y), 1.0),
    Op.SINH: lambda b, x, y: b.unary(Op.COSH, x),
    Op.COSH: lambda b, x, y: b.unary(Op.SINH, x),
    Op.ASIN: lambda b, x, y: b.unary(Op.RSQRT, b.sub(1.0, b.mul(x, x))),
    Op.ACOS: lambda b, x, y: b.unary(Op.NEG, b.unary(Op.RSQRT, b.sub(1.0, b.mul(x, x)))),
    Op.ATAN: lambda b, x, y: b.unary(Op.RECIPROCAL, b.add(b.mul(x, x), 1.0)),
    Op.ASINH: lambda b, x, y: b.unary(Op.RSQRT, b.add(b.mul(x, x), 1.0)),
    Op.ACOSH: lambda b, x, y: b.unary(Op.RSQRT, b.sub(b.mul(x, x), 1.0)),
    Op.ATANH: lambda b, x, y: b.unary(Op.RECIPROCAL, b.sub(1.0, b.mul(x, x))),
    Op.ERF: lambda b, x, y: b.mul(b.unary(Op.EXP, b.unary(Op.NEG, b.mul(x, x))),
                                  2.0 / math.sqrt(math.pi)),
    Op.ERFC: lambda b, x, y: b.mul(b.unary(Op.EXP, b.unary(Op.NEG, b.mul(x, x))),
                                   -2.0 / math.sqrt(math.pi)),
    Op.ABS: lambda b, x, y: b.unary(Op.SIGN, x),
}.items():
    vjp_rules[_op] = _unary(_derivative)


@rule(Op.NEG)
def _neg(b, node, primal, g):
    return [b.unary(Op.NEG, g)]


@rule(Op.TANH)
def _tanh(b, node, primal, g):  # eager: grad * (1 - y*y).conj()
    y = primal(node)
    return [b.mul(g, b.sub(1.0, b.mul(y, y)))]


@rule(Op.SIGMOID)
def _sigmoid(b, node, primal, g):  # eager: grad * (1 - y) * y
    y = primal(node)
    return [b.mul(b.mul(g, b.sub(1.0, y)), y)]


@rule(Op.SQRT)
def _sqrt(b, node, primal, g):  # eager: grad / (2 * result)
    return [b.div(g, b.mul(primal(node), 2.0))]


@rule(Op.RSQRT)
def _rsqrt(b, node, primal, g):  # eager: -0.5 * grad * result.pow(3)
    y = primal(node)
    return [b.mul(b.mul(g, -0.5), b.mul(b.mul(y, y), y))]


@rule(Op.RECIPROCAL)
def _reciprocal(b, node, primal, g):  # eager: -grad * (result * result)
    y = primal(node)
    return [b.mul(b.unary(Op.NEG, g), b.mul(y, y))]


@rule(Op.ADD)
def _add(b, node, primal, g):
    return [g, g]


@rule(Op.SUB)
def _sub(b, node, primal, g):
    return [g, b.unary(Op.NEG, g)]


@rule(Op.MUL)
def _mul(b, node, primal, g):
    x, y = node.inputs
    return [b.mul(g, primal(y)), b.mul(g, primal(x))]


@rule(Op.DIV)
def _div(b, node, primal, g):  # eager: grad / other, -grad * self / (other * other)
    x, y = (primal(v) for v in node.inputs)
    return [b.div(g, y), b.div(b.mul(b.unary(Op.NEG, g), x), b.mul(y, y))]


@rule(Op.POW)
def _pow(b, node, primal, g):
    x, e = (primal(v) for v in node.inputs)
    # d/dx: e * x^(e-1), 0 where e == 0; d/de: x^e * log(x), 0 where x == 0 and e >= 0
    dx = b.mul(b.mul(g, e), b.elementwise(Op.POW, x, b.sub(e, 1.0)))
    dx = b.where(b.compare(Op.EQ, e, 0.0), b.full(0.0, g.dtype, g.shape), dx)
    de = b.mul(b.mul(g, primal(node)), b.unary(Op.LOG, x))
    zero_base = b.binary(Op.BITWISE_AND, b.compare(Op.EQ, x, 0.0), b.compare(Op.GE, e, 0.0))
    de = b.where(zero_base, b.full(0.0, g.dtype, g.shape), de)
    return [dx, de]


@rule(Op.MAXIMUM, Op.MINIMUM)
def _extremum(b, node, primal, g):
    """eager: where(x == y, grad / 2, grad), zeroed where the input lost (for maximum, x < y
    zeroes x's share) — so with a NaN both inputs get the whole gradient, as eager's do."""
    x, y = (primal(v) for v in node.inputs)
    zero = b.full(0.0, g.dtype, g.shape)
    marked = node.attrs.get("gradient")
    if marked == "relu":  # threshold_backward: where(result <= 0, 0, grad) (NaN passes)
        return [b.where(b.compare(Op.LE, primal(node), 0.0), zero, g), None]
    if marked == "hardtanh":  # hardtanh_backward: 0 at or beyond a bound (NaN passes)
        outside = b.compare(Op.LE if node.op is Op.MAXIMUM else Op.GE, x, y)
        return [b.where(outside, zero, g), b.where(outside, g, zero)]
    if marked == "clamp":  # the input inside the closed bound takes it all, the bound the rest
        inside = b.compare(Op.GE if node.op is Op.MAXIMUM else Op.LE, x, y)
        return [b.where(inside, g, zero), b.where(inside, zero, g)]
    shared = b.where(b.compare(Op.EQ, x, y), b.mul(g, 0.5), g)
    loses = Op.LT if node.op is Op.MAXIMUM else Op.GT
    return [b.where(b.compare(loses, x, y), zero, shared),
            b.where(b.compare(loses, y, x), zero, shared)]


@rule(Op.ATAN2)
def _atan2(b, node, primal, g):
    # eager: grad * other * recip, grad * -self * recip, with recip 0 where x = y = 0
    x, y = (primal(v) for v in node.inputs)
    squares = b.add(b.mul(x, x), b.mul(y, y))
    recip = b.where(b.compare(Op.EQ, squares, 0.0), b.full(0.0, squares.dtype, squares.shape),
                    b.unary(Op.RECIPROCAL, squares))
    return [b.mul(b.mul(g, y), recip), b.mul(b.mul(g, b.unary(Op.NEG, x)), recip)]


@rule(Op.HYPOT)
def _hypot(b, node, primal, g):
    x, y = (primal(v) for v in node.inputs)
    scale = b.div(g, primal(node))
    return [b.mul(scale, x), b.mul(scale, y)]


@rule(Op.COPYSIGN)
def _copysign(b, node, primal, g):
    x = primal(node.inputs[0])
    ratio = b.div(primal(node), x)
    return [b.where(b.compare(Op.EQ, x, 0.0), b.full(0.0, g.dtype, g.shape), b.mul(g, ratio)),
            None]


@rule(Op.FMOD, Op.REMAINDER)
def _modulo(b, node, primal, g):
    """eager: self -> grad; other -> -grad * (self / other rounded toward zero for fmod,
    down for remainder)."""
    x, y = (primal(v) for v in node.inputs)
    quotient = b.unary(Op.TRUNC if node.op is Op.FMOD else Op.FLOOR, b.div(x, y))
    return [g, b.mul(b.unary(Op.NEG, g), quotient)]


@rule(Op.WHERE)
def _where(b, node, primal, g):
    condition = primal(node.inputs[0])
    zero = b.full(0.0, g.dtype, g.shape)
    return [None, b.where(condition, g, zero), b.where(condition, zero, g)]


@rule(Op.CAST)
def _cast(b, node, primal, g):
    source = node.inputs[0]
    return [b.cast(g, source.dtype) if source.dtype.is_floating_point else None]


# -- reductions -----------------------------------------------------------------------------
@rule(Op.SUM)
def _sum(b, node, primal, g):
    return [b.expand(g, node.inputs[0].shape)]


@rule(Op.MAX, Op.MIN)
def _max(b, node, primal, g):
    """eager's amax/amin backward (scale_grad_by_count): (grad / count) * mask, where mask
    marks the positions holding the extreme value — split evenly among ties, and NaN
    everywhere when the extreme is NaN (no position equals it), as eager gives."""
    x = node.inputs[0]
    axes = node.attrs["axes"]
    mask = b.cast(b.compare(Op.EQ, primal(x), b.expand(primal(node), x.shape)), g.dtype)
    count = b.reduce(Op.SUM, mask, axes, keepdim=True)
    return [b.mul(b.expand(b.div(g, count), x.shape), mask)]


@rule(Op.PROD)
def _prod(b, node, primal, g):
    """torch's own prod backward (it handles zeros in the product), as a library call. A 0-d
    tensor's prod (lowered through a size-1 axis) is the tensor itself: eager's gradient is
    the cotangent (its general formula, result / x, would be NaN at inf)."""
    x = node.inputs[0]
    if x.op is Op.UNSQUEEZE and x.inputs[0].shape == ():
        return [b.reshape(g, x.shape)]
    grad = b.library(prod_backward, [primal(x), g, tuple(node.attrs["axes"])], x.shape, x.dtype)
    return [grad]


def prod_backward(x: torch.Tensor, grad: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    with torch.enable_grad():
        leaf = x.detach().requires_grad_()
        if len(axes) == x.dim():  # torch.prod(x): its own backward formula
            product = leaf.prod().reshape(grad.shape)
        else:
            product = leaf
            for axis in sorted(axes, reverse=True):
                product = product.prod(dim=axis, keepdim=True)
        found, = torch.autograd.grad(product, leaf, grad)
    return found.contiguous()


# -- views ----------------------------------------------------------------------------------
@rule(Op.RESHAPE, Op.SQUEEZE, Op.UNSQUEEZE)
def _reshape(b, node, primal, g):
    return [b.reshape(g, node.inputs[0].shape)]


@rule(Op.PERMUTE)
def _permute(b, node, primal, g):
    perm = node.attrs["perm"]
    inverse = [0] * len(perm)
    for position, dim in enumerate(perm):
        inverse[dim] = position
    return [b.permute(g, inverse)]


@rule(Op.EXPAND)
def _expand(b, node, primal, g):
    x = node.inputs[0]
    grown = [d for d, (a, c) in enumerate(zip(x.shape, node.shape)) if a == 1 and c != 1]
    return [b.reduce(Op.SUM, g, grown, keepdim=True) if grown else g]


@rule(Op.AS_STRIDED)
def _as_strided(b, node, primal, g):
    """Every element of the view adds its gradient where it reads the input (windows of
    unfold overlap): an index_add over the input's row-major positions."""
    x = node.inputs[0]
    a = node.attrs
    grad = b.library(as_strided_backward, [g, tuple(x.shape), tuple(a["shape"]),
                                           tuple(a["strides"]), a["offset"]], x.shape, g.dtype)
    return [grad]


def as_strided_backward(grad: torch.Tensor, size: tuple, shape: tuple, strides: tuple,
                        offset: int) -> torch.Tensor:
    count = math.prod(size)
    positions = torch.arange(count, device=grad.device).as_strided(shape, strides, offset)
    flat = torch.zeros(count, dtype=grad.dtype, device=grad.device)
    return flat.index_add_(0, positions.reshape(-1), grad.reshape(-1)).reshape(size)


@rule(Op.FLIP)
def _flip(b, node, primal, g):
    return [b.graph.add(Op.FLIP, (g,), dims=node.attrs["dims"])]


@rule(Op.SLICE)
def _slice(b, node, primal, g):
    a = node.attrs
    size = node.inputs[0].shape[a["dim"]]
    count = node.shape[a["dim"]]
    pads = [(0, 0, 0)] * node.ndim
    if count == 0:
        return [b.full(0.0, g.dtype, node.inputs[0].shape)]
    last = a["start"] + (count - 1) * a["step"]
    pads[a["dim"]] = (a["start"], size - last - 1, a["step"] - 1)
    return [b.pad(g, pads, 0.0)]


@rule(Op.PAD)
def _pad(b, node, primal, g):
    x = node.inputs[0]
    if any(low < 0 or high < 0 for low, high, _ in node.attrs["pads"]):
        return NotImplemented  # cropping pads: no rule yet
    result = g
    for dim, ((low, _high, interior), size) in enumerate(zip(node.attrs["pads"], x.shape)):
        result = b.slice(result, dim, low, low + (size - 1) * (interior + 1) + 1 if size else low,
                         interior + 1)
    return [result]


@rule(Op.CAT)
def _cat(b, node, primal, g):
    dim = node.attrs["dim"]
    grads, start = [], 0
    for source in node.inputs:
        grads.append(b.slice(g, dim, start, start + source.shape[dim]))
        start += source.shape[dim]
    return grads


@rule(Op.TAKE)
def _take(b, node, primal, g):
    x, index = node.inputs
    a = node.attrs
    grad = b.library(take_backward, [g, primal(index), a["dim"], tuple(x.shape), a["wrap"]],
                     x.shape, g.dtype)
    return [grad, None]


@rule(Op.GATHER)
def _gather(b, node, primal, g):
    x, index = node.inputs
    dim = node.attrs["dim"]
    if index.shape[dim] == 1 and all(index.shape[d] == x.shape[d]
                                     for d in range(x.ndim) if d != dim):
        # One position picked per row (a loss's target, nll_loss): no two land on the same
        # element, so the scatter-add into zeros is a select that fuses with what reads it —
        # no dense zeros written and scattered into (the size of the logits).
        picked = b.compare(Op.EQ, b.iota(x.shape, dim), b.broadcast_to(primal(index), x.shape))
        return [b.where(picked, b.broadcast_to(g, x.shape), b.full(0.0, g.dtype)), None]
    grad = b.library(gather_backward, [g, primal(index), dim, tuple(x.shape)],
                     x.shape, g.dtype)
    return [grad, None]


def take_backward(grad: torch.Tensor, index: torch.Tensor, dim: int, size: tuple, wrap: bool
                  ) -> torch.Tensor:
    """The gradient of x.take-along-dim(index): grad's rows added into zeros at `index`."""
    index = index.reshape(-1)
    if wrap:
        index = torch.where(index < 0, index + size[dim], index)
    rows = grad.reshape(size[:dim] + (index.numel(),) + size[dim + 1:])
    return torch.zeros(size, dtype=grad.dtype, device=grad.device).index_add_(dim, index, rows)


def gather_backward(grad: torch.Tensor, index: torch.Tensor, dim: int, size: tuple
                    ) -> torch.Tensor:
    return torch.zeros(size, dtype=grad.dtype, device=grad.device).scatter_add_(dim, index, grad)


# -- library nodes --------------------------------------------------------------------------
def _mm(b: Builder, x: Node, y: Node) -> Node:
    return b.library(aten.mm.default, [x, y], (x.shape[0], y.shape[1]), x.dtype)


def _bmm(b: Builder, x: Node, y: Node) -> Node:
    return b.library(aten.bmm.default, [x, y], (x.shape[0], x.shape[1], y.shape[2]), x.dtype)


@rule(Op.LIBRARY)
def _library(b, node, primal, g):
    target = node.attrs["target"]
    if node.attrs["tuple_result"]:
        return NotImplemented  # multi-output calls: differentiate.py handles them
    if node.dtype.is_complex:
        # (the products' rules below are real ones: a complex product's derivative takes
        # the other operand's conjugate, as torch's own backward does — library_vjp)
        return NotImplemented
    if target is aten.mm.default and node.attrs["args"] and not node.attrs["kwargs"]:
        x, y = (primal(v) for v in node.inputs)
        return [_mm(b, g, b.transpose(y, 0, 1)), _mm(b, b.transpose(x, 0, 1), g)]
    if target is aten.bmm.default and node.attrs["args"] and not node.attrs["kwargs"]:
        x, y = (primal(v) for v in node.inputs)  # (eager's formula: two bmm, no rerun)
        return [_bmm(b, g, b.transpose(y, 1, 2)), _bmm(b, b.transpose(x, 1, 2), g)]
    if target is torch._C._nn.linear and len(node.inputs) in (2, 3) and \
            node.inputs[0].ndim == 2:
        x, w = (primal(v) for v in node.inputs[:2])  # y = x @ w.T (+ bias)
        grads = [_mm(b, g, w), _mm(b, b.transpose(g, 0, 1), x)]
        return grads + [_bias_grad(b, g, node.inputs[2])] if len(node.inputs) == 3 else grads
    if target is aten.avg_pool2d.default:
        from ember.autodiff.library_rules import avg_pool2d  # (it builds on this module)

        return avg_pool2d(b, node, primal, g)
    if target is aten.addmm.default and not node.attrs["kwargs"] and \
            node.attrs["args"] == (Slot(0), Slot(1), Slot(2)) and \
            _broadcasts_to(node.inputs[0].shape, node.shape):
        bias, x, y = (primal(v) for v in node.inputs)  # bias + x @ y (whole_biased_matmuls)
        return [_bias_grad(b, g, bias), _mm(b, g, b.transpose(y, 0, 1)),
                _mm(b, b.transpose(x, 0, 1), g)]
    return NotImplemented


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    return len(shape) <= len(target) and all(
        n in (1, m) for n, m in zip(reversed(shape), reversed(target)))


def _bias_grad(b: Builder, g: Node, bias: Node) -> Node:
    """The gradient of a bias broadcast over a product's result (a row of biases, a column
    of them as a Linear layer with one output gets: (rows, 1), or one number): g summed over
    the dimensions the bias was broadcast along, in the bias's shape and dtype."""
    leading = g.ndim - bias.ndim
    padded = (1,) * leading + tuple(bias.shape)
    dims = [d for d in range(g.ndim) if padded[d] == 1 and g.shape[d] != 1]
    summed = b.reduce(Op.SUM, g, dims, keepdim=True) if dims else g
    return b.cast(b.reshape(summed, bias.shape), bias.dtype)


def library_vjp(call: Any, differentiable: tuple[bool, ...], count: int,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """torch's own backward of a library call (`call`: differentiate.LibraryCallSpec): the
    call run again on detached copies of its inputs (those in `differentiable` requiring
    grad), then torch.autograd.grad with the gradients of its outputs. Returns one gradient
    per differentiable input (zeros if none)."""
    inputs, grads = tensors[:count], tensors[count:]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(wanted) for t, wanted in zip(inputs, differentiable)]
        result = call.target(*fill(call.args, leaves), **fill(call.kwargs, leaves))
        outputs = result if call.tuple_result else (result,)
        pairs = [(out, grad) for out, grad in zip(outputs, grads)
                 if isinstance(out, torch.Tensor) and out.requires_grad]
        wanted = [leaf for leaf, flag in zip(leaves, differentiable) if flag]
        found = torch.autograd.grad([out for out, _ in pairs], wanted,
                                    [grad for _, grad in pairs], allow_unused=True) \
            if pairs else [None] * len(wanted)
    return owned_gradients(found, wanted, tensors)
