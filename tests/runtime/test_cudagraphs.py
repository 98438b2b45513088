"""mode="reduce-overhead": CUDA-graph recording and replay (ember/runtime/cudagraphs.py).

The replay tests need an NVIDIA GPU (marked `gpu`); without one, what is checked is that the
mode says why it cannot record and runs the graph without CUDA graphs, with eager's results.
"""

import copy

import pytest
import torch
from helpers import captured_log

import ember
from ember import config
from ember.runtime.cudagraphs import ShapeGraphs, serves_several_shapes

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def mlp(x, w1, w2):
    return torch.tanh(x @ w1) @ w2 + 1


def test_cpu_tensors_run_without_cuda_graphs_and_say_why():
    compiled = ember.compile(mlp, mode="reduce-overhead")
    args = [torch.randn(4, 8, device="cpu"), torch.randn(8, 8, device="cpu"),
            torch.randn(8, 3, device="cpu")]
    with captured_log("perf") as records:
        for _ in range(3):
            torch.testing.assert_close(compiled(*args), mlp(*args))
    assert any("no CUDA graph: tensors on cpu" in r.getMessage() for r in records)
    report = ember.explain(mlp, mode="reduce-overhead")(*args)
    assert report.cuda_graphs == ["not used: tensors on cpu (CUDA graphs replay CUDA work only)"]
    assert "CUDA graphs: not used: tensors on cpu" in str(report)


def test_cpu_training_graphs_run_without_cuda_graphs_and_say_why():
    model = torch.nn.Linear(8, 3).to("cpu")
    compiled = ember.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 8, device="cpu")
    with captured_log("perf") as records:
        compiled(x).sum().backward()
    assert any("no CUDA graph: tensors on cpu" in r.getMessage() for r in records)
    assert model.weight.grad is not None


def test_graphs_over_symbolic_sizes_on_the_cpu_run_without_cuda_graphs_and_say_why():
    fn = lambda x: torch.tanh(x) * 2 + 1  # noqa: E731
    compiled = ember.compile(fn, mode="reduce-overhead")
    with captured_log("perf") as records:
        for batch in [3, 5, 9, 5, 3]:
            x = torch.randn(batch, 8, device="cpu")
            torch.testing.assert_close(compiled(x), fn(x))
    assert len(compiled.records) == 2 and any(e.captured.symbolic for e in compiled.entries)
    assert any("no CUDA graph: tensors on cpu" in r.getMessage() for r in records)


def test_a_symbolic_training_graph_serves_several_shapes():
    # (its forward's symbols say so: before, only a plan's were read, and a symbolic
    # training graph would have been recorded at one shape and replayed at others)
    model = torch.nn.Linear(8, 3)
    compiled = ember.compile(model, dynamic=True)
    compiled(torch.randn(4, 8)).sum().backward()
    training = compiled._compiled_forward.records[0].compiled
    assert type(training).__name__ == "TrainingGraph" and serves_several_shapes(training)


class Recording:
    """Stands in for one shape's CudaGraphed (no CUDA here): counts its calls."""

    def __init__(self, compiled, args, where):
        self.compiled, self.where, self.calls = compiled, where, 0
        self.shape = tuple(args[0].shape)

    def __call__(self, x):
        self.calls += 1  # (a replay: the graph's results, without calling the graph)
        return x * 2


def test_one_cuda_graph_per_shape_recorded_on_its_second_call_least_recent_dropped(
        monkeypatch):
    made: list[Recording] = []

    def make(self, args, where):
        made.append(Recording(self.compiled, args, where))
        return made[-1]

    monkeypatch.setattr(ShapeGraphs, "make", make)
    plain = []
    graphs = ShapeGraphs(lambda x: plain.append(tuple(x.shape)) or x * 2, [], "graph")
    script = [3, 3, 3, 5, 5, 7, 7, 3, 5, 9]
    with config.override(cuda_graph_shapes=2), captured_log("perf") as records:
        for batch in script:
            x = torch.randn(batch, 4)
            torch.testing.assert_close(graphs(x), x * 2)
        assert graphs.status() == "one per shape: 2 kept, 3 recorded, 1 dropped " \
                                  "(EMBER_CUDA_GRAPH_SHAPES=2)"
    # first calls run the graph plainly; a second call records (and runs the recording)
    assert [r.shape for r in made] == [(3, 4), (5, 4), (7, 4)]
    assert [r.calls for r in made] == [2, 2, 1]  # 3: recorded, replayed; 5: again at the end
    # 7's recording dropped 3's (least recently used): 3 met again is a first call
    assert plain == [(3, 4), (5, 4), (7, 4), (3, 4), (9, 4)]
    assert list(graphs.graphs) == [(((7, 4), (4, 1)),), (((5, 4), (4, 1)),)]
    said = [r.getMessage() for r in records]
    assert sum("met first: run without a CUDA graph" in m for m in said) == 5
    assert [m for m in said if "dropped" in m] == [
        "graph: dropped the CUDA graph of shapes [3, 4] (least recently used; "
        "EMBER_CUDA_GRAPH_SHAPES=2)"]


@cuda
@pytest.mark.gpu
def test_graphs_over_symbolic_sizes_keep_a_cuda_graph_per_shape():
    fn = lambda x: torch.tanh(x) * 2 + 1  # noqa: E731
    compiled = ember.compile(fn, mode="reduce-overhead")
    with captured_log("perf") as records:
        for batch in [3, 5, 9, 5, 9, 5, 3, 9]:
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), fn(x))
    said = [r.getMessage() for r in records]
    assert sum("recorded a CUDA graph" in m for m in said) == 3, said  # (3: the static entry)
    assert compiled.records[1].cuda_graph.status().startswith("one per shape: 2 kept")


@cuda
@pytest.mark.gpu
def test_symbolic_training_steps_replay_per_shape_as_eager_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    compiled = ember.compile(model, mode="reduce-overhead", dynamic=True)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for batch in [4, 6, 4, 6, 4, 6, 5]:
        x, y = torch.randn(batch, 16), torch.randn(batch, 4)
        for net, optimizer in ((compiled, optimizers[0]), (reference, optimizers[1])):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
        for ours, theirs in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    status = compiled._compiled_forward.records[0].cuda_graph.status()
    assert status.startswith("forward one per shape: 2 kept"), status


@cuda
@pytest.mark.gpu
def test_training_steps_replay_forward_and_backward_as_eager_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    compiled = ember.compile(model, mode="reduce-overhead")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
                  for m in (model, reference)]
    losses = []
    for step in range(5):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        for net, optimizer, kept in ((compiled, optimizers[0], losses),
                                     (reference, optimizers[1], None)):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
            if kept is not None:
                kept.append(loss)  # (kept losses: a later replay must not overwrite them)
            else:
                torch.testing.assert_close(losses[step], loss, rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    graphs = [r.cuda_graph.status() for r in compiled._compiled_forward.records]
    assert graphs == ["forward recorded, backward recorded"]


def test_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        ember.compile(mlp, mode="fastest")


@cuda
@pytest.mark.gpu
def test_outputs_of_earlier_calls_are_never_overwritten():
    compiled = ember.compile(mlp, mode="reduce-overhead")
    weights = [torch.randn(64, 64, device="cuda"), torch.randn(64, 32, device="cuda")]
    inputs = [torch.randn(16, 64, device="cuda") for _ in range(3)]
    kept = [compiled(x, *weights) for x in inputs]    # calls 2 and 3 replay the graph
    for x, result in zip(inputs, kept):
        torch.testing.assert_close(result, mlp(x, *weights), rtol=1e-3, atol=1e-3)
    report = ember.explain(mlp, mode="reduce-overhead")(inputs[0], *weights)
    assert report.cuda_graphs == ["recorded"]


@cuda
@pytest.mark.gpu
def test_in_place_updates_reach_the_callers_tensors():
    def step(x, state):
        state.mul_(0.5).add_(x)
        return state * 2, state

    compiled = ember.compile(step, mode="reduce-overhead")
    state, expected = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
    for _ in range(4):
        x = torch.randn(8, device="cuda")
        doubled, same = compiled(x, state)
        want, _ = step(x, expected)
        torch.testing.assert_close(state, expected)
        torch.testing.assert_close(doubled, want)
        assert same.data_ptr() == state.data_ptr()  # the view is of the caller's tensor


@cuda
@pytest.mark.gpu
def test_parameters_are_read_in_place_and_a_moved_one_records_again():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()).cuda().eval()
    compiled = ember.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 32, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)
        model[0].weight.data = torch.randn(32, 32, device="cuda")  # a new tensor: it moved
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)
        model[0].weight.add_(1)                                    # in place: replay sees it
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)


@cuda
@pytest.mark.gpu
def test_a_host_sync_inside_the_graph_runs_without_cuda_graphs():
    def fn(x):
        return torch.histc(x, bins=10) + 1  # the range (min, max) is read on the host

    compiled = ember.compile(fn, mode="reduce-overhead")
    x = torch.randn(100, device="cuda")
    with captured_log("perf") as records:
        for _ in range(3):
            torch.testing.assert_close(compiled(x), fn(x))
    assert any("no CUDA graph" in r.getMessage() for r in records)


@cuda
@pytest.mark.gpu
def test_replayed_training_never_overwrites_saved_values_or_gradients_still_held():
    # the forward's saved values and the backward's gradients are pool memory handed out
    # uncopied: accumulation, interleaved forwards and retain_graph must not see it overwritten
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    compiled = ember.compile(model, mode="reduce-overhead")
    xs = [torch.randn(8, 16) for _ in range(6)]

    def phases(net, params):
        grads = []
        for x in xs[:3]:                       # plain steps (the graphs are recorded)
            for p in params:
                p.grad = None
            net(x).pow(2).sum().backward()
        grads.append([p.grad.clone() for p in params])
        for x in xs[:3]:                       # accumulation: .grad held between backwards
            net(x).pow(2).sum().backward()
        grads.append([p.grad.clone() for p in params])
        for p in params:
            p.grad = None
        first, second = net(xs[3]).sum(), net(xs[4]).pow(2).sum()  # two forwards pending
        second.backward()
        first.backward()
        grads.append([p.grad.clone() for p in params])
        for p in params:
            p.grad = None
        kept = net(xs[5]).sum()
        kept.backward(retain_graph=True)       # saved values still needed ...
        net(xs[0]).sum()                       # ... while another forward runs
        kept.backward()
        grads.append([p.grad.clone() for p in params])
        return grads

    got = phases(compiled, list(model.parameters()))
    want = phases(reference, list(reference.parameters()))
    for phase, (ours, theirs) in enumerate(zip(got, want)):
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"phase {phase}")


@cuda
@pytest.mark.gpu
def test_eager_islands_are_recorded_with_the_regions_around_them(monkeypatch):
    from ember.lower import Unsupported, lowerings
    from ember.lower.registry import aten

    def refused(*args, **kwargs):
        raise Unsupported("refused by the test")

    monkeypatch.setitem(lowerings, aten.mean.dim, refused)  # (an island between two regions)

    def fn(x, w):
        return (torch.tanh(x @ w).mean(1, keepdim=True) * x).sum(0)

    compiled = ember.compile(fn, mode="reduce-overhead")
    args = [torch.randn(16, 32, device="cuda"), torch.randn(32, 32, device="cuda")]
    with captured_log("perf") as records:
        kept = [compiled(*args) for _ in range(3)]
    for result in kept:
        torch.testing.assert_close(result, fn(*args), rtol=1e-4, atol=1e-4)
    assert any("1 eager islands inside" in r.getMessage() for r in records)
    report = ember.explain(fn, mode="reduce-overhead", backend="ember")(*args)
    assert report.cuda_graphs == ["recorded"]
    assert report.eager_islands == ["Tensor.mean (mean): refused by the test"]


@cuda
@pytest.mark.gpu
def test_a_training_graph_with_an_island_runs_without_cuda_graphs_and_says_why(monkeypatch):
    from ember.lower import Unsupported, lowerings
    from ember.lower.registry import aten

    def refused(*args, **kwargs):
        raise Unsupported("refused by the test")

    monkeypatch.setitem(lowerings, aten.mean.dim, refused)

    def fn(x, w):
        return torch.tanh(x @ w).mean(1).sum()

    compiled = ember.compile(fn, mode="reduce-overhead")
    x = torch.randn(16, 32, device="cuda")
    w = torch.randn(32, 32, device="cuda", requires_grad=True)
    with captured_log("perf") as records:
        compiled(x, w).backward()
    assert any("no CUDA graph: a training graph with eager islands" in r.getMessage()
               for r in records)
    expected = w.grad.clone()
    w.grad = None
    fn(x, w).backward()
    torch.testing.assert_close(expected, w.grad, rtol=1e-4, atol=1e-4)


def test_a_recording_is_kept_only_where_its_copies_cost_less_than_the_launches_it_saves():
    from ember.runtime.cudagraphs import replay_loses

    # a softmax over 4096 x 1000 floats: one launch saved, 15.6 MiB in and as much out
    reason = replay_loses(1, 2 * 4096 * 1000 * 4)
    assert reason is not None and "31.2 MiB" in reason and "1 launches" in reason
    # sixty small kernels, a few KB copied: the replay pays
    assert replay_loses(60, 3 * 64 * 64 * 4) is None
    # a language model's logits (8 x 256 x 50257 bf16) after 150 launches: still pays
    assert replay_loses(150, 8 * 256 * 50257 * 2) is None
