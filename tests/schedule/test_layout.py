"""ember.schedule.layout: the strides of a reshape that is a view (torch's computeStride) and
of view chains, against what torch's own views give."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from property.strategies import layouts, materialize, reshape_targets, shapes

from ember.ir import Graph, Op
from ember.schedule.layout import _reshape_strides, row_major, view_geometry


@settings(max_examples=400)
@given(st.data())
def test_reshape_strides_are_torchs_view_strides(data):
    shape = data.draw(shapes(max_rank=4))
    tensor = materialize(shape, torch.float32, data.draw(layouts(shape)), 0, False)
    target = data.draw(reshape_targets(shape))
    try:
        want = tensor.view(target).stride()
    except RuntimeError:
        want = None  # torch needs a copy: ember must say so too
    got = _reshape_strides(tuple(tensor.shape), tuple(tensor.stride()), target)
    if want is None or 0 in target:
        # for empty tensors torch picks strides freely; only "is a view" must agree
        assert (got is None) == (want is None), (shape, tensor.stride(), target, got)
    else:
        assert got == tuple(want), (shape, tensor.stride(), target)


def test_reshape_strides_on_known_cases():
    assert _reshape_strides((4, 6), (6, 1), (2, 2, 6)) == (12, 6, 1)
    assert _reshape_strides((4, 6), (1, 4), (24,)) is None          # a transpose: needs a copy
    assert _reshape_strides((4, 6), (1, 4), (4, 2, 3)) == (1, 12, 4)
    assert _reshape_strides((3, 1, 5), (5, 99, 1), (15,)) == (1,)   # size-1 dims never matter
    assert _reshape_strides((), (), (1, 1)) == (1, 1)
    assert _reshape_strides((2, 3), (0, 1), (6,)) is None            # expanded
    assert _reshape_strides((2, 3), (0, 1), (2, 3, 1)) == (0, 1, 1)


VIEW_STEPS = st.sampled_from(["permute", "slice", "expand", "squeeze", "unsqueeze", "reshape"])


@settings(max_examples=200)
@given(st.data())
def test_view_chains_have_the_geometry_of_torchs_views(data):
    """A random chain of views over a strided buffer: ember's (shape, strides, offset) is the
    view torch makes, or None exactly where a reshape would need a copy."""
    shape = data.draw(shapes(min_rank=1, max_rank=3))
    tensor = materialize(shape, torch.float32, data.draw(layouts(shape)), 0, False)
    graph = Graph(torch.device("cpu"))
    node = base = graph.add_input(tensor.shape, tensor.dtype, tensor.stride())
    view = tensor
    for _ in range(data.draw(st.integers(1, 4))):
        step = data.draw(VIEW_STEPS)
        rank = view.ndim
        if step == "permute" and rank:
            perm = data.draw(st.permutations(range(rank)))
            node, view = graph.add(Op.PERMUTE, (node,), perm=tuple(perm)), view.permute(perm)
        elif step == "slice" and rank and view.shape[0] > 0:
            dim = data.draw(st.integers(0, rank - 1))
            size = view.shape[dim]
            start = data.draw(st.integers(0, size))
            step_size = data.draw(st.integers(1, 3))
            count = max(0, -(-(size - start) // step_size))
            stop = start + (count - 1) * step_size + 1 if count else start
            node = graph.add(Op.SLICE, (node,), dim=dim, start=start, stop=stop, step=step_size)
            index = [slice(None)] * rank
            index[dim] = slice(start, stop, step_size)
            view = view[tuple(index)]
        elif step == "expand" and 1 in view.shape:
            target = tuple(3 if n == 1 else n for n in view.shape)
            node, view = graph.add(Op.EXPAND, (node,), shape=target), view.expand(target)
        elif step == "squeeze" and 1 in view.shape:
            dims = tuple(d for d, n in enumerate(view.shape) if n == 1)
            node = graph.add(Op.SQUEEZE, (node,), dims=dims)
            view = view.reshape(node.shape) if view.numel() == 0 else view.squeeze(dims)
        elif step == "unsqueeze":
            dim = data.draw(st.integers(0, rank))
            node, view = graph.add(Op.UNSQUEEZE, (node,), dim=dim), view.unsqueeze(dim)
        elif step == "reshape":
            target = data.draw(reshape_targets(tuple(view.shape)))
            node = graph.add(Op.RESHAPE, (node,), shape=target)
            try:
                view = view.view(target)
            except RuntimeError:
                view = None
            if view is None or 0 in target:
                got = view_geometry(node, base, (tensor.shape, tensor.stride(), 0))
                assert (got is None) == (view is None)
                return
    got = view_geometry(node, base, (tuple(tensor.shape), tuple(tensor.stride()),
                                     tensor.storage_offset()))
    assert got is not None
    if view.numel() == 0:
        assert got[0] == tuple(view.shape)
        return
    significant = [d for d, n in enumerate(view.shape) if n > 1]
    assert got[0] == tuple(view.shape)
    assert [got[1][d] for d in significant] == [view.stride()[d] for d in significant]
    assert got[2] == view.storage_offset()


def test_row_major_strides():
    assert row_major((2, 3, 4)) == (12, 4, 1)
    assert row_major((2, 0, 4)) == (4, 4, 1)
    assert row_major(()) == ()
