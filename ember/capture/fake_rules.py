"""Results on fake tensors that the capture computes itself, where torch's fake mode would
run a Python decomposition of the op, each of its pieces dispatched through the fake mode
again. A batch norm in eval is ~10 such pieces: 19 of them were a quarter of MobileNetV3's
capture (2026-12-06), its 29 hardswishes and hardsigmoids another 8%. A rule answers only
the plain case, where its answer is surely what the op gives; None leaves the op to the fake
mode (and its errors to eager's own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ember import torch_internals


def _plain(input: Any, *others: Any) -> bool:
    """The case a rule answers: a floating-point input of known sizes (no symbol: asking would
    guard them) laid out contiguously or channels-last (an elementwise result's layout is
    then the input's own), no autocast, and no tensor among them that autograd tracks."""
    if not isinstance(input, torch.Tensor) or not input.is_floating_point() or \
            not all(isinstance(n, int) for n in (*input.shape, *input.stride())) or \
            torch_internals.autocast_state() is not None:
        return False
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (input, *others)):
        return False
    return input.is_contiguous() or (input.dim() == 4 and
                                     input.is_contiguous(memory_format=torch.channels_last))


def _batch_norm(input: Any, running_mean: Any, running_var: Any, weight: Any = None,
                bias: Any = None, training: bool = False, momentum: float = 0.1,
                eps: float = 1e-5) -> Any:
    """F.batch_norm that updates no running statistics and makes nothing autograd tracks:
    a tensor like its input."""
    per_channel = [running_mean, running_var, weight, bias]
    if (training and (running_mean is not None or running_var is not None)) or \
            (not training and (running_mean is None or running_var is None)) or \
            not _plain(input, *per_channel) or input.dim() < 2:
        return None
    channels = input.shape[1]
    if any(t is not None and (not isinstance(t, torch.Tensor) or t.shape != (channels,))
           for t in per_channel):
        return None
    return torch.empty_like(input)


def _elementwise(input: Any, inplace: bool = False) -> Any:
    """An activation (hardswish, hardsigmoid: torch's fake mode runs their decompositions) of
    a floating-point tensor that autograd does not track: a tensor like it, or the tensor
    itself, its version moved, in place."""
    if not _plain(input):
        return None
    if inplace:
        torch.autograd.graph.increment_version(input)
        return input
    return torch.empty_like(input)


_RULES: dict[Any, Callable[..., Any]] = {F.batch_norm: _batch_norm,
                                         F.hardswish: _elementwise, F.hardsigmoid: _elementwise}


def result(target: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The fake result of `target(*args, **kwargs)` where a rule answers it, else None."""
    rule = _RULES.get(target)
    if rule is None:
        return None
    try:
        return rule(*args, **kwargs)
    except TypeError:  # (arguments the rule does not take: the fake mode's to answer)
        return None
