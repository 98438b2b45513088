"""ember.schedule.indexing: index maps of views and data ops, and the reads a node makes."""

import itertools

import torch

from ember.ir import Graph, Op
from ember.schedule.expr import ZERO, Expr, Var
from ember.schedule.indexing import cat_pieces, index_rules, input_indices, pad_source, reads


def _evaluate(expr: Expr, point: dict[str, int]) -> int:
    from ember.schedule.expr import Div

    total = expr.const
    for atom, coefficient in expr.terms:
        if isinstance(atom, Var):
            value = point[atom.name]
        elif isinstance(atom, Div):
            value = _evaluate(atom.expr, point) // atom.divisor
        else:
            value = _evaluate(atom.expr, point) % atom.divisor
        total += coefficient * value
    return total


def _check_view(node, source_value, view_value):
    """At every output position, the index map points at the element the torch view holds."""
    index = tuple(Expr.of(Var(f"i{d}", n)) if n != 1 else ZERO for d, n in enumerate(node.shape))
    mapped = index_rules[node.op](node, index)
    for position in itertools.product(*(range(n) for n in node.shape)):
        point = {f"i{d}": p for d, p in enumerate(position)}
        source_position = tuple(_evaluate(e, point) for e in mapped)
        assert source_value[source_position] == view_value[position], (node.op, position)


def test_view_index_maps_point_where_torch_views_do():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((4, 6), torch.float32)
    value = torch.arange(24.0).reshape(4, 6)
    cases = [
        (graph.add(Op.RESHAPE, (x,), shape=(3, 2, 4)), value.reshape(3, 2, 4)),
        (graph.add(Op.PERMUTE, (x,), perm=(1, 0)), value.t()),
        (graph.add(Op.SLICE, (x,), dim=1, start=1, stop=6, step=2), value[:, 1::2]),
        (graph.add(Op.UNSQUEEZE, (x,), dim=1), value.unsqueeze(1)),
        (graph.add(Op.FLIP, (x,), dims=(0, 1)), value.flip(0, 1)),
        (graph.add(Op.AS_STRIDED, (x,), shape=(3, 3), strides=(5, 2), offset=1),
         value.as_strided((3, 3), (5, 2), 1)),
    ]
    for node, view in cases:
        _check_view(node, value, view)
    column = graph.add_input((4, 1), torch.float32)
    _check_view(graph.add(Op.EXPAND, (column,), shape=(4, 5)), torch.arange(4.0)[:, None],
                torch.arange(4.0)[:, None].expand(4, 5))
    _check_view(graph.add(Op.SQUEEZE, (column,), dims=(1,)), torch.arange(4.0)[:, None],
                torch.arange(4.0))


def test_reshapes_point_where_torch_reshapes_do_dim_group_by_dim_group():
    shapes = [((4, 6), (2, 2, 6)), ((4, 6), (24,)), ((2, 3, 4), (6, 4)), ((2, 3, 4), (2, 12)),
              ((6, 4), (2, 3, 2, 2)), ((4, 6), (3, 8)), ((1, 24), (2, 1, 3, 4, 1)),
              ((2, 1, 12), (2, 3, 4))]
    for source_shape, shape in shapes:
        graph = Graph(torch.device("cpu"))
        x = graph.add_input(source_shape, torch.float32)
        value = torch.arange(24.0).reshape(source_shape)
        _check_view(graph.add(Op.RESHAPE, (x,), shape=shape), value, value.reshape(shape))


def test_a_reshape_merging_trailing_dims_leaves_the_others_alone():
    # (a position outside its dim's range — a pad's border, under the pad's check — does not
    # carry into the dims before it: the depthwise taps over a channels-last view read the
    # image at affine positions, no division or remainder per element)
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((4, 256, 256), torch.float32)
    image = graph.add(Op.RESHAPE, (x,), shape=(4, 256, 16, 16))
    i, c, h, w = (Expr.of(Var(name, n)) for name, n in (("i0", 4), ("i1", 256), ("i2", 16),
                                                         ("i3", 16)))
    mapped = index_rules[Op.RESHAPE](image, (i, c, h - 1, w + 1))
    assert mapped == (i, c, h * 16 + w - 15)


def test_pad_and_cat_say_which_input_element_they_read():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((3,), torch.float32)
    pad = graph.add(Op.PAD, (x,), pads=((2, 1, 1),), value=0.0)   # 0 0 x0 0 x1 0 x2 0
    i = Expr.of(Var("i0", pad.shape[0]))
    (source,), checks = pad_source(pad, (i,))
    ((relative, size, step),) = checks
    assert (size, step) == (3, 2)
    for position in range(pad.shape[0]):
        point = {"i0": position}
        offset = _evaluate(relative, point)
        inside = 0 <= offset < size * step and offset % step == 0
        assert inside == (position in (2, 4, 6))
        if inside:
            assert _evaluate(source, point) == (position - 2) // 2
    y = graph.add_input((2,), torch.float32)
    cat = graph.add(Op.CAT, (x, y), dim=0)
    pieces = cat_pieces(cat, (Expr.of(Var("i0", 5)),))
    assert [(p[0], p[2], p[3]) for p in pieces] == [(x, 0, 3), (y, 3, 5)]
    assert str(pieces[1][1][0]) == "i0 + -3"


def test_reads_inline_everything_but_boundaries():
    graph = Graph(torch.device("cpu"))
    x = graph.add_input((4, 6), torch.float32)
    shared = graph.add(Op.EXP, (x,))
    transposed = graph.add(Op.PERMUTE, (shared,), perm=(1, 0))
    out = graph.add(Op.ADD, (transposed, graph.add(Op.NEG, (transposed,))))
    index = (Expr.of(Var("i0", 6)), Expr.of(Var("i1", 4)))
    inlined = list(reads(out, index, lambda n: n.op is Op.INPUT))
    assert inlined == [(x, (index[1], index[0]))]     # read once, at the transposed index
    realized = list(reads(out, index, lambda n: n in (x, shared)))
    assert realized == [(shared, (index[1], index[0]))]
    assert input_indices(graph.add(Op.CAST, (x,), dtype=torch.float64), index) == [(x, index)]
