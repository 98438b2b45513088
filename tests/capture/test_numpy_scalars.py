"""numpy scalars (np.bool_, np.int64, np.float32, ...) in captured code are constants: tested,
compared, used as sizes and indices, and computed with at capture time with numpy's own
arithmetic (results that leave keep numpy's types); one from outside is guarded on its type
and value. An op of the graph takes one as the Python number it holds, and where torch reads
the two differently (an np.bool_ as a float) the op is a break, as eager computes it. Each case
compares with eager and counts graphs and breaks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checks import same

import ember


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def a_numpy_bool_tested(x, pad):
    if pad:
        return x[:2] + 1
    return x - 1


def arithmetic(x, n, scale, half):
    m = n * 2 + 1  # (np.int64, as numpy computes it)
    return x[:m] * (scale / 2), m, scale * 3, half + half, n > 1, x.view(m, -1).sum(0)


def computed_inside(x):
    # Reformer's chunk lengths: np.lcm of Python numbers, then a numpy bool tested
    length = np.lcm(2, 3)
    pad = x.shape[0] % length != 0
    scale = np.float32(0.5) + np.sqrt(np.float32(4.0))
    if pad:
        return x[: x.shape[0] - x.shape[0] % length] * scale, length
    return x * scale, length


def after_a_break(x):
    # (the numpy bool made before the break is a local the resumed code takes from outside)
    pad = np.lcm(4, x.shape[0]) != x.shape[0]
    y = x.exp()
    ember.graph_break()
    if pad:
        y = y[:2]
    return y * 2, pad


@pytest.mark.parametrize("fn, calls, counts", [
    (a_numpy_bool_tested, [(t(6), np.bool_(True)), (t(6, seed=1), np.bool_(False))], (1, 0)),
    (arithmetic, [(t(10), np.int64(2), np.float64(3.0), np.float32(0.25)),
                  (t(10, seed=1), np.int64(2), np.float64(3.0), np.float32(0.25))], (1, 0)),
    (computed_inside, [(t(8),), (t(6, seed=1),)], (1, 0)),
    (after_a_break, [(t(6),), (t(4, seed=1),)], (2, 1)),
], ids=lambda v: getattr(v, "__name__", None))
def test_numpy_scalars_are_constants(fn, calls, counts):
    report = ember.explain(fn)(*calls[0])
    assert (report.graph_count, report.graph_break_count, report.eager_islands) == \
        (*counts, []), report
    compiled = ember.compile(fn)
    for args in calls:
        same(compiled(*args), fn(*args))


def test_a_numpy_scalar_from_outside_is_guarded_on_its_type_and_value():
    def scaled(x, s):
        return x * s, s * 2

    compiled = ember.compile(scaled)
    x = t(3)
    for s in (np.float64(2.0), np.float64(3.0), 2.0, np.float32(2.0), np.int64(2), 2):
        same(compiled(x, s), scaled(x, s))


def test_an_op_that_reads_a_numpy_scalar_otherwise_breaks():
    # torch takes an np.bool_ as a float (an int32 tensor times np.True_ is float32) and
    # torch.tensor(np.float64(x)) is float64: the graph would see Python's True and 1.5
    def bool_factor(x, flag):
        return x * flag + 1

    def made_from(x, s):
        return x + torch.tensor(s)

    for fn, args in ((bool_factor, (torch.arange(4, dtype=torch.int32), np.bool_(True))),
                     (made_from, (t(3), np.float64(1.5)))):
        report = ember.explain(fn)(*args)
        assert report.graph_break_count == 1, report
        assert "takes a numpy scalar otherwise than the Python number it holds" in \
            report.break_reasons[0].reason
        same(ember.compile(fn)(*args), fn(*args))
