"""The layout ember gives pointwise results must be eager's (TensorIterator's), even where the
meta kernels disagree with eager: size-1 dims, Python numbers as operands, decompositions."""

import copy

import pytest
import torch

from ember.lower import rules  # noqa: F401  (fills the lowerings table)
from ember.lower.layout import eager_layout
from ember.lower.registry import lowerings


def _pointwise_ops():
    ops = set()
    for key in lowerings:
        if isinstance(key, torch._ops.OpOverloadPacket):
            ops.update(getattr(key, name) for name in key.overloads())
        else:
            ops.add(key)
    return sorted((op for op in ops if torch.Tag.pointwise in op.tags and not any(
        a.alias_info is not None for a in op._schema.arguments)), key=str)


def _operands():
    return [
        torch.rand(2, 1).as_strided((2, 1), (1, 2)),     # row-major but for a size-1 stride
        torch.rand(3, 3).t()[..., 1::2],                 # (3, 1) with strides (1, 6)
        torch.rand(3, 1, 4).as_strided((3, 1, 4), (1, 12, 3)),
        torch.rand(5, 4).t(), torch.rand(4, 5), torch.rand(3, 4, 10)[..., ::2],
        torch.rand(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        torch.rand(4, 1).expand(4, 5), torch.rand(1, 5), torch.tensor(1.5),
    ]


def _argument_lists():
    operands = _operands()
    for a in operands:
        yield (a,)
        yield (a, 2.0)
        yield (2.0, a)  # (a number as `self`: pow.Scalar's result is row-major, whatever `a`)
        for b in operands:
            yield (a, b)
            yield (a, b, operands[3])


def _meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


@pytest.mark.parametrize("op", _pointwise_ops(), ids=str)
def test_pointwise_results_take_eager_strides(op):
    for args in _argument_lists():
        meta_args = [_meta(a) for a in args]
        try:
            expected, meta = op(*args), op(*meta_args)
        except (RuntimeError, TypeError, ValueError):
            continue  # not a valid call of this overload
        if not isinstance(expected, torch.Tensor) or expected.ndim < 2 or not expected.numel():
            continue
        corrected = eager_layout(op, meta_args, {}, meta)
        described = [(tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a
                     for a in args]
        assert corrected.stride() == expected.stride(), f"{op}{described}"


def test_flip_keeps_the_layout_of_its_input():
    # eager's flip allocates like its input (empty_like); the meta kernel, row-major
    for x in _operands():
        if x.ndim:
            meta = _meta(x)
            corrected = eager_layout(torch.ops.aten.flip.default, [meta, [0]], {},
                                             torch.ops.aten.flip.default(meta, [0]))
            assert corrected.stride() == x.flip(0).stride(), (tuple(x.shape), x.stride())


@pytest.mark.parametrize("training", [True, False])
def test_cpu_batch_norm_allocates_in_the_inputs_suggested_memory_format(training):
    # CPU's kernel: empty_like(input, input.suggest_memory_format()), row-major for a
    # transposed (batch, channels, length) view (PatchTST); the meta kernel keeps its strides
    aten = torch.ops.aten
    inputs = [torch.rand(6, 4, 8).transpose(1, 2), torch.rand(2, 5, 6, 8).permute(0, 3, 1, 2),
              torch.rand(2, 8, 5, 6).contiguous(memory_format=torch.channels_last),
              torch.rand(2, 8, 3, 4, 5).contiguous(memory_format=torch.channels_last_3d),
              torch.rand(2, 8, 5)]
    for x in inputs:
        channels = [torch.rand(8), torch.rand(8), torch.zeros(8), torch.ones(8)]
        for op, args in [(aten.native_batch_norm.default, (x, *channels, training, 0.1, 1e-5)),
                         (aten._native_batch_norm_legit_no_training.default,
                          (x, *channels, 0.1, 1e-5))]:
            meta_args = [_meta(a) for a in args]
            corrected = eager_layout(op, meta_args, {}, op(*meta_args))
            expected = op(*args)
            assert [t.stride() for t in corrected] == [t.stride() for t in expected], \
                (op, tuple(x.shape), x.stride())


def test_batch_norm_in_training_over_a_transposed_view_runs_compiled():
    # the library call's result was checked against the meta kernel's strides, failed, and
    # sent the whole graph to eager
    from helpers import watching_fallbacks

    import ember

    torch.manual_seed(0)
    norm = torch.nn.BatchNorm1d(8).train()
    reference = copy.deepcopy(norm)

    def fn(module, x):
        return (module(x.transpose(1, 2)).transpose(1, 2) * 2).sum(-1)

    x = torch.randn(3, 5, 8, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_()
    compiled = ember.compile(fn)
    with watching_fallbacks() as fallbacks:
        got = compiled(norm, x)
        got.sum().backward()
    assert not [m for m in fallbacks.messages if "eager" in m], fallbacks.messages
    want = fn(reference, x_eager)
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, x_eager.grad)
    torch.testing.assert_close(norm.weight.grad, reference.weight.grad)
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    explained = ember.explain(fn)(copy.deepcopy(reference), x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


@pytest.mark.parametrize("op, extra", [
    (torch.ops.aten.reflection_pad2d.default, ([1, 2, 2, 1],)),
    (torch.ops.aten.replication_pad2d.default, ([1, 2, 2, 1],)),
    (torch.ops.aten.channel_shuffle.default, (2,)),
    (torch.ops.aten.native_channel_shuffle.default, (2,)),
    (torch.ops.aten.reflection_pad3d.default, ([1, 1, 2, 1, 1, 0],)),
    (torch.ops.aten.replication_pad3d.default, ([1, 1, 2, 1, 1, 0],)),
    (torch.ops.aten.roll.default, ([1], [2])),
], ids=str)
def test_cpu_pads_and_shuffles_allocate_in_the_inputs_suggested_memory_format(op, extra):
    # channels-last in, channels-last out on the CPU, where the meta kernels say row-major
    three_d = "3d" in str(op)
    shape = (2, 4, 3, 6, 5) if three_d else (2, 4, 6, 5)
    inputs = [torch.rand(shape), torch.rand(shape).transpose(-1, -2),
              torch.rand(shape).contiguous(memory_format=torch.channels_last_3d if three_d
                                           else torch.channels_last)]
    for x in inputs:
        if op is torch.ops.aten.native_channel_shuffle.default and not x.is_contiguous() \
                and not x.is_contiguous(memory_format=torch.channels_last):
            continue  # (eager's own view refuses it)
        expected = op(x, *extra)
        corrected = eager_layout(op, [_meta(x), *extra], {}, op(_meta(x), *extra))
        assert corrected.stride() == expected.stride(), (tuple(x.shape), x.stride())


def test_reflection_padding_of_a_channels_last_image_runs_compiled():
    from helpers import watching_fallbacks

    import ember

    def fn(x):
        padded = torch.nn.functional.pad(x, (1, 2, 2, 1), mode="reflect")
        return torch.nn.functional.channel_shuffle(padded, 2) * 2

    x = torch.randn(2, 4, 6, 5).contiguous(memory_format=torch.channels_last)
    with watching_fallbacks() as fallbacks:
        got = ember.compile(fn)(x)
    assert not fallbacks.messages
    expected = fn(x)
    torch.testing.assert_close(got, expected)
    assert got.stride() == expected.stride()
