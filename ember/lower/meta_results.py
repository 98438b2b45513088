"""Results of functional ops on meta tensors, kept by what they depend on.

The tracer runs every op on meta tensors to learn its result's shape, dtype and strides. A
meta kernel written in Python is slow: batch norm's is torch's decomposition, about twenty
ops, 1.4 ms a call on a CPU of 2026 (several under a profiler); a ReLU's, type promotion and
TensorIterator's layout in Python, 0.4 ms. A model repeats its layers, and each repeat asks
the same questions (ResNet-50's 53 batch norms have 16 shapes: its training forward asks
280 questions, 224 of them repeats; a transformer's layers are all alike). A meta tensor holds no
data, so a functional op's result depends on nothing but its arguments' metadata and values:
the answer is kept by those and given again as fresh meta tensors of the same geometry.

Kept only where that is sure: plain tensors and plain values in, fresh dense tensors out
(none of them a view of an input or of each other, none with a symbolic size), no write.
Anything else runs the meta kernel as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from ember.lower.layout import fresh_meta
from ember.torch_internals import tree_flatten

_KEPT_MOST = 4096  # (entries: a few hundred bytes each)
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout)

_kept: OrderedDict[tuple, Any] = OrderedDict()  # (key -> the meta result, kept as made)
_lock = threading.Lock()


def call(func: Any, args: tuple, kwargs: dict) -> Any:
    """func(*args, **kwargs) on meta tensors, from the kept answer where there is one."""
    key = _key(func, args, kwargs)
    if key is None:
        return func(*args, **kwargs)
    with _lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
    if found is not None:
        return fresh_meta(found)
    out = func(*args, **kwargs)
    if _reproducible(out, args, kwargs):
        with _lock:
            _kept[key] = fresh_meta(out)  # (not `out` itself: the tracer binds it)
            if len(_kept) > _KEPT_MOST:
                _kept.popitem(last=False)
    return out


def clear() -> None:
    with _lock:
        _kept.clear()


def _key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """What the meta result depends on, or None where an argument is not plain (a symbolic
    size, a generator, a tensor subclass or one on a real device)."""
    parts: list[Any] = [func, torch.is_grad_enabled(), torch.get_default_dtype()]
    if not _describe(args, parts):
        return None
    for name in sorted(kwargs):
        parts.append(name)
        if not _describe(kwargs[name], parts):
            return None
    return tuple(parts)


def _describe(value: Any, parts: list) -> bool:
    kind = type(value)
    if kind is torch.Tensor:
        if value.device.type != "meta" or value.is_conj() or value.is_neg() or \
                value.requires_grad:
            return False
        shape, stride = value.shape, value.stride()
        if not all(type(n) is int for n in (*shape, *stride)):
            return False
        parts.append((tuple(shape), stride, value.storage_offset(), value.dtype))
        return True
    if kind in (tuple, list):
        parts.append((kind, len(value)))
        return all(_describe(item, parts) for item in value)
    if kind in _PLAIN:
        parts.append((kind, value))
        return True
    return False


def _reproducible(out: Any, args: tuple, kwargs: dict) -> bool:
    """Would fresh meta tensors of `out`'s geometry be the same answer? Not where a tensor is
    a view of an input or of another result, does not fill its storage from its start, or
    has a symbolic size; nor where a leaf is not a tensor or a plain value."""
    inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0]
              if type(t) is torch.Tensor}
    storages: set[int] = set()
    for leaf in tree_flatten(out)[0]:
        if type(leaf) is not torch.Tensor:
            if type(leaf) not in _PLAIN:
                return False
            continue
        if leaf.device.type != "meta" or leaf.requires_grad or leaf.is_conj() or \
                leaf.is_neg() or leaf.storage_offset() != 0 or leaf._base is not None:
            return False
        shape, stride = tuple(leaf.shape), leaf.stride()
        if not all(type(n) is int for n in (*shape, *stride)) or \
                leaf.untyped_storage().nbytes() != _dense_bytes(shape, stride,
                                                                leaf.element_size()):
            return False
        storage = leaf.untyped_storage()._cdata
        if storage in inputs or storage in storages:
            return False
        storages.add(storage)
    return True


def _dense_bytes(shape: tuple, stride: tuple, itemsize: int) -> int:
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * itemsize
