"""Library nodes: an aten op called at run time on real tensors.

A library node's attrs hold the op (`target`), its arguments with `Slot(i)` where the node's
i-th input tensor goes (`args`, `kwargs`), and the results eager gives (`results`: shape, dtype,
strides per output; `operand_strides`, eager's strides of each input, when the tracer made
the node). It is how ember runs matmul and convolution, and any op without a rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch


class Slot(NamedTuple):
    """Where the library node's input tensor number `index` goes in the argument list."""

    index: int


def fill(template: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(template, Slot):
        return tensors[template.index]
    if isinstance(template, (list, tuple)):
        filled = [fill(item, tensors) for item in template]
        return filled if isinstance(template, list) else tuple(filled)
    if isinstance(template, dict):
        return {key: fill(value, tensors) for key, value in template.items()}
    return template


def format_template(template: Any) -> str:
    if isinstance(template, Slot):
        return f"${template.index}"
    if isinstance(template, list):
        return "[" + ", ".join(format_template(item) for item in template) + "]"
    if isinstance(template, tuple):
        return "(" + ", ".join(format_template(item) for item in template) + ")"
    if isinstance(template, dict):
        return ", ".join(f"{key}={format_template(value)}" for key, value in template.items())
    return repr(template)


def call(attrs: dict[str, Any], tensors: Sequence[torch.Tensor]) -> Any:
    target = attrs["target"]
    switched = attrs.get("switches")
    if not switched:
        return target(*fill(attrs["args"], tensors), **fill(attrs["kwargs"], tensors))
    from ember.runtime.switches import Switched

    with Switched(switched):  # (the backend switches it was traced under)
        return target(*fill(attrs["args"], tensors), **fill(attrs["kwargs"], tensors))


def returns_views(attrs: dict[str, Any]) -> bool:
    """Does the call's result share memory with its operands (as_strided, view(dtype))? Then
    the result depends on the operands' layout, and their memory lives as long as it does."""
    from ember import torch_internals

    target = called_target(attrs)
    if not torch_internals.is_op_overload(target):
        return False
    return any(r.alias_info is not None for r in torch_internals.schema_of(target).returns)


def called_target(attrs: dict[str, Any]) -> Any:
    """The op a library node calls: its target, or, for a call a training graph's forward
    runs under autograd (autodiff/tape.py: `keeps_operands`), the op inside it."""
    if attrs.get("keeps_operands"):
        return attrs["args"][0].target
    return attrs["target"]
