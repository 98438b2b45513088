"""torch's markers for compilers, as libraries use them, in code ember compiles: a custom op
stays one node of its op (and ember's backend calls it, its fake kernel giving shapes, its
registered backward the gradient); torch.compiler.disable breaks the graph and runs the
function natively; allow_in_graph keeps the call one node; is_compiling answers True;
torch._dynamo.graph_break breaks; mark_static_address acts as in eager. Every test compares
with eager PyTorch and counts graphs, breaks and ops exactly."""

from __future__ import annotations

import functools

import pytest
import torch
from checks import same

import ember
from ember.capture.errors import CaptureError

NS = "ember_markers_test"
backward_calls: list[int] = []


@torch.library.custom_op(f"{NS}::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_sin_backward(ctx, grad):
    backward_calls.append(1)
    return grad * ctx.x.cos() * ctx.scale, None


def _scaled_sin_setup(ctx, inputs, output):
    ctx.x, ctx.scale = inputs


scaled_sin.register_autograd(_scaled_sin_backward, setup_context=_scaled_sin_setup)


@torch.library.custom_op(f"{NS}::accumulate", mutates_args=("total",))
def accumulate(x: torch.Tensor, total: torch.Tensor) -> None:
    total.add_(x)


@accumulate.register_fake
def _(x, total):
    return None


_library = torch.library.Library(NS, "FRAGMENT")
_library.define("twice(Tensor x) -> Tensor")
_library.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NS}::twice")
def _(x):
    return torch.empty_like(x)


# (torch.library.define's spelling, with a meta kernel instead of a fake one)
torch.library.define(f"{NS}::halves", "(Tensor x) -> Tensor", lib=_library)
torch.library.impl(f"{NS}::halves", "CompositeExplicitAutograd", func=lambda x: x / 2,
                   lib=_library)
torch.library.impl(f"{NS}::halves", "Meta", func=lambda x: torch.empty_like(x), lib=_library)


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def targets(graph: torch.fx.GraphModule) -> list:
    return [node.target for node in graph.graph.nodes if node.op == "call_function"]


# -- custom ops -------------------------------------------------------------------------------
def uses_custom_op(x):
    return scaled_sin(x * 2, 0.5) + 1


def calls_a_helper_that_uses_it(x):
    return uses_custom_op(x - 1) * 3


@pytest.mark.parametrize("fn", [uses_custom_op, calls_a_helper_that_uses_it])
def test_a_custom_op_is_one_node_of_its_op(fn):
    report = ember.explain(fn)(t(8))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    ops = 3 if fn is uses_custom_op else 5
    assert report.ops_per_graph == [ops]
    op = getattr(torch.ops, NS).scaled_sin.default
    assert targets(report.graphs[0]).count(op) == 1
    compiled = ember.compile(fn, fullgraph=True)
    for seed in range(3):
        same(compiled(t(8, seed=seed)), fn(t(8, seed=seed)))
    (record,) = compiled.records
    assert record.compiled.library_count == 1  # (the op, called at run time; the rest fused)


@pytest.mark.parametrize("through", ["ember", "torch.compile"])
def test_a_custom_op_s_gradient_is_its_registered_backward(through):
    compiled = ember.compile(uses_custom_op, fullgraph=True) if through == "ember" \
        else torch.compile(uses_custom_op, backend="ember", fullgraph=True)
    x, y = t(8).requires_grad_(), t(8).requires_grad_()
    expected = uses_custom_op(x)
    expected.sum().backward()
    del backward_calls[:]
    actual = compiled(y)
    same(actual, expected)
    actual.sum().backward()
    same(y.grad, x.grad)
    assert len(backward_calls) == 1


def test_library_defined_ops_and_a_mutating_custom_op_are_one_node_each():
    def fn(x, total):
        accumulate(x * 2, total)
        return getattr(torch.ops, NS).twice(total) + getattr(torch.ops, NS).halves(x)

    report = ember.explain(fn)(t(6), torch.zeros(6))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (1, 0, [5])
    ops = getattr(torch.ops, NS)
    assert {ops.accumulate.default, ops.twice, ops.halves} <= set(targets(report.graphs[0]))
    compiled = ember.compile(fn, fullgraph=True)
    eager_total, compiled_total = torch.zeros(6), torch.zeros(6)
    for seed in range(3):
        x = t(6, seed=seed)
        same(compiled(x, compiled_total), fn(x, eager_total))
        same(compiled_total, eager_total)  # (the op's write to its argument, as in eager)


def test_a_custom_op_without_a_fake_kernel_runs_natively_at_a_break_that_says_why():
    @torch.library.custom_op(f"{NS}::no_fake", mutates_args=())
    def no_fake(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def fn(x):
        return no_fake(x + 1) * 2

    report = ember.explain(fn)(t(3))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (2, 1, [1, 1])
    assert "register_fake" in report.break_reasons[0].hint
    same(ember.compile(fn)(t(3)), fn(t(3)))


# -- torch.compiler.disable -----------------------------------------------------------------
ran_natively: list[bool] = []


@torch.compiler.disable
def disabled(x):
    ran_natively.append(not torch.compiler.is_compiling())
    return torch.cos(x) * 2


def _plain(x):
    ran_natively.append(not torch.compiler.is_compiling())
    return torch.tanh(x) - 1


dynamo_disabled = torch._dynamo.disable(_plain)
not_recursive = torch.compiler.disable(_plain, recursive=False)


@pytest.mark.parametrize("helper", [disabled, dynamo_disabled, not_recursive],
                         ids=["decorator", "torch._dynamo.disable", "recursive=False"])
def test_a_disabled_function_breaks_the_graph_once_and_runs_natively(helper):
    def fn(x):
        return helper(x + 1) * 3

    report = ember.explain(fn)(t(4))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (2, 1, [1, 1])
    (reason,) = report.break_reasons
    assert "torch.compiler.disable" in reason.reason and reason.location.function.endswith("fn")
    compiled = ember.compile(fn)
    for seed in range(3):
        del ran_natively[:]
        same(compiled(t(4, seed=seed)), fn(t(4, seed=seed)))
        assert ran_natively == [True, True]  # once compiled, once eager: each time natively


def test_disable_called_inside_the_compiled_code_and_from_an_inlined_function():
    def inner(x):
        return disabled(x) + 1

    def fn(x):
        return torch.compiler.disable(torch.sin)(x) + inner(x * 2)

    report = ember.explain(fn)(t(4))
    reasons = [r.reason for r in report.break_reasons]
    # fn breaks at torch.sin, then at the call of `inner` (for the disabled call inside it),
    # which is compiled apart and breaks at `disabled`
    assert report.graph_break_count == 3
    assert [r.split(" is marked")[0] for r in reasons] == ["torch.sin", "disabled", "disabled"]
    compiled = ember.compile(fn)
    for seed in range(3):
        del ran_natively[:]
        same(compiled(t(4, seed=seed)), fn(t(4, seed=seed)))
        assert ran_natively == [True, True]


def test_a_submodule_whose_forward_is_disabled_runs_natively_inside_a_compiled_model():
    class Inner(torch.nn.Module):
        @torch.compiler.disable
        def forward(self, x):
            ran_natively.append(not torch.compiler.is_compiling())
            return x * 2

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.linear = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.linear(self.inner(self.linear(x)))

    model = Outer()
    report = ember.explain(model)(t(2, 3))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (2, 1, [1, 1])
    assert report.break_reasons[0].reason.startswith("Inner.forward is marked")
    compiled = ember.compile(model)
    with torch.no_grad():
        for seed in range(3):
            del ran_natively[:]
            same(compiled(t(2, 3, seed=seed)), model(t(2, 3, seed=seed)))
            assert ran_natively == [True, True]


def test_fullgraph_names_the_user_s_line_of_a_disabled_call():
    def fn(x):
        y = x * 2
        return disabled(y)  # the disabled call

    with pytest.raises(CaptureError) as raised:
        ember.compile(fn, fullgraph=True)(t(4))
    message = str(raised.value)
    line = fn.__code__.co_firstlineno + 2
    assert f'File "{__file__}", line {line}, in ' in message
    assert "disabled is marked torch.compiler.disable" in message


def test_compiling_a_disabled_function_or_forward_runs_it_eagerly_from_the_first_call():
    class Model(torch.nn.Module):
        @torch.compiler.disable
        def forward(self, x):
            ran_natively.append(not torch.compiler.is_compiling())
            return x.relu()

    model = Model()
    compiled_model = ember.compile(model)
    compiled_function = ember.compile(disabled)
    del ran_natively[:]
    for seed in range(3):
        x = t(4, seed=seed)
        same(compiled_model(x), model(x))
        same(compiled_function(x), disabled(x))
    assert ran_natively == [True] * 12
    for compiled in (compiled_model._compiled_forward, compiled_function):
        assert len(compiled.records) == 1 and compiled.direct is not None
    report = ember.explain(disabled)(t(4))
    assert (report.graph_count, report.graph_break_count) == (0, 1)


# -- torch.compile'd code called from ember-compiled code -----------------------------------
def test_torch_compiled_functions_modules_and_methods_inside_are_traced_as_their_code():
    # as Dynamo inlines a nested torch.compile: called as they were, Dynamo's frame hook
    # came on inside ember's runner and tried to compile ember's own capture (a crash)
    helper = torch.compile(lambda x: x.cos() + 1, backend="eager")
    linear = torch.nn.Linear(4, 4)
    compiled_linear = torch.compile(linear, backend="eager")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        @torch.compile(backend="eager")
        def scaled(self, x):
            return self.linear(x) * 3

        def forward(self, x):
            return self.scaled(x) + helper(x) + compiled_linear(x).relu()

    model = Model()
    x = t(3, 4)
    same(ember.compile(model)(x), model.linear(x) * 3 + x.cos() + 1 + linear(x).relu())
    report = ember.explain(model)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_ember_compiled_code_inside_torch_compile_is_traced_by_dynamo_as_its_code():
    # (Dynamo traced ember's runtime, then tried to compile ember's capture: a crash)
    import torch._dynamo

    helper = ember.compile(lambda x: x.sin() * 2)
    linear = torch.nn.Linear(4, 4)
    compiled_linear = ember.compile(linear)

    def fn(x):
        return helper(x) + compiled_linear(x).relu()

    x = t(3, 4)
    same(torch.compile(fn, backend="eager")(x), x.sin() * 2 + linear(x).relu())
    report = torch._dynamo.explain(fn)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_scripted_and_traced_submodules_run_natively_at_a_break_that_says_so():
    # (inlined, the class's `forward` of a ScriptModule raised inside torch.jit: an internal
    # error in capture)
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(5, 5)
            self.traced = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(5, 5),
                                                              torch.nn.ReLU()), t(2, 5))
            self.scripted = torch.jit.script(torch.nn.Linear(5, 3))

        def forward(self, x):
            return self.scripted(self.traced(self.linear(x).tanh())) * 2

    model = Model()
    x = t(3, 5)
    same(ember.compile(model)(x), model(x))
    report = ember.explain(model)(x)
    assert (report.graph_count, report.graph_break_count) == (3, 2)
    assert all("TorchScript module" in r.reason for r in report.break_reasons)


# -- allow_in_graph -------------------------------------------------------------------------
allowed_calls: list[int] = []


@torch.compiler.allow_in_graph
def allowed(x, y):
    allowed_calls.append(1)
    return torch.cos(x) * y, x.sum()


def _also_allowed(x):
    allowed_calls.append(1)
    return x.exp()


torch._dynamo.allow_in_graph(_also_allowed)


def uses_allowed(x, y):
    a, b = allowed(x + 1, y)
    return _also_allowed(a) + b


def test_an_allowed_function_is_one_node_and_the_backend_calls_it():
    report = ember.explain(uses_allowed)(t(5), t(5, seed=1))
    # (x + 1, allowed, _also_allowed, + b)
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (1, 0, [4])
    assert {allowed, _also_allowed} <= set(targets(report.graphs[0]))
    compiled = ember.compile(uses_allowed, fullgraph=True)
    same(compiled(t(5), t(5, seed=1)), uses_allowed(t(5), t(5, seed=1)))
    (record,) = compiled.records
    assert record.compiled.library_count == 2  # (each function called as it is, not fused)
    for seed in range(3):  # once compiled, every call runs each function once, as eager does
        x, y = t(5, seed=seed), t(5, seed=seed + 1)
        before = len(allowed_calls)
        actual = compiled(x, y)
        assert len(allowed_calls) - before == 2
        same(actual, uses_allowed(x, y))


@pytest.mark.parametrize("through", ["ember", "torch.compile"])
def test_an_allowed_function_s_gradient_is_eager_s(through):
    compiled = ember.compile(uses_allowed, fullgraph=True) if through == "ember" \
        else torch.compile(uses_allowed, backend="ember", fullgraph=True)
    leaves = [t(5).requires_grad_(), t(5, seed=1).requires_grad_()]
    copies = [leaf.detach().clone().requires_grad_() for leaf in leaves]
    expected = uses_allowed(*leaves)
    actual = compiled(*copies)
    same(actual, expected)
    expected.sum().backward()
    actual.sum().backward()
    for leaf, copy in zip(leaves, copies):
        same(copy.grad, leaf.grad)


# -- is_compiling, graph_break, mark_static_address -------------------------------------------
def test_is_compiling_answers_true_while_ember_captures():
    def fn(x):
        answers = (torch.compiler.is_compiling(), torch._dynamo.is_compiling(),
                   torch.compiler.is_dynamo_compiling(), torch.compiler.is_exporting())
        return x + 1 if answers == (True, True, True, False) else x - 1

    report = ember.explain(fn)(t(3))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (1, 0, [1])
    same(ember.compile(fn, fullgraph=True)(t(3)), t(3) + 1)
    same(fn(t(3)), t(3) - 1)  # (eagerly, the other branch)


probe_calls: list[str] = []


@functools.lru_cache
@torch._dynamo.assume_constant_result
def backend_probe(name: str) -> bool:
    # (as transformers' is_torch_distributed_available: a C method it calls would break)
    probe_calls.append(name)
    return bool(torch.distributed.is_available()) and name == "gloo"


def test_a_function_marked_constant_result_under_lru_cache_answers_a_constant():
    def fn(x):
        return x + 1 if backend_probe("gloo") else x - 1

    probe_calls.clear()
    report = ember.explain(fn)(t(3))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (1, 0, [1])
    compiled = ember.compile(fn, fullgraph=True)
    same(compiled(t(3)), fn(t(3)))
    assert probe_calls == ["gloo"]  # (the cache's: called once, at the first capture)


def test_dynamo_s_graph_break_breaks_once():
    def fn(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    report = ember.explain(fn)(t(3))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (2, 1, [1, 1])
    assert "graph_break" in report.break_reasons[0].reason
    same(ember.compile(fn)(t(3)), fn(t(3)))


def test_mark_static_address_marks_the_real_tensor_and_adds_no_node():
    def fn(x, buffer):
        torch._dynamo.mark_static_address(buffer)
        return x + buffer

    report = ember.explain(fn)(t(3), t(3))
    assert (report.graph_count, report.graph_break_count, report.ops_per_graph) == (1, 0, [1])
    compiled = ember.compile(fn, fullgraph=True)
    eager_buffer, compiled_buffer = t(3, seed=1), t(3, seed=1)
    same(compiled(t(3), compiled_buffer), fn(t(3), eager_buffer))
    assert compiled_buffer._dynamo_static_input_type == \
        eager_buffer._dynamo_static_input_type == "unguarded"


# -- custom autograd.Function ----------------------------------------------------------------
class TenfoldBackward(torch.autograd.Function):
    """A forward with a backward of its own that autograd of the forward would not give."""

    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * scale, x.exp()

    @staticmethod
    def backward(ctx, grad_scaled, grad_exp):
        (x,) = ctx.saved_tensors
        return grad_scaled * ctx.scale * 10 + grad_exp * x.exp(), None


class BumpInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.add_(1)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _through_custom_function(x):
    scaled, exped = TenfoldBackward.apply(x * 2, 3.0)
    return (scaled + exped).sum()


def test_a_custom_autograd_function_is_one_call_with_its_own_backward():
    # (its apply was inlined and broke the graph twice; kept whole, the backward must still
    # be the Function's own — tracing into its forward gave autograd's gradient of x * scale)
    x = torch.randn(5, requires_grad=True)
    expected = x.detach().clone().requires_grad_()
    _through_custom_function(expected).backward()
    compiled = ember.compile(_through_custom_function)
    loss = compiled(x)
    loss.backward()
    same(loss.detach(), _through_custom_function(expected.detach()))
    same(x.grad, expected.grad)
    assert ember.explain(_through_custom_function)(x).graph_count == 1
    with torch.no_grad():
        same(compiled(x), _through_custom_function(x))


def test_a_custom_function_that_writes_its_input_runs_outside_the_graph():
    # (where autograd records the call: one call of the Function would hide the write)
    def fn(x):
        y = x * 2
        BumpInPlace.apply(y)
        return y + 1

    x = torch.randn(4, requires_grad=True)
    same(ember.compile(fn)(x), fn(x))
    report = ember.explain(fn)(x)
    assert (report.graph_count, report.graph_break_count) == (2, 1)
    assert "mark_dirty" in str(report.break_reasons[0])
    # where it records nothing, the forward is traced: its write is the graph's
    x = torch.randn(4)
    same(ember.compile(fn)(x.clone()), fn(x.clone()))
    report = ember.explain(fn)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


class ReverseGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha: float):
        ctx.alpha = alpha
        return x.view_as(x)  # (a view of its input: DANN's gradient reversal)

    @staticmethod
    def backward(ctx, grad):
        return grad.neg() * ctx.alpha, None


def test_a_custom_function_that_returns_a_view_of_its_input_runs_outside_the_graph():
    def fn(x):
        return (ReverseGradient.apply(torch.relu(x), 0.5) * 3).sum()

    x = torch.randn(5, requires_grad=True)
    expected = x.detach().clone().requires_grad_()
    fn(expected).backward()
    ember.compile(fn)(x).backward()
    same(x.grad, expected.grad)
    report = ember.explain(fn)(x)
    assert report.graph_break_count == 1 and "view of its input" in str(
        report.break_reasons[0])
