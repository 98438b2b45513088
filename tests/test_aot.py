"""Ahead of time (ember/aot.py): lower() captures without running, compile() builds, the
Compiled runs only the arguments it was lowered for, and the analyses say what the wrapper
really allocates and what the kernels compute."""

import weakref

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE

import ember
from ember.aot import ArgumentMismatch
from ember.capture.errors import CaptureError


def _softmax_chain(x, w):
    y = torch.relu(x @ w) * 2
    z = y.softmax(-1)
    return z * y.sum(-1, keepdim=True), y.mean()


class _Allocations:
    """The bytes a compiled graph's wrapper holds while it runs: its allocations and its
    library calls' results, each counted until the tensor is freed."""

    def __init__(self):
        self.live = 0
        self.peak = 0

    def track(self, value):
        if isinstance(value, torch.Tensor):
            size = value.untyped_storage().nbytes()
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(value, self._free, size)
        elif isinstance(value, (tuple, list)):
            for item in value:
                self.track(item)
        return value

    def _free(self, size):
        self.live -= size

    def watch(self, namespace):
        """Wrap the wrapper's allocator and library calls (its `plain_empty` and `op*`)."""
        for name, value in list(namespace.items()):
            if callable(value) and (name == "plain_empty" or name.startswith("op")):
                namespace[name] = lambda *a, _f=value, **k: self.track(_f(*a, **k))


def test_lower_captures_without_running_and_compile_runs_as_eager():
    calls = []

    def f(x, w):
        calls.append(1)  # (a side effect the capture sees, the lowering must not run)
        return _softmax_chain(x, w)

    x, w = torch.randn(64, 32), torch.randn(32, 16)
    lowered = ember.compile(f).lower(x, w)
    assert calls == []
    text = lowered.as_text()
    assert "softmax" in text or "exp(" in text
    assert "L['x']" in text and "library(" in text  # (guards, and the IR's matmul)
    compiled = lowered.compile()
    result = compiled(x, w)
    assert len(calls) == 1  # (the runner replays the side effect, as a call would)
    for got, want in zip(result, _softmax_chain(x, w)):
        torch.testing.assert_close(got, want)
    assert "def call(args)" in compiled.as_text()


def test_a_compiled_call_with_other_arguments_says_what_differs():
    x, w = torch.randn(64, 32), torch.randn(32, 16)
    compiled = ember.compile(_softmax_chain).lower(x, w).compile()
    with pytest.raises(ArgumentMismatch, match=r"L\['x'\].shape\[0\] changed 64 -> 8"):
        compiled(torch.randn(8, 32), w)
    with pytest.raises(ArgumentMismatch, match="dtype"):
        compiled(x.double(), w.double())


def _mlp_chain(x, w):
    # (temporaries that die and are reused, library results freed between kernels)
    h = torch.tanh(x @ w)
    h = (h * h.mean(-1, keepdim=True)) @ w.t()
    h = torch.sigmoid(h).exp() @ w
    return h.softmax(-1), (h * 3).sum(0)


@pytest.mark.parametrize("function", [_softmax_chain, _mlp_chain])
def test_memory_analysis_is_what_the_wrapper_allocates(function):
    x, w = torch.randn(256, 128), torch.randn(128, 512)
    if function is _mlp_chain:
        w = torch.randn(128, 128)
    compiled = ember.compile(function).lower(x, w).compile()
    planned = compiled.memory_analysis()
    assert planned.argument_size_in_bytes == x.nbytes + w.nbytes
    outputs = function(x, w)
    assert planned.output_size_in_bytes == sum(t.nbytes for t in outputs)
    assert planned.alias_size_in_bytes == 0
    ((_, graph),) = compiled.parts()
    compiled(x, w)  # (the first call runs the checked wrapper, later ones the plain one)
    allocations = _Allocations()
    allocations.watch(graph.fast.__globals__)
    result = compiled(x, w)
    assert planned.peak_size_in_bytes == planned.argument_size_in_bytes + allocations.peak
    assert allocations.live == sum(t.nbytes for t in result)
    del result
    if DEVICE == "cuda":  # (and as the caching allocator counts it, within 5%)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        compiled(x, w)
        measured = torch.cuda.max_memory_allocated() - before
        planned_extra = planned.peak_size_in_bytes - planned.argument_size_in_bytes
        assert abs(measured - planned_extra) <= 0.05 * planned_extra, (measured, planned_extra)


def test_cost_analysis_counts_a_matmul_s_flops_and_each_kernel():
    x, w = torch.randn(64, 32), torch.randn(32, 16)
    cost = ember.compile(_softmax_chain).lower(x, w).compile().cost_analysis()
    matmuls = [s for s in cost.steps if s.name.startswith("library:")]
    assert [s.flops for s in matmuls] == [2 * 64 * 32 * 16]
    assert matmuls[0].bytes_accessed == x.nbytes + w.nbytes + 64 * 16 * 4
    kernels = [s for s in cost.steps if not s.name.startswith("library:")]
    assert kernels and all(s.flops > 0 for s in kernels)
    assert cost["flops"] == sum(s.flops for s in cost.steps)
    assert sum(s.transcendentals for s in kernels) == 64 * 16  # (softmax's exp)


def test_a_module_s_training_graph_lowers_whole_and_trains_as_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).to(DEVICE)
    eager = [p.detach().clone().requires_grad_() for p in model.parameters()]
    x = torch.randn(16, 32, device=DEVICE)
    compiled = ember.compile(model).lower(x).compile()
    memory = compiled.memory_analysis()
    assert set(memory.parts) == {"forward", "backward"}
    assert memory.argument_size_in_bytes == x.nbytes + sum(p.nbytes
                                                           for p in model.parameters())
    cost = compiled.cost_analysis()
    forward_matmuls = [s.flops for s in cost.steps if s.name.startswith("forward.library")]
    assert sorted(forward_matmuls) == sorted([2 * 16 * 32 * 64, 2 * 16 * 64 * 8])
    out = compiled(x)
    out.square().sum().backward()
    want = F.linear(F.gelu(F.linear(x, eager[0], eager[1])), eager[2], eager[3])
    want.square().sum().backward()
    torch.testing.assert_close(out, want)
    for parameter, reference in zip(model.parameters(), eager):
        torch.testing.assert_close(parameter.grad, reference.grad)


def test_a_function_that_breaks_its_graph_cannot_be_lowered_whole():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    with pytest.raises(CaptureError, match="test_aot.py"):
        ember.compile(step).lower(torch.randn(8, 4), torch.randn(8, 3))


class _Exported(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 4))

    def forward(self, x, y):
        return torch.relu(self.linear(x)) * self.scale + y.sum(), {"mean": x.mean()}


def test_a_program_torch_export_made_compiles_whole():
    # (its module flattens and unflattens with pytree and checks its inputs under a Dynamo
    # config patch: all captured, one graph)
    model = _Exported().to(DEVICE)
    x, y = torch.randn(3, 8, device=DEVICE), torch.randn(5, device=DEVICE)
    program = torch.export.export(model, (x, y))
    explained = ember.explain(program.module())(x, y)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    got, want = ember.compile(program)(x, y), model(x, y)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1]["mean"], want[1]["mean"])
