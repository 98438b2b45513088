"""runtime/library_warmup: a plan's convolutions, each distinct one once, called on zeros laid
out as the wrapper passes its operands; nothing else called, nothing of the caller's touched."""

import torch
import torch.nn.functional as F

from ember import config
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.runtime import library_warmup
from ember.schedule.fuse import schedule
from ember.schedule.plan import LibraryCall


def _net(x, w1, w2, wt):
    y = F.conv2d(x, w1, padding=1).relu()
    z = F.conv2d(y, w1, padding=1).relu()  # (the same geometry again: warmed once)
    u = F.conv2d(z, w2, stride=2)
    return F.conv_transpose2d(u, wt) @ torch.ones(8, 8, device=x.device)


def _plan(device="cpu"):
    args = [torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), torch.randn(6, 4, 2, 2),
            torch.randn(6, 3, 5, 5)]
    args = [a.to(device) for a in args]
    with config.override(convolution_layout="never"):  # (eager's layouts: two calls alike)
        lowered = trace(torch.fx.symbolic_trace(_net), args)
        return schedule(run_passes(lowered.graph)), args


def test_each_distinct_convolution_runs_once_on_zeros_in_the_wrappers_layouts():
    plan, args = _plan()
    kept = [a.clone() for a in args]
    calls = [s for s in plan.steps if isinstance(s, LibraryCall)]
    convolutions = [c for c in calls if library_warmup.warmed(c)]
    assert len(convolutions) == 4 and len(calls) == 5  # (the matrix product is not warmed)
    seen = []

    def convolution_recorded(*arguments, **keywords):
        tensors = [a for a in arguments if isinstance(a, torch.Tensor)]
        seen.append([(tuple(t.shape), t.stride(), t.dtype) for t in tensors])
        assert all(t.count_nonzero() == 0 for t in tensors)
        return torch.ops.aten.convolution.default(*arguments, **keywords)

    assert {c.node.attrs["target"] for c in convolutions} == {torch.ops.aten.convolution.default}
    for call in convolutions:
        call.node.attrs["target"] = convolution_recorded
    library_warmup._warm(convolutions, torch.device("cpu"), "net")
    expected = []
    for call in convolutions:
        layouts = call.node.attrs.get("operand_strides") or (None,) * len(call.inputs)
        operands = [(tuple(b.shape), tuple(s or b.strides), b.dtype)
                    for b, s in zip(call.inputs, layouts)]
        if operands not in expected:
            expected.append(operands)
    assert seen == expected and len(seen) == 3
    for arg, before in zip(args, kept):
        assert torch.equal(arg, before)


def test_only_cuda_graphs_are_warmed_and_the_flag_turns_it_off():
    plan, _ = _plan()
    assert library_warmup.start(plan, torch.device("cpu"), "net") is None
    if torch.cuda.is_available():
        plan, _ = _plan("cuda")
        started = library_warmup.start(plan, torch.device("cuda"), "net")
        assert started is not None and started.result() is None
        with config.override(warm_library=False):
            assert library_warmup.start(plan, torch.device("cuda"), "net") is None


def test_a_failing_call_or_a_symbolic_size_is_passed_over():
    plan, _ = _plan()
    convolutions = [s for s in plan.steps if isinstance(s, LibraryCall) and
                    library_warmup.warmed(s)]

    def convolution_failing(*arguments, **keywords):
        raise RuntimeError("no engine")

    for call in convolutions:
        call.node.attrs["target"] = convolution_failing
    library_warmup._warm(convolutions, torch.device("cpu"), "net")  # (does not raise)
    call = convolutions[0]
    shape = call.inputs[0].shape
    call.inputs[0].shape = ("s0", *shape[1:])
    assert library_warmup._operands(call) is None


def test_stand_ins_take_at_most_an_eighth_of_the_free_memory(monkeypatch):
    operands = [((4, 1024), (1024, 1), torch.float32), ((1024,), (0,), torch.float32)]
    needed = 4 * 1024 * 4 + 1 * 4  # (an expanded operand spans one element)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (needed * 8, 1 << 40))
    assert library_warmup._room_for(operands, cuda)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (needed * 8 - 1, 1 << 40))
    assert not library_warmup._room_for(operands, cuda)
