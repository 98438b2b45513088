"""A fake of a plain tensor made directly (FakeTensor's constructor, the converter's memo,
a storage's use count: torch internals, behind this adapter).

FakeTensorMode.from_tensor describes a real tensor (its view chain, its storage, its
autograd metadata) and rebuilds it on the meta device: about 180 us a tensor on this host.
A model's parameters and buffers are mostly plain dense leaves that share their storage with
no other tensor; for those the fake is an uninitialized meta tensor of the same geometry,
wrapped, about 20 us — MobileNetV3's capture faked some 300 such tensors on every first call.
The fake is put in the mode's memo, so that from_tensor answers it for that tensor after.

Also here: `quiet_failed_meta_runs`, which keeps FakeTensorMode's own log of an op that
failed on fakes off the user's stderr while ember captures.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ember.torch_internals import storage_use_count

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def quick_fake(mode: Any, tensor: torch.Tensor) -> torch.Tensor | None:
    """`mode`'s fake of `tensor` made directly, or None where the tensor is not plain enough
    (a view, a storage shared with another tensor or larger than the tensor, a gradient
    attached, a subclass, an inference tensor, conjugate or negative bits, names, a layout
    or device from_tensor treats apart): from_tensor answers those."""
    if type(tensor) not in _PLAIN_TYPES or tensor.layout is not torch.strided or \
            tensor.device.type not in ("cpu", "cuda") or tensor._base is not None or \
            tensor.grad_fn is not None or tensor.grad is not None or \
            tensor.is_inference() or tensor.is_conj() or tensor.is_neg() or \
            tensor.is_quantized or tensor.storage_offset() != 0 or \
            any(name is not None for name in getattr(tensor, "names", ())):
        return None
    from torch._subclasses.fake_tensor import FakeTensor

    converter = mode.fake_tensor_converter
    if converter._get_memo(tensor) is not None:
        return None  # (from_tensor answers from the memo)
    # (2: the tensor's own reference and the count's look at it; a view or an alias adds one)
    if storage_use_count(tensor) != 2:
        return None
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    if tensor.numel() == 0 or \
            tensor.untyped_storage().nbytes() != span * tensor.element_size():
        return None
    with torch.inference_mode(False):  # (a normal tensor's fake is no inference tensor)
        meta = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()),
                                   dtype=tensor.dtype, device="meta")
        fake = FakeTensor(mode, meta, tensor.device)
        if tensor.requires_grad:
            fake.requires_grad_(True)
    if isinstance(tensor, torch.nn.Parameter):
        fake._is_param = True  # (isinstance(fake, nn.Parameter), as from_tensor's fake)
    converter.set_tensor_memo(tensor, fake)
    return fake


# FakeTensorMode logs an op that raised on fakes (with its traceback, at ERROR level, through
# torch's own handler) before the error goes on. Ember's capture catches that error and does
# what eager would (a graph break where the code catches it, eager's own run otherwise), and
# says so on its fallbacks channel; the record would be a page of an internal traceback on the
# user's stderr for a program that then runs correctly (transformers' Nystromformer, whose
# mask under compilation does not broadcast).
_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"
_FAILED_META_RUN = "failed while attempting to run meta"
_capturing = threading.local()


class _FailedMetaRuns(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_capturing, "depth", 0) and
                    str(record.msg).startswith(_FAILED_META_RUN))


_filter = _FailedMetaRuns()


@contextlib.contextmanager
def quiet_failed_meta_runs() -> Iterator[None]:
    """FakeTensorMode's record of an op failing on fakes dropped in this thread, inside."""
    logging.getLogger(_FAKE_TENSOR_LOGGER).addFilter(_filter)  # (once: addFilter checks)
    _capturing.depth = getattr(_capturing, "depth", 0) + 1
    try:
        yield
    finally:
        _capturing.depth -= 1
