"""The seed workloads (../shared/ANCHORS.md) at small sizes: same answers, exact kernel counts."""

import torch
import torch.nn.functional as F
from helpers import check


def gelu_ish(x):
    return 0.5 * x * (1 + torch.tanh(0.8 * (x + 0.04 * x**3)))


def gelu_chain20(x):
    for _ in range(20):
        x = F.gelu(x * 1.01 + 0.01)
    return x


def test_s1_gelu_ish_is_one_kernel():
    check(gelu_ish, torch.randn(400, 300), kernels=1)


def test_s2_gelu_chain_is_one_kernel():
    check(gelu_chain20, torch.randn(256, 128), kernels=1)


def test_softmax_last_dim_in_at_most_two_kernels():
    compiled = check(lambda x: F.softmax(x, -1), torch.randn(64, 333))
    assert compiled.kernel_count <= 2


def test_layer_norm_in_at_most_two_kernels():
    compiled = check(lambda x, w, b: F.layer_norm(x, (96,), w, b),
                     torch.randn(32, 96), torch.randn(96), torch.randn(96))
    assert compiled.kernel_count <= 2


def test_s5_mlp_matches_eager():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU(),
                                torch.nn.Linear(256, 256), torch.nn.SiLU(),
                                torch.nn.Linear(256, 64)).eval()
    check(model, torch.randn(16, 64), dynamo=True, rtol=1e-4, atol=1e-5)
