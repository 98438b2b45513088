"""torch.vmap in the capture, unrolled over the batch (capture/vmap_rules.py), and torch's
associative scan, inlined in its generic form (which vmaps its combine function): each
compared with eager, with exact counts of graphs and breaks."""

import pytest
import torch
import torch.utils._pytree as pytree

import ember
from ember import torch_internals


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def graphs_and_breaks(fn, *args):
    explained = ember.explain(fn)(*args)
    return explained.graph_count, explained.graph_break_count


def test_vmap_of_a_function_that_is_not_pointwise_answers_as_eager():
    def fn(x, y):
        return torch.vmap(lambda u, v: (u * v.sum(), u.amax()), in_dims=(0, 1))(x, y)

    x, y = t(5, 3), t(3, 5, seed=1)
    expected = fn(x, y)
    got = ember.compile(fn)(x, y)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert graphs_and_breaks(fn, x, y) == (1, 0)


def test_vmap_with_unmapped_arguments_and_nested_in_dims():
    def fn(pair, scale):
        return torch.vmap(lambda p, s: p[0] @ p[1] * s, in_dims=((0, None), None),
                          out_dims=1)(pair, scale)

    pair, scale = (t(4, 2, 3), t(3, 5, seed=1)), t(5, seed=2)
    torch.testing.assert_close(ember.compile(fn)(pair, scale), fn(pair, scale))
    assert graphs_and_breaks(fn, pair, scale) == (1, 0)


def test_a_batch_past_the_unrolling_limit_breaks_and_answers_as_eager():
    def fn(x):
        return torch.vmap(torch.sum)(x) + 1

    x = t(300, 2)
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    assert graphs_and_breaks(fn, x)[1] == 1


def test_vmap_with_the_same_randomness_breaks_and_answers_as_eager():
    def fn(x):
        return torch.vmap(lambda u: u * 2, randomness="same")(x) + 1

    x = t(3, 2)
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    # (then torch's vmap runs as Python: its own implementation breaks again, per torch)
    reasons = [str(reason) for reason in ember.explain(fn)(x).break_reasons]
    assert 'randomness="same"' in reasons[0], reasons


def test_tree_leaves_of_containers_made_in_the_capture():
    def fn(x):
        leaves = pytree.tree_leaves([None, (x, [x * 2]), {"b": x + 1, "a": x - 1}])
        return [leaf for leaf in leaves if leaf is not None]

    x = t(3)
    for a, b in zip(ember.compile(fn)(x), fn(x)):
        torch.testing.assert_close(a, b)
    assert graphs_and_breaks(fn, x) == (1, 0)


scan = torch_internals.associative_scan_function()


@pytest.mark.skipif(scan is None, reason="this torch has no associative_scan")
@pytest.mark.parametrize("reverse", [False, True])
def test_associative_scan_in_its_generic_mode_is_one_graph(reverse):
    def combine(left, right):  # (Mamba's selective scan: h = a * h + b)
        return left[0] * right[0], right[0] * left[1] + right[1]

    def fn(a, b):
        return scan(combine, (a, b), dim=2, reverse=reverse, combine_mode="generic")[1]

    a, b = torch.rand(2, 3, 11, 4, generator=torch.Generator().manual_seed(0)), t(2, 3, 11, 4)
    torch.testing.assert_close(ember.compile(fn)(a, b), fn(a, b))
    assert graphs_and_breaks(fn, a, b) == (1, 0)


@pytest.mark.skipif(scan is None, reason="this torch has no associative_scan")
def test_associative_scan_in_pointwise_mode_on_the_cpu_raises_as_eager_does():
    def fn(a):
        return scan(lambda x, y: x + y, a, dim=0, combine_mode="pointwise") * 2

    a = t(5, 2)
    if a.is_cuda:
        pytest.skip("the pointwise mode runs on CUDA")
    with pytest.raises(ValueError, match="CUDA"):
        fn(a)
    with pytest.raises(ValueError, match="CUDA"):
        ember.compile(fn)(a)
