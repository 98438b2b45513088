"""convolution_biases: on CUDA a convolution's bias becomes an add that fuses with the kernel
reading the result (eager's cuDNN path adds it in a kernel of its own). Run here on the CPU
with the pass let on for it: values, gradients, kernel counts, and what it leaves alone."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check, check_grad, make

from ember import config
from ember.ir import Op
from ember.lower import trace
from ember.passes import convolution_bias
from ember.passes.convolution_bias import convolution_biases


def _depthwise_then_norm(x, w, b):
    h = F.conv2d(x, w, b, padding=3, groups=x.shape[1])  # (ConvNeXt's block)
    return F.layer_norm(h.permute(0, 2, 3, 1), (x.shape[1],))


def _convolution_calls(fn, *args):
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    changed = convolution_biases(lowered.graph)
    calls = [n for n in lowered.graph.nodes if n.op is Op.LIBRARY]
    return changed, [n.attrs["args"][2] for n in calls]


@pytest.fixture
def on_this_device(monkeypatch):
    """(the CPU's depthwise convolutions are ember's own kernels: here they stay calls)"""
    monkeypatch.setattr(convolution_bias, "SEPARATE_BIAS_DEVICES",
                        frozenset({"cpu", "cuda"}))
    with config.override(convolution_depthwise=False):
        yield


@pytest.mark.parametrize("channels_last", [False, True], ids=["rows", "channels_last"])
def test_a_bias_read_by_a_kernel_fuses_into_it(on_this_device, channels_last):
    x, w, b = make(2, 8, 9, 9), make(8, 1, 7, 7, seed=1), make(8, seed=2)
    if channels_last:
        x, w = (t.to(memory_format=torch.channels_last) for t in (x, w))
    assert _convolution_calls(_depthwise_then_norm, x, w, b) == (1, [None])
    check(_depthwise_then_norm, x, w, b, kernels=1)
    check_grad(_depthwise_then_norm, x, w, b)


def test_a_result_read_only_by_a_library_call_keeps_its_bias(on_this_device):
    def fn(x, w, b, w2):
        return F.conv2d(F.conv2d(x, w, b), w2)

    args = make(1, 3, 8, 8), make(4, 3, 3, 3, seed=1), make(4, seed=2), make(2, 4, 1, 1, seed=3)
    changed, biases = _convolution_calls(fn, *args)
    assert changed == 0 and biases[0] is not None
    check(fn, *args, kernels=0)


def test_the_cpu_keeps_onednns_bias():
    args = make(2, 8, 9, 9), make(8, 1, 7, 7, seed=1), make(8, seed=2)
    assert _convolution_calls(_depthwise_then_norm, *args)[0] == 0
