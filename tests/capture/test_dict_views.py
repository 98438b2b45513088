"""keys(), values() and items() views of a dict from outside the captured code iterate as the
dict does: a view passed in, and the view that a dict subclass's object known only by its type
answers (Hugging Face's ModelOutput handed back by a resumed frame, whose to_tuple iterates
`self.keys()`). Their items are guarded as a list from outside is (its length, each key,
each tensor); a view handed on is the real one. Each case compares with eager over calls with
other tensors, other keys and another order, and counts graphs and breaks."""

from __future__ import annotations

import collections

import pytest
import torch
from checks import same
from model_outputs import LMOutputs, ModelOutputs

import ember


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Outputs(ModelOutputs):
    """A ModelOutput-like object with no fields: its items are what it is made with."""


def views_passed_in(x, keys, values, items):
    return [k for k in keys], [v * x for v in values], {k: v + 1 for k, v in items}


def views_of_an_object_from_outside(x, out):
    # (`out` is known by its type: its views are read again through it on each call)
    return (out.to_tuple(), out[1:], [v.sum() * x for v in out.values()],
            [k for k, _ in out.items()], out.keys())


def _encoder(x):
    hidden = x.exp()
    ember.graph_break()
    return LMOutputs(logits=hidden * 2, hidden=(hidden, hidden + 1))


def a_model_output_from_a_resumed_frame(x):
    # Reformer's pattern: the object comes back from a call that broke, and the resumed code
    # indexes it with a slice (to_tuple over self.keys())
    out = _encoder(x)
    return out[1:], out.to_tuple()[0] * 3


def _dicts(*key_lists, seed=0):
    return [collections.OrderedDict((k, t(3, seed=seed + i)) for i, k in enumerate(keys))
            for keys in key_lists]


@pytest.mark.parametrize("fn, calls, counts", [
    (views_passed_in,
     [(t(3), d.keys(), d.values(), d.items())
      for d in [{"a": t(3), "b": t(3, seed=1)}, {"a": t(3, seed=2), "b": t(3, seed=3)},
                {"b": t(3, seed=4), "a": t(3), "c": t(3, seed=5)}]
      + _dicts(["p", "q"], seed=6)], (1, 0)),
    (views_of_an_object_from_outside,
     [(t(3), Outputs(d)) for d in _dicts(["p", "q"], ["p", "q"], ["q", "p"], ["p", "r", "q"],
                                         seed=7)], (1, 0)),
    (a_model_output_from_a_resumed_frame, [(t(3),), (t(3, seed=1),)], (4, 2)),
], ids=lambda v: getattr(v, "__name__", None))
def test_views_of_a_dict_from_outside_iterate_like_the_dict(fn, calls, counts):
    report = ember.explain(fn)(*calls[0])
    assert (report.graph_count, report.graph_break_count, report.eager_islands) == \
        (*counts, []), report
    assert all("ember.graph_break()" in b.reason for b in report.break_reasons), report
    compiled = ember.compile(fn)
    for args in calls:
        same(compiled(*args), fn(*args))


def test_a_view_handed_on_is_the_real_one():
    def hand_on(x, out):
        return x + 1, out.keys(), out.values()

    compiled = ember.compile(hand_on, fullgraph=True)
    out = Outputs(a=t(3))
    _, keys, values = compiled(t(3), out)
    out["b"] = t(3, seed=1)  # (a view follows its dict)
    assert list(keys) == ["a", "b"] and len(values) == 2
