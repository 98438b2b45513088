"""ember.partition: an FX graph split into compiled regions and eager islands, in the order
they run, and what each region reads (ember/codegen/glue.py joins them; tests/e2e/
test_eager_islands.py runs them against eager)."""

import operator

import pytest
import torch
import torch.fx

from ember.partition import (
    Island,
    Region,
    Unknowable,
    elsewhere,
    keeps_its_place,
    module_device,
    region_examples,
    region_module,
    split,
)


def _pieces(fn, islands, *args):
    module = torch.fx.symbolic_trace(fn)
    partition = split(module, {name: "refused" for name in islands})
    text = [f"island {p.node.name}" if isinstance(p, Island) else
            "region " + " ".join(n.name for n in p.nodes) for p in partition.pieces]
    return partition, text


def test_a_chain_is_cut_at_its_island():
    def fn(x):
        return x.exp().mean(0).sin()

    _, pieces = _pieces(fn, ["mean"])
    assert pieces == ["region exp", "island mean", "region sin"]


def test_islands_that_do_not_read_each_other_share_regions():
    def fn(x, y):  # (in the graph's order: exp, mean, sin, mean_1, add)
        p = x.exp().mean(0)
        q = y.sin().mean(0)
        return p + q

    _, pieces = _pieces(fn, ["mean", "mean_1"])
    assert pieces == ["region exp sin", "island mean", "island mean_1", "region add"]


def test_a_node_that_only_feeds_a_later_region_sinks_into_it():
    def fn(x):
        m = x.mean(0)
        r = x.relu()
        return r - m

    _, pieces = _pieces(fn, ["mean"])
    assert pieces == ["island mean", "region relu sub"]


def test_an_in_place_write_keeps_its_place_after_an_island_that_reads_first():
    def fn(x):
        m = x.mean(0)   # the island reads x before the write
        x.add_(1)
        return m + x

    partition, pieces = _pieces(fn, ["mean"])
    assert pieces == ["island mean", "region add_ add"]
    (region,) = partition.regions
    assert [n.name for n in region.inputs] == ["x", "mean"]
    assert [n.name for n in region.outputs] == ["add"]


def test_nothing_moves_across_a_write_it_could_see():
    def fn(x):
        a = x * 2         # reads x before the write: it may not sink past it
        x.mul_(3)
        m = x.mean(0)
        return a + m

    _, pieces = _pieces(fn, ["mean"])
    assert pieces == ["region mul mul_", "island mean", "region add"]


def test_items_of_an_islands_tuple_and_grad_mode_switches_are_glue():
    def fn(x):
        top = torch.topk(x, 2)
        return top[0] * 2 + top[1]

    module = torch.fx.symbolic_trace(fn)
    nodes = {n.name: n for n in module.graph.nodes}
    with module.graph.inserting_before(nodes["mul"]):  # (as Dynamo records torch.no_grad())
        module.graph.call_function(torch._C._set_grad_enabled, (False,))
    with module.graph.inserting_after(nodes["mul"]):
        module.graph.call_function(torch._C._set_grad_enabled, (True,))
    module.recompile()
    partition = split(module, {"topk": "refused"})
    pieces = [f"island {p.node.name}" if isinstance(p, Island) else
              "region " + " ".join(n.name for n in p.nodes) for p in partition.pieces]
    assert pieces == ["island topk", "island getitem", "island _set_grad_enabled",
                      "region mul", "island _set_grad_enabled_1", "island getitem_1",
                      "region add"]
    assert [i.node.name for i in partition.islands] == ["topk"]  # (the rest: no reason)
    assert [r.grad_enabled for r in partition.regions] == [False, True]


@pytest.mark.parametrize("call, fixed", [
    (lambda x: x.add_(1), True),
    (lambda x: torch.relu_(x), True),
    (lambda x: torch.nn.functional.relu(x, inplace=True), True),
    (lambda x: torch.nn.functional.relu(x, True), True),
    (lambda x: torch.nn.functional.dropout(x, 0.5), True),
    (lambda x: torch.rand_like(x), True),
    (lambda x: torch.add(x, 1, out=x), True),
    (lambda x: x.add(1), False),
    (lambda x: torch.nn.functional.relu(x), False),
    (lambda x: x[0], False),
])
def test_which_nodes_keep_their_place(call, fixed):
    module = torch.fx.symbolic_trace(call)
    (node,) = [n for n in module.graph.nodes if n.op in ("call_function", "call_method")]
    assert keeps_its_place(node) is fixed


def test_an_item_assignment_keeps_its_place():
    graph = torch.fx.Graph()
    node = graph.call_function(operator.setitem, (graph.placeholder("x"), 0, 1.0))
    assert keeps_its_place(node)


def test_a_region_module_takes_its_inputs_by_their_nodes_names():
    def fn(x, w):
        return (x.mean(0) @ w).relu(), x.exp()

    partition, _ = _pieces(fn, ["mean"])
    first, second = partition.regions
    module = region_module(partition.module, second)
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    assert [n.name for n in module.graph.nodes if n.op == "placeholder"] == ["mean", "w"]
    torch.testing.assert_close(module(x.mean(0), w), ((x.mean(0) @ w).relu(),))
    assert isinstance(first, Region) and [n.name for n in first.outputs] == ["exp"]


def test_examples_are_the_metadata_a_region_starts_with():
    def fn(x):
        y = x.t().contiguous().t().mean(0, keepdim=True)   # column-major in, the island
        x.unsqueeze_(0)                                    # restrides an input
        return y * 2 + x

    module = torch.fx.symbolic_trace(fn)
    partition = split(module, {"mean": "refused", "unsqueeze_": "refused"})
    x = torch.randn(3, 4, requires_grad=False)
    examples, _, _ = region_examples(partition, [x])
    last = partition.regions[-1]
    seen = {n.name: e for n, e in zip(last.inputs, examples[last.number])}
    assert seen["x"].shape == (1, 3, 4) and x.shape == (3, 4)  # (a fake run: x untouched)
    assert seen["mean"].shape == (1, 4) and seen["mean"].tensor


def test_a_shape_only_the_data_knows_makes_its_readers_unknowable():
    def fn(x):
        return x[x > 0].sum() + x.exp()

    module = torch.fx.symbolic_trace(fn)
    with pytest.raises(Unknowable) as raised:
        region_examples(split(module, {}), [torch.randn(4)])
    assert set(raised.value.islands) == {"getitem", "sum_1", "add"}


def _with_fake_values(calls, *shapes, device="cuda"):
    """A graph of `calls` ((name, function, args[, kwargs]): an arg naming an earlier node is that
    node; the last call is the result) over placeholders x0, x1, ... of `shapes`, each
    node's example value a fake tensor on `device` (the CUDA of a machine without one: fake
    tensors need no device). Built by hand: symbolic_trace would run a `torch.rand([])`,
    which reads no input, while tracing, not record it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = torch.fx.Graph()
    nodes = {f"x{i}": graph.placeholder(f"x{i}") for i in range(len(shapes))}
    for name, function, args, *kwargs in calls:
        nodes[name] = graph.call_function(
            function, tuple(nodes[a] if isinstance(a, str) else a for a in args), *kwargs)
        nodes[name].name = name
    graph.output(nodes[calls[-1][0]])
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    with FakeTensorMode():
        inputs = [torch.empty(shape, device=device) for shape in shapes]

        class Recording(torch.fx.Interpreter):
            def run_node(self, node):
                value = super().run_node(node)
                node.meta["example_value"] = value
                return value

        Recording(module).run(*inputs)
    return module


# (said, not left to the default device: EMBER_TEST_DEVICE=cuda makes CUDA the default)
_ON_CPU = {"device": "cpu"}


def test_a_draw_and_its_readers_on_the_cpu_are_islands_beside_a_cuda_graph():
    # a layer drop (whisper, wav2vec2, BART in training): `torch.rand([])` on the CPU, its
    # comparison read by nothing once the branch was decided; before, the region reading it
    # ran eagerly as a whole ("inputs live on several devices")
    module = _with_fake_values([
        ("relu", torch.relu, ("x0",)),
        ("rand", torch.rand, ([],), _ON_CPU),
        ("lt", operator.lt, ("rand", 0.0)),
        ("mul", operator.mul, ("relu", 2)),
        ("rand_1", torch.rand, ([],), _ON_CPU),
        ("lt_1", operator.lt, ("rand_1", 0.0)),
        ("add", operator.add, ("mul", 1))], (4, 8))
    device = module_device(module)
    assert device == torch.device("cuda", 0)
    islands = {n.name: elsewhere(n, device) for n in module.graph.nodes
               if n.op == "call_function" and elsewhere(n, device) is not None}
    assert islands == {"rand": "makes a tensor on cpu, the graph runs on cuda:0",
                       "lt": "makes a tensor on cpu, the graph runs on cuda:0",
                       "rand_1": "makes a tensor on cpu, the graph runs on cuda:0",
                       "lt_1": "makes a tensor on cpu, the graph runs on cuda:0"}
    # the CPU's draws use the CPU's generator: they do not cut the CUDA work in two, and
    # keep their order among themselves
    pieces = [f"island {p.node.name}" if isinstance(p, Island) else
              "region " + " ".join(n.name for n in p.nodes)
              for p in split(module, islands).pieces]
    assert pieces == ["region relu mul add", "island rand", "island lt", "island rand_1",
                      "island lt_1"]


def test_the_cpus_draws_do_not_cut_a_cuda_graph_between_its_own_draws():
    # BART training on CUDA: each layer's `torch.rand([])` layer drop (on the CPU) between
    # dropouts on the GPU. A draw on the graph's device keeps its order among the graph's
    # draws and writes, not among pure islands: before, each dropout after a layer drop
    # began a region of its own (24 islands cut BART's training graph into 25 compiles)
    module = _with_fake_values([
        ("relu", torch.relu, ("x0",)),
        ("rand", torch.rand, ([],), _ON_CPU),
        ("lt", operator.lt, ("rand", 0.0)),
        ("drop", torch.nn.functional.dropout, ("relu", 0.1, True)),
        ("rand_1", torch.rand, ([],), _ON_CPU),
        ("lt_1", operator.lt, ("rand_1", 0.0)),
        ("drop_1", torch.nn.functional.dropout, ("drop", 0.1, True)),
        ("add", operator.add, ("drop_1", 1))], (4, 8))
    device = module_device(module)
    islands = {n.name: elsewhere(n, device) for n in module.graph.nodes
               if n.op == "call_function" and elsewhere(n, device) is not None}
    assert set(islands) == {"rand", "lt", "rand_1", "lt_1"}
    pieces = [f"island {p.node.name}" if isinstance(p, Island) else
              "region " + " ".join(n.name for n in p.nodes)
              for p in split(module, islands).pieces]
    assert pieces == ["region relu drop drop_1 add", "island rand", "island lt",
                      "island rand_1", "island lt_1"]


def test_a_write_still_waits_for_the_pure_islands_before_it():
    # (an island may read what the write changes: writes keep their place among islands)
    module = _with_fake_values([
        ("relu", torch.relu, ("x0",)),
        ("rand", torch.rand, ([],), _ON_CPU),
        ("lt", operator.lt, ("rand", 0.0)),
        ("add_", torch.Tensor.add_, ("relu", 1)),
        ("mul", operator.mul, ("add_", 2))], (4, 8))
    device = module_device(module)
    islands = {"rand": "elsewhere", "lt": "elsewhere"}
    pieces = [f"island {p.node.name}" if isinstance(p, Island) else
              "region " + " ".join(n.name for n in p.nodes)
              for p in split(module, islands).pieces]
    assert device == torch.device("cuda", 0)
    assert pieces == ["island rand", "island lt", "region relu add_ mul"]


def test_a_draw_on_the_graphs_device_keeps_its_place():
    module = _with_fake_values([
        ("relu", torch.relu, ("x0",)),
        ("rand", torch.rand, ([],), {"device": "cuda"}),
        ("rand_1", torch.rand, ([],), _ON_CPU),
        ("mul", operator.mul, ("relu", "rand"))], (4, 8))
    device = module_device(module)
    on_cuda, on_cpu = (n for n in module.graph.nodes if n.name in ("rand", "rand_1"))
    assert keeps_its_place(on_cuda, device) and elsewhere(on_cuda, device) is None
    assert not keeps_its_place(on_cpu, device)
    assert keeps_its_place(on_cpu, None)  # (no device known: every draw keeps its place)
