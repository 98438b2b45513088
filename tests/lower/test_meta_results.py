"""The tracer's meta results kept by their arguments' geometry (ember/lower/meta_results.py):
a repeat gets fresh tensors of the same geometry; what a fresh copy would not reproduce (a
view of an input, a symbolic size, a real tensor) runs the meta kernel every time."""

import torch

from ember.lower import meta_results

aten = torch.ops.aten


def _geometry(tensor):
    return (tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype,
            tensor.untyped_storage().nbytes())


def test_a_repeated_call_is_answered_with_fresh_tensors_of_the_same_geometry():
    meta_results.clear()
    x = torch.empty(8, 4, 6, 6, device="meta").contiguous(memory_format=torch.channels_last)
    weight, bias = torch.empty(4, device="meta"), torch.empty(4, device="meta")
    stats = [torch.empty(4, device="meta"), torch.empty(4, device="meta")]
    args = (x, weight, bias, *stats, True, 0.1, 1e-5)
    func = aten._native_batch_norm_legit_functional.default
    first = meta_results.call(func, args, {})
    assert len(meta_results._kept) == 1
    again = meta_results.call(func, args, {})
    assert len(meta_results._kept) == 1
    direct = func(*args)
    assert [_geometry(t) for t in again] == [_geometry(t) for t in first] == \
        [_geometry(t) for t in direct]
    assert all(a is not b for a, b in zip(again, first))
    assert {t.untyped_storage()._cdata for t in again}.isdisjoint(
        {t.untyped_storage()._cdata for t in (*first, x)})


def test_other_geometry_other_values_and_other_dtypes_are_other_answers():
    meta_results.clear()
    a = torch.empty(3, 5, device="meta")
    meta_results.call(aten.add.Tensor, (a, a), {})
    meta_results.call(aten.add.Tensor, (a.t(), a.t()), {})
    meta_results.call(aten.add.Tensor, (a, a), {"alpha": 2})
    meta_results.call(aten.add.Tensor, (a.to(torch.float64), a), {})
    assert len(meta_results._kept) == 4
    out = meta_results.call(aten.add.Tensor, (a.t(), a.t()), {})
    assert out.stride() == aten.add.Tensor(a.t(), a.t()).stride() == (1, 5)


def test_results_that_a_fresh_tensor_would_not_reproduce_are_not_kept():
    meta_results.clear()
    a = torch.empty(3, 5, device="meta")
    assert meta_results.call(aten.alias.default, (a,), {})._base is a  # (a view of its input)
    meta_results.call(aten.add.Tensor, (torch.ones(2), torch.ones(2)), {})  # (real tensors)
    meta_results.call(aten.add.Tensor, (a.requires_grad_(), a), {})
    assert len(meta_results._kept) == 0
