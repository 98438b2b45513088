"""Activation functions (aten's forms of torch.nn.functional's): relu, gelu, silu, elu, ..."""

from __future__ import annotations

import functools
import math

import torch

from ember import torch_internals
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.lower.builder import Builder, normalize_dim
from ember.lower.registry import Decline, aten, lowering
from ember.lower.rules.pointwise import clamp


@lowering(aten.relu)
def _relu(b: Builder, x: Node) -> Node:
    result = b.elementwise(Op.MAXIMUM, x, b.full(0, x.dtype))
    result.attrs["gradient"] = "relu"  # eager's threshold_backward
    return result


@lowering(aten.hardtanh)
def _hardtanh(b: Builder, x: Node, min_val=-1.0, max_val=1.0) -> Node:
    # unlike clamp, the result keeps x's dtype: the bounds convert to it (integers truncate)
    # (its gradient stops at the bounds: eager's hardtanh_backward)
    return clamp(b, x, b.full(min_val, x.dtype), b.full(max_val, x.dtype), "hardtanh")


@lowering(aten.relu6)
def _relu6(b: Builder, x: Node) -> Node:
    return _hardtanh(b, x, 0, 6)


@lowering(aten.leaky_relu)
def _leaky_relu(b: Builder, x: Node, negative_slope=0.01) -> Node:
    return b.where(b.compare(Op.GT, x, 0), x, b.mul(x, negative_slope))


@lowering(aten.rrelu_with_noise_functional)
def _rrelu_eval(b: Builder, x: Node, noise: Node, lower=0.125, upper=1.0 / 3.0,
                training: bool = False, generator=None) -> tuple[Node, Node]:
    if training:
        raise Decline("rrelu in training draws random slopes")
    # in eval, a leaky relu with the mean slope; `noise` is left as it was
    return _leaky_relu(b, x, (lower + upper) / 2), noise


@lowering(aten.elu)
def _elu(b: Builder, x: Node, alpha=1.0, scale=1.0, input_scale=1.0) -> Node:
    negative = b.mul(b.unary(Op.EXPM1, b.mul(x, input_scale)), alpha * scale)
    return b.where(b.compare(Op.GT, x, 0), b.mul(x, scale), negative)


@lowering(aten.celu)
def _celu(b: Builder, x: Node, alpha=1.0) -> Node:
    return _elu(b, x, alpha, 1.0, 1.0 / alpha)


@lowering(aten.selu)
def _selu(b: Builder, x: Node) -> Node:
    return _elu(b, x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946)


@lowering(aten.gelu)
def _gelu(b: Builder, x: Node, *, approximate: str = "none") -> Node:
    if approximate == "tanh":
        inner = b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), 0.044715)),
                      math.sqrt(2.0 / math.pi))
        return b.mul(b.mul(x, 0.5), b.add(b.unary(Op.TANH, inner), 1.0))
    half = b.mul(x, 0.5)
    erf = b.unary(Op.ERF, b.mul(x, math.sqrt(0.5)))
    if x.dtype is not torch.float32:
        # eager's own x/2 * (1 + erf(x/sqrt2)), whose sign at zero is x's: gelu(-0.0) is -0.0
        # in float64, float16 and bfloat16
        return b.mul(half, b.add(erf, 1.0))
    # float32: one multiply-add instead of an add and a multiply (4% of S2's compute-bound
    # chain on the H200), one rounding fewer. Eager's float32 loop differs between machines
    # at -0.0 (+0.0 from one CPU's vector loop, -0.0 from AVX-512's and CUDA's): the form is
    # the one whose sign is eager's on the graph's device
    if _eager_gelu_keeps_the_sign_of_zero(b.graph.device):
        return b.mul(x, b.add(b.mul(erf, 0.5), 0.5))  # x * (1/2 + erf/2): x's sign at zero
    return b.add(b.mul(half, erf), half)  # x/2 + x/2 * erf: +0.0 at -0.0


@functools.cache
def _eager_gelu_keeps_the_sign_of_zero(device: torch.device) -> bool:
    # (outside the tracer's modes: under a symbolic lowering's fake mode the probe would be
    # a fake tensor whose value cannot be read)
    with torch_internals.outside_dispatch_modes():
        zeros = torch.full((64,), -0.0, device=device)  # (64: eager's vectorized loop)
        return bool(torch.signbit(torch.nn.functional.gelu(zeros)).all())


@lowering(aten.silu)
def _silu(b: Builder, x: Node) -> Node:
    return b.mul(x, b.unary(Op.SIGMOID, x))


@lowering(aten.mish)
def _mish(b: Builder, x: Node) -> Node:
    return b.mul(x, b.unary(Op.TANH, _softplus(b, x)))


@lowering(aten.softplus)
def _softplus(b: Builder, x: Node, beta=1.0, threshold=20.0) -> Node:
    scaled = b.mul(x, beta) if beta != 1 else x
    soft = b.unary(Op.LOG1P, b.unary(Op.EXP, scaled))
    if beta != 1:
        soft = b.div(soft, beta)
    return b.where(b.compare(Op.GT, scaled, threshold), x, soft)


@lowering(aten.log_sigmoid_forward)
def _log_sigmoid_forward(b: Builder, x: Node) -> tuple[Node, Node]:
    # eager's CPU kernel also returns exp(-|x|) (its backward's buffer)
    buffer = b.unary(Op.EXP, b.unary(Op.NEG, b.unary(Op.ABS, x)))
    return b.sub(b.minimum(x, 0.0), b.unary(Op.LOG1P, buffer)), buffer


@lowering(aten.hardshrink)
def _hardshrink(b: Builder, x: Node, lambd=0.5) -> Node:
    inside = b.binary(Op.BITWISE_AND, b.compare(Op.GE, x, -lambd), b.compare(Op.LE, x, lambd))
    return b.where(inside, b.full(0, x.dtype), x)


@lowering(aten.softshrink)
def _softshrink(b: Builder, x: Node, lambd=0.5) -> Node:
    # x * 0 in the middle, as eager: it keeps NaN and the sign of zero
    middle = b.where(b.compare(Op.LT, x, -lambd), b.add(x, lambd), b.mul(x, 0))
    return b.where(b.compare(Op.GT, x, lambd), b.sub(x, lambd), middle)


@lowering(aten.glu)
def _glu(b: Builder, x: Node, dim: int = -1) -> Node:
    dim = normalize_dim(dim, x.ndim)
    half = x.shape[dim] // 2
    first, second = b.slice(x, dim, 0, half), b.slice(x, dim, half, 2 * half)
    return b.mul(first, b.unary(Op.SIGMOID, second))


@lowering(aten._prelu_kernel)
def _prelu(b: Builder, x: Node, weight: Node) -> Node:
    return b.where(b.compare(Op.GT, x, 0), x, b.mul(weight, x))


@lowering(aten.hardsigmoid)
def _hardsigmoid(b: Builder, x: Node) -> Node:
    clamped = clamp(b, b.add(x, 3.0), 0.0, 6.0)
    if b.graph.device.type == "cuda":  # eager's CUDA kernel multiplies by 1/6 as a float32
        return b.mul(clamped, _ONE_SIXTH_F32)
    return b.div(clamped, 6.0)


_ONE_SIXTH_F32 = torch.tensor(1 / 6, dtype=torch.float32).item()


@lowering(aten.hardswish)
def _hardswish(b: Builder, x: Node) -> Node:
    clamped = clamp(b, b.add(x, 3.0), 0.0, 6.0)
    if b.graph.device.type == "cuda":  # as hardsigmoid: times float32 1/6
        return b.mul(b.mul(x, clamped), _ONE_SIXTH_F32)
    return b.mul(x, b.div(clamped, 6.0))


@lowering(aten.threshold)
def _threshold(b: Builder, x: Node, threshold, value) -> Node:
    return b.where(b.compare(Op.LE, x, threshold), b.operand(value, x.dtype), x)
