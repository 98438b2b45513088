"""ember.lower.mutation: functional variants of in-place and out= ops, and writing a new
value of a view back into its base through any chain of views."""

import pytest
import torch

from ember.ir import Graph, Op
from ember.ir.interpreter import interpret
from ember.lower.builder import Builder
from ember.lower.mutation import CloneAndCall, functional_variant, scatter_through
from ember.lower.registry import aten


@pytest.mark.parametrize("op, functional", [
    (aten.add_.Tensor, aten.add.Tensor),
    (aten.mul_.Scalar, aten.mul.Scalar),
    (aten.relu_.default, aten.relu.default),
    (aten.add.out, aten.add.Tensor),
    (aten.sin.out, aten.sin.default),
    (aten.clamp_.default, aten.clamp.default),
])
def test_functional_variants(op, functional):
    assert functional_variant(op) is functional


def test_functional_ops_have_no_functional_variant():
    assert functional_variant(aten.add.Tensor) is None
    assert functional_variant(aten.sum.default) is None


# Each chain is applied to a (4, 6) base: (description, how eager takes the view).
CHAINS = {
    "slice_step": lambda t: t[:, 1::2],
    "select": lambda t: t[2],
    "permute_select": lambda t: t.t()[3],
    "reshape_slice": lambda t: t.reshape(3, 8)[1:, ::3],
    "unsqueeze_squeeze": lambda t: t.unsqueeze(0)[0, 1:3],
    "unfold": lambda t: t.unfold(1, 2, 3),  # lowered to as_strided
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_scatter_through_a_view_chain_equals_eagers_write(name):
    from ember.lower import trace

    view = CHAINS[name]
    base = torch.randn(4, 6)
    value = torch.randn(view(base).shape)

    def fn(b, v):
        view(b).copy_(v)
        return b + 0

    lowered = trace(torch.fx.symbolic_trace(fn), [base.clone(), value])
    outputs, _ = interpret(lowered.graph, [base.clone(), value])
    expected = base.clone()
    view(expected).copy_(value)
    torch.testing.assert_close(outputs[0], expected, rtol=0, atol=0)


def test_scatter_through_builds_only_pointwise_and_data_nodes_for_slices():
    graph = Graph(torch.device("cpu"))
    builder = Builder(graph)
    base = graph.add_input((4, 6), torch.float32)
    value = graph.add_input((4, 3), torch.float32)
    chain = ((Op.SLICE, dict(dim=1, start=1, stop=6, step=2)),)
    result = scatter_through(builder, base, chain, value)
    assert result.op is Op.WHERE and result.shape == (4, 6)
    assert {n.op for n in graph.nodes} <= {Op.INPUT, Op.FULL, Op.PAD, Op.WHERE}
    b, v = torch.randn(4, 6), torch.randn(4, 3)
    graph.outputs = [result]
    (got,), _ = interpret(graph, [b, v])
    want = b.clone()
    want[:, 1::2] = v
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_clone_and_call_leaves_its_arguments_alone():
    wrapper = CloneAndCall(aten.add_.Tensor, [0], ["self"])
    x, y = torch.ones(3), torch.full((3,), 2.0)
    (result,) = wrapper(x, y)
    assert torch.equal(result, torch.full((3,), 3.0)) and torch.equal(x, torch.ones(3))
    assert wrapper.__name__ == "functional_add_.Tensor"
