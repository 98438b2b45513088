"""whole_biased_matmuls: a linear layer's bias add that nothing else fuses with (a projection
read only by attention or another matmul) stays inside eager's addmm; one that fuses with the
pointwise work after it stays an add in that kernel. Values, gradients and kernel counts."""

import torch
import torch.nn.functional as F
from helpers import check, check_grad, make

from ember.ir import Op
from ember.lower import trace
from ember.passes.matmul_operands import whole_biased_matmuls
from ember.passes.pipeline import run_passes


def _projections(x, wq, bq, wk, bk, wv, bv):
    b, t, d = x.shape
    q, k, v = (F.linear(x, w, bias).view(b, t, 2, d // 2).transpose(1, 2)
               for w, bias in ((wq, bq), (wk, bk), (wv, bv)))
    return F.scaled_dot_product_attention(q, k, v)


def _weights(d):
    return [t for seed in range(3) for t in (make(d, d, seed=2 * seed + 1),
                                             make(d, seed=2 * seed + 2))]


def test_projections_read_by_attention_keep_their_bias_in_the_library_call():
    x = make(2, 5, 8)
    # no kernel for the three bias adds: the values are eager's addmm's (and its attention's),
    # to the bit
    check(_projections, x, *_weights(8), kernels=0, rtol=0, atol=0)


def test_the_pass_rewrites_only_adds_nothing_fuses_with():
    def fn(x, w, b, w2, b2):
        attended = F.linear(x, w, b) @ x.t()         # read by a matmul: addmm
        activated = torch.relu(F.linear(x, w2, b2))  # fuses with relu: an add in that kernel
        return attended, activated

    args = [make(4, 6), make(6, 6, seed=1), make(6, seed=2), make(3, 6, seed=3), make(3, seed=4)]
    lowered = trace(torch.fx.symbolic_trace(fn), args)
    assert whole_biased_matmuls(lowered.graph) == 1
    graph = run_passes(lowered.graph)
    biased = [n for n in graph.nodes if n.op is Op.LIBRARY and len(n.inputs) == 3]
    assert [n.attrs["target"] for n in biased] == [torch._C._nn.linear]
    assert Op.ADD in {n.op for n in graph.nodes}
    check(fn, *args, kernels=1)


def test_an_output_keeps_its_bias_add():
    def fn(x, w, b):
        return F.linear(x, w, b), F.linear(x, w, b) @ x.t()

    # (the first linear is the graph's output, which nothing reads: eager's linear call,
    # by matmuls_onto_sums; the second's bias stays in its addmm)
    check(fn, make(4, 6), make(6, 6, seed=1), make(6, seed=2), kernels=0)


def test_gradients_through_a_whole_biased_matmul():
    check_grad(_projections, make(2, 5, 8), *_weights(8))


def test_a_stored_sum_that_kernels_read_keeps_its_bias_in_the_library_call():
    # a biased head's logits, returned and read by a loss: stored whoever computes them, so
    # the product writes them with its bias (eager's addmm) and the loss's kernel reads them,
    # where the add was a pass of its own that wrote them (BERT's 2048 x 30522 logits)
    def fn(x, w, b, labels):
        logits = F.linear(x, w, b).view(2, 3, 10)
        return logits, F.cross_entropy(logits.view(6, 10), labels)

    args = [make(6, 8), make(10, 8, seed=1), make(10, seed=2), torch.randint(0, 10, (6,))]
    lowered = trace(torch.fx.symbolic_trace(fn), args)
    assert whole_biased_matmuls(lowered.graph) == 1
    graph = run_passes(lowered.graph)
    assert Op.ADD not in {n.op for n in graph.nodes}
    check(fn, *args, kernels=2)  # (the loss's statistics, then its mean)
    check_grad(fn, *args)
