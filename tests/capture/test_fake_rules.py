"""Results the capture computes itself on fake tensors (ember/capture/fake_rules.py): a batch
norm in eval, under no_grad, is a tensor like its input — the layout, dtype and the metadata
the code asks of it are eager's, one graph; every other case goes through torch's fake mode
as before (training, autograd, symbolic sizes, wrong shapes that eager rejects)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def normalized(x, mean, var, weight, bias):
    y = F.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)
    # (what the code asks of the result: answered from its fake at capture)
    layout = (y.is_contiguous(), y.is_contiguous(memory_format=torch.channels_last),
              y.stride(), y.dtype, y.requires_grad)
    return torch.relu(y) * 2, layout


def statistics(channels):
    return (t(channels, seed=1), t(channels, seed=2).abs() + 0.5, t(channels, seed=3),
            t(channels, seed=4))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced", "bf16", "2d"])
def test_batch_norm_in_eval_answers_as_eager(layout):
    x = t(2, 8, 5, 6)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "sliced":  # (not dense: the fake mode's answer)
        x = t(2, 8, 5, 12)[..., ::2]
    elif layout == "2d":
        x = t(6, 8)
    stats = statistics(8)
    if layout == "bf16":
        x = x.bfloat16()
    with torch.no_grad():
        report = ember.explain(normalized)(x, *stats)
        assert (report.graph_count, report.graph_break_count) == (1, 0)
        got, got_layout = ember.compile(normalized)(x, *stats)
        expected, expected_layout = normalized(x, *stats)
    assert got_layout == expected_layout
    torch.testing.assert_close(got, expected)


def test_batch_norm_under_autograd_and_in_training_as_before():
    x, stats = t(2, 8, 5, 6), statistics(8)
    weight = stats[2].clone().requires_grad_()
    compiled = ember.compile(normalized)
    got, got_layout = compiled(x, stats[0], stats[1], weight, stats[3])
    expected, expected_layout = normalized(x, stats[0], stats[1], weight, stats[3])
    assert got_layout == expected_layout and got_layout[-1] is True
    torch.testing.assert_close(got, expected)

    def trained(x, mean, var):
        return F.batch_norm(x, mean, var, training=True) + 1

    mean, var = stats[0].clone(), stats[1].clone()
    eager_mean, eager_var = mean.clone(), var.clone()
    torch.testing.assert_close(ember.compile(trained)(x, mean, var), trained(x, eager_mean,
                                                                                 eager_var))
    torch.testing.assert_close((mean, var), (eager_mean, eager_var))  # (updated as eager's)


def test_batch_norm_of_a_wrong_size_raises_as_eager():
    x, stats = t(2, 8, 5, 6), statistics(7)
    with torch.no_grad(), pytest.raises(RuntimeError) as eager:
        normalized(x, *stats)
    with torch.no_grad(), pytest.raises(RuntimeError) as compiled:
        ember.compile(normalized)(x, *stats)
    assert type(compiled.value) is type(eager.value)


def test_the_rule_answers_the_plain_case_only():
    from ember import torch_internals
    from ember.capture import fake_rules

    mode = torch_internals.make_fake_mode()
    x, *stats = (torch_internals.fake_of(mode, v) for v in (t(2, 8, 5, 6), *statistics(8)))
    with mode, torch.no_grad():
        plain = fake_rules.result(F.batch_norm, (x, *stats), {})
        assert plain is not None and plain.shape == x.shape and plain.stride() == x.stride()
        assert fake_rules.result(F.batch_norm, (x, *stats, True), {}) is None  # (training)
        assert fake_rules.result(F.batch_norm, (x, *stats), {"unknown": 1}) is None
    with mode, torch.enable_grad():
        weight = stats[2].clone().requires_grad_()
        assert fake_rules.result(F.batch_norm, (x, stats[0], stats[1], weight), {}) is None


def activations(x, inplace):
    y = x * 2
    a = F.hardswish(y, inplace=inplace)
    b = F.hardsigmoid(a if inplace else y, inplace=inplace)
    layout = (a.stride(), b.stride(), a.dtype, b.requires_grad, a is y, b is y)
    return a + b, y, layout


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
def test_activations_answer_as_eager(inplace, layout):
    x = t(2, 8, 5, 6)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "sliced":
        x = t(2, 8, 5, 12)[..., ::2]
    with torch.no_grad():
        report = ember.explain(activations)(x, inplace)
        assert (report.graph_count, report.graph_break_count) == (1, 0)
        got = ember.compile(activations)(x, inplace)
        expected = activations(x, inplace)
    assert got[2] == expected[2]
    torch.testing.assert_close(got[:2], expected[:2])


def test_activations_under_autograd_as_before():
    x = t(2, 8).requires_grad_()
    got = ember.compile(activations)(x, False)
    expected = activations(x, False)
    assert got[2] == expected[2] and got[2][3] is True
    torch.testing.assert_close(got[:2], expected[:2])
    got[0].sum().backward()
    grad, x.grad = x.grad, None
    expected[0].sum().backward()
    torch.testing.assert_close(grad, x.grad)


def test_an_activation_in_place_moves_the_version_as_eager():
    from ember import torch_internals
    from ember.capture import fake_rules

    mode = torch_internals.make_fake_mode()
    x = torch_internals.fake_of(mode, t(2, 8))
    with mode, torch.no_grad():
        version = x._version
        assert fake_rules.result(F.hardswish, (x,), {"inplace": True}) is x
        assert x._version == version + 1
        assert fake_rules.result(F.hardswish, (x.long(),), {}) is None  # (eager's error)
