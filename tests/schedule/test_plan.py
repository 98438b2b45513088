"""ember.schedule.plan: a plan describes itself as text, and frees each temporary after its
last use."""

import torch

from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule
from ember.schedule.plan import Kernel, LibraryCall


def _softmax_matmul(x, w):
    h = torch.softmax(x, -1) @ w
    return h.sum(0), h.t()


def test_a_plan_prints_its_steps_and_frees_temporaries_after_last_use():
    lowered = trace(torch.fx.symbolic_trace(_softmax_matmul),
                    [torch.randn(3, 4), torch.randn(4, 5)])
    plan = schedule(run_passes(lowered.graph))
    assert plan.describe() == """\
kernel0: reduce over [1] [3, 4] members [%2, %7, %9] stores [%9->buf3]
library mm.default([buf3, in1]) -> [lib2]
kernel1: reduce over [0] [3, 5] members [%11] stores [%11->buf0]"""
    assert [type(s) for s in plan.steps] == [Kernel, LibraryCall, Kernel]
    assert [[b.name for b in frees] for frees in plan.frees] == [[], ["buf3"], []]
    (first, call, second) = plan.steps
    assert first.is_reduction and first.stores[0].buffer.role == "temp"
    # the library result is an output (returned transposed), so it is never freed
    assert call.outputs[0].name == "lib2" and plan.outputs[1] is call.outputs[0]
    assert plan.kernels == [first, second]
