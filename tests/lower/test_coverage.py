"""How much of aten the `lowerings` table covers, and what happens to the rest.

The ops models use most must lower to IR primitives (no library call); an op without a rule
must still run, as a library node, inside a graph whose other ops fuse.
"""

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from helpers import check, make

from ember.lower import trace
from ember.lower.registry import find_rule, lowerings

aten = torch.ops.aten


def test_the_table_covers_at_least_120_ops():
    assert len(lowerings) >= 120, f"only {len(lowerings)} aten ops/overloads have rules"


# aten ops that must have a rule (what the models' functions reach on torch 2.13)
REQUIRED = [
    aten.gelu.default, aten.silu.default, aten.sigmoid.default, aten._softmax.default,
    aten._log_softmax.default, aten.native_layer_norm.default, aten.pow.Tensor_Scalar,
    aten.mean.dim, aten.rsqrt.default, aten.addmm.default, aten.mm.default, aten.bmm.default,
    aten.mean.default, aten.var.correction, aten.std.correction, aten.clamp.default,
    aten.relu.default, aten.leaky_relu.default, aten.elu.default, aten.hardtanh.default,
    aten.masked_fill.Scalar, aten.cat.default, aten.stack.default, aten.split.Tensor,
    aten.split_with_sizes.default, aten.transpose.int, aten.permute.default, aten.view.default,
    aten._unsafe_view.default, aten.expand.default, aten.embedding.default,
    aten.nll_loss_forward.default, aten.native_dropout.default, aten.where.self,
    aten.sum.dim_IntList, aten.amax.default, aten.addmv.default, aten.baddbmm.default,
    aten.logaddexp.default, aten.hardshrink.default, aten.softshrink.default,
]


@pytest.mark.parametrize("op", REQUIRED, ids=str)
def test_required_op_has_a_rule(op):
    assert find_rule(op) is not None


def lowered_library_calls(fn, *args) -> int:
    return trace(torch.fx.symbolic_trace(fn), list(args)).library_calls


x, w, b = make(4, 6, 8), make(8, seed=1), make(8, seed=2)
logits, target = make(5, 7), torch.tensor([0, 6, 3, 3, 1])
FUNCTIONS = {
    "gelu": lambda x: F.gelu(x), "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": lambda x: F.silu(x), "sigmoid": lambda x: torch.sigmoid(x),
    "softmax": lambda x: F.softmax(x, -1), "log_softmax": lambda x: F.log_softmax(x, 1),
    "layer_norm": lambda x: F.layer_norm(x, (8,), w, b), "rms_norm": lambda x: F.rms_norm(
        x, (8,), w), "linear": lambda x: F.linear(x, w[None].expand(3, 8), b[:3]),
    "matmul": lambda x: x @ x.transpose(1, 2), "mean_var_std": lambda x: (
        x.mean(1), x.var(-1), x.std(0)), "clamps": lambda x: (
        x.clamp(-1, 1), F.relu(x), F.leaky_relu(x), F.elu(x), F.hardtanh(x)),
    "masked_fill": lambda x: x.masked_fill(x > 0, 0.5),
    "joins": lambda x: (torch.cat([x, x], 1), torch.stack([x, x]), x.split(3, 1), x.chunk(2)),
    "views": lambda x: (x.transpose(0, 1) * 1, x.permute(2, 0, 1) * 1, x.view(24, 8) * 1,
                        x.reshape(-1) * 1, x[:1].expand(3, 6, 8) * 1, x.flatten(1) * 1),
    "embedding": lambda x: F.embedding(torch.tensor([[1, 2], [0, 3]]), x[0]),
    "cross_entropy": lambda x: F.cross_entropy(logits, target),
    "nll_loss": lambda x: F.nll_loss(F.log_softmax(logits, 1), target),
    "dropout_eval": lambda x: F.dropout(x, 0.1, training=False),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_common_functions_lower_without_library_calls(name):
    assert lowered_library_calls(FUNCTIONS[name], x) == 0


def test_ops_without_rules_run_as_library_nodes_among_fused_ops():
    # cumsum, sort and topk have no rule: each is one library call; the pointwise ops around
    # them still fuse into kernels, and everything matches eager
    def fn(x):
        y = torch.cumsum(x * 2 + 1, dim=1)
        values, indices = torch.sort(y.exp(), dim=-1, descending=True)
        top, where = torch.topk(y - 1, 3, dim=0)
        return values.sigmoid() + 1, indices, top * 2, where

    assert all(find_rule(op) is None for op in (aten.cumsum.default, aten.sort.default,
                                                aten.topk.default))
    compiled = check(fn, make(6, 7), library=3)
    assert compiled.kernel_count <= 4
