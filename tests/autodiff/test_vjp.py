"""Gradients of compiled training graphs against eager's, per family of primitives (each vjp
rule is reached through the aten ops that lower to it), plus gradcheck in float64."""

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, check_grad, compile_fn, make, watching_fallbacks

import ember
from ember import torch_internals
from ember.autodiff import tape
from ember.backends import compile_graph
from ember.ir import Op
from ember.runtime.training import TrainingGraph

TOLERANCE = dict(rtol=1e-4, atol=1e-5)

UNARY = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "sinh": torch.sinh, "cosh": torch.cosh,
    "tanh": torch.tanh, "atan": torch.atan, "asinh": torch.asinh, "erf": torch.erf,
    "erfc": torch.erfc, "sigmoid": torch.sigmoid, "abs": torch.abs, "neg": torch.neg,
    "floor": torch.floor, "relu": torch.relu, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "elu": F.elu,
    "leaky_relu": F.leaky_relu, "hardtanh": F.hardtanh, "softplus": F.softplus,
    "mish": F.mish, "square": lambda x: x ** 2, "cube": lambda x: x ** 3,
    "clamp": lambda x: x.clamp(-0.5, 0.7), "sign_mul": lambda x: torch.sign(x) * x,
}
POSITIVE = {
    "log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "pow_frac": lambda x: x ** 2.5, "acosh": lambda x: torch.acosh(x + 1.5),
}
UNIT = {"asin": torch.asin, "acos": torch.acos, "atanh": torch.atanh}


def one(f):
    return lambda x: f(x)  # (torch.fx traces Python functions, not builtins)


def two(f):
    return lambda x, y: f(x, y)


@pytest.mark.parametrize("name", UNARY)
def test_unary(name):
    check_grad(one(UNARY[name]), make(4, 5, low=-2, high=2), **TOLERANCE)


@pytest.mark.parametrize("name", POSITIVE)
def test_unary_on_positive_inputs(name):
    check_grad(one(POSITIVE[name]), make(4, 5, low=0.2, high=3), **TOLERANCE)


@pytest.mark.parametrize("name", UNIT)
def test_unary_inside_the_unit_interval(name):
    check_grad(one(UNIT[name]), make(4, 5, low=-0.9, high=0.9), **TOLERANCE)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
    "hypot": torch.hypot, "where": lambda x, y: torch.where(x > y, x * 2, y),
    "broadcast": lambda x, y: x * y[0] + y[:, :1], "scalar_ops": lambda x, y: 3 * x - y / 2,
    "pow_positive": lambda x, y: torch.pow(x.abs() + 0.5, y),
    "copysign": torch.copysign, "fmod": torch.fmod, "remainder": torch.remainder,
}


@pytest.mark.parametrize("name", BINARY)
def test_binary(name):
    check_grad(two(BINARY[name]), make(4, 5), make(4, 5, seed=1), **TOLERANCE)


def test_ties_split_the_gradient_as_eager_does():
    x = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 0.0]])
    check_grad(lambda a, b: (torch.maximum(a, b), a.amax(dim=1)), x, x.flip(1), **TOLERANCE)


def test_max_and_min_over_a_dim_give_a_tie_s_gradient_to_the_index_returned():
    # (eager's max(dim)/min(dim) backward selects by index; amax/amin split among ties)
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 1.0], [0.0, 0.0, 0.0]])
    check_grad(lambda a: (a.max(dim=1).values, a.min(dim=0, keepdim=True)[0],
                          torch.max(a, -1)[0] * a.amax(dim=1)), x, **TOLERANCE)


def test_a_norm_at_zero_has_eager_s_zero_gradient():
    # (the root's derivative at 0 is infinite: times the zero below it, NaN; eager masks it)
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]])
    check_grad(lambda a: (a.norm(), a.norm(dim=1), a.norm(p=3, dim=1),
                          torch.linalg.vector_norm(a, 4.5, dim=-1)), x, **TOLERANCE)
    check_grad(lambda a: a.norm(), torch.zeros(3), **TOLERANCE)


REDUCTIONS = {
    "sum": lambda x: x.sum(), "sum_dim": lambda x: x.sum(dim=1),
    "mean_keepdim": lambda x: x.mean(dim=0, keepdim=True), "amax": lambda x: x.amax(dim=-1),
    "amin": lambda x: x.amin(dim=(0, 2)), "max_dim": lambda x: x.max(dim=1).values,
    "var": lambda x: x.var(dim=-1), "std": lambda x: x.std(), "norm": lambda x: x.norm(dim=0),
    "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=1),
    "prod_dim": lambda x: x.prod(dim=1), "prod": lambda x: x.prod(),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions(name):
    check_grad(REDUCTIONS[name], make(3, 4, 5), **TOLERANCE)


VIEWS = {
    "reshape": lambda x: x.reshape(6, 10) * 2, "permute": lambda x: x.permute(2, 0, 1) * 2,
    "transpose_matmul": lambda x: x.transpose(1, 2) @ x, "expand": lambda x: x[:, :1].expand(
        3, 4, 5) * x, "slice_step": lambda x: x[:, 1::2, ::3] * 3,
    "squeeze_unsqueeze": lambda x: x[:1].squeeze(0).unsqueeze(-1) * 2,
    "flip": lambda x: x.flip(1) * x, "cat": lambda x: torch.cat([x, x * 2], dim=1),
    "pad": lambda x: F.pad(x, (1, 2, 0, 1)) * 2, "stack": lambda x: torch.stack([x, -x]),
    "index": lambda x: x[:, torch.tensor([0, 2, 2])] * 2,
    "gather": lambda x: torch.gather(x, 2, torch.tensor([[[0, 4]] * 4] * 3)),
    "unbind": lambda x: x.unbind(1)[0] * x.unbind(1)[3],
    "unfold": lambda x: x.unfold(2, 3, 1) * 2,  # overlapping windows
    "diagonal": lambda x: torch.diagonal(x, 1, 1, 2) * 3,
}


@pytest.mark.parametrize("name", VIEWS)
def test_views_and_data_movement(name):
    check_grad(VIEWS[name], make(3, 4, 5), **TOLERANCE)


NN = {
    "linear": lambda x, w, b: F.linear(x, w, b),
    "linear_3d": lambda x, w, b: F.linear(x.reshape(2, 3, 6), w, b),
    "layer_norm": lambda x, w, b: F.layer_norm(x, (6,), w[0], b),
    "mse": lambda x, w, b: F.mse_loss(x @ w.t(), b.expand(6, 6)),
    "cross_entropy": lambda x, w, b: F.cross_entropy(x @ w.t() + b, torch.tensor(
        [0, 5, 2, 1, 3, 4])),
    "bmm": lambda x, w, b: torch.bmm(x.reshape(2, 3, 6), w.t().expand(2, 6, 6)),
}


@pytest.mark.parametrize("name", NN)
def test_nn_functions(name):
    check_grad(NN[name], make(6, 6), make(6, 6, seed=1), make(6, seed=2), **TOLERANCE)


def test_native_dropout_scales_the_gradient_by_the_forwards_mask():
    # (what dropout on CUDA becomes: eager's fused kernel; any device runs the op itself)
    def fn(x):
        return torch.ops.aten.native_dropout.default(x * 2, 0.3, True)[0].sin()

    results = []
    for run in (compile_fn_for_training(fn), fn):
        x = make(8, 16).requires_grad_()
        torch.manual_seed(5)
        out = run(x)
        out.backward(torch.ones_like(out))
        results.append((out, x.grad))
    (got, got_grad), (want, want_grad) = results
    torch.testing.assert_close(got, want, **TOLERANCE)
    torch.testing.assert_close(got_grad, want_grad, **TOLERANCE)
    assert (want == 0).any() and (want != 0).any()  # (a mask was drawn)


def compile_fn_for_training(fn):
    x = make(8, 16).requires_grad_()
    compiled, graphs = compile_fn(fn, (x,))
    assert all(isinstance(g, TrainingGraph) for g in graphs)
    return compiled


def test_convolution_takes_torchs_own_backward():
    check_grad(lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1)), make(2, 3, 6, 6),
               make(4, 3, 3, 3, seed=1), make(4, seed=2), **TOLERANCE)


def test_inputs_without_grad_and_integer_outputs():
    def fn(x, y):
        return x * 2, (x > 0).sum(), y + 1

    x = make(3, 4)
    y = make(3, 4, seed=1)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x.requires_grad_(), y])
    out, count, other = graph(x, y)
    assert not count.requires_grad and not other.requires_grad
    (out.sum() * 3).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 6.0))


@pytest.mark.parametrize("fn", [
    lambda x, y: (torch.tanh(x) * y).sum(dim=0),
    lambda x, y: torch.softmax(x @ y.t(), dim=-1),
    lambda x, y: torch.sigmoid(x).amax(dim=1) / (y ** 2 + 1).sum(),
    lambda x, y: F.layer_norm(x, (5,)) * y,
], ids=["tanh_mul_sum", "softmax_matmul", "amax_div", "layer_norm"])
def test_gradcheck_in_float64(fn):
    x = make(4, 5, dtype=torch.float64).requires_grad_()
    y = make(4, 5, dtype=torch.float64, seed=1).requires_grad_()
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, y])
    assert type(compiled).__name__ == "TrainingGraph"
    assert torch.autograd.gradcheck(compiled, (x, y))


def test_extremes_with_nan_and_zeros_in_a_product_as_eager():
    x = torch.tensor([[1.0, float("nan"), 2.0], [0.0, 3.0, 0.0], [0.0, 2.0, 5.0]])
    check_grad(lambda a, b: (torch.maximum(a, b), a.amax(dim=1), a.prod(dim=1), a.prod()),
               x, x.flip(0), **TOLERANCE)


def test_the_product_of_a_0d_tensor_passes_the_cotangent_at_inf_and_nan():
    # (lowered through a size-1 axis, torch's general formula gave inf / inf = NaN)
    for value in (float("inf"), float("nan"), 0.0, -2.5):
        check_grad(lambda a: (a.prod(), (a * 2).prod()), torch.tensor(value), **TOLERANCE)


def test_relu_clamp_and_hardtanh_gradients_at_their_edges_as_eager():
    # eager: relu passes NaN and stops at 0 (-0 too); clamp passes at its bounds, hardtanh
    # does not; neither splits a tie as maximum/minimum do
    x = torch.tensor([-1.0, -0.5, -0.0, 0.0, 0.5, 1.0, float("nan"), 2.0, 6.0])
    check_grad(lambda a: (torch.relu(a), a.clamp(-0.5, 0.5), F.hardtanh(a), F.relu6(a),
                          a.clamp_min(0.0), torch.maximum(a, a.flip(0))), x, **TOLERANCE)


def test_a_random_library_call_is_not_run_again_for_its_backward():
    # (rrelu's functional variant: torch's formula for it reads the noise it was given, not
    # the noise it drew, so it is not taped; running it again would draw again)
    def fn(x):
        return F.rrelu(x, training=True) * 2

    x = make(4, 5).requires_grad_()
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x])
    assert type(graph).__name__ == "EagerGraph" and "is random" in graph.reason


class _Counting(torch_internals.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _kernel_calls(graph, inputs, word: str) -> tuple[list[str], list[str]]:
    """The aten calls naming `word` that a training step of `graph` makes: (forwards,
    backwards)."""
    with _Counting() as counted:
        graph(*inputs).sum().backward()
    kernels = [name for name in counted.names if word in name]
    return [n for n in kernels if "backward" not in n], [n for n in kernels if "backward" in n]


@pytest.mark.parametrize("value_requires_grad", [True, False])
@pytest.mark.parametrize("taped", [True, False])
def test_attention_in_a_training_step_runs_once_forward_and_once_backward(
        taped, value_requires_grad):
    # (its operands known to require grad or not — a symbolically traced graph keeps no
    # example values: the inputs' own flags — the CPU's flash kernel's backward is called by
    # the backward graph on what the forward kept: no tape, and nothing run again without one)
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    q, k, v = (make(2, 2, 8, 4, seed=i) for i in range(3))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_(value_requires_grad)
    with tape.kept(taped):
        graph = compile_graph(torch.fx.symbolic_trace(fn), [q, k, v])
    assert isinstance(graph, TrainingGraph) and graph.split.tapes == 0
    expected = fn(q, k, v)
    expected.sum().backward()
    expected_grads = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    forwards, backwards = _kernel_calls(graph, (q, k, v), "attention")
    assert len(forwards) == 1 and len(backwards) == 1, forwards + backwards
    torch.testing.assert_close(graph(q, k, v), expected, rtol=0, atol=0)
    for t, grad in zip((q, k, v), expected_grads):
        if grad is None:
            assert t.grad is None
        else:
            torch.testing.assert_close(t.grad, grad, rtol=0, atol=0)


@pytest.mark.parametrize("taped", [True, False])
def test_a_library_call_without_a_rule_runs_once_forward_with_the_tape(taped):
    # (its forward keeps eager's autograd record on the step's tape, and the backward uses
    # it; without the tape, for CUDA graphs, the backward runs the forward again)
    def fn(x, grid):
        return F.grid_sample(x, grid, align_corners=False) * 2

    x, grid = make(2, 3, 5, 5).requires_grad_(), make(2, 4, 4, 2, seed=1).requires_grad_()
    with tape.kept(taped):
        graph = compile_graph(torch.fx.symbolic_trace(fn), [x, grid])
    assert isinstance(graph, TrainingGraph) and graph.split.tapes == int(taped)
    forwards, backwards = _kernel_calls(graph, (x, grid), "grid_sampler")
    assert len(forwards) == (1 if taped else 2) and len(backwards) == 1, forwards + backwards
    check_grad(fn, x.detach(), grid.detach(), **TOLERANCE)


def test_attention_with_a_row_masked_by_the_most_negative_float_has_eager_s_gradients():
    # (Hugging Face's left padding: `(1 - mask) * finfo.min`; eager's fused kernel and the
    # composite differ in the backward of a row whose every key is masked)
    mask = torch.zeros(4, 4)
    mask[0] = torch.finfo(torch.float32).min
    mask[2, 3] = float("-inf")

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    check_grad(attention, make(1, 2, 4, 8), make(1, 2, 4, 8, seed=1), make(1, 2, 4, 8, seed=2),
               **TOLERANCE)


def test_accumulating_writes_differentiate_without_leaving_the_compiled_backward():
    # (torch's backward of index_put/scatter_add hands the incoming gradient back as the
    # gradient of `self`: a result sharing an operand's memory sent the backward to eager)
    from helpers import watching_fallbacks

    index = torch.tensor([1, 3, 1])
    with watching_fallbacks() as fallbacks:
        check_grad(lambda x, v: (x.index_put((index,), v, accumulate=True),
                                 x.scatter_add(0, index, v)), make(4), make(3, seed=1),
                   **TOLERANCE)
    assert not fallbacks.messages, "; ".join(fallbacks.messages)


def test_sinc_at_zero_has_eager_s_zero_gradient():
    check_grad(lambda a: torch.special.sinc(a), torch.tensor([0.0, 0.5, -1.5]), **TOLERANCE)


def test_an_in_place_op_under_no_grad_on_a_value_made_in_the_graph_keeps_its_history():
    # (eager does not record the write but keeps the value's own history: the gradient still
    # flows to what made it; only writes into inputs — an EMA — stop it)
    import ember

    def fn(x):
        y = x * 3
        with torch.no_grad():
            y.add_(1)
        return y * x

    grads = []
    for run in (fn, ember.compile(fn)):
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        run(x).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])


CONVOLUTIONS = {
    "bias": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), (2, 4, 9, 9), (6, 4, 3, 3)),
    "groups": (lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2), (2, 4, 7, 7),
               (6, 2, 3, 3)),
    "depthwise_dilated": (lambda x, w, b: F.conv2d(x, w, b, padding=2, dilation=2, groups=4),
                          (2, 4, 8, 8), (4, 1, 3, 3)),
    "transposed": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, output_padding=1),
                   (2, 4, 5, 5), (4, 3, 3, 3)),
    "1d": (lambda x, w, b: F.conv1d(x, w, b, padding=1), (2, 3, 11), (5, 3, 3)),
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["rows", "channels_last"])
@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_convolution_gradients_are_eagers_convolution_backward(name, channels_last):
    fn, x_shape, w_shape = CONVOLUTIONS[name]
    if channels_last and len(x_shape) != 4:
        pytest.skip("channels-last is a 4-d layout")
    x, w = make(*x_shape), make(*w_shape, seed=1)
    b = make(w_shape[1] if name == "transposed" else w_shape[0], seed=2)
    if channels_last:
        x, w = (t.to(memory_format=torch.channels_last) for t in (x, w))
    check_grad(fn, x, w, b, **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x.requires_grad_(), w.requires_grad_(),
                                                        b.requires_grad_()])
    targets = [n.attrs["target"] for n in graph.split.backward.nodes if n.op is Op.LIBRARY]
    # one call of eager's backward kernel: the forward is not run again for it
    assert targets == [torch.ops.aten.convolution_backward.default]


def test_a_convolution_of_an_input_without_grad_asks_only_for_the_weights():
    x, w = make(2, 3, 8, 8), make(4, 3, 3, 3, seed=1).requires_grad_()
    graph = compile_graph(torch.fx.symbolic_trace(lambda x, w: F.conv2d(x, w)), [x, w])
    (call,) = [n for n in graph.split.backward.nodes if n.op is Op.LIBRARY]
    assert call.attrs["args"][-1] == [False, True, False]
    graph(x, w).sum().backward()
    expected = w.detach().clone().requires_grad_()
    F.conv2d(x, expected).sum().backward()
    torch.testing.assert_close(w.grad, expected.grad, **TOLERANCE)


FOLDED_PRODUCTS = {
    # (a transposed activation: folding copies it; eager folds when the weight requires grad)
    "linear": (lambda x, w, b: F.linear(x.transpose(1, 2), w, b).transpose(1, 2) + x,
               (4, 6, 5), (6, 6)),
    "linear_no_bias": (lambda x, w, b: F.linear(x.transpose(1, 2), w) * b, (4, 6, 5), (6, 6)),
    "matmul_4d": (lambda x, w, b: torch.relu(x.transpose(2, 3) @ w) + b, (2, 3, 6, 5),
                  (6, 6)),
    "matrix_first": (lambda x, w, b: (w @ x.transpose(1, 2)).sum(1) + b, (4, 6, 5), (6, 5)),
    "batch_of_one": (lambda x, w, b: torch.matmul(w.unsqueeze(0), x).sum() + b,
                     (4, 6, 5), (6, 6)),
}


@pytest.mark.parametrize("name", FOLDED_PRODUCTS)
def test_a_product_eager_folds_for_its_weight_s_gradient_is_folded(name):
    # (eager's matmul folds a batched operand into one product when the other operand
    # requires grad, even where that copies a transposed activation, and drops a batch of one
    # from an operand that requires grad: the weight's gradient is then one product, not a
    # batched product summed over the batch — ResMLP's token mixing)
    fn, x_shape, w_shape = FOLDED_PRODUCTS[name]
    x, w, b = make(*x_shape), make(*w_shape, seed=1), make(w_shape[0], seed=2)
    check_grad(fn, x, w, b, **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [t.clone().requires_grad_()
                                                        for t in (x, w, b)])
    targets = {n.attrs["target"] for part in (graph.split.forward, graph.split.backward)
               for n in part.nodes if n.op is Op.LIBRARY}
    assert torch.ops.aten.bmm.default not in targets, targets


def test_values_the_forward_realizes_for_a_matmul_are_saved_not_recomputed():
    # (each layer's normalized input feeds its matmul: recomputing it in the backward chained
    # every layer's recomputation to the one before, one kernel over the whole network)
    def fn(x, w1, w2, w3):
        h = x
        for w in (w1, w2, w3):
            h = h + torch.tanh(F.layer_norm(h, (16,)) @ w)
        return h.sum()

    x = make(8, 16).requires_grad_()
    weights = [make(16, 16).requires_grad_() for _ in range(3)]
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x, *weights])
    assert isinstance(graph, TrainingGraph)
    saved = graph.split.saved
    matmuls = [n for n in graph.split.forward.nodes if n.op is Op.LIBRARY]
    operands = {n.inputs[0] for n in matmuls}
    assert len(matmuls) == 3 and operands <= set(saved)
    check_grad(fn, x, *weights, **TOLERANCE)


def test_a_residual_stream_is_saved_not_recomputed_from_every_layer_s_matmuls():
    # (a pre-norm residual stream: each layer's sum is read again after the layer's matmul,
    # so the forward stores it anyway; recomputed, the backward summed every layer's matmul
    # result again in one kernel — ViT-B/16's first backward kernel, 471 us on the H200)
    def fn(x, w1, w2, w3, w4):
        h = x
        for w in (w1, w2, w3, w4):
            h = h + F.layer_norm(h, (16,)) @ w
        return F.layer_norm(h, (16,)).sum()

    x = make(8, 16).requires_grad_()
    weights = [make(16, 16, seed=k).requires_grad_() for k in range(4)]
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x, *weights])
    assert isinstance(graph, TrainingGraph)
    saved = set(graph.split.saved)
    matmuls = [n for n in graph.split.forward.nodes if n.op is Op.LIBRARY]
    sums = [n for n in graph.split.forward.nodes if n.op is Op.ADD and
            any(source in matmuls for source in n.inputs)]
    # the sums read after a matmul are saved, and no matmul result but the last layer's (the
    # last sum, read by nothing after a matmul, is recomputed from it)
    assert len(matmuls) == 4 and len(sums) == 4
    assert set(sums[:3]) <= saved and saved & set(matmuls) == {matmuls[-1]}
    check_grad(fn, x, *weights, **TOLERANCE)


def test_an_expanded_input_s_gradient_is_dense():
    # (its gradient took the input's strides, stride 0 among them: each row's gradient was
    # written over the others' — torch.distributions.Normal's scale broadcast over a batch)
    weight = make(3).requires_grad_()
    x = torch.linspace(-1, 1, 12).reshape(4, 3)

    def fn(x, scale):
        return (x * torch.log(scale)).sum()

    scale = weight.exp().expand(4, 3)
    compiled = ember.compile(fn)
    compiled(x, scale).backward()
    got, weight.grad = weight.grad, None
    fn(x, weight.exp().expand(4, 3)).backward()
    torch.testing.assert_close(got, weight.grad, **TOLERANCE)


def test_attention_with_a_mask_that_requires_grad_trains_compiled_as_eager():
    # (T5's position bias: with operands that require grad eager's attention lays its result
    # out otherwise than the no-grad run the graph was planned on; the taped call hands the
    # planned layout on, and the graph kept running eagerly from its first call before)
    def fn(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0) * 2

    q, k, v = (make(2, 4, 16, 16).requires_grad_() for _ in range(3))
    bias = make(1, 4, 16, 16).requires_grad_()
    with watching_fallbacks() as fallbacks:
        check_grad(fn, q, k, v, bias, **TOLERANCE)
    assert not fallbacks.messages


def test_a_channels_last_network_saves_its_convolutions_inputs_as_they_are_used():
    # (a saved value whose strides the IR left to the schedule — an in-place relu's — was
    # saved row-major: timm's ResNet-50 copied each such relu output into channels-last for
    # its convolution in the forward, and back for the convolution's backward — 103 copies
    # a step on the H200, 1.21x torch.compile's step)
    def fn(x, w1, w2, weight, bias):
        h = F.conv2d(x, w1, padding=1)
        h = F.relu(F.batch_norm(h, None, None, weight, bias, training=True), inplace=True)
        return F.relu(F.conv2d(h, w2, padding=1)).sum()

    x = make(2, 4, 8, 8)  # (row-major images into a channels-last model, as timm's)
    w1, w2 = (make(8, c, 3, 3, seed=s).to(memory_format=torch.channels_last).requires_grad_()
              for c, s in ((4, 1), (8, 2)))
    weight, bias = make(8, seed=3).requires_grad_(), make(8, seed=4).requires_grad_()
    check_grad(fn, x, w1, w2, weight, bias, **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x, w1, w2, weight, bias])
    assert isinstance(graph, TrainingGraph)
    for part in (graph.forward_graph, graph.backward_graph):
        assert "relaid(" not in part.wrapper_source, part.wrapper_source


@pytest.mark.parametrize("ignored", [False, True], ids=["all_targets", "ignore_index"])
def test_cross_entropy_backward_is_one_kernel_without_a_dense_scatter(ignored):
    # (a language model's loss: the gradient of the picked log-probabilities was a dense
    # zeros-and-scatter library call the size of the logits, and the max that shifts the
    # softmax was differentiated — two more passes over each row for a gradient that is 0)
    def fn(logits, target):
        return F.cross_entropy(logits, target)

    logits = make(6, 37)
    target = torch.randint(0, 37, (6,), generator=torch.Generator().manual_seed(0),
                           device="cpu").to(DEVICE)
    if ignored:
        target[2] = -100
    check_grad(fn, logits, target, **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [logits.requires_grad_(), target])
    assert isinstance(graph, TrainingGraph)
    assert [n for n in graph.split.backward.nodes if n.op is Op.LIBRARY] == []
    assert not any(n.op is Op.MAX for n in graph.split.backward.nodes)
    # (the mean's scale, one scalar; then one pass over the rows)
    assert graph.backward_graph.kernel_count == 2


def test_a_gather_of_one_position_per_row_differentiates_to_a_select():
    def fn(x, index):
        return torch.gather(x, 1, index) * 3

    x = make(4, 9, 5)
    index = torch.randint(0, 9, (4, 1, 5), generator=torch.Generator().manual_seed(0),
                          device="cpu").to(DEVICE)
    check_grad(fn, x, index, **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x.requires_grad_(), index])
    assert [n for n in graph.split.backward.nodes if n.op is Op.LIBRARY] == []
    # several positions per row can pick one element twice: those still add up
    wide = torch.tensor([[0, 0, 3]]).expand(4, 3).contiguous()
    check_grad(lambda x, index: torch.gather(x, 1, index) * 3, make(4, 9), wide, **TOLERANCE)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_gradients_do_not_pass_through_the_shifting_max(log):
    def fn(x):
        return F.log_softmax(x, dim=-1) if log else F.softmax(x, dim=-1)

    x = make(3, 4, 50, low=-3, high=3)
    x[0, 0, :] = 2.0  # a row of ties: every element is its max
    check_grad(fn, x, **TOLERANCE)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x.requires_grad_()])
    assert not any(n.op is Op.MAX for n in graph.split.backward.nodes)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's FFT layout (cuFFT lays results out "
                                            "as planned)")
def test_a_taped_result_laid_out_otherwise_than_planned_is_said_once(monkeypatch):
    # (the plan takes a library call's layout from the meta kernel or a run without grad;
    # where the call under autograd lays its result out otherwise, the tape copies it into
    # the planned layout — values kept, strides the plan's — and says so once per call.
    # rfftn's layout is learned from a run on stand-ins; without that run, its meta
    # kernel's permuted strides are the plan)
    from helpers import captured_log

    from ember.lower import layout

    monkeypatch.delitem(layout.LAYOUTS_FROM_A_RUN, torch.ops.aten._fft_r2c.default)

    def fn(x):
        return torch.fft.rfftn(x, norm="ortho")

    compiled = ember.compile(fn)
    x = make(5, 6, 7).requires_grad_()
    with captured_log("fallbacks") as said:
        for _ in range(3):
            got = compiled(x)
    torch.testing.assert_close(got, fn(x))
    relaid = [r.getMessage() for r in said if "not the planned" in r.getMessage()]
    assert len(relaid) == 1 and "(24, 4, 1)" in relaid[0] and "(6, 1, 30)" in relaid[0]


@pytest.mark.parametrize("out_features", [1, 5])
def test_a_biased_product_s_gradient_is_ember_s_own_whatever_the_bias_s_broadcast(
        out_features):
    # (a Linear whose result is the graph's output is addmm again (whole_biased_matmuls);
    # with one output feature its bias comes as a column, (rows, 1), and the rule took only
    # a row of biases: the product was taped, its backward a nested autograd call each step
    # — a tiny MLP's training step 2x eager's time)
    def fn(x, w1, b1, w2, b2):
        return F.linear(F.linear(x, w1, b1).relu(), w2, b2)

    x = make(8, 6)
    params = [make(6, 6, seed=1), make(6, seed=2), make(out_features, 6, seed=3),
              make(out_features, seed=4)]
    graph = compile_graph(torch.fx.symbolic_trace(fn),
                          [x, *(p.clone().requires_grad_() for p in params)])
    assert isinstance(graph, TrainingGraph) and graph.split.tapes == 0
    check_grad(fn, x, *params, **TOLERANCE)


@pytest.mark.parametrize("options", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, stride=1, divisor_override=3)], ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["rows", "channels_last"])
def test_an_average_pooling_s_gradient_is_eager_s_kernel_not_the_tape(options, channels_last):
    # (its backward is avg_pool2d_backward in the backward graph; taped, each step ran a
    # nested autograd call for it: DenseNet's transitions)
    def fn(x):
        return F.avg_pool2d(x.relu() * 2, **options) + 1

    x = make(2, 3, 7, 6)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x.clone().requires_grad_()])
    assert isinstance(graph, TrainingGraph) and graph.split.tapes == 0
    check_grad(fn, x, **TOLERANCE)


@pytest.mark.parametrize("dim, largest", [(-1, True), (0, False), (1, True)])
def test_topk_s_gradient_is_eager_s_scatter_not_the_tape(dim, largest):
    # (a router's top-k: the values' gradient scattered at the indices, in the backward
    # graph; taped, each step ran a nested autograd call for it)
    def fn(x):
        values, indices = torch.topk(x * 2, 2, dim=dim, largest=largest)
        return values.softmax(-1) + indices.float()

    x = make(4, 5, 3)
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x.clone().requires_grad_()])
    assert isinstance(graph, TrainingGraph) and graph.split.tapes == 0
    check_grad(fn, x, **TOLERANCE)
