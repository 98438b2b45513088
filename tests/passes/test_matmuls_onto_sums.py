"""matmuls_onto_sums: a weight used by a lookup and by a matmul (an embedding tied to a
language model's head) gets its two gradients as one addmm, not a product and an add kernel.
Gradients against eager and the backward's library calls and kernels."""

import torch
import torch.nn.functional as F
from helpers import check, check_grad, make

from ember.backends import compile_graph
from ember.ir import Op
from ember.runtime.training import TrainingGraph

aten = torch.ops.aten


def _tied(ids, table, targets):
    hidden = torch.tanh(F.embedding(ids, table))  # (the lookup's gradient: index-adds)
    logits = hidden @ table.t()                    # (the head's gradient: a product)
    return F.cross_entropy(logits, targets)


def _arguments():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (12,), generator=generator)
    targets = torch.randint(0, 40, (12,), generator=generator)
    return ids, make(40, 16), targets


def test_a_tied_weights_gradient_is_one_addmm_onto_the_lookups():
    ids, table, targets = _arguments()
    check_grad(_tied, ids, table, targets, rtol=1e-4, atol=1e-5)
    graph = compile_graph(torch.fx.symbolic_trace(_tied), [ids, table.requires_grad_(), targets])
    assert isinstance(graph, TrainingGraph)
    backward = graph.split.backward
    targets_called = [n.attrs["target"] for n in backward.nodes if n.op is Op.LIBRARY]
    assert aten.addmm.default in targets_called
    (gradient,) = [n for n in backward.outputs if n.shape == (40, 16)]
    assert gradient.op is Op.LIBRARY and gradient.attrs["target"] is aten.addmm.default
    assert not any(n.op is Op.ADD and n.shape == (40, 16) for n in backward.nodes)


def test_a_sum_a_kernel_reads_keeps_its_add():
    def fn(x, w, c):
        total = x @ w + c
        return total, torch.relu(total)  # (the relu's kernel reads the sum: the add fuses)

    check(fn, make(4, 6), make(6, 5, seed=1), make(4, 5, seed=2), rtol=1e-5, atol=1e-6)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [make(4, 6), make(6, 5, seed=1),
                                                        make(4, 5, seed=2)])
    assert graph.library_count == 1 and graph.kernel_count == 1
