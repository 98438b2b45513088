"""Custom torch.autograd.Functions whose apply takes more than tensors: modules, lists, dicts,
numbers, None, objects the code made (capture/autograd_functions.py). Each test compares
with eager — results, their requires_grad, every gradient (the modules' parameters too) —
and counts graphs and breaks."""

from __future__ import annotations

import copy

import pytest
import torch
from checks import same

import ember


def _explained(fn, *args):
    report = ember.explain(fn)(*args)
    return report.graph_count, report.graph_break_count


def _gradients(model: torch.nn.Module, *tensors: torch.Tensor) -> list:
    return [t.grad for t in tensors] + [p.grad for p in model.parameters()]


# -- a module as an argument, its parameters' gradients made by the backward ----------------
class Recomputed(torch.autograd.Function):
    """Gradient checkpointing as Reformer's reversible layers do it: the forward keeps no
    activations; the backward runs the block again under enable_grad and backpropagates
    through it, which gives the block's parameters their gradients."""

    @staticmethod
    def forward(ctx, x, block, scale, unused):
        ctx.save_for_backward(x)
        ctx.block, ctx.scale = block, scale
        return block(x) * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            out = ctx.block(x) * ctx.scale
            torch.autograd.backward(out, grad)
        return x.grad, None, None, None


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(6, 8)
        self.second = torch.nn.Linear(8, 6)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


class Checkpointed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Block()
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        hidden = Recomputed.apply(torch.relu(x), self.inner, 0.5, None)
        return self.head(hidden).sum()


def test_a_module_argument_gets_its_gradients_from_the_functions_backward():
    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(4, 6, requires_grad=True)
    reference, expected_x = copy.deepcopy(model), x.detach().clone().requires_grad_()
    expected = reference(expected_x)
    expected.backward()
    loss = ember.compile(model)(x)
    loss.backward()
    same(loss, expected)
    same(_gradients(model, x), _gradients(reference, expected_x))
    assert _explained(model, x) == (1, 0)
    with torch.no_grad():  # (nothing recorded: the forward is traced)
        same(ember.compile(model)(x), reference(x))
        assert _explained(model, x) == (1, 0)


class BoundForward(torch.autograd.Function):
    """torch.utils.checkpoint's old form: the function to run again is an argument."""

    @staticmethod
    def forward(ctx, run, x):
        ctx.run = run
        ctx.save_for_backward(x)
        return run(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            torch.autograd.backward(ctx.run(x), grad)
        return None, x.grad


def test_a_bound_method_argument():
    torch.manual_seed(0)
    block, x = Block(), torch.randn(3, 6, requires_grad=True)
    reference, expected_x = copy.deepcopy(block), x.detach().clone().requires_grad_()

    def fn(model, x):
        return BoundForward.apply(model.forward, x * 2).square().sum()

    fn(reference, expected_x).backward()
    ember.compile(fn)(block, x).backward()
    same(_gradients(block, x), _gradients(reference, expected_x))
    assert _explained(fn, block, x) == (1, 0)


# -- lists, dicts, numbers, None; tuples out ------------------------------------------------------
class Mixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, extras, weights, power, flag, nothing):
        ctx.power, ctx.flag, ctx.count = power, flag, len(extras)
        ctx.save_for_backward(x)
        total = x ** power
        for extra in extras:
            total = total + extra
        scaled = total * weights["scale"] if flag else total
        counted = torch.full_like(x, float(len(extras)))
        ctx.mark_non_differentiable(counted)
        return scaled, counted

    @staticmethod
    def backward(ctx, grad_scaled, grad_counted):
        (x,) = ctx.saved_tensors
        grad = grad_scaled * ctx.power * x ** (ctx.power - 1) * (3.0 if ctx.flag else 1.0)
        return grad + ctx.count, None, None, None, None, None


def _mixed(x, a, b, weight):
    scaled, counted = Mixed.apply(x * 2, [a, b.sin()], {"scale": weight}, 2, True, None)
    return scaled.sum() + counted.mean(), counted


def test_lists_dicts_numbers_and_none_as_arguments_and_a_tuple_returned():
    x = torch.randn(5, requires_grad=True)
    a, b, weight = torch.randn(5), torch.randn(5, requires_grad=True), torch.randn(5)
    expected_x, expected_b = (t.detach().clone().requires_grad_() for t in (x, b))
    expected = _mixed(expected_x, a, expected_b, weight)
    expected[0].backward()
    got = ember.compile(_mixed)(x, a, b, weight)
    got[0].backward()
    same(got, expected)  # (the non-differentiable result requires no grad, as eager's)
    same([x.grad, b.grad], [expected_x.grad, expected_b.grad])  # (b's: None, as eager's)
    assert _explained(_mixed, x, a, b, weight) == (1, 0)


class NeedsInputGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        return (grad * y * 10 if wanted[0] else None), (grad * x * 100 if wanted[1] else None)


def test_needs_input_grad_answers_as_in_eager():
    def fn(x, y):
        return NeedsInputGrad.apply(x.exp(), y).sum()

    x, y = torch.randn(4, requires_grad=True), torch.randn(4)
    expected_x = x.detach().clone().requires_grad_()
    fn(expected_x, y).backward()
    ember.compile(fn)(x, y).backward()
    same(x.grad, expected_x.grad)
    assert _explained(fn, x, y) == (1, 0)


class SplitStyle(torch.autograd.Function):
    """The functorch-style Function: forward without ctx, then setup_context."""

    @staticmethod
    def forward(x, scale=3.0):
        return x * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale * 2, None


def test_a_function_with_setup_context():
    def fn(x):
        return SplitStyle.apply(x + 1).sum()

    x = torch.randn(4, requires_grad=True)
    expected_x = x.detach().clone().requires_grad_()
    fn(expected_x).backward()
    ember.compile(fn)(x).backward()
    same(x.grad, expected_x.grad)
    assert _explained(fn, x) == (1, 0)
    with torch.no_grad():
        same(ember.compile(fn)(x), fn(x))


# -- what the forward does to its arguments ---------------------------------------------------
class Collecting(torch.autograd.Function):
    """Appends what it computes to the list it was given (Reformer's hidden states)."""

    @staticmethod
    def forward(ctx, x, seen, cache):
        seen.append(x * 2)
        cache.states.append(x + 1)
        cache.length += x.shape[0]
        return x.cos()

    @staticmethod
    def backward(ctx, grad):
        return -grad, None, None


class Cache:
    def __init__(self):
        self.states = []
        self.length = 0


def _collect(x, seen):
    cache = Cache()
    out = Collecting.apply(x.sin(), seen, cache)
    return out.sum() + sum(s.sum() for s in seen) + cache.states[0].sum(), cache


def test_what_the_forward_adds_to_its_arguments_reaches_the_caller():
    x = torch.randn(3, requires_grad=True)
    expected_x, expected_seen = x.detach().clone().requires_grad_(), [torch.ones(1)]
    expected, expected_cache = _collect(expected_x, expected_seen)
    expected.backward()
    seen = [torch.ones(1)]
    loss, cache = ember.compile(_collect)(x, seen)
    loss.backward()
    same(loss, expected)
    same(x.grad, expected_x.grad)
    same(seen, expected_seen)  # (the caller's list got the tensor the forward appended)
    same(cache, expected_cache)
    assert _explained(_collect, x, [torch.ones(1)]) == (1, 0)


class BumpsBuffer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module):
        module.calls.add_(1)  # (a write one call in the graph would hide)
        return x * module.calls

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def test_a_forward_that_writes_a_tensor_it_did_not_make_runs_outside_the_graph():
    module = torch.nn.Module()
    module.register_buffer("calls", torch.zeros(()))
    reference = copy.deepcopy(module)

    def fn(x, module):
        return BumpsBuffer.apply(x + 1, module) * 2

    x = torch.randn(3, requires_grad=True)
    same(ember.compile(fn)(x, module), fn(x, reference))
    same(module.calls, reference.calls)
    report = ember.explain(fn)(x, copy.deepcopy(module))
    assert report.graph_break_count == 1
    assert "did not make" in str(report.break_reasons[0])


class ReadsValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask):
        if mask.sum().item() < mask.numel():  # (as Reformer's hashing reads its mask)
            x = x * mask
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2, None


def test_a_forward_that_reads_tensor_values_runs_outside_the_graph():
    def fn(x, mask):
        return ReadsValues.apply(x.exp(), mask).sum()

    x, mask = torch.randn(4, requires_grad=True), torch.tensor([1.0, 1.0, 0.0, 1.0])
    expected_x = x.detach().clone().requires_grad_()
    fn(expected_x, mask).backward()
    ember.compile(fn)(x, mask).backward()
    same(x.grad, expected_x.grad)
    report = ember.explain(fn)(x, mask)
    assert report.graph_break_count == 1
    assert "reads a tensor's value at" in str(report.break_reasons[0])
    assert "test_autograd_functions.py" in str(report.break_reasons[0])


class Settings:  # (an object from outside, known only by its type)
    factor = 3.0


class TakesObject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, settings):
        ctx.factor = settings.factor
        return x * settings.factor

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def test_an_object_from_outside_as_an_argument_runs_outside_the_graph():
    def fn(x, settings):
        return TakesObject.apply(x * 2, settings).sum()

    x = torch.randn(3, requires_grad=True)
    expected_x = x.detach().clone().requires_grad_()
    fn(expected_x, Settings()).backward()
    ember.compile(fn)(x, Settings()).backward()
    same(x.grad, expected_x.grad)
    report = ember.explain(fn)(x, Settings())
    assert report.graph_break_count == 1
    assert "Settings" in str(report.break_reasons[0])


# -- traced where autograd records nothing ----------------------------------------------------
class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        assert not any(ctx.needs_input_grad)
        return x, x * scale

    @staticmethod
    def backward(ctx, same_grad, scaled_grad):
        return same_grad + scaled_grad * ctx.scale, None


def test_without_gradients_the_forward_is_traced():
    def fn(x):
        kept, scaled = Identity.apply(x, 2.0)
        return kept, scaled + 1, kept is x

    x = torch.randn(4)
    same(ember.compile(fn)(x), fn(x))  # (an input returned comes back as a view of it)
    report = ember.explain(fn)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    assert report.ops_per_graph[0] >= 3  # (the forward's ops are the graph's, not one call)


class Uncapturable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, parts):
        torch.manual_seed(7)  # (global state: the capture does not trace it)
        return x + torch.rand_like(x) * parts["scale"]

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def test_a_forward_the_capture_cannot_trace_is_one_call():
    def fn(x, scale):
        return Uncapturable.apply(x * 2, {"scale": scale}) - 1

    x, scale = torch.randn(4), torch.randn(4)
    same(ember.compile(fn)(x, scale), fn(x, scale))
    assert _explained(fn, x, scale) == (1, 0)


class HalfTraced(torch.autograd.Function):
    """Changes things before what the capture cannot trace: a traced attempt that fails must
    leave no trace (no append twice, no node of its own)."""

    @staticmethod
    def forward(ctx, x, seen):
        seen.append(x * 2)
        ctx.kept = x.sin()
        torch.manual_seed(3)
        return ctx.kept + torch.rand_like(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def test_a_traced_forward_that_fails_midway_is_rolled_back():
    def fn(x, seen):
        return HalfTraced.apply(x + 1, seen) * len(seen)

    x = torch.randn(4)
    expected_seen, seen = [x], [x]
    expected = fn(x, expected_seen)
    same(ember.compile(fn)(x, seen), expected)
    same(seen, expected_seen)
    report = ember.explain(fn)(x, [x])
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    assert report.ops_per_graph[0] == 3  # (x + 1, the call, the product: no sin, no x * 2)


class Dropped(torch.autograd.Function):
    """Draws from the global generator in its forward, keeps the mask for its backward."""

    @staticmethod
    def forward(ctx, x, p):
        mask = (torch.rand_like(x) > p).to(x.dtype) / (1 - p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def test_a_forward_that_draws_random_numbers_draws_them_once_as_eager():
    def fn(x):
        return (Dropped.apply(x.exp(), 0.5) * 3).sum()

    x = torch.randn(64, requires_grad=True)
    expected_x = x.detach().clone().requires_grad_()
    compiled = ember.compile(fn)
    for seed in (1, 2):
        torch.manual_seed(seed)
        expected = fn(expected_x)
        expected.backward()
        after_eager = torch.rand(1)
        torch.manual_seed(seed)
        got = compiled(x)
        got.backward()
        same(got, expected)
        same(x.grad, expected_x.grad)
        same(torch.rand(1), after_eager)  # (the generator moved as far as eager's)


# -- the real Reformer ----------------------------------------------------------------------
def _reformer():
    pytest.importorskip("transformers")
    from ember.bench import model_sweep

    return model_sweep.cases()["reformer"]()  # (its small config, as the sweep builds it)


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_reformer_without_a_mask_is_one_graph(mode):
    model, batch, forward, loss = _reformer()
    batch = {"input_ids": batch["input_ids"]}
    model.train(mode == "train")
    reference = copy.deepcopy(model)
    run = forward if mode == "infer" else loss
    with torch.set_grad_enabled(mode == "train"):
        report = ember.explain(model)(**batch)
        assert (report.graph_count, report.graph_break_count) == (1, 0)
        expected, got = run(reference, batch), run(ember.compile(model), batch)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        if mode == "train":
            expected.backward()
            got.backward()
            for (name, want), have in zip(reference.named_parameters(), model.parameters()):
                assert (have.grad is None) == (want.grad is None), name
                if want.grad is not None:
                    torch.testing.assert_close(have.grad, want.grad, rtol=1e-4, atol=1e-5,
                                               msg=name)


def test_reformer_with_a_mask_runs_its_reversible_layers_outside_the_graph():
    # (its hashing reads the mask's values, `attention_mask.sum().item()`, to pick a branch:
    # one call's results are unknown without running it)
    model, batch, forward, _ = _reformer()
    model.eval()
    with torch.no_grad():
        report = ember.explain(model)(**batch)
        assert "reads a tensor's value at" in str(report.break_reasons[0])
        assert "modeling_reformer.py" in str(report.break_reasons[0])
        torch.testing.assert_close(forward(ember.compile(model), batch),
                                   forward(copy.deepcopy(model), batch))
