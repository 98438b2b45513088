"""Signed zeros as eager gives them, bit for bit, in the C and Triton kernels: relu, clamp
and hardtanh keep x where it ties with a bound (relu(-0.0) is -0.0), negation and rounding
keep the sign, and a -0.0 constant stays -0.0 (Triton makes every zero constant +0.0 and its
unary minus 0 - x)."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import compile_fn

from ember import config
from ember.runtime.compiled import CompiledGraph
from ember.runtime.interpreted import InterpretedGraph

OPS = {
    "relu": torch.relu,
    "clamp": lambda x: x.clamp(0, 1),
    "clamp_signed_zero_bounds": lambda x: x.clamp(-0.0, 0.0),
    "clamp_min": lambda x: x.clamp_min(0),
    "clamp_max": lambda x: x.clamp_max(0),
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "maximum": lambda x: torch.maximum(x, torch.zeros_like(x)),
    "minimum": lambda x: torch.minimum(x, torch.zeros_like(x)),
    "fmax": lambda x: torch.fmax(x, torch.zeros_like(x)),
    "fmin": lambda x: torch.fmin(x, torch.zeros_like(x)),
    "where": lambda x: torch.where(x > 0, x, 0.0),
    "threshold": lambda x: F.threshold(x, 0.0, 0.0),
    "leaky_relu": F.leaky_relu,
    "neg": torch.neg,
    "abs": torch.abs,
    "round": torch.round,
    "trunc": torch.trunc,
    "tanh": torch.tanh,
    "gelu": F.gelu,  # (float32: +0.0 or -0.0 as the machine's eager loop gives; else -0.0)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "plus_negative_zero": lambda x: x + (-0.0),
    "times_zero": lambda x: x * 0.0,
}
# NOTE: eager's maximum and minimum of zeros of both signs keep their first operand in their
# scalar loop but the second in their SIMD body (which one an element takes depends on the
# tensor's length and the CPU); ember keeps the first, so these compare with eager per element.
PER_ELEMENT = {"maximum", "minimum"}
VALUES = [-0.0, 0.0, -0.3, 0.3, -1.0, 1.0, math.nan, -math.inf]


def bits(tensor: torch.Tensor) -> list[int]:
    return tensor.view({torch.float32: torch.int32, torch.float64: torch.int64}[tensor.dtype]
                       ).tolist()


@pytest.mark.parametrize("backend", ["c", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_signed_zeros_match_eager_bit_for_bit(name, dtype, backend):
    op = OPS[name]

    def fn(x):
        return op(x)

    x = torch.tensor(VALUES, dtype=dtype, device="cpu")
    with config.override(backend=backend), torch.no_grad():
        compiled, graphs = compile_fn(fn, (x,))
        got = compiled(x.clone())
    assert isinstance(graphs[0], (CompiledGraph, InterpretedGraph)) and \
        graphs[0].kernel_count == 1
    if name in PER_ELEMENT:
        expected = torch.cat([fn(x[i:i + 1]) for i in range(len(x))])
    else:
        expected = fn(x.clone())
    got = got[0] if isinstance(got, tuple) else got
    zeros = expected == 0
    assert bits(got[zeros]) == bits(expected[zeros]), (got, expected)  # the sign, bit for bit
    torch.testing.assert_close(got, expected, equal_nan=True)  # the rest (tanh: to an ulp)
