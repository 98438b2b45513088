"""Batch norm in training: the batch statistics, the normalized result and the running
statistics' updates are generated kernels (no library call of eager's batch norm), the
BatchNorm's buffers end as eager's leaves them, and the gradients are eager's."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import DEVICE, check, make

import ember

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_batch_norm_in_training_updates_its_buffers_as_eager(momentum, layout):
    # momentum=None: the cumulative average, its factor 1 / num_batches_tracked a new
    # number on every call
    torch.manual_seed(0)
    norm = torch.nn.BatchNorm2d(6, momentum=momentum).train().to(DEVICE)
    reference = copy.deepcopy(norm)
    x = make(3, 6, 5, 4)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)

    def fn(x):
        return norm(x).relu()

    compiled = ember.compile(fn)
    for step in range(3):
        with torch.no_grad():
            got = compiled(x + step)
            want = reference(x + step).relu()
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
        for name, value in reference.named_buffers():
            torch.testing.assert_close(getattr(norm, name), value, msg=name)


def test_batch_norm_in_training_needs_no_library_call():
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(5), torch.nn.ReLU()).train().to(DEVICE)
    check(model, make(8, 5, 3), library=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_training_step_matches_eager(dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.SiLU(), torch.nn.Conv2d(8, 4, 1),
                                torch.nn.BatchNorm2d(4)).to(DEVICE, dtype).train()
    reference = copy.deepcopy(model)
    x = make(4, 3, 6, 6, dtype=dtype)

    def step(model, x):
        loss = model(x).square().mean()
        loss.backward()
        return loss

    compiled = ember.compile(step)
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype is torch.bfloat16 else \
        dict(rtol=1e-4, atol=1e-5)
    for _ in range(2):
        torch.testing.assert_close(compiled(model, x), step(reference, x), **tolerance)
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, **tolerance, msg=name)
    for (name, got), want in zip(model.named_buffers(), reference.buffers()):
        torch.testing.assert_close(got, want, **tolerance, msg=name)
    explained = ember.explain(step)(copy.deepcopy(reference), x)
    assert (explained.graph_count, explained.graph_break_count) == (2, 1)  # (at backward())
    assert "backward" in str(explained.break_reasons[0])


def test_batch_norm_in_training_over_symbolic_batches_is_captured(tmp_path):
    # the BatchNorm's num_batches_tracked, a 0-dim int64 buffer, asks torch's fake tensors
    # for a source that ember's stand-in for torch._dynamo lacked: every BatchNorm in
    # training ran eagerly under dynamic=True. (A fresh process: the stand-in serves only
    # where torch._dynamo was never imported, which the test session has done.)
    code = """
import copy, sys, torch, ember
norm = torch.nn.BatchNorm2d(4).train()
reference = copy.deepcopy(norm)
compiled = ember.compile(lambda x: norm(x) * 2, dynamic=True)
for batch in (3, 5, 7):
    x = torch.randn(batch, 4, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), reference(x) * 2)
torch.testing.assert_close(norm.running_var, reference.running_var)
print(len(compiled.records), "torch._dynamo" in sys.modules)
"""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), EMBER_CACHE_DIR=str(tmp_path),
                       EMBER_LOGS="graph_breaks")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "graph break" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.split() == ["1", "False"], done.stdout
