"""Dynamic shapes for training (issue 18, stage 5): a training step compiled with symbolic
sizes — one forward and one backward graph serve every batch size or sequence length. Every
step is compared with the same step of an eager copy of the model (loss, gradients,
parameters). Builds are counted on EMBER_LOGS=kernels (the `builds` fixture: one line per C
file built or loaded, per Triton module made), captures on `compiled.records`."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from helpers import small_tiles, watching_fallbacks
from training_models import TransformerModel  # (attention by matmuls, a GELU MLP, a head)

import ember
from ember.shapes import ShapeSpecialized


@pytest.fixture(autouse=True)
def _torch_trace_quiet():
    """torch's structured trace logger (`torch.__trace`, level DEBUG) describes every fake
    tensor a symbolic capture makes; its records reach pytest's capture handler on the root
    logger, and a training step's parameters made them gigabytes and minutes."""
    logger = logging.getLogger("torch.__trace")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # (torch may set the level back while capturing)
    yield
    logger.setLevel(level)
    logger.propagate = propagate


BATCHES = [3, 5, 7, 9, 11, 13, 17, 2, 30, 64]
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def c_only(kernel_backend):
    if kernel_backend != "c":
        pytest.skip("minutes under Triton's interpreter: its tiny case is below")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def training_step(model, optimizer):
    """An S3-style step: zero the gradients, mse loss, backward, optimizer step."""
    def step(x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def data(shape, targets, seed):
    # drawn on the CPU (a seeded CPU generator), then placed where tests make tensors (the
    # GPU under EMBER_TEST_DEVICE=cuda)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator, device="cpu")
    y = torch.randn(*targets, generator=generator, device="cpu")
    return x.to(torch.get_default_device()), y.to(torch.get_default_device())


def train_beside_eager(build, optimizer, shapes, dynamic=None, mark=None):
    """Compile a training step of a copy of `build()`'s model; run it and eager's over
    `shapes` ((input shape, target shape) pairs), comparing loss, gradients and parameters
    after each step. The compiled step, for counting."""
    torch.manual_seed(0)
    eager_model = build()
    ember_model = copy.deepcopy(eager_model)
    eager_step = training_step(eager_model, optimizer(eager_model.parameters()))
    compiled = ember.compile(training_step(ember_model, optimizer(ember_model.parameters())),
                             dynamic=dynamic)
    with watching_fallbacks() as fallbacks:
        for seed, (shape, targets) in enumerate(shapes):
            x, y = data(shape, targets, seed)
            if mark is not None:
                ember.mark_dynamic(x, mark)
                ember.mark_dynamic(y, 0)
            got = compiled(x, y)
            want = eager_step(x, y)
            torch.testing.assert_close(got, want, **TOLERANCE)
            for (name, a), b in zip(ember_model.named_parameters(), eager_model.parameters()):
                where = f"{name} at {shape}"
                torch.testing.assert_close(a.grad, b.grad, **TOLERANCE,
                                           msg=lambda m, where=where: f"{where} (grad): {m}")
                torch.testing.assert_close(a, b, **TOLERANCE,
                                           msg=lambda m, where=where: f"{where}: {m}")
    assert not fallbacks.messages, "; ".join(fallbacks.messages)
    return compiled


def adamw(parameters):
    return torch.optim.AdamW(parameters, lr=1e-2, weight_decay=0.1)


def sgd(parameters):
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


def training_builds(builds) -> list[str]:
    """The training graph's builds: forward and backward (the optimizer's update is built
    once, whatever the batch)."""
    return [line for line in builds() if line.startswith("step ")]


def symbolic_records(compiled) -> list:
    """Every capture record of the step and of its resume functions (zero_grad breaks the
    graph first)."""
    # (a resume function's own resumes may lead back to one already seen: a loop's)
    found, pending, seen = [], [compiled], set()
    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        found.extend(function.records)
        pending.extend(resume.compiled for resume in function.resumes.values()
                       if getattr(resume, "compiled", None) is not None)
    return found


MLP_SHAPES = [((b, 16), (b, 4)) for b in BATCHES]


@pytest.mark.parametrize("optimizer", [adamw, sgd])
def test_a_training_step_over_ten_batch_sizes_compiles_twice(optimizer, kernel_backend, builds):
    # automatic dynamic: static at the first batch, then one symbolic forward and backward
    c_only(kernel_backend)
    train_beside_eager(mlp, optimizer, MLP_SHAPES)
    training = training_builds(builds)
    assert len(training) == 4, training  # (2 compiles, a forward and a backward each)
    assert sum("_backward" in line for line in training) == 2


def test_dynamic_true_compiles_a_training_step_once(kernel_backend, builds):
    c_only(kernel_backend)
    train_beside_eager(mlp, adamw, MLP_SHAPES, dynamic=True)
    training = training_builds(builds)
    assert len(training) == 2, training


def test_mark_dynamic_compiles_a_training_step_once(kernel_backend, builds):
    c_only(kernel_backend)
    train_beside_eager(mlp, sgd, MLP_SHAPES[:5], mark=0)
    training = training_builds(builds)
    assert len(training) == 2, training


def test_torch_compile_dynamic_true_trains_with_one_build_each_way(kernel_backend, builds):
    # Dynamo's graph is the model's forward; its backward is ember's, over the same symbol
    c_only(kernel_backend)
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ember", dynamic=True)
    for batch in [3, 5, 9, 17]:
        x, y = data((batch, 16), (batch, 4), batch)
        F.mse_loss(compiled(x), y).backward()
        F.mse_loss(reference(x), y).backward()
        for ours, theirs in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad, **TOLERANCE)
            ours.grad = theirs.grad = None
    assert len(builds()) == 2, builds()  # (the forward and the backward)


def test_a_transformer_block_trains_over_sequence_lengths(kernel_backend, builds):
    # the length is the symbol: layer norm's, softmax's and the mean's reductions, attention's
    # batched matmuls and the transposes between them all take it, forward and backward
    c_only(kernel_backend)
    # (SGD: the key bias's gradient is zero but for rounding, which Adam's first step
    # scales up to the learning rate, in eager as in any compiled order of the sums)
    shapes = [((2, n, 16), (2, 4)) for n in [3, 5, 8, 13, 21, 6]]
    train_beside_eager(TransformerModel, sgd, shapes)
    training = training_builds(builds)
    assert len(training) == 4, training


def test_size_one_specializes_in_training(kernel_backend, builds):
    # a batch of 1 is never a symbol: its own static entry beside the symbolic one
    c_only(kernel_backend)
    shapes = [((b, 16), (b, 4)) for b in [3, 1, 5, 1, 9, 2]]
    train_beside_eager(mlp, sgd, shapes)
    training = training_builds(builds)
    assert len(training) == 6, training  # (3 static/symbolic compiles: 3, 1, then symbolic)


@pytest.mark.slow_in_interpreter
def test_a_training_step_on_triton_compiles_once_for_every_batch(kernel_backend, builds,
                                                                 monkeypatch):
    # the tiny case under Triton's interpreter (and C's): dynamic=True, four batch sizes.
    # A reduction over a symbolic batch (the loss, bias gradients) is split at any size
    # into up to 256 programs, each interpreted in Python (~30 s a step): the split
    # thresholds are scaled down (helpers.small_tiles) — the same paths as the GPU's tiles
    small_tiles(monkeypatch)
    shapes = [((b, 8), (b, 2)) for b in [3, 5, 2, 7]]
    model = lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(),  # noqa: E731
                                        torch.nn.Linear(8, 2))
    compiled = train_beside_eager(model, sgd, shapes, dynamic=True)
    training = training_builds(builds)
    assert len(training) == 2, training
    assert not any(isinstance(r.compiled, ShapeSpecialized) for r in symbolic_records(compiled))


def test_symbolic_inputs_that_need_gradients_and_outputs_that_are_views(kernel_backend):
    # a weight whose sizes are symbols too (its gradient's layout is decided on symbols), and
    # results that are views of the graph's outputs (their geometry is evaluated at each
    # call's sizes; a reshape of a linear's result in a timm-style module is one)
    def step(x, w):
        y = x @ w
        return y.reshape(-1), y.t()

    compiled = ember.compile(step, dynamic=True)
    for n, m in [(3, 4), (5, 6), (9, 2)]:
        x = torch.randn(n, 4)
        w = torch.randn(4, m, requires_grad=True)
        w_eager = w.detach().clone().requires_grad_()
        got, want = compiled(x, w), step(x, w_eager)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, **TOLERANCE)
            assert a.stride() == b.stride()
        (got[0].sum() + 2 * got[1].square().sum()).backward()
        (want[0].sum() + 2 * want[1].square().sum()).backward()
        torch.testing.assert_close(w.grad, w_eager.grad, **TOLERANCE)
    assert len(compiled.records) == 1
    assert not isinstance(compiled.records[0].compiled, ShapeSpecialized)


def test_an_input_read_as_another_dtype_over_symbolic_sizes(kernel_backend):
    # the wrapper makes such a view through OutputSpec.view_of, with this call's sizes
    def views(x):
        return x.view(torch.int32)[1:], x.t()

    compiled = ember.compile(views, dynamic=True)
    with watching_fallbacks() as fallbacks:
        for n in [3, 5, 9]:
            x = torch.randn(n, 4)
            for a, b in zip(compiled(x), views(x)):
                assert torch.equal(a, b) and a.stride() == b.stride()
    assert not fallbacks.messages, "; ".join(fallbacks.messages)
    assert len(compiled.records) == 1
    assert not isinstance(compiled.records[0].compiled, ShapeSpecialized)


class _CausalAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        b, n = x.shape[0], x.shape[1]
        q, k, v = self.qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, n, 16)


@pytest.mark.slow_in_interpreter  # (12 s under Triton's interpreter)
def test_attention_taped_for_its_backward_over_symbolic_lengths():
    """SDPA's backward is eager's autograd (a taped call): the layout the graph planned for its
    result has symbolic strides, made per call from the result's shape (it raised TypeError
    from empty_strided, in the compiled step and in its IR's eager form alike)."""
    model = _CausalAttention()
    reference = copy.deepcopy(model)
    compiled = ember.compile(model, dynamic=True)
    with watching_fallbacks() as fallbacks:
        for length in (8, 6, 9):
            x = torch.randn(2, length, 16, generator=torch.Generator().manual_seed(length))
            out = compiled(x)
            expected = reference(x)
            torch.testing.assert_close(out, expected, **TOLERANCE)
            out.square().sum().backward()
            expected.square().sum().backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, **TOLERANCE)
    assert len(compiled._compiled_forward.records) == 1
    assert not fallbacks.messages, "; ".join(fallbacks.messages)
