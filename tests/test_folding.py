"""ember.folding: work a graph does from constants on another device (a table built on the CPU
and moved to the model's CUDA device), computed once when it compiles. Graphs built by hand
with fake CUDA example values (a machine without CUDA); the move to the graph's device is a
stand-in that copies on the CPU when it runs for real (tests/e2e/test_eager_islands.py runs
the real thing on CUDA)."""

import operator

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ember.folding import fold_constants_elsewhere


def _to_graph_device(t):
    """A fake CUDA tensor of `t`'s shape for a fake `t`; a copy on the CPU for a real one."""
    if isinstance(t, FakeTensor):
        return torch.empty(t.shape, dtype=t.dtype, device="cuda")
    return t.clone()


def _graph(calls, *outputs, shape=(4, 3)):
    """A graph over one placeholder x0 (a fake CUDA tensor of `shape`) of `calls` ((name,
    function or method name, args[, kwargs]): an arg naming an earlier node is that node),
    returning the nodes named in `outputs`; each node's example value recorded from a run on
    fake tensors."""
    graph = torch.fx.Graph()
    nodes = {"x0": graph.placeholder("x0")}
    for name, function, args, *kwargs in calls:
        make = graph.call_method if isinstance(function, str) else graph.call_function
        nodes[name] = make(function, tuple(nodes[a] if isinstance(a, str) and a in nodes else a
                                           for a in args), *kwargs)
        nodes[name].name = name
    graph.output(tuple(nodes[n] for n in outputs))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(shape, device="cuda")

        class Recording(torch.fx.Interpreter):
            def run_node(self, node):
                value = super().run_node(node)
                node.meta["example_value"] = value
                return value

        Recording(module).run(x)
    return module


_TABLE = [  # (ConViT's relative positions: a CPU table, written through a view, then moved)
    ("table", torch.zeros, ([4, 3],), {"device": "cpu"}),
    ("positions", torch.arange, (4,), {"device": "cpu"}),
    ("column", operator.getitem, ("table", (slice(None), 0))),
    ("write", torch.Tensor.copy_, ("column", "positions")),
    ("moved", _to_graph_device, ("table",)),
]
_WANT = torch.zeros(4, 3, device="cpu")
_WANT[:, 0] = torch.arange(4, device="cpu")


def test_a_table_built_on_another_device_and_moved_becomes_a_constant():
    module = _graph(_TABLE + [("scaled", torch.mul, ("x0", "moved"))], "scaled")
    assert fold_constants_elsewhere(module) == 1
    kinds = [(n.op, n.name) for n in module.graph.nodes]
    assert kinds == [("placeholder", "x0"), ("get_attr", "_ember_constant_0"),
                     ("call_function", "scaled"), ("output", "output")]
    torch.testing.assert_close(module._ember_constant_0, _WANT)  # (the write included)
    x = torch.randn(4, 3, device="cpu")  # (the stand-in move left the table there)
    torch.testing.assert_close(module(x)[0], x * _WANT)
    # a view of it that is only read
    module = _graph(_TABLE + [("flat", torch.Tensor.view, ("moved", 12)),
                              ("scaled", torch.mul, ("x0", "moved"))], "scaled", "x0")
    assert fold_constants_elsewhere(module) == 1
    torch.testing.assert_close(module(x)[0], x * _WANT)


def test_a_returned_table_is_a_copy_of_the_constant_per_call():
    # (ConViT keeps it as an attribute of the model: the caller gets a tensor of its own)
    module = _graph(_TABLE + [("scaled", torch.mul, ("x0", "moved"))], "scaled", "moved")
    assert fold_constants_elsewhere(module) == 1
    x = torch.randn(4, 3, device="cpu")  # (the stand-in move left the table there)
    first, second = module(x)[1], module(x)[1]
    torch.testing.assert_close(first, _WANT)
    assert first.data_ptr() not in (second.data_ptr(), module._ember_constant_0.data_ptr())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the move is a real one: CUDA")
def test_a_move_to_another_tensors_device_and_dtype_folds_by_its_metadata():
    # (XLNet: `-torch.eye(qlen).to(attn_mask)`, the mask made from the inputs)
    module = _graph([("eye", torch.eye, (4,), {"device": "cpu"}),
                     ("negated", torch.neg, ("eye",)), ("mask", torch.Tensor.double, ("x0",)),
                     ("moved", "to", ("negated", "mask")),
                     ("scaled", torch.mul, ("mask", "moved"))], "scaled", shape=(4, 4))
    assert fold_constants_elsewhere(module) == 1
    assert module._ember_constant_0.dtype == torch.float64  # (and the device, fake here)
    x = torch.randn(4, 4, device="cuda")
    torch.testing.assert_close(module(x)[0], x.double() * -torch.eye(4, dtype=torch.float64,
                                                                     device="cuda"))


def test_nothing_folds_where_the_moved_table_is_written_after_or_returned_as_a_view():
    written = _graph(_TABLE + [("scaled", torch.mul, ("x0", "moved")),
                               ("bump", torch.Tensor.mul_, ("moved", "x0"))], "scaled")
    through_a_view = _graph(_TABLE + [("flat", torch.Tensor.view, ("moved", 12)),
                                      ("bump", torch.Tensor.add_, ("flat", 1.0)),
                                      ("scaled", torch.mul, ("x0", "moved"))], "scaled")
    returned_as_a_view = _graph(_TABLE + [("flat", torch.Tensor.view, ("moved", 12)),
                                          ("scaled", torch.mul, ("x0", "moved"))],
                                "scaled", "flat")
    for module in (written, through_a_view, returned_as_a_view):
        before = [n.name for n in module.graph.nodes]
        assert fold_constants_elsewhere(module) == 0
        assert [n.name for n in module.graph.nodes] == before


def test_nothing_folds_where_a_cpu_value_is_read_by_the_graph_or_a_draw_is_made():
    read_on_cpu = _graph(_TABLE + [("total", torch.sum, ("table",)),
                                   ("scaled", torch.mul, ("x0", "moved"))], "scaled", "total")
    drawn = _graph([("noise", torch.rand, ([4, 3],)), ("moved", _to_graph_device, ("noise",)),
                    ("scaled", torch.mul, ("x0", "moved"))], "scaled")
    for module in (read_on_cpu, drawn):
        assert fold_constants_elsewhere(module) == 0


def test_work_on_the_graphs_own_device_is_left_to_compile():
    module = _graph([("ones", torch.ones, ([4, 3],), {"device": "cuda"}),
                     ("scaled", torch.mul, ("x0", "ones"))], "scaled")
    assert fold_constants_elsewhere(module) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the index moves for real: CUDA")
def test_an_index_made_on_another_device_moves_to_the_graphs_own():
    # (Data2Vec-Vision, BEiT: a relative position index made on the CPU per call picks from
    # a CUDA table; torch moves such an index itself)
    module = _graph([("positions", torch.arange, (3,), {"device": "cpu"}),
                     ("reversed", torch.flip, ("positions", [0])),
                     ("picked", operator.getitem, ("x0", "reversed"))], "picked")
    assert fold_constants_elsewhere(module) == 1
    assert module._ember_constant_0.device.type == "cuda"
    x = torch.randn(4, 3, device="cuda")
    torch.testing.assert_close(module(x)[0], x[torch.tensor([2, 1, 0])])
    # read otherwise than as an index, it stays where it is
    module = _graph([("positions", torch.arange, (3,), {"device": "cpu"}),
                     ("picked", operator.getitem, ("x0", "positions")),
                     ("total", torch.sum, ("positions",))], "picked", "total")
    assert fold_constants_elsewhere(module) == 0


def test_an_operator_on_the_cpus_draw_that_nothing_reads_is_dropped():
    # (a layer drop once its branch is decided: the draw stays, for the CPU's generator; its
    # comparison, read by nothing, would be an eager island for nothing)
    module = _graph([
        ("rand", torch.rand, ([],), {"device": "cpu"}),
        ("lt", operator.lt, ("rand", 0.0)),
        ("unread", operator.mul, ("lt", 2)),
        ("rand_1", torch.rand, ([],), {"device": "cpu"}),
        ("lt_1", operator.lt, ("rand_1", 0.0)),
        ("read", operator.add, ("x0", "lt_1")),
        ("neg", operator.neg, ("x0",)),  # (on the graph's device: lowering's to drop)
    ], "read")
    fold_constants_elsewhere(module)
    calls = [n.name for n in module.graph.nodes if n.op == "call_function"]
    assert calls == ["rand", "rand_1", "lt_1", "read", "neg"]
