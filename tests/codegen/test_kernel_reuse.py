"""Kernels of one structure written once (ember/codegen/kernel_reuse.py): a model's repeated
layers schedule one kernel per layer; the first is written, the others renamed from it, and
the C file or Triton module holds its function once. The whole suite runs with
EMBER_CHECK_REUSED_KERNELS=1 (tests/conftest.py): every renamed kernel is also written and
compared. Here: the exact counts for repeated layers, eager's results through the shared
functions, and that the check catches a structure that misses what a writer reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.codegen import kernel_reuse
from ember.codegen.c import write_source
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule

BACKENDS = ["c", pytest.param("triton", marks=pytest.mark.skipif(
    not config.triton_interpreted(), reason="the Triton interpreter's module (CPU tensors)"))]


def layers(x, w1, w2, w3, w4, w5):
    """Five layers alike: a product (a library call), then a pointwise kernel over it."""
    for w in (w1, w2, w3, w4, w5):
        x = F.gelu(x @ w) * 0.5 + x
    return x


def arguments():
    torch.manual_seed(0)
    return [torch.randn(8, 16)] + [torch.randn(16, 16) / 4 for _ in range(5)]


def written(backend):
    with config.override(backend=backend), torch.no_grad():
        plan = schedule(run_passes(trace(torch.fx.symbolic_trace(layers), arguments()).graph))
        if backend == "c":
            return write_source(plan)
        from ember.codegen.triton_module import write_module

        text, launches = write_module(plan)
        return text, [kernel for launch in launches for kernel in launch.kernels]


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_layers_are_written_once_and_the_file_holds_one_function(backend):
    # the first layer's kernel reads a graph input and the last one's writes the output
    # (a buffer's role is part of the structure): the three between are one structure
    text, kernels = written(backend)
    assert len(kernels) == 5
    assert [k.same_as for k in kernels] == [None, None] + [kernels[1].name] * 2 + [None]
    defined = "def " if backend == "triton" else "int "
    assert [k.name for k in kernels if f"{defined}{k.name}(" in text] == \
        [kernels[0].name, kernels[1].name, kernels[4].name]
    # a renamed kernel names its own buffers, in the first's order
    assert len({tuple(map(id, k.arguments)) for k in kernels[1:4]}) == 3
    assert all(len(k.arguments) == len(kernels[1].arguments) for k in kernels[1:4])


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_layers_through_one_function_give_eagers_results(backend):
    with config.override(backend=backend):
        compiled = ember.compile(layers)
        torch.testing.assert_close(compiled(*arguments()), layers(*arguments()))


def test_a_structure_that_misses_what_the_writer_reads_is_caught_by_the_check(monkeypatch):
    # every kernel given one structure: the sigmoid's kernel would be the tanh's renamed (one
    # buffer read, one written, alike); the check writes it too and raises, rather than run
    # the tanh's code
    def two_kernels(x):
        return torch.sigmoid(torch.tanh(x @ x) @ x)

    real = kernel_reuse.structure
    monkeypatch.setattr(kernel_reuse, "structure",
                        lambda kernel, plan: (("one key",), real(kernel, plan)[1]))
    with config.override(backend="c", check_reused_kernels=True), torch.no_grad():
        x = torch.randn(8, 8)
        plan = schedule(run_passes(trace(torch.fx.symbolic_trace(two_kernels), [x]).graph))
        assert len(plan.kernels) == 2
        with pytest.raises(AssertionError, match="differs from its own writing"):
            write_source(plan)


def centred_layers(x, w1, w2, w3, w4, w5):
    """Five layers alike, each a product and its columns' mean taken off: a reduction over
    8192 rows, split in two stages with a workspace of its own per kernel."""
    for w in (w1, w2, w3, w4, w5):
        x = x @ w
        x = x - x.mean(0)
    return x


def centred_arguments():
    torch.manual_seed(0)
    return [torch.randn(8192, 16)] + [torch.randn(16, 16) / 4 for _ in range(5)]


@pytest.mark.skipif(not config.triton_interpreted(), reason="the Triton interpreter (CPU)")
def test_split_reductions_are_reused_with_workspaces_of_their_own():
    from ember.codegen.triton_module import write_module

    with config.override(backend="triton"), torch.no_grad():
        graph = trace(torch.fx.symbolic_trace(centred_layers), centred_arguments()).graph
        launches = write_module(schedule(run_passes(graph)))[1]
    assert len(launches) == 5 and all(len(launch.kernels) == 2 for launch in launches)
    # the last layer writes the output: a structure of its own
    assert [[k.same_as for k in launch.kernels] for launch in launches] == \
        [[None, None]] + [[f"{launches[0].name}_stage1", launches[0].name]] * 3 + [[None, None]]
    for launch in launches:
        assert [space.name for space in launch.workspaces] == [f"{launch.name}_ws0"]
        assert all(space in kernel.arguments for kernel in launch.kernels
                   for space in launch.workspaces)
    with config.override(backend="triton"):
        compiled = ember.compile(centred_layers)
        torch.testing.assert_close(compiled(*centred_arguments()),
                                   centred_layers(*centred_arguments()))
