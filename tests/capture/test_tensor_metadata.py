"""Tensor metadata read inside compiled code answers what eager answers at that point of the
program: requires_grad, is_leaf, grad_fn, dtype, device, is_contiguous(), stride(), data_ptr
equality, _version, including after grad-mode switches inside the function (no_grad blocks,
enable_grad nested in them, set_grad_enabled as a statement). Each probe runs eagerly and
compiled, for inputs that require grad and inputs that do not, under grad mode on and off;
the Python values it returns and the autograd state of its tensors must be eager's."""

from __future__ import annotations

import pytest
import torch

import ember


def made_under_no_grad(x):
    with torch.no_grad():
        y = x * 2
    return y.requires_grad, y.is_leaf, x * 3


def made_normally(x):
    y = x * 2
    return y.requires_grad, y.is_leaf, y


def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        with torch.enable_grad():
            z = x * 3
    return y.requires_grad, z.requires_grad, z.is_leaf, y + z


def set_grad_enabled_statements(x):
    torch.set_grad_enabled(False)
    y = x * 2
    torch.set_grad_enabled(True)
    z = x * 2
    return y.requires_grad, z.requires_grad, y + z


def set_grad_enabled_block(x):
    with torch.set_grad_enabled(False):
        y = x.sin()
    return y.requires_grad, y.is_leaf, y


def detached(x):
    y = x.detach()
    return y.requires_grad, y.is_leaf, x.is_leaf, x.requires_grad, y + 1


def requires_grad_set_inside(x):
    y = (x * 2).detach().requires_grad_()
    return y.requires_grad, y.is_leaf, y * 3


def requires_grad_attribute_set_inside(x):
    y = x.detach()[0]
    y.requires_grad = True
    return y.requires_grad, y.is_leaf, (y * x).sum(-1)


def grad_fn_is_none(x):
    y = x * 2
    return y.grad_fn is None, x.grad_fn is None, y


def factory_tensor(x):
    y = torch.zeros(3)
    return y.requires_grad, y.is_leaf, y + x.sum()


def dtype_and_device(x):
    y = x.to(torch.float64)
    return y.dtype, y.device, str(y.device), y.dtype == torch.float64, y.is_floating_point(), y


def contiguity_and_strides(x):
    y = x.t()
    return y.is_contiguous(), y.stride(), x.is_contiguous(), y.contiguous().stride(), y * 1


def data_pointers(x):
    y = x.view(-1)
    z = x.clone()
    return y.data_ptr() == x.data_ptr(), z.data_ptr() == x.data_ptr(), y + z.view(-1)


def views_and_offsets(x):
    y = x[1]
    return y.is_contiguous(), y.storage_offset(), y.stride(), y * 1


def versions(x):
    y = x.clone()
    before = y._version
    y.add_(1)
    return before, y._version, y


PROBES = [made_under_no_grad, made_normally, enable_grad_inside_no_grad,
          set_grad_enabled_statements, set_grad_enabled_block, detached,
          requires_grad_set_inside, requires_grad_attribute_set_inside, grad_fn_is_none,
          factory_tensor, dtype_and_device, contiguity_and_strides, data_pointers,
          views_and_offsets, versions]


def _answers(result):
    """The probe's Python values, and each tensor's (requires_grad, is_leaf, has a grad_fn,
    dtype, shape)."""
    values = [v for v in result if not isinstance(v, torch.Tensor)]
    tensors = [(v.requires_grad, v.is_leaf, v.grad_fn is not None, v.dtype, tuple(v.shape))
               for v in result if isinstance(v, torch.Tensor)]
    return values, tensors


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("requires_grad", [True, False], ids=["leaf", "plain"])
@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.__name__)
def test_metadata_inside_compiled_code_matches_eager(probe, requires_grad, grad_mode):
    def make():
        return torch.arange(12.0).reshape(3, 4).requires_grad_(requires_grad)

    with torch.set_grad_enabled(grad_mode):
        expected = probe(make())
        mode_after = torch.is_grad_enabled()
    with torch.set_grad_enabled(grad_mode):
        actual = ember.compile(probe)(make())
        assert torch.is_grad_enabled() == mode_after  # (a set_grad_enabled statement stays)
    assert _answers(actual) == _answers(expected)
    for got, want in zip(actual, expected):
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want)


def test_no_grad_value_requires_no_grad_in_one_graph():
    """The no_grad block's value is read in the same graph as the rest (no break)."""
    x = torch.randn(4, requires_grad=True)
    explanation = ember.explain(made_under_no_grad)(x)
    assert explanation.graph_break_count == 0
    assert ember.compile(made_under_no_grad)(x)[:2] == (False, True)


def in_place_results(x):
    y = x * 2
    a = y.add_(1)
    b = torch.relu_(y)
    c = torch.nn.functional.relu(y, inplace=True)
    d = torch.nn.functional.hardswish(y, inplace=True)
    e = y.mul_(2).add_(1)
    f = y.add(1)
    return y, a, (a is y, b is y, c is y, d is y, e is y, f is y)


def test_an_in_place_op_returns_its_operand_itself():
    x = torch.randn(3, 4)
    with torch.no_grad():
        report = ember.explain(in_place_results)(x)
        got = ember.compile(in_place_results)(x)
    expected = in_place_results(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    assert got[2] == expected[2] == (True,) * 5 + (False,)
    assert got[1] is got[0]  # (one tensor returned twice, as eager returns it)
    torch.testing.assert_close(got[:2], expected[:2])
