"""A tensor's attributes under capture: its metadata (constants of the fake: dtype, device,
shape as tracked sizes), its views (T, mT, mH, real, imag, data) as graph nodes, its methods
as TensorMethodValues; and `requires_grad` set on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ember import torch_internals
from ember.capture.errors import Unsupported
from ember.capture.semantics import python_value
from ember.capture.symbols import tracked_size
from ember.capture.values import Const, SequenceValue, TensorMethodValue, TensorValue, Value

if TYPE_CHECKING:
    from ember.capture.session import Session

_MISSING = object()

_TENSOR_CONSTANT_ATTRIBUTES = ("dtype", "device", "ndim", "is_cuda", "is_cpu", "is_sparse",
                               "layout", "requires_grad", "is_leaf", "is_quantized", "is_meta",
                               "is_nested", "is_mkldnn")


def tensor_attribute(session: Session, value: TensorValue, name: str) -> Value:
    fake = value.fake
    if name in _TENSOR_CONSTANT_ATTRIBUTES:
        return Const(getattr(fake, name))
    if name == "shape":
        return SequenceValue([Const(tracked_size(d)) for d in fake.shape], torch.Size)
    if name == "T":
        return session.builder.call("call_method", "permute", (value,),
                                    {"dims": Const(tuple(reversed(range(fake.ndim))))})
    if name == "mT" or (name == "mH" and not fake.is_complex()):
        return session.builder.call("call_method", "transpose",
                                    (value, Const(-2), Const(-1)), {})
    if name in ("mH", "H"):  # (conjugated: complex; H of at most two dims, as eager checks)
        if name == "H" and fake.ndim > 2:
            raise Unsupported("tensor.H of more than two dims (eager refuses it too)")
        return session.builder.call("call_function", torch.adjoint, (value,), {})
    if name == "data":
        # (not detach(): .data has a version counter of its own, so `p.data.clamp_()` leaves
        # what autograd saved of p valid, as it must when the graph runs eagerly)
        for getter in torch_internals.data_attribute_getters():
            return session.builder.call("call_function", getter, (value,), {})
        return session.builder.call("call_method", "detach", (value,), {})
    if name == "real" and not fake.is_complex():
        return value
    if name in ("real", "imag"):  # (views of a complex tensor's parts)
        return session.builder.call("call_function", getattr(torch, name), (value,), {})
    if name in ("grad", "grad_fn", "_base", "_version"):
        raise Unsupported(f"tensor.{name} inside the compiled function",
                          f"read tensor.{name} outside the compiled function")
    attribute = getattr(torch.Tensor, name, _MISSING)
    if attribute is _MISSING:
        raise Unsupported(f"tensors have no attribute {name!r}")
    if callable(attribute):
        return TensorMethodValue(value, name)
    raise Unsupported(f"tensor attribute {name!r} is not supported yet")


def set_requires_grad(session: Session, tensor: TensorValue, wanted: Value,
                      method: bool) -> Value:
    """`x.requires_grad = b` (`method`: `x.requires_grad_(b)`), as eager answers it. True
    makes a new autograd leaf: a node, kept in the compiled graph where eager's gradient of
    the leaf is unobservable, else an eager island (lower/meta_interpreter.py). False would
    stop a gradient the graph already takes: a break."""
    requires = python_value(wanted)
    fake = tensor.fake
    if type(requires) is not bool:
        raise Unsupported(f"requires_grad set to a {type(requires).__name__}",
                          "eager wants a bool here")
    if not fake.is_leaf and not (method and requires):
        raise Unsupported("requires_grad set on a tensor that is not a leaf (eager raises "
                          "here)", "set it on a leaf, or detach() the tensor first")
    if fake.requires_grad == requires:
        return tensor  # (nothing changes)
    if not requires:
        raise Unsupported("requires_grad turned off inside the compiled function",
                          "set it before calling the compiled function")
    return session.builder.call("call_method", "requires_grad_", (tensor,), {})
