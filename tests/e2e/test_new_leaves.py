"""A new autograd leaf made inside compiled code: `h.requires_grad = True`, `h.requires_grad_()`
or a factory's requires_grad=True on a tensor the function made. Where the leaf stays inside
the graph (no result is it or a view of it, and none requires grad through it alone), eager's
gradient of it reaches only its own .grad, which nobody can read: one graph, no break, no
island. Where a result exposes it, the call runs as an eager island on the real tensor.
Turning requires_grad off breaks the graph. Each test compares with eager: the results, their
requires_grad and is_leaf, and after backward the gradients of the parameters, the inputs and
the exposed leaves; and counts graphs, breaks and islands."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, assert_close, make, watching_fallbacks

import ember


class FeatureEncoder(torch.nn.Module):
    """Wav2Vec2's feature encoder: convolutions over the waveform, whose first hidden state
    (a view of the input) is set to require grad in training, for gradient checkpointing."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList([torch.nn.Conv1d(1, 8, 5, stride=2),
                                          torch.nn.Conv1d(8, 8, 3, stride=2)])
        self.head = torch.nn.Linear(8, 4)

    def forward(self, input_values):
        hidden = input_values[:, None]
        if self.training:
            hidden.requires_grad = True
        for conv in self.convs:
            hidden = F.gelu(conv(hidden))
        return self.head(hidden.transpose(1, 2)).pow(2).mean()


def _tensors(result):
    return [r for r in (result if isinstance(result, tuple) else (result,))
            if isinstance(r, torch.Tensor)]


def _run(fn, args, parameters):
    """fn(*args), the autograd facts of its tensors, and after backward of its last tensor the
    gradients of the parameters, of the tensor arguments and of the results that are leaves."""
    result = fn(*args)
    tensors = _tensors(result)
    facts = [(t.requires_grad, t.is_leaf) for t in tensors]
    tensors[-1].backward()
    grads = [p.grad for p in parameters] + [a.grad for a in args] + \
        [t.grad for t in tensors if t.is_leaf and t.requires_grad]
    return [t.detach() for t in tensors], facts, grads, [a.requires_grad for a in args]


def check(fn, make_args, parameters=(), graphs=1, breaks=0, islands=0):
    report = ember.explain(fn)(*make_args())
    assert (report.graph_count, report.graph_break_count, len(report.eager_islands)) == \
        (graphs, breaks, islands), report
    for parameter in parameters:
        parameter.grad = None
    expected = _run(fn, make_args(), parameters)
    compiled = ember.compile(fn)
    for _ in range(2):
        for parameter in parameters:
            parameter.grad = None
        with watching_fallbacks():
            actual = _run(compiled, make_args(), parameters)
        assert actual[1] == expected[1]  # (requires_grad, is_leaf) of each result
        assert actual[3] == expected[3]  # the arguments' requires_grad after the call
        assert [g is None for g in actual[2]] == [g is None for g in expected[2]]
        assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-5)
        assert_close([g for g in actual[2] if g is not None],
                     [g for g in expected[2] if g is not None], rtol=1e-5, atol=1e-5)
    return report


def test_a_feature_encoder_that_sets_requires_grad_on_its_input_view_compiles_whole():
    model = FeatureEncoder().to(DEVICE).train()
    reference = copy.deepcopy(model)
    check(model, lambda: (make(2, 40),), list(model.parameters()))
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert_close(mine, theirs)  # (nothing but the gradients changed)


weight = make(4, 3, seed=1).requires_grad_()


def requires_grad_method(x):
    hidden = (x * 2).requires_grad_()
    return (hidden @ weight).sum()


def factory_requires_grad(x):
    bias = torch.zeros(3, device=x.device, requires_grad=True)
    return (x @ weight + bias).sum()


def set_under_no_grad(x):
    with torch.no_grad():
        hidden = x * 2
        hidden.requires_grad = True
        scaled = hidden * 3  # (made under no_grad: no gradient through the leaf)
    return (scaled @ weight).sum()


@pytest.mark.parametrize("fn", [requires_grad_method, factory_requires_grad, set_under_no_grad],
                         ids=lambda f: f.__name__)
def test_a_leaf_that_stays_inside_compiles_in_one_graph_without_islands(fn):
    check(fn, lambda: (make(2, 4),), [weight])


def returns_the_leaf(x):
    hidden = x * 2
    hidden.requires_grad_()
    return hidden, (hidden @ weight).sum()


def requires_grad_through_the_leaf_alone(x):
    hidden = x.detach()[:, :2]
    hidden.requires_grad = True
    return (hidden * 3).sum()


def sets_it_on_the_input(x):
    x.requires_grad_()
    return (x @ weight).sum()


@pytest.mark.parametrize("fn", [returns_the_leaf, requires_grad_through_the_leaf_alone,
                                sets_it_on_the_input], ids=lambda f: f.__name__)
def test_a_leaf_a_result_exposes_runs_as_an_eager_island(fn):
    report = check(fn, lambda: (make(2, 4),), [weight], islands=1)
    assert "a new autograd leaf" in report.eager_islands[0]


def turns_it_off(x):
    x.requires_grad = False
    return x * 2


def test_turning_requires_grad_off_breaks_the_graph_there():
    report = ember.explain(turns_it_off)(make(3).requires_grad_())
    assert report.graph_break_count == 1
    assert "requires_grad turned off" in report.break_reasons[0].reason
    for run in (turns_it_off, ember.compile(turns_it_off)):
        x = make(3).requires_grad_()
        result = run(x)
        assert (x.requires_grad, result.requires_grad) == (False, False)
        assert_close(result, make(3) * 2)


def sets_it_on_a_non_leaf(x):
    y = x * 2
    y.requires_grad = True
    return y


def sets_it_on_integers(x):
    return torch.arange(3, device=x.device).requires_grad_() + x


@pytest.mark.parametrize("fn", [sets_it_on_a_non_leaf, sets_it_on_integers],
                         ids=lambda f: f.__name__)
def test_what_eager_refuses_raises_eagers_error(fn):
    errors = []
    for run in (fn, ember.compile(fn)):
        with pytest.raises(RuntimeError) as error:
            run(make(3).requires_grad_())
        errors.append(str(error.value))
    assert errors[0] == errors[1]
