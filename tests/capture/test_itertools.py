"""itertools under capture: each function runs compiled (fullgraph: one graph) and eager over
several calls, results and arguments compared; torch's own `_pair` (`tuple(repeat(x, 2))`),
which every convolution with a padding mode calls, keeps such a module one graph."""

from __future__ import annotations

import itertools
from itertools import (
    accumulate,
    chain,
    combinations,
    compress,
    count,
    cycle,
    dropwhile,
    filterfalse,
    islice,
    pairwise,
    permutations,
    product,
    repeat,
    starmap,
    takewhile,
    tee,
    zip_longest,
)

import pytest
import torch
from checks import check_calls

import ember


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def tensors(seed):
    return [t(3, seed=seed + k) for k in range(3)]


CALLS = [((t(3, seed=1), tensors(10)), {}), ((t(3, seed=2), tensors(20)), {})]


def finite(x, ys):
    pair = tuple(repeat(2, 3))
    chained = list(chain(ys, [x])) + list(itertools.chain.from_iterable([[1.0], [x]]))
    products = [p * q for p, q in product([1, 2], [3, 4])] + [len(list(product(ys, repeat=2)))]
    longest = [u + v for u, v in zip_longest(ys, [1.0], fillvalue=0.5)]
    return x * sum(pair) + sum(chained) + sum(products) + sum(longest)


def consuming(x, ys):
    it = iter(ys)
    first = list(islice(it, 2))  # (advances `it` by two, no further)
    rest = list(it)
    stepped = list(islice([x, 2 * x, 3 * x, 4 * x], 1, None, 2))
    one, two = tee(iter(ys))
    return sum(first) * 2 + sum(rest) + sum(stepped) + sum(one) - sum(two) * 3


def calling(x, ys):
    totals = list(accumulate(ys)) + list(accumulate(ys, lambda a, b: a * b, initial=x))
    scaled = list(starmap(lambda u, v: u * v, zip(ys, [1.0, 2.0, 3.0])))
    neighbours = [u - v for u, v in pairwise(ys)]
    chosen = [u * v for u, v in combinations(ys, 2)] + [u / (v.abs() + 1)
                                                        for u, v in permutations(ys[:2])]
    kept = list(compress(ys, [1, 0, 1])) + list(takewhile(lambda v: v is not None, ys)) + \
        list(dropwhile(lambda v: v is None, ys)) + list(filterfalse(lambda v: v is None, ys))
    return sum(totals) + sum(scaled) + sum(neighbours) + sum(chosen) + sum(kept)


def endless(x, ys):
    counted = [x * i for i, _ in zip(count(1), ys)] + \
        [x * v for v, _ in zip(count(0.1, 0.1), range(12))]  # (floats summed as eager sums)
    cycled = list(map(lambda u, w: u * w, ys, cycle([1.0, -1.0])))
    repeated = list(map(torch.add, ys, repeat(x)))
    out = sum(counted) + sum(cycled) + sum(repeated)
    for i, step in enumerate(count(5, 2)):
        if i == 3:
            break
        out = out + step
    return out


@pytest.mark.parametrize("fn", [finite, consuming, calling, endless], ids=lambda f: f.__name__)
def test_itertools_in_one_graph(fn):
    check_calls(fn, CALLS)


def test_endless_iterator_taken_whole_breaks_the_graph_and_says_why():
    def taken(x):
        return x + len(list(islice(count(), 4))) + sum(islice(repeat(1), 3))

    check_calls(taken, [((t(2),), {})])  # (sliced: finite, one graph)

    def whole(x, stop):
        y = x * 2
        for k in cycle([1, 2]):  # (an endless loop ended by a break on a tensor's value)
            y = y + k
            if (y > stop).all():
                break
        return y

    explanation = ember.explain(whole)(t(2), torch.tensor(5.0))
    assert explanation.graph_break_count >= 1
    x = t(2)
    torch.testing.assert_close(ember.compile(whole)(x, torch.tensor(5.0)),
                               whole(x, torch.tensor(5.0)))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_convolution_with_padding_mode_is_one_graph(mode):
    torch.manual_seed(0)
    image = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1, padding_mode=mode),
                                torch.nn.ReLU())
    signal = torch.nn.Conv1d(4, 8, 3, padding=2, padding_mode=mode)
    for model, x in ((image, t(2, 4, 6, 6)), (signal, t(2, 4, 9))):
        explanation = ember.explain(model)(x)
        assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
        torch.testing.assert_close(ember.compile(model)(x), model(x))
