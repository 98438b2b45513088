"""Eager islands: a node ember cannot compile runs as an eager call inside the compiled graph,
between compiled regions (ember/partition.py, ember/codegen/glue.py), instead of sending the
whole graph to eager. Each test compares with eager (outputs, strides, what happened to the
inputs, aliasing, gradients) and counts the compiled regions and the islands."""

import copy
import importlib.util

import pytest
import torch
from helpers import (
    DEVICE,
    Recorder,
    assert_close,
    captured_log,
    make,
    sharing,
    significant_strides,
    watching_fallbacks,
)

import ember
from ember.backends import EagerGraph, compile_graph
from ember.lower import Unsupported, lowerings
from ember.lower.registry import aten
from ember.runtime.build import BuildError
from ember.runtime.compiled import CompiledGraph
from ember.runtime.partitioned import PartitionedGraph
from ember.runtime.training import TrainingGraph


@pytest.fixture
def refuse(monkeypatch):
    """refuse(op): lowering raises Unsupported at that aten op, as at an op ember cannot
    compile."""
    def refuse_op(op):
        def rule(*args, **kwargs):
            raise Unsupported(f"{op} refused by the test")

        monkeypatch.setitem(lowerings, op, rule)

    return refuse_op


def check_islands(fn, *args, regions: int, islands: int) -> PartitionedGraph:
    """Compile `fn` (from torch.fx.symbolic_trace), run it twice beside eager on copies of
    `args`, compare, and count its compiled regions and eager islands."""
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    with torch.no_grad(), watching_fallbacks():
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(args))
        eager_args = copy.deepcopy(args)
        expected = fn(*eager_args)
        for _ in range(2):  # (a region's first call runs its checked wrapper)
            got_args = copy.deepcopy(args)
            actual = compiled(*got_args)
            assert_close(actual, expected)
            assert_close(got_args, eager_args)
            assert sharing(actual, got_args) == sharing(expected, eager_args)
            for got, want in zip(torch.utils._pytree.tree_leaves(actual),
                                 torch.utils._pytree.tree_leaves(expected)):
                if isinstance(want, torch.Tensor):
                    assert significant_strides(got) == significant_strides(want)
    assert isinstance(compiled, PartitionedGraph), getattr(compiled, "reason", compiled)
    assert (compiled.region_count, compiled.island_count) == (regions, islands), \
        compiled.glue_source
    assert compiled.eager_region_count == 0, compiled.islands
    assert all(isinstance(r, CompiledGraph) for r in compiled.regions.values())
    return compiled


def test_an_op_ember_refuses_in_the_middle_runs_eagerly_between_two_regions(refuse):
    refuse(aten.mean.dim)

    def fn(x, w):
        a = torch.tanh(x) * 2
        pooled = a.mean((2, 3))        # the island
        return (pooled @ w).relu() + 1, a

    with captured_log("fallbacks") as records:
        graph = check_islands(fn, make(2, 4, 5, 5), make(4, 3), regions=2, islands=1)
    assert graph.kernel_count >= 2
    assert graph.islands == [f"Tensor.mean (mean): {aten.mean.dim} refused by the test"]
    assert any("Tensor.mean runs as an eager island" in r.getMessage() for r in records)
    assert "mean = mul.mean((2, 3))" in graph.glue_source  # (the graph's own call)


def test_an_op_without_a_meta_kernel_is_an_island():
    # (fake quantization, as quantization-aware training runs it: torch has no meta kernel)
    def fn(x, w):
        a = torch.tanh(x @ w)
        q = torch.fake_quantize_per_tensor_affine(a, 0.1, 0, -128, 127)
        return (q * 2 + 1).relu()

    graph = check_islands(fn, make(4, 5), make(5, 6), regions=2, islands=1)
    assert "no fake impl or Meta kernel" in graph.islands[0]


def test_independent_islands_share_the_regions_around_them(refuse):
    refuse(aten.mean.dim)

    def fn(x, y):  # in the graph's order: region, island, region, island, region
        p = x.exp().mean(1, keepdim=True)
        q = y.sin().mean(1, keepdim=True)
        return p * 2 + q

    check_islands(fn, make(4, 5), make(4, 5, seed=1), regions=2, islands=2)


def test_work_that_only_feeds_later_nodes_waits_for_them(refuse):
    refuse(aten.mean.dim)

    def fn(x):  # (x.relu() joins the region that reads it: it is not handed across)
        m = x.mean(1, keepdim=True)
        r = x.relu()
        return r - m

    graph = check_islands(fn, make(4, 5), regions=1, islands=1)
    assert graph.kernel_count == 1


def test_an_island_writes_an_input_in_place_between_a_read_and_a_read(refuse):
    refuse(aten.mul.Tensor)  # (x.mul_(y) is lowered through mul)

    def fn(x, y):
        before = x.exp()
        x.mul_(y)
        return before - x, x.sin()

    graph = check_islands(fn, make(4, 5), make(4, 5, seed=1), regions=2, islands=1)
    assert "x.mul_(y)" in graph.glue_source


def test_a_write_after_an_island_waits_for_the_island_to_read(refuse):
    refuse(aten.mean.dim)

    def fn(x):
        m = x.mean(0)   # the island reads x first
        x.add_(1)
        return m + x

    check_islands(fn, make(4, 5), regions=1, islands=1)


def test_views_made_by_an_island_keep_eagers_aliasing(refuse):
    refuse(aten.t.default)

    def fn(x):
        a = x * 2
        b = a.t()                  # an island's view of a region's result
        return b + 1, b, a, x[0]   # (b and a share memory; x[0] is a view of the input)

    check_islands(fn, make(3, 4), regions=2, islands=1)


def test_a_lazily_conjugated_result_is_never_handed_to_a_compiled_region():
    # (x.H is a view with torch's conj bit, .imag of it one with the neg bit: kernels read
    # memory, not bits, so the ops that read them run eagerly until a plain tensor comes out)
    def fn(x):
        return (torch.fft.fft(x).H.imag * 2).relu()

    graph = check_islands(fn, make(4, 8), regions=2, islands=3)
    assert "conj/neg bits" in graph.islands[1]


def test_an_alias_that_a_later_island_writes_through_is_made_eagerly():
    # (CLIP's logit_scale.data.clamp_: in a training graph `.data` is compiled as a value of
    # its own, so the write would not reach the parameter)
    def fn(x, scale):
        out = x * scale
        scale.data.clamp_(0, 1.0)
        return out

    recorder = Recorder()
    x, scale = make(3, 4), torch.tensor(5.0, device=DEVICE, requires_grad=True)
    ember.compile(fn, backend=recorder)(x, scale).sum().backward()
    (graph,) = recorder.compiled
    assert isinstance(graph, PartitionedGraph) and graph.island_count == 2
    assert "compiled, it would be a copy" in graph.islands[0]
    assert scale.item() == 1.0
    assert_close(scale.grad, x.sum())


def test_training_runs_through_an_island(refuse):
    refuse(aten.mean.dim)

    def fn(x, w):
        a = torch.tanh(x @ w)
        m = a.mean(1, keepdim=True)
        return ((a - m) ** 2).sum(), m

    x, w = make(4, 5).requires_grad_(), make(5, 3, seed=1).requires_grad_()
    graph = compile_graph(torch.fx.symbolic_trace(fn), [x, w])
    assert isinstance(graph, PartitionedGraph) and graph.trains
    assert (graph.region_count, graph.island_count) == (2, 1)
    assert all(isinstance(r, TrainingGraph) for r in graph.regions.values())
    reference = [t.detach().clone().requires_grad_() for t in (x, w)]
    for _ in range(2):
        loss, m = graph(x, w)
        (loss + m.sum()).backward()
        expected_loss, expected_m = fn(*reference)
        (expected_loss + expected_m.sum()).backward()
        assert_close((loss, m), (expected_loss, expected_m))
        assert_close((x.grad, w.grad), (reference[0].grad, reference[1].grad))
        for t in (x, w, *reference):
            t.grad = None


def test_an_island_under_no_grad_inside_a_training_graph(refuse):
    refuse(aten.mean.default)

    def fn(x, w):
        y = torch.tanh(x @ w)
        with torch.no_grad():
            scale = y.mean() + 1      # the island, and a region, under no_grad
        return (y / scale).sum()

    recorder = Recorder()
    compiled = ember.compile(fn, backend=recorder)
    x, w = make(4, 5).requires_grad_(), make(5, 3, seed=1).requires_grad_()
    reference = [t.detach().clone().requires_grad_() for t in (x, w)]
    loss, expected = compiled(x, w), fn(*reference)
    loss.backward()
    expected.backward()
    assert_close((loss, x.grad, w.grad), (expected, reference[0].grad, reference[1].grad))
    (graph,) = recorder.compiled
    assert isinstance(graph, PartitionedGraph) and graph.island_count == 1, graph
    assert [r.grad_enabled for r in graph.partition.regions] == [True, False, True]


def test_a_region_whose_build_fails_runs_eagerly_and_the_rest_compiles(refuse, monkeypatch,
                                                                        kernel_backend):
    if kernel_backend != "c":
        pytest.skip("the C compiler's build is what fails here")
    import ember.compile_plan

    refuse(aten.mean.dim)
    builds = []

    def build_once(source, flags):  # the first region builds, the second's build fails
        builds.append(source)
        if len(builds) > 1:
            raise BuildError("cc failed (the test's)")
        return real_build(source, flags)

    real_build = ember.compile_plan.build
    monkeypatch.setattr(ember.compile_plan, "build", build_once)

    def fn(x):
        m = x.exp().mean(1, keepdim=True)
        return (m * 3).sin()

    x = make(4, 5)
    with captured_log("fallbacks") as records:
        graph = compile_graph(torch.fx.symbolic_trace(fn), [x])
    assert isinstance(graph, PartitionedGraph)
    assert (graph.region_count, graph.eager_region_count, graph.island_count) == (1, 1, 1)
    assert any("region 1 (2 ops): cc failed" in i for i in graph.islands)
    assert any(r.levelno >= 30 and "cc failed" in r.getMessage() for r in records)
    assert_close(graph(x), fn(x))


def test_a_data_dependent_shape_makes_its_readers_islands():
    def fn(x):
        positive = x[x > 0]                # nonzero: only the data knows the shape
        return positive.sum() * 2, x.exp()

    graph = check_islands(fn, make(4, 5), regions=1, islands=3)
    assert "depends on the data" in graph.islands[1]


def test_sparse_tensors_are_made_and_read_in_islands():
    # a sparse tensor has no storage to compare: the islands' alias check raised
    # NotImplementedError, and the whole graph ran eagerly as after an internal error
    def fn(x, values):
        sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 2]]), values, (3, 3))
        return torch.sparse.mm(sparse, x.sin()) + 1, sparse.to_dense() * 2

    x, values = make(3, 2).cpu(), make(2, seed=1).cpu()
    compiled = ember.compile(fn)
    with watching_fallbacks() as fallbacks:
        for _ in range(2):
            assert_close(compiled(x, values), fn(x, values))
    assert not [m for m in fallbacks.messages if "internal error" in m], fallbacks.messages
    report = ember.explain(fn)(x, values)
    assert (report.graph_count, report.graph_break_count, len(report.eager_islands)) == (1, 0, 3)


def test_explain_lists_each_island_and_why(refuse):
    refuse(aten.mean.dim)

    def fn(x):
        return torch.tanh(x).mean(0) + 1

    for options in ({}, {"backend": "ember"}):  # (by default explain compiles nothing)
        report = ember.explain(fn, **options)(make(4, 5))
        assert report.eager_islands == [f"Tensor.mean (mean): {aten.mean.dim} refused by the "
                                        f"test"]
        assert "Eager islands:\n  1. Tensor.mean (mean)" in str(report)
    assert ember.explain(lambda x: x.tanh())(make(3)).eager_islands == []


def test_an_island_in_a_graph_torch_compile_hands_over(refuse):
    refuse(aten.mean.dim)

    def fn(x):
        return (x.sin().mean(-1) * 2).cos()

    recorder = Recorder()
    compiled = torch.compile(fn, backend=recorder, fullgraph=True, dynamic=False)
    x = make(3, 4)
    assert_close(compiled(x), fn(x))
    (graph,) = recorder.compiled
    assert isinstance(graph, PartitionedGraph) and graph.island_count == 1


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")
def test_a_channels_last_resnet_compiles_without_islands(kernel_backend):
    # (adaptive_avg_pool2d(x, 1) on channels_last restrides its mean with as_strided_; that
    # once sent the whole model to eager)
    if kernel_backend == "triton" and DEVICE == "cpu":
        pytest.skip("a whole ResNet under the Triton interpreter is too slow for the suite")
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", num_classes=10).eval().to(DEVICE)
    model = model.to(memory_format=torch.channels_last)
    x = make(1, 3, 32, 32).to(memory_format=torch.channels_last)
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder, dynamic=False)
    with torch.no_grad(), watching_fallbacks() as fallbacks:
        actual, expected = compiled(x), model(x)
    assert recorder.compiled and all(isinstance(g, CompiledGraph) for g in recorder.compiled), \
        fallbacks.messages
    assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    assert not isinstance(recorder.compiled[0], (EagerGraph, PartitionedGraph))


class _Ema(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model, self.ema = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.ema.requires_grad_(False)

    def forward(self, x):
        with torch.no_grad():
            # (state_dict's values are detached aliases of the parameters: the in-place write
            # through them is an eager island, which cuts the graph into regions)
            for e, m in zip(self.ema.state_dict().values(), self.model.state_dict().values()):
                e.lerp_(m, 0.1)
            for e, m in zip(self.ema.parameters(), self.model.parameters()):
                e.mul_(0.9).add_(m, alpha=0.1)
        return self.ema(x)


def test_a_region_that_writes_an_input_another_input_aliases_writes_it_eagerly():
    # the next region took the bias's detached alias and the bias itself as two inputs and
    # wrote both, each from the original values: ema(x) read a bias without the lerp
    torch.manual_seed(0)
    eager, compiled_model = _Ema().to(DEVICE), _Ema().to(DEVICE)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = ember.compile(compiled_model)
    x = make(2, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), eager(x))
    for (name, ours), theirs in zip(compiled_model.state_dict().items(),
                                    eager.state_dict().values()):
        torch.testing.assert_close(ours, theirs, msg=name)


class _LayerDrop(torch.nn.Module):
    """transformers' layer drop (Whisper, wav2vec2, BART): a draw on the CPU's generator per
    layer, whatever the model's device; with layerdrop 0 no layer is ever dropped. Each
    layer's dropout draws on the model's device, between the CPU's draws."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.layerdrop = 0.0

    def forward(self, x):
        for layer in self.layers:
            dropout_probability = torch.rand([])
            if self.training and dropout_probability < self.layerdrop:
                continue
            x = torch.nn.functional.dropout(torch.tanh(layer(x)), 0.25, self.training)
        return x


@pytest.fixture
def cpu_default_device():
    """Factories that name no device make CPU tensors, as in a user's process (the suite on
    CUDA makes them on the GPU: tests/conftest.py)."""
    before = torch.get_default_device()
    if before.type == "cpu":  # (setting it again would leave torch's device mode active)
        yield
        return
    torch.set_default_device("cpu")
    yield
    torch.set_default_device(before)


def test_a_layer_drops_cpu_draws_leave_a_cuda_model_compiled_whole(cpu_default_device):
    # on CUDA each draw is an eager island beside one compiled region (before, that region
    # ran eagerly: "inputs live on several devices"), the comparison that read it dropped
    # once the branch was decided (folding._drop_unread_comparisons); on the CPU nothing is
    # an island
    torch.manual_seed(0)
    model = _LayerDrop().to(DEVICE).train()
    compiled = ember.compile(copy.deepcopy(model))
    x = make(4, 8).to(DEVICE)
    explained = ember.explain(copy.deepcopy(model))(x)
    islands = [i.split(":")[0] for i in explained.eager_islands]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    assert islands == ([] if DEVICE == "cpu" else
                       ["rand (rand)", "rand (rand_1)"])
    for _ in range(2):
        torch.manual_seed(1)
        want = model(x.clone().requires_grad_())
        want.sum().backward()
        torch.manual_seed(1)
        got = compiled(x.clone().requires_grad_())
        got.sum().backward()
        assert_close(got, want)
        after_ember = torch.rand([])  # (the draws took from the CPU's generator as eager's)
        torch.manual_seed(1)
        model(x)
        assert torch.rand([]) == after_ember
        for mine, theirs in zip(compiled.parameters(), model.parameters()):
            assert_close(mine.grad, theirs.grad)
            mine.grad = theirs.grad = None


class _CpuAttribute(torch.nn.Module):
    """A tensor kept as a plain attribute, which `model.to(device)` leaves on the CPU
    (ConViT's rel_indices), moved by the forward where it is used."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.scale = torch.linspace(0.5, 2.0, 8, device="cpu")

    def forward(self, x):
        return torch.tanh(self.linear(x)) * self.scale.to(x.device)


def _compiled_whole_and_trained_as_eager(model, x, islands: int) -> None:
    """`model` explained as one graph with `islands` eager islands, then two training steps
    compiled against eager's: outputs and every gradient."""
    compiled = ember.compile(copy.deepcopy(model))
    explained = ember.explain(copy.deepcopy(model))(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    assert len(explained.eager_islands) == islands, explained.eager_islands
    for _ in range(2):
        want = model(x)
        want.sum().backward()
        got = compiled(x)
        got.sum().backward()
        assert_close(got, want)
        for mine, theirs in zip(compiled.parameters(), model.parameters()):
            assert_close(mine.grad, theirs.grad)
            mine.grad = theirs.grad = None


def test_a_tensor_kept_on_the_cpu_leaves_a_cuda_model_compiled():
    # on CUDA the move reads the CPU input: that node is an eager island, the rest one
    # compiled region (before, "tensors on several devices" sent the whole graph to eager)
    torch.manual_seed(0)
    model = _CpuAttribute().to(DEVICE).train()
    assert model.scale.device.type == "cpu"
    _compiled_whole_and_trained_as_eager(model, make(4, 8).to(DEVICE),
                                         islands=0 if DEVICE == "cpu" else 1)


class _CpuTable(torch.nn.Module):
    """ConViT's relative positions: a table built on the CPU on every call, written into
    through views, then moved to the model's device."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 5)

    def forward(self, x):
        n = x.shape[1]
        table = torch.zeros(1, n, n, 3)
        offsets = torch.arange(n).view(1, -1) - torch.arange(n).view(-1, 1)
        table[:, :, :, 0] = offsets
        table[:, :, :, 1] = offsets ** 2
        table[:, :, :, 2] = offsets.abs().float().sqrt()
        table = table.to(self.linear.weight.device)
        return torch.tanh(self.linear(table)).sum(-1) * x.sum(-1, keepdim=True)


def test_a_table_built_on_the_cpu_and_moved_is_computed_once_and_compiles_whole(
        cpu_default_device):
    # (on CUDA its zeros, aranges, writes and move were eager islands: ConViT, MPNet,
    # XLNet; they are now a constant of the graph, ember/folding.py)
    torch.manual_seed(0)
    _compiled_whole_and_trained_as_eager(_CpuTable().to(DEVICE).train(),
                                         make(2, 6, 4).to(DEVICE), islands=0)


class _CpuIndex(torch.nn.Module):
    """Data2Vec-Vision's and BEiT's relative position bias: an index made on the CPU per call
    picks from a table of parameters on the model's device."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(7, 2))

    def forward(self, x):
        n = x.shape[1]
        offsets = torch.arange(n).view(1, -1) - torch.arange(n).view(-1, 1) + n - 1
        bias = self.table[offsets.view(-1)].view(n, n, 2).permute(2, 0, 1)
        return (x.unsqueeze(1) @ x.unsqueeze(1).transpose(-1, -2)).softmax(-1) + bias


def test_an_index_made_on_the_cpu_moves_once_and_the_model_compiles_whole(
        cpu_default_device):
    torch.manual_seed(0)
    _compiled_whole_and_trained_as_eager(_CpuIndex().to(DEVICE), make(2, 4, 4).to(DEVICE),
                                         islands=0)
