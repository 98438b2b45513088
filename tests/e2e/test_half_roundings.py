"""A half-precision value is carried in float32 between fused ops and rounded to its type
where eager would hold it in that type; a value loaded from memory is already so, and the
kernels do not round it again (on the H200 a ResNet-50 batch norm + add + ReLU kernel spent
most of its time on 13 such roundings per element: notes/device-runs.md, call 55)."""

import pytest
import torch
from helpers import DEVICE, check, make

ROUNDING = "ember_round_bf16("  # (the C and Triton helpers' common name)


def _batch_norm_add_relu(x, mean, var, weight, bias, residual):
    normed = torch.nn.functional.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)
    return torch.relu(normed + residual)


@pytest.mark.parametrize("channels_last", [False, True], ids=["rows", "channels_last"])
def test_bf16_values_loaded_from_memory_are_not_rounded_again(channels_last, kernel_backend):
    x, residual = make(2, 16, 6, 6).bfloat16(), make(2, 16, 6, 6, seed=1).bfloat16()
    if channels_last:
        x, residual = (t.contiguous(memory_format=torch.channels_last) for t in (x, residual))
    mean, weight, bias = (make(16, seed=s).bfloat16() for s in (2, 3, 4))
    var = make(16, seed=5).abs().bfloat16() + 0.5
    graph = check(_batch_norm_add_relu, x, mean, var, weight, bias, residual, rtol=0, atol=0)
    text = "\n".join(graph.kernel_texts.values())
    # eager rounds the batch norm's result to bf16 before the add: one rounding in the kernel
    # (and, under Triton's interpreter, the store's own, which a GPU's conversion does)
    interpreted = kernel_backend == "triton" and DEVICE != "cuda"
    assert text.count(ROUNDING) == 1 + interpreted, text
