"""Complex intermediates in training graphs, against eager: values, gradients, and that the
graph compiles whole for training (no eager island, no region sent to eager). Complex values
are differentiated through library calls, whose backward is torch's own; a graph output that
views a complex value as its real pairs (view_as_real) stays a view autograd differentiates.
(Such regions raised an internal KeyError on a complex kernel, and ran eagerly with a
warning, until 2026-12-02.)"""

import pytest
import torch
from helpers import check_grad, make, watching_fallbacks

import ember


def rotary(xq: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Meta's Llama rotary embedding, as its model.py writes it."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    return torch.view_as_real(xq_ * freqs_cis).flatten(2).type_as(xq)


def complex_of(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(x)


PROGRAMS = {
    "mul_by_a_constant": lambda x: torch.view_as_real(complex_of(x) * 2 + 1j),
    "exp": lambda x: torch.view_as_real(torch.exp(complex_of(x))),
    "plus_complex_zeros": lambda x: torch.view_as_real(
        complex_of(x) + torch.zeros(x.shape[0], dtype=torch.complex64, device=x.device)),
    "abs_plus_angle": lambda x: complex_of(x).abs() + complex_of(x).angle(),
    "sum": lambda x: torch.view_as_real(complex_of(x).sum(0, keepdim=True)),
    "polar_times_input": lambda x: torch.view_as_real(
        torch.polar(x[:, 0].abs() + 0.5, x[:, 1]) * complex_of(x)),
    "rfft_irfft": lambda x: torch.fft.irfft(torch.fft.rfft(x[:, 0]) * 2, n=x.shape[0]),
    "complex_result": lambda x: complex_of(x) * 2,
    "cat": lambda x: torch.view_as_real(torch.cat([complex_of(x), complex_of(x) * 1j])),
    "where": lambda x: torch.view_as_real(torch.where(x[:, 0] > 0, complex_of(x), 0)),
    "used_twice": lambda x: torch.view_as_real(complex_of(x) * complex_of(x).exp()),
    # (the product's derivative conjugates the other operand: a real rule gave wrong ones)
    "mm": lambda x: torch.view_as_real(torch.mm(complex_of(x).view(2, 3),
                                                complex_of(x).view(3, 2) * (1 + 2j))),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_complex_intermediate_trains_compiled(name):
    program = PROGRAMS[name]

    def real(x):  # (check_grad compares real results)
        result = program(x)
        return torch.view_as_real(result) if result.is_complex() else result

    check_grad(real, make(6, 2), dynamo=True)


def test_llama_rotary_embedding_trains_as_one_graph_without_islands():
    xq = make(2, 5, 3, 8).requires_grad_()
    angles = make(5, 1, 4, seed=1)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    compiled = ember.compile(rotary)
    with watching_fallbacks() as fallbacks:
        got = compiled(xq, freqs_cis)
    assert not fallbacks.messages
    want = rotary(xq, freqs_cis)
    torch.testing.assert_close(got, want)
    assert got.requires_grad
    cotangent = make(*want.shape, seed=2)
    torch.testing.assert_close(torch.autograd.grad(got, xq, cotangent)[0],
                               torch.autograd.grad(want, xq, cotangent)[0])
    explanation = ember.explain(rotary)(xq, freqs_cis)
    assert explanation.graph_count == 1 and not explanation.eager_islands


def test_a_complex_leaf_gets_eagers_gradient():
    # (a complex input that requires grad: its gradient is the conjugate Wirtinger one)
    z = torch.complex(make(5), make(5, seed=1)).requires_grad_()
    w = make(5, seed=2).requires_grad_()

    def program(z, w):
        return torch.view_as_real(z * z.exp() * w).sum(-1)

    with watching_fallbacks() as fallbacks:
        got = ember.compile(program)(z, w)
    assert not fallbacks.messages
    want = program(z, w)
    torch.testing.assert_close(got, want)
    assert got.requires_grad
    cotangent = make(5, seed=3)
    for g, e in zip(torch.autograd.grad(got, (z, w), cotangent),
                    torch.autograd.grad(want, (z, w), cotangent)):
        torch.testing.assert_close(g, e)
