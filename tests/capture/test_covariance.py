"""torch.cov and torch.corrcoef (ember/capture/covariance_rules.py): without weights they are
captured as their arithmetic, one graph with no break (ATen's composite reads its degrees of
freedom from a tensor, which the fakes cannot: every call broke the graph), with eager's
results, eager's warning where no degree of freedom is left, and eager's gradients; with
weights they break as before, eager's checks of the weights' values intact."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from checks import same, warnings_of_each_run

import ember


def t(*shape, dtype=torch.float32, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), device="cpu",
                       dtype=dtype).to(torch.get_default_device())


def shape_of(report):
    return report.graph_count, report.graph_break_count, report.eager_islands


def statistics(x):
    # (one call a line: eager warns once per call, ember once per line — see the warning test)
    plain = torch.cov(x)
    unbiased_not = torch.cov(x, correction=0)
    twice = x.cov(correction=2)
    unbound = torch.Tensor.cov(x, correction=1, fweights=None, aweights=None)
    correlation = torch.corrcoef(x)
    method = x.corrcoef()
    return plain * 2, unbiased_not, twice, unbound, correlation, method


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64], ids=str)
@pytest.mark.parametrize("shape", [(4, 10), (10,), (1, 7), (3, 2)], ids=str)
def test_cov_and_corrcoef_are_one_graph_with_eagers_results(dtype, shape):
    # ((10,): one variable, a 0-d covariance and corrcoef's c / c; (1, 7): a row of one
    # variable; (3, 2): correction 2 leaves no degree of freedom, inf and nan as eager's)
    x = t(*shape, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert shape_of(ember.explain(statistics)(x)) == (1, 0, [])
        compiled = ember.compile(statistics, fullgraph=True)
        for _ in range(2):
            same(compiled(x), statistics(x))


def spread(x):
    covariance = torch.cov(x, correction=2)
    correlation = x.corrcoef()
    return covariance * 2, correlation


@pytest.mark.skipif(torch.get_default_device().type != "cpu",
                    reason="under torch.set_default_device (EMBER_TEST_DEVICE=cuda) eager's "
                           "warning points at the device mode's frame (torch/utils/_device.py)")
def test_no_degrees_of_freedom_warns_as_eager_from_the_user_s_line():
    # (eager's composite warns "cov(): degrees of freedom is <= 0" from the values of its
    # factor; ember knows the factor from the sizes and warns from the user's line after each
    # call, whatever computes the graph)
    seen = warnings_of_each_run(spread, [t(*shape) for shape in ((3, 1), (3, 1), (3, 5), (2, 0))])
    assert seen[:2] == seen[2:]
    assert len(seen[0]) == 6 and len(seen[1]) == 2 and {w[2] for w in seen[0]} == {__file__}
    assert all(w[0].startswith("cov(): degrees of freedom is <= 0") for w in seen[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert shape_of(ember.explain(spread)(t(3, 1))) == (1, 0, [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_training_step_through_cov_and_corrcoef_gets_eagers_gradients(dtype):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4, dtype=dtype)
    twin = copy.deepcopy(model)

    def loss_of(model, x):
        features = model(x).t()
        covariance = torch.cov(features, correction=0)
        return covariance.square().sum() + features.corrcoef().sum() * 0.5

    compiled = ember.compile(loss_of)
    steps = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, twin)]
    for number in range(2):
        x = t(8, 6, dtype=dtype, seed=number)
        for run, module, optimizer in zip((loss_of, compiled), (model, twin), steps):
            optimizer.zero_grad()
            run(module, x).backward()
            optimizer.step()
        for (name, want), got in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(got.grad, want.grad, msg=f"{name}'s gradient")
            torch.testing.assert_close(got, want, msg=f"{name} after step {number}")
    assert shape_of(ember.explain(loss_of)(twin, t(8, 6, dtype=dtype))) == (1, 0, [])


def test_a_complex_input_gets_eagers_gradient():
    def loss_of(z):
        return torch.corrcoef(z).abs().sum() + torch.cov(z).real.sum()

    z = t(3, 6, dtype=torch.complex64).requires_grad_()
    want = torch.autograd.grad(loss_of(z), z)[0]
    got = torch.autograd.grad(ember.compile(loss_of, fullgraph=True)(z), z)[0]
    torch.testing.assert_close(got, want)
    assert shape_of(ember.explain(loss_of)(z)) == (1, 0, [])


def test_a_symbolic_count_of_observations_is_guarded_only_by_the_sign_of_the_freedom():
    # (a correction above 1 leaves a symbolic count of 2 or more without a known sign: the
    # guard is the relation, not the count's value)
    def fn(x):
        return torch.cov(x), torch.cov(x, correction=3)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend.serves_any_shape = True
    compiled = ember.compile(fn, backend=backend, dynamic=True)
    for count in (4, 6, 9, 3, 2, 5):
        x = t(3, count, seed=count)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            want = fn(x)
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            got = compiled(x)
        same(got, want, f"{count} observations")
        assert len(ours) == len(caught) == (count <= 3), f"{count} observations"
    assert len(compiled.records) == len(graphs) == 2


def test_weights_break_the_graph_as_before_with_eagers_checks():
    # (with fweights or aweights the factor and eager's checks — weights not negative, not
    # summing to 0 — read the weights' values: the op runs at a break)
    def fn(x, frequencies, weights):
        return torch.cov(x, fweights=frequencies, aweights=weights) * 2

    x, weights = t(3, 5), t(5, seed=1).abs()
    frequencies = torch.tensor([1, 2, 1, 1, 3])
    report = ember.explain(fn)(x, frequencies, weights)
    assert (report.graph_count, report.graph_break_count) == (2, 1)
    assert "cov" in report.break_reasons[0].reason
    compiled = ember.compile(fn)
    same(compiled(x, frequencies, weights), fn(x, frequencies, weights))
    with pytest.raises(RuntimeError, match="fweights cannot be negative"):
        compiled(x, -frequencies, weights)


@pytest.mark.parametrize("fn, message", [
    (lambda x: torch.cov(x > 0), "bool dtype is not supported"),
    (lambda x: torch.corrcoef(x[None]), "two or fewer dimensions"),
])
def test_arguments_eager_refuses_raise_eagers_error(fn, message):
    with pytest.raises(RuntimeError, match=message):
        fn(t(3, 5))
    with pytest.raises(RuntimeError, match=message):
        ember.compile(fn)(t(3, 5))
