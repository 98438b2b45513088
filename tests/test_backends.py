"""ember.backends: the backend contract and its fallbacks (each one logged, none fatal)."""

import logging

import pytest
import torch
from helpers import captured_log, check, check_grad

from ember import config
from ember.backends import EagerGraph, ShapeSpecialized, backend, compile_graph
from ember.runtime.compiled import CompiledGraph


def _fn(x):
    return torch.tanh(x) * 3


def _traced():
    return torch.fx.symbolic_trace(_fn)


def test_a_graph_compiles_and_matches_eager():
    compiled = check(_fn, torch.randn(4, 5), kernels=1)
    assert isinstance(compiled, CompiledGraph) and compiled.library_count == 0


def test_disabled_ember_runs_the_graph_eagerly_and_says_why():
    gm = _traced()
    with config.override(disable=True):
        result = backend(gm, [torch.randn(3)])
    assert isinstance(result, EagerGraph) and result.forward == gm.forward
    assert "EMBER_DISABLE" in result.reason
    x = torch.randn(3)
    torch.testing.assert_close(result(x), gm(x))


def test_training_graphs_compile_forward_and_backward():
    from ember.runtime.training import TrainingGraph

    x = torch.randn(3, requires_grad=True)
    compiled = compile_graph(_traced(), [x])
    assert isinstance(compiled, TrainingGraph)
    assert compiled.forward_graph.kernel_count == 1 and compiled.backward_graph.kernel_count == 1
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, 3 * (1 - torch.tanh(x.detach()) ** 2))
    with torch.no_grad():
        assert isinstance(compile_graph(_traced(), [x]), CompiledGraph)


def test_calls_while_a_c_library_builds_run_eagerly_then_its_kernels(tmp_path):
    # (the C compiler runs in a process of its own: a first call need not wait for it)
    from ember.backends import wait_for_background_compiles

    def fn(x, y):
        return torch.tanh(x * y + 1).sum(1)

    # (C kernels: on the CPU whatever the tests' default device)
    x, y = torch.randn(8, 32, device="cpu"), torch.randn(8, 32, device="cpu")
    with config.override(backend="c", eager_first=True, cache_dir=tmp_path), \
            captured_log("perf") as records:
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, y])
        assert isinstance(compiled, CompiledGraph) and not compiled.kernels_in
        torch.testing.assert_close(compiled(x, y), fn(x, y))
        wait_for_background_compiles()
        assert compiled.kernels_in
        torch.testing.assert_close(compiled(x, y), fn(x, y))
        torch.testing.assert_close(compiled(x * 2, y), fn(x * 2, y))
    said = [r.getMessage() for r in records]
    assert any("first call run eagerly while its kernels compile" in m for m in said)
    assert any("first run (checked" in m for m in said)
    with config.override(backend="c", eager_first=True, cache_dir=tmp_path):
        again = compile_graph(torch.fx.symbolic_trace(fn), [x, y])
        assert again.kernels_in  # (built already: nothing compiles beside its calls)
        torch.testing.assert_close(again(x, y), fn(x, y))


def test_a_training_graph_s_calls_while_its_kernels_compile_run_eagerly():
    # (as where its forward's Triton kernels compile beside the first call: the kernels'
    # future stood in for, on the CPU's compiled graph)
    import concurrent.futures

    def fn(x, w):
        return torch.tanh(x @ w).sum()

    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 5, requires_grad=True)
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w])
    pending = concurrent.futures.Future()
    compiled.forward_graph._later, compiled._eager_first = pending, True
    with captured_log("perf") as records:
        loss = compiled(x, w)
    loss.backward()
    eager_x, eager_w = x.detach().requires_grad_(), w.detach().requires_grad_()
    fn(eager_x, eager_w).backward()
    torch.testing.assert_close(loss, fn(x, w))
    torch.testing.assert_close(x.grad, eager_x.grad)
    torch.testing.assert_close(w.grad, eager_w.grad)
    assert any("run eagerly while its kernels compile" in r.getMessage() for r in records)
    assert compiled.output_views is None  # (its compiled forward has not run)
    assert compiled._backward_ran  # (the next call starts the backward for every output)
    x.grad = w.grad = None
    compiled(x, w).backward()  # (still compiling, only kernels: eager again)
    assert compiled.output_views is None and compiled._start_backward is None
    torch.testing.assert_close(x.grad, eager_x.grad)
    pending.set_result(None)  # (the kernels are in: the next call runs the compiled step)
    x.grad = w.grad = None
    compiled(x, w).backward()
    assert compiled.output_views is not None
    torch.testing.assert_close(x.grad, eager_x.grad)
    torch.testing.assert_close(w.grad, eager_w.grad)


def test_a_training_graph_whose_calls_take_no_backward_never_compiles_one():
    # (a decoding loop under grad mode: its outputs are read, never differentiated)
    def fn(x, w):
        return torch.tanh(x @ w) * 2

    from ember.backends import wait_for_background_compiles

    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    for eager_first in (False, True):
        with config.override(eager_first=eager_first), captured_log("perf") as records:
            compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w])
            for _ in range(3):
                got = compiled(x, w)
                torch.testing.assert_close(got, fn(x, w))
                assert got.requires_grad
            # (the last call on the kernels: calls that ran eagerly while they compiled —
            # all three, where Triton's take longer — differentiate through eager's graph)
            wait_for_background_compiles(start_deferred=False)  # (the backward stays unbuilt)
            got = compiled(x, w)
        assert not compiled.backward_started
        assert not any("_backward compiled" in r.getMessage() for r in records)
        got.sum().backward()  # (the first backward compiles it, and waits)
        assert compiled.backward_started
        eager_w = w.detach().requires_grad_()
        fn(x, eager_w).sum().backward()
        torch.testing.assert_close(w.grad, eager_w.grad)
        w.grad = None


def test_a_backward_wrapped_before_it_is_compiled_is_wrapped_when_first_taken():
    # (as a CUDA-graph recording wraps a training graph's backward: wrapping never compiles
    # it; the first backward that needs it compiles it and takes it wrapped, once)
    def fn(x, w):
        return torch.tanh(x @ w) * 2

    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    wrapped = []

    def wrapper(backward):
        wrapped.append(backward)
        return lambda *args: backward(*args)

    compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w])
    compiled.wrap_backward(wrapper)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert wrapped == [] and not compiled.backward_started and not compiled.backward_compiled
    compiled(x, w).sum().backward()
    assert len(wrapped) == 1 and compiled.backward_compiled
    eager_w = w.detach().requires_grad_()
    fn(x, eager_w).sum().backward()
    torch.testing.assert_close(w.grad, eager_w.grad)
    w.grad = None
    compiled(x, w).sum().backward()
    assert len(wrapped) == 1  # (taken wrapped once, then as it is)
    torch.testing.assert_close(w.grad, eager_w.grad)
    compiled.wrap_backward(wrapper)  # (compiled already: wrapped at once)
    assert len(wrapped) == 2


def test_a_backward_through_a_call_run_eagerly_starts_the_compile_on_the_next_call():
    import concurrent.futures

    def fn(x, w):
        return torch.tanh(x @ w)

    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w])
    pending = concurrent.futures.Future()  # (its kernels still compiling, stood in for)
    compiled.forward_graph._later, compiled._eager_first = pending, True
    compiled(x, w)  # (run eagerly, its outputs never differentiated)
    compiled(x, w)
    assert not compiled._backward_ran and not compiled.backward_started
    compiled(x, w).sum().backward()  # (eager's backward reaches an output)
    assert compiled._backward_ran and not compiled.backward_started
    compiled(x, w)
    assert compiled.backward_started


def test_a_training_graph_says_which_backward_arguments_the_forward_saved():
    def fn(x, w):
        return (x @ w).relu().sum(1), x.sum()  # the product is saved, the rest recomputed

    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 5, requires_grad=True)
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w])
    saved = compiled.saved_positions()
    # the forward returns the user's outputs, then what it saved: one backward argument each
    assert len(saved) == len(compiled.split.forward.outputs) - compiled.output_count == 1
    saved_shapes = [compiled.split.backward.inputs[k].shape for k in saved]
    assert saved_shapes == [(4, 5)]


def test_equal_subexpressions_take_their_own_cotangents_as_in_eager():
    # found by the property tests: merged before the differentiation, x1 / x0 twice took
    # (g0 + g1) * inf where eager sums g0 * inf + g1 * inf (NaN when the signs differ)
    def program(x0, x1):
        return torch.div(x1, x0), torch.div(x1, x0), torch.sum(x0)

    check_grad(program, torch.tensor([-0.0, -0.0]), torch.tensor(-0.25))
    check_grad(program, torch.tensor([0.5, -2.0]), torch.tensor(3.0))


def test_a_training_graph_without_a_rule_runs_eagerly_and_says_why():
    def fn(x):
        return torch.nn.functional.rrelu(x * 2, training=True)  # random: not run twice

    x = torch.randn(3, 2, requires_grad=True)
    with captured_log("fallbacks") as records:
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
    assert isinstance(compiled, EagerGraph)
    assert any("is random" in r.getMessage() for r in records)


def test_an_internal_error_falls_back_with_a_warning_or_raises_when_asked(monkeypatch):
    import ember.compile_plan

    def broken(graph):
        raise ZeroDivisionError("a bug in a pass")

    monkeypatch.setattr(ember.compile_plan, "schedule", broken)
    x = torch.randn(3)
    with captured_log("fallbacks") as records:
        compiled = compile_graph(_traced(), [x])
    (record,) = records
    assert record.levelno == logging.WARNING
    assert "internal error in ember (please report it): ZeroDivisionError" in record.getMessage()
    torch.testing.assert_close(compiled(x), _fn(x))
    with config.override(logs=frozenset({"raise"})), pytest.raises(ZeroDivisionError):
        compile_graph(_traced(), [x])


def test_the_interpreter_backend_gives_the_same_answers():
    def fn(x, y):
        x[0].add_(1)
        return torch.softmax(x * y, -1), x.t()

    with config.override(backend="interp"):
        compiled = check(fn, torch.randn(3, 4), torch.randn(4))
    assert compiled.kernel_count == 0


def _half(x):
    return torch.tanh(x[: x.shape[0] // 2]) * 3


def test_shape_symbolic_graphs_compile_once_or_once_per_shape():
    # Dynamo's symbolic graphs: once for every shape where ember's C backend can (every dim
    # a symbol, symbolic strides included: issue 18, stage 3); per shape where it cannot
    # (a floor-division size)
    for fn, sizes, per_shape in ((_fn, (3, 5, 3), False), (_half, (4, 6, 4), True)):
        recorder = []

        def counting(gm, example_inputs, recorder=recorder):
            compiled = backend(gm, example_inputs)
            recorder.append(compiled)
            return compiled

        torch._dynamo.reset()
        compiled_fn = torch.compile(fn, backend=counting, dynamic=True)
        for n in sizes:
            x = torch.randn(n, 2)
            torch.testing.assert_close(compiled_fn(x), fn(x))
        (compiled,) = recorder
        if per_shape:
            assert isinstance(compiled, ShapeSpecialized) and len(compiled.cache) == 2
            assert all(isinstance(c, CompiledGraph) for c in compiled.cache.values())
        else:
            assert isinstance(compiled, CompiledGraph)


def test_alignment_assumptions_cover_every_kind_of_kernel_argument():
    from ember.codegen.triton import Workspace
    from ember.compile_plan import _known_aligned
    from ember.schedule.plan import Buffer

    workspace = Workspace("kernel0_ws0", (98, 1), torch.float32)
    assert _known_aligned(workspace, set(), assume_inputs=False)
    inp = Buffer("in0", (4,), (1,), torch.float32, "input", input_index=0)
    assert _known_aligned(inp, {inp}, assume_inputs=True)
    assert not _known_aligned(inp, {inp}, assume_inputs=False)
    assert _known_aligned(Buffer("buf0", (4,), (1,), torch.float32, "temp"), set(), False)
    assert not _known_aligned(Buffer("lib0", (4,), (1,), torch.float32, "library"), set(), True)


def test_graphs_handed_over_under_autocast_keep_eagers_dtypes():
    # (a graph Dynamo hands over under torch.autocast, or with an autocast region inside, is
    # traced again with autocast's casts made explicit)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.randn(2, 8)
    device = x.device.type  # (the suite's default device: EMBER_TEST_DEVICE)

    def region(x):
        with torch.autocast(device, dtype=torch.bfloat16):
            y = model(x)
        return y, model(x)

    with torch.no_grad():
        compiled = torch.compile(model, backend="ember")
        with torch.autocast(device, dtype=torch.bfloat16):
            got, want = compiled(x), model(x)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
        (inside, outside), (want_inside, want_outside) = \
            torch.compile(region, backend="ember")(x), region(x)
        assert (inside.dtype, outside.dtype) == (torch.bfloat16, torch.float32)
        torch.testing.assert_close(inside, want_inside, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(outside, want_outside)
