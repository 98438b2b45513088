"""torch.distributions made and used inside compiled code (an RL policy's head, a VAE's
sample): their classes and methods are torch's Python, inlined, and their lazy properties
(a Python descriptor) run as eager runs them; descriptors and property setters of a user's
class on objects made inside. Each compares with eager and counts graphs and breaks."""

from __future__ import annotations

import torch
from checks import check_calls
from torch.distributions import Bernoulli, Categorical, Independent, Normal

import ember


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def policy_head(logits, mean, std, action):
    actions = Categorical(logits=logits, validate_args=False)
    motion = Independent(Normal(mean, std, validate_args=False), 1, validate_args=False)
    gate = Bernoulli(logits=mean, validate_args=False)
    score = actions.log_prob(action) + actions.entropy() + motion.log_prob(mean * 0.5) + \
        motion.entropy() + gate.entropy().sum(-1)
    return score, actions.probs, motion.mean


def policy_inputs(seed):
    return (t(4, 5, seed=seed), t(4, 3, seed=seed + 1), t(4, 3, seed=seed + 2).abs() + 0.5,
            torch.tensor([0, 4, 2, 1]))


def test_distributions_without_validation_are_one_graph():
    check_calls(policy_head, [(policy_inputs(0), {}), (policy_inputs(10), {})])
    report = ember.explain(policy_head)(*policy_inputs(0))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_reparameterized_sample_draws_eagers_numbers():
    def sample(mean, std):
        return Normal(mean, std, validate_args=False).rsample((2,)) * 2

    mean, std = t(3), t(3, seed=1).abs() + 0.1
    torch.manual_seed(7)
    expected = sample(mean, std)
    torch.manual_seed(7)
    torch.testing.assert_close(ember.compile(sample, fullgraph=True)(mean, std), expected)


def test_validated_distribution_answers_as_eager_and_raises_as_eager():
    def log_density(mean, std, x):
        # (validation asked for: importing torch._dynamo turns the default off process-wide)
        return Normal(mean, std, validate_args=True).log_prob(x)

    mean, std, x = t(3), t(3, seed=1).abs() + 0.1, t(3, seed=2)
    compiled = ember.compile(log_density)
    torch.testing.assert_close(compiled(mean, std, x), log_density(mean, std, x))
    try:
        log_density(mean, -std, x)
    except ValueError as error:
        expected = str(error)
    try:
        compiled(mean, -std, x)
        raise AssertionError("an invalid scale did not raise")
    except ValueError as error:
        assert str(error) == expected


class Cached:
    """A non-data descriptor written in Python: computes once, then the instance holds it."""

    def __init__(self, function):
        self.function = function

    def __get__(self, instance, owner):
        if instance is None:
            return self
        value = self.function(instance)
        instance.__dict__[self.function.__name__] = value
        return value


class Box:
    def __init__(self, x):
        self.x = x
        self._scale = None

    @Cached
    def doubled(self):
        return self.x * 2

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = value * 3


def boxed(x):
    box = Box(x)
    box.scale = x.sum()
    return box.doubled + box.doubled + box.scale, box


def test_python_descriptors_and_property_setters_on_objects_made_inside():
    check_calls(boxed, [((t(3),), {}), ((t(3, seed=4),), {})])
