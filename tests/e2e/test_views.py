"""View ops against eager: views returned as outputs (same strides and storage offsets as
eager's), views of computed values, views feeding pointwise ops, every layout, negative dims,
empty and 0-d tensors."""

import pytest
import torch
from helpers import LAYOUTS, check, make, make_layout


def views_of(x):
    """Views of a (4, 6, 5) tensor, by every view op ember has a rule for."""
    return {
        "reshape": x.reshape(4, 30), "reshape_infer": x.reshape(-1, 5),
        "flatten": x.flatten(1), "flatten_all": x.flatten(),
        "unflatten": x.unflatten(1, (2, 3)), "t": x[0].t(), "T": x[0].T, "mT": x.mT,
        "transpose": x.transpose(0, -1), "transpose_neg": x.transpose(-2, -3),
        "permute": x.permute(2, 0, 1), "permute_neg": x.permute(-1, -3, -2),
        "movedim": x.movedim(0, -1), "expand": x[:, :1].expand(4, 3, 5),
        "expand_new_dims": x[0, 0].expand(2, 3, 5), "slice": x[1:3],
        "slice_step": x[:, ::2], "slice_neg": x[..., -3:], "slice_step_offset": x[1::2, 1::3],
        "select": x[2], "select_neg": x[:, -1], "narrow": x.narrow(2, 1, 3),
        "narrow_neg": x.narrow(-1, -2, 2), "squeeze": x[:, :1].squeeze(1),
        "squeeze_all": x[:1, :, :1].squeeze(), "squeeze_dims": x[:1, :1].squeeze((0, 1)),
        "unsqueeze": x.unsqueeze(1), "unsqueeze_neg": x.unsqueeze(-1),
        "diagonal": x.diagonal(), "diagonal_offset": x.diagonal(1, 1, 2),
        "diagonal_neg": x.diagonal(-1, -1, 0), "unfold": x.unfold(1, 2, 2),
        "unfold_overlap": x.unfold(-1, 3, 1), "split": x.split(2, 1), "split_uneven": x.split(4, 2),
        "split_sizes": x.split([1, 3, 2], 1), "chunk": x.chunk(3, -1), "unbind": x.unbind(0),
        "view": x.view(4, 6, 5), "detach": x.detach(), "alias": x.view_as(x),
        "new_dims": x[None, :, None],
    }


SEQUENCES = ("split", "split_uneven", "split_sizes", "chunk", "unbind")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_views_of_inputs_are_returned_as_views(layout):
    check(views_of, make_layout(layout, 4, 6, 5), library=0)


def test_views_of_computed_values():
    check(lambda x: views_of(x * 2 + 1), make(4, 6, 5), library=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_views_feeding_pointwise_ops(layout):
    def fn(x):
        result = {}
        for name, value in views_of(x).items():
            if name in SEQUENCES:  # fx proxies: index them, they cannot be iterated
                result[name] = (value[0] * 2, value[-1].exp())
            else:
                result[name] = value * 2
        return result

    check(fn, make_layout(layout, 4, 6, 5), library=0)


def test_mixing_views_in_one_expression():
    def fn(x, y):
        a = x.transpose(0, 1)[:, ::2] + y.unsqueeze(-1)
        b = x.reshape(6, 2)[1:].t() * y.flatten()[:1]
        c = torch.cat(x.split(2, 0), 1) - x.flip(0).reshape(2, 6)
        return a, b, c

    check(fn, make(4, 3), make(3, seed=1), library=0)


def test_reshape_that_must_copy():
    # a transposed input cannot be viewed with the new shape: eager copies, so must ember
    x = make_layout("transposed", 4, 6)
    check(lambda x: (x.reshape(24), x.reshape(2, 12), x.flatten(), x.reshape(3, 8) + 1,
                     x.contiguous(), x.view(4, 6), x.t().view(24)), x, library=0)


def test_empty_and_zero_dim_views():
    def fn(empty, scalar):
        return {"view": empty.view(-1, 5), "t": empty.t(), "slice": empty[:, 1:3],
                "unsqueeze": empty.unsqueeze(0), "flatten": empty.flatten(),
                "split": empty.split(2, 1), "expand": empty[:, :1].expand(0, 4),
                "scalar_view": scalar.view(1), "scalar_reshape": scalar.reshape(1, 1),
                "scalar_unsqueeze": scalar.unsqueeze(0), "scalar_expand": scalar.expand(3, 2),
                "scalar_t": scalar.t(), "scalar_squeeze": scalar.squeeze(),
                "scalar_flatten": scalar.flatten(), "scalar_math": scalar.view(1, 1) * 2}

    check(fn, make(0, 5), torch.tensor(2.5), library=0)


def test_size_one_dims():
    x = make(1, 5, 1, 3)
    check(lambda x: (x.squeeze(), x.squeeze(0), x.squeeze(-2), x.mT,
                     x.permute(3, 2, 1, 0), x.expand(2, 5, 4, 3), x.view(5, 3), x.transpose(0, 2),
                     x.flatten(0, 2), x.unsqueeze(2)), x, library=0)


def test_as_strided_of_an_input():
    x = make(4, 5)
    check(lambda x: (x.as_strided((3, 3), (5, 1), 2), x.as_strided((2, 2), (1, 5)) * 2), x)


def test_views_of_integer_and_bool_tensors():
    for dtype in (torch.int64, torch.uint8, torch.bool, torch.float16):
        x = make(4, 6, 5, dtype=dtype)
        check(lambda x: {k: v for k, v in views_of(x).items() if k != "expand_new_dims"}, x,
              library=0)


def test_reading_a_returned_view_at_another_index():
    # the row maxima are returned (a view of the reduction's buffer) and read flipped by a
    # pointwise op: that op must not share the reduction's loop (it reads later elements)
    x = make_layout("strided", 3, 8)
    check(lambda x: (torch.cat([x, x * 2], -1).amax(-2) * 1,
                     torch.cat([x, x * 2], -1).amax(-2).flip(0) - 1.0), x, library=0)


def test_view_passed_to_a_library_call_and_returned():
    # the slice goes to cumsum (a library call) as an alias; returned, it takes eager's layout
    x = make_layout("strided", 8, 8, 5)
    check(lambda x: (torch.sigmoid(x)[..., 1::2] * 1, torch.sigmoid(x)[..., 1::2].cumsum(-1)),
          x, library=1)


def test_consumer_of_a_returned_view_in_the_reduction_kernel():
    # the reduced value is returned (a squeezed view of its buffer) and used by pointwise ops in
    # the kernel that computes it: they must compute it, not load it before it is stored
    x = make(1, 1, 5)
    check(lambda x: (torch.exp(x.sum(-2)), x.sum(-2), torch.tanh(x.amax(1)) + x.amax(1)), x,
          library=0)


def test_flip_of_a_copied_view():
    # (found by the property tests: the flipped index 3 - i was divided as -i + 1, and C and
    # Triton truncate negative quotients and remainders toward zero)
    x = make(2, 2).t()
    check(lambda x: torch.flip(x.reshape(-1), (0,)), x)
    check(lambda x: torch.flip(x, (0, 1)).reshape(-1) * 2, make(3, 5).t())


def test_complex_parts_conjugates_and_adjoints_match_eager():
    # (.real/.imag/.H of a tensor sent the whole frame to eager; torch's lazy conjugate's
    # imaginary part, read through library calls, came back with its sign flipped)
    import ember

    x = make(4, 8)
    programs = [lambda x: (torch.fft.fft(x).real * 2 + 1).relu(),
                lambda x: torch.fft.fft(x).imag.sum(-1),
                lambda x: x.real + 1,
                lambda x: x.H @ x,
                lambda x: torch.fft.fft(x).conj().imag * 1,
                lambda x: torch.fft.fft(x).H.imag,
                lambda x: torch.adjoint(torch.fft.fft(x)).real]
    for program in programs:
        assert ember.explain(program)(x).graph_break_count == 0
        torch.testing.assert_close(ember.compile(program)(x), program(x))


def test_an_input_returned_as_it_is_is_the_same_object_and_an_alias_is_a_new_one():
    # (x[...], view_as, detach and a same-shape reshape are new tensor objects in eager: a
    # later t_() or requires_grad_() on them must not reach the caller's tensor)
    import ember

    def fn(x):
        return x, x[...], x.view_as(x), x.detach(), x.reshape(x.shape), x.contiguous()

    for run in (fn, ember.compile(fn)):
        x = make(2, 3)
        outputs = run(x)
        assert [out is x for out in outputs] == [True, False, False, False, False, True]
        assert all(out.data_ptr() == x.data_ptr() for out in outputs)
        outputs[1].t_()
        outputs[3].requires_grad_()
        assert x.shape == (2, 3) and not x.requires_grad
