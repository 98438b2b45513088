"""ember.lower.builder: broadcasting, promotion, dims and slices exactly as eager has them."""

import itertools

import pytest
import torch

from ember.ir import Graph, Op
from ember.ir.interpreter import interpret
from ember.lower.builder import Builder, broadcast_shapes, normalize_dim, normalize_dims

SHAPES = [(), (1,), (3,), (0,), (2, 1), (1, 3), (2, 3), (4, 1, 3), (1, 0), (2, 0, 1)]


def test_broadcast_shapes_is_torchs():
    for a, b in itertools.product(SHAPES, SHAPES):
        try:
            want = tuple(torch.broadcast_shapes(a, b))
        except RuntimeError:
            with pytest.raises(ValueError):
                broadcast_shapes(a, b)
            continue
        assert broadcast_shapes(a, b) == want, (a, b)


def test_dims_normalize_like_eager():
    assert [normalize_dim(d, 3) for d in (-3, -1, 0, 2)] == [0, 2, 0, 2]
    assert normalize_dim(-1, 0) == 0 and normalize_dim(0, 0) == 0  # 0-d tensors take dim 0
    with pytest.raises(IndexError):
        normalize_dim(3, 3)
    assert normalize_dims(None, 3) == (0, 1, 2)
    assert normalize_dims([], 2) == (0, 1)
    assert normalize_dims([-1, 0, 2], 3) == (0, 2)


def test_compute_dtype_is_torchs_result_type():
    graph = Graph(torch.device("cpu"))
    builder = Builder(graph)
    for dtype, ndim, scalar in itertools.product(
            [torch.bool, torch.uint8, torch.int32, torch.float16, torch.float64], [0, 2],
            [True, 2, 0.5]):
        node = graph.add_input((2,) * ndim, dtype)
        want = torch.result_type(torch.zeros((2,) * ndim, dtype=dtype), scalar)
        assert builder.compute_dtype(node, scalar) == want, (dtype, ndim, scalar)


def test_elementwise_promotes_broadcasts_and_computes_float_ops_in_floats():
    graph = Graph(torch.device("cpu"))
    builder = Builder(graph)
    i = graph.add_input((3, 1), torch.int32)
    h = graph.add_input((4,), torch.float16)
    total = builder.add(i, h)
    assert (total.shape, total.dtype) == ((3, 4), torch.float16)
    exp = builder.elementwise(Op.EXP, i)
    assert exp.dtype == torch.get_default_dtype()
    quotient = builder.div(i, 2)
    assert quotient.dtype == torch.float32
    compare = builder.compare(Op.LT, h, 1)
    assert compare.dtype is torch.bool and compare.shape == (4,)


def test_trivial_nodes_are_never_built():
    graph = Graph(torch.device("cpu"))
    builder = Builder(graph)
    x = graph.add_input((2, 1, 3), torch.float32)
    count = len(graph.nodes)
    assert builder.cast(x, torch.float32) is x
    assert builder.reshape(x, (2, 1, 3)) is x
    assert builder.permute(x, (0, 1, 2)) is x
    assert builder.expand(x, (2, 1, 3)) is x
    assert builder.slice(x, 2, 0, 100) is x
    assert builder.squeeze(x, [0]) is x
    assert len(graph.nodes) == count
    # moving only size-1 dims is a squeeze and unsqueezes, not a general reshape
    moved = builder.reshape(x, (1, 2, 3, 1))
    assert {n.op for n in graph.nodes[count:]} == {Op.SQUEEZE, Op.UNSQUEEZE}
    assert moved.shape == (1, 2, 3, 1)


@pytest.mark.parametrize("start, stop, step", [
    (None, None, 1), (1, None, 2), (-3, None, 1), (None, -1, 3), (5, 2, 1), (-100, 100, 4),
    (2, 3, 5), (6, None, 1), (0, 0, 2)])
def test_slices_are_pythons(start, stop, step):
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((7,), torch.float32)
    node = Builder(graph).slice(x, 0, start, stop, step)
    graph.outputs = [node]
    value = torch.arange(7.0)
    (got,), _ = interpret(graph, [value])
    assert got.tolist() == value[start:stop:step].tolist()
