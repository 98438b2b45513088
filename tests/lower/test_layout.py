"""The layout ember gives pointwise results must be eager's (TensorIterator's), even where the
meta kernels disagree with eager: size-1 dims, Python numbers as operands, decompositions."""

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
