"""Large CPU buffers come from fresh memory with a huge-page hint: right values, right
layout, nothing shared between calls."""

import torch

from ember.runtime import memory


def test_large_buffer_has_the_asked_geometry_and_is_writable():
    shape, strides = (1024, 2048), (1, 1024)  # transposed, 8 MB
    tensor = memory.empty_cpu(shape, strides, torch.float32)
    assert tuple(tensor.shape) == shape and tuple(tensor.stride()) == strides
    tensor.fill_(3.0)
    assert float(tensor.sum()) == 3.0 * 1024 * 2048


def test_small_buffer_skips_the_hint():
    tensor = memory.empty_cpu((4, 4), (4, 1), torch.float16)
    assert tensor.dtype == torch.float16 and tuple(tensor.stride()) == (4, 1)


def test_each_call_gets_its_own_memory():
    first = memory.empty_cpu((1 << 21,), (1,), torch.float32)
    second = memory.empty_cpu((1 << 21,), (1,), torch.float32)
    assert first.data_ptr() != second.data_ptr()
