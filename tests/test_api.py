"""ember.compile as users call it: decorator, methods, modules, backends."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from checks import same

import ember
from ember.runtime.compiled import CompiledGraph


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def test_decorator_forms():
    @ember.compile
    def plain(x):
        return x * 2

    @ember.compile(fullgraph=True, backend="eager")
    def configured(x):
        return x + 1

    same(plain(t(3)), t(3) * 2)
    same(configured(t(3)), t(3) + 1)
    assert configured.__name__ == "configured"


def test_bound_method_and_method_decorator():
    class Scaler:
        def __init__(self, k):
            self.k = k

        def apply(self, x):
            return x * self.k

        @ember.compile(backend="eager")
        def decorated(self, x):
            return x + self.k

    scaler = Scaler(3)
    same(ember.compile(scaler.apply, backend="eager")(t(2)), t(2) * 3)
    same(scaler.decorated(t(2)), t(2) + 3)
    same(Scaler(5).decorated(t(2)), t(2) + 5)


def test_module_wrapper_keeps_the_module_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    compiled = ember.compile(model)
    assert isinstance(compiled, torch.nn.Module)
    model.note = "kept"
    assert compiled.note == "kept"  # attributes reach the original module
    assert set(compiled.state_dict()) == {f"_orig_mod.{k}" for k in model.state_dict()}
    with torch.no_grad():
        same(compiled(t(3, 4)), model(t(3, 4)))
        compiled.eval()
        assert not model.training
        same(compiled(t(3, 4)), model(t(3, 4)))


def test_module_keyword_arguments():
    class Mixer(torch.nn.Module):
        def forward(self, x, *, scale=1.0, bias=None):
            y = x * scale
            return y if bias is None else y + bias

    compiled = ember.compile(Mixer(), backend="eager")
    same(compiled(t(3)), t(3))
    same(compiled(t(3), scale=2.0, bias=t(3, seed=1)), t(3) * 2 + t(3, seed=1))


def test_a_modules_hooks_run_around_its_compiled_forward():
    model = torch.nn.Linear(3, 3)
    seen = []
    model.register_forward_pre_hook(lambda module, inputs: (inputs[0] * 2,))
    model.register_forward_hook(lambda module, inputs, output: seen.append(output.shape))
    model.register_forward_hook(lambda module, inputs, output: output + 1)
    compiled = ember.compile(model)
    with torch.no_grad():
        same(compiled(t(2, 3)), model(t(2, 3)))
    assert len(seen) == 2
    assert compiled._compiled_forward.records[-1].graphs == 1  # (the forward was compiled)
    assert "forward" not in model.__dict__  # (the module is left as it was)


def test_ember_backend_end_to_end_compiles_kernels():
    def block(x, w, b):
        return F.layer_norm(F.gelu(x @ w + b), (w.shape[1],))

    graphs = []

    def recording(gm, example_inputs):
        result = ember.backend(gm, example_inputs)
        graphs.append(result)
        return result

    compiled = ember.compile(block, backend=recording, fullgraph=True)
    args = (t(8, 16), t(16, 32, seed=1), t(32, seed=2))
    with torch.no_grad():
        for _ in range(2):
            same(compiled(*args), block(*args))
    assert len(graphs) == 1 and isinstance(graphs[0], CompiledGraph)
    assert graphs[0].kernel_count <= 2 and graphs[0].library_count == 1


def test_same_answers_through_each_backend():
    def fn(x):
        return torch.softmax(x * 2, dim=-1) + x.mean()

    x = t(16, 16)
    for backend in ("eager", "ember"):
        same(ember.compile(fn, backend=backend)(x), fn(x))


def test_disable_switch_runs_eagerly():
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    compiled = ember.compile(fn, backend="eager")
    with ember.config.override(disable=True):
        same(compiled(t(2)), t(2) + 1)
    assert compiled.entries == [] and len(calls) == 1


def test_torch_compile_backend_name():
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend="ember")
    same(fn(t(5)), torch.tanh(t(5)) * 2)


def test_graphs_that_compute_nothing_reach_no_backend():
    # a break's resume function that only hands values on (here: returns y) is not compiled
    compiled_graphs = []

    def backend(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward

    def fn(x):
        y = x * 2
        print("between the graphs")
        return y

    compiled = ember.compile(fn, backend=backend)
    for _ in range(2):
        same(compiled(t(4)), t(4) * 2)
    assert len(compiled_graphs) == 1  # (x * 2; the identity after the print is not)


def test_a_hooked_submodule_trains_with_its_hook_inlined():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference = copy.deepcopy(model)
    for net in (model, reference):
        net[0].register_forward_hook(lambda module, inputs, output: output * 0.5)
    compiled = ember.compile(model)
    for net in (compiled, reference):
        net(t(4, 6)).pow(2).sum().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)
    # (the hook is traced into the model's one graph: nothing compiled apart)
    assert "_compiled_call_impl" not in model[0].__dict__
    assert compiled._compiled_forward.records[-1].graphs == 1


def test_a_submodule_whose_hook_cannot_be_traced_is_compiled_on_its_own():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference = copy.deepcopy(model)
    shapes = []
    for net in (model, reference):
        net[0].register_forward_hook(
            lambda module, inputs, output: shapes.append(output.sum().item()) or output * 0.5)
    compiled = ember.compile(model)
    for net in (compiled, reference):
        net(t(4, 6)).pow(2).sum().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)
    assert len(shapes) == 2 and shapes[0] == pytest.approx(shapes[1])
    # (the hooked Linear is compiled on its own, its hook run around it)
    routed = model[0].__dict__.get("_compiled_call_impl")
    assert routed is not None and routed.__self__._compiled_forward.records[-1].graphs == 1


@pytest.mark.parametrize("where", ["root", "submodule"])
def test_full_backward_hooks_run_as_in_eager(where):
    # (nn.Module's call wraps the forward's inputs and outputs for backward hooks: calling the
    # forward directly skipped them, and the gradients came out unscaled)
    def run(compile_model: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
        hooked = model if where == "root" else model[0]
        hooked.register_full_backward_hook(lambda module, grad_in, grad_out:
                                           (grad_in[0] * 10,))
        x = torch.ones(2, 3, requires_grad=True)
        (ember.compile(model) if compile_model else model)(x).sum().backward()
        return x.grad

    torch.testing.assert_close(run(True), run(False))


def test_a_forward_set_on_the_instance_is_the_one_called():
    # (accelerate's and PEFT's wrappers, a user's patch: nn.Module's call runs the instance's
    # forward, which shadows the class's)
    import functools

    def patched():
        torch.manual_seed(0)
        linear = torch.nn.Linear(2, 2)
        original = linear.forward

        def wrapper(module, x):
            return original(x) + 100

        linear.forward = functools.update_wrapper(functools.partial(wrapper, linear), original)
        return linear

    x = torch.ones(1, 2)
    for build in (patched, lambda: torch.nn.Sequential(torch.nn.ReLU(), patched())):
        model = build()
        torch.testing.assert_close(ember.compile(model)(x), model(x))


def test_a_compiled_model_or_function_called_inside_compiled_code_is_inlined():
    # (traced as it is, the capture went through ember's own runtime: hundreds of guards,
    # breaks in its timers, and the outer function recompiled as the inner cache grew)
    torch.manual_seed(0)
    inner_model = ember.compile(torch.nn.Linear(4, 4))

    @ember.compile
    def doubled(x):
        return x * 2

    def outer(x):
        return doubled(inner_model(x)).relu()

    x = torch.randn(2, 4)
    report = ember.explain(outer)(x)
    assert report.graph_count == 1 and report.graph_break_count == 0
    same(ember.compile(outer)(x), outer(x))


def test_a_hook_registered_on_a_submodule_after_compiling_runs():
    # (the capture inlines submodules' forwards: a later hook must make the next call
    # capture again; torch numbers every hook handle, so the guard is one comparison while
    # no hook is registered anywhere)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    compiled = ember.compile(model)
    x = torch.ones(2, 3)
    same(compiled(x), model(x))
    handle = model[0].register_forward_hook(lambda module, args, out: out * 0 - 1)
    same(compiled(x), model(x))
    handle.remove()
    same(compiled(x), model(x))
    pre = model[1].register_forward_pre_hook(lambda module, args: (args[0] + 5,))
    same(compiled(x), model(x))
    pre.remove()
    model[0].forward = lambda x: x * 0 + 3  # (a forward set on the instance later, too)
    same(compiled(x), model(x))
    del model[0].forward
    same(compiled(x), model(x))


def test_a_partial_and_an_object_with_a_python_call_compile():
    import functools

    def affine(x, scale, shift=0.0):
        return x * scale + shift

    class Scaler:
        def __init__(self, scale):
            self.scale = scale

        def __call__(self, x):
            return x.tanh() * self.scale

    x = torch.randn(3)
    same(ember.compile(functools.partial(affine, scale=2.0, shift=1.0))(x), affine(x, 2.0, 1.0))
    scaler = Scaler(3.0)
    compiled = ember.compile(scaler)
    same(compiled(x), scaler(x))
    assert len(compiled.entries) == 1  # (compiled, not called as it is)


@pytest.mark.parametrize("function", [torch.relu, F.gelu, torch.ops.aten.add.Tensor,
                                      torch.ops.aten.mul, torch.Tensor.sigmoid],
                         ids=["builtin", "c-function", "op", "op-packet", "tensor-method"])
def test_a_callable_without_python_code_compiles(function):
    # (torch.compile takes these too: each is compiled as one call of it, in one graph)
    x = torch.randn(4, 3)
    args = (x, x) if function in (torch.ops.aten.add.Tensor, torch.ops.aten.mul) else (x,)
    compiled = ember.compile(function)
    same(compiled(*args), function(*args))
    assert len(compiled.entries) == 1 and compiled.entries[0].eager_reason is None


def test_a_module_with_both_a_hook_and_an_instance_forward_runs_both():
    # (the hooks' path sets the instance's forward for its call: checked first, the user's
    # instance forward was replaced by the class's compiled one)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    model.forward = lambda x: x * 0 + 3
    model.register_forward_hook(lambda module, args, out: out + 1)
    x = torch.ones(1, 2)
    same(ember.compile(model)(x), model(x))
