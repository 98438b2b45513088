"""A half-precision op with a Python scalar gives eager's bits. Eager's kernels read the
scalar either as a float32 value beside their float32 compute (products and quotients
everywhere; sums and differences on CUDA) or rounded to the tensor's type first (everything
else, and sums on the CPU): `python -m ember.bench.scalar_semantics` prints which. Ember
rounded every scalar, so `x * 0.1` in bf16 differed from eager's in a fifth of its elements
and MobileNetV3's hardswish (times float32 1/6 on CUDA) tripled the bf16 logits' error."""

import pytest
import torch
import torch.nn.functional as F

import ember

SCALAR_OPS = {
    "mul": lambda x: x * 0.1,
    "div": lambda x: x / 0.3,
    "add": lambda x: x + 0.1,
    "sub": lambda x: x - 0.1,
    "rsub": lambda x: 0.1 - x,
    "mul_method": lambda x: x.mul(1 / 3),
    "lerp": lambda x: torch.lerp(x, x * 2, 0.3),
    "addcmul": lambda x: torch.addcmul(x, x, x, value=0.1),
    "addcdiv": lambda x: torch.addcdiv(x, x, x.flip(0), value=0.1),
    "fmod": lambda x: torch.fmod(x, 0.3),
    "remainder": lambda x: torch.remainder(x, 0.3),
    "rpow": lambda x: 1.1 ** x,
    "pow": lambda x: x.abs() ** 0.1,
    "lt": lambda x: x < 0.1,
    "clamp": lambda x: x.clamp(min=0.1, max=0.7),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(SCALAR_OPS))
def test_a_scalar_operand_gives_eagers_bits(name, dtype):
    fn = SCALAR_OPS[name]
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(0), device="cpu") * 4).to(
        dtype=dtype, device=torch.get_default_device())
    expected = fn(x)
    got = ember.compile(fn)(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def test_a_product_with_a_scalar_in_a_longer_expression_is_no_less_exact():
    """(fused ops keep float32 between them: the scalar is not rounded there either)"""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1), device="cpu").to(
        dtype=torch.bfloat16, device=torch.get_default_device())
    got = ember.compile(lambda v: (v * 0.1).exp())(x).double()
    exact = (x.double() * 0.1).exp()
    eager = (x * 0.1).exp().double()
    assert (got - exact).abs().max() <= (eager - exact).abs().max()


@pytest.mark.skipif(torch.get_default_device().type != "cpu",
                    reason="a CPU scalar tensor beside CPU tensors (on CUDA: unmeasured)")
@pytest.mark.parametrize("name", ["mul", "rmul", "div"])
def test_a_zero_dim_float32_tensor_is_read_as_eager_reads_it(name):
    """x * s with s a 0-d float32 tensor: eager's CPU kernel reads s in float32 (as a Python
    scalar); s * x casts s to x's type first."""
    fn = {"mul": lambda x, s: x * s, "rmul": lambda x, s: s * x, "div": lambda x, s: x / s}[name]
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(2)) * 4).to(torch.bfloat16)
    s = torch.tensor(0.1)
    torch.testing.assert_close(ember.compile(fn)(x, s), fn(x, s), rtol=0, atol=0)

