"""Device comparison as eager means it: "cuda" is the current CUDA device ("cuda:0" when
that is current), so a factory call or copy with device="cuda" stays in a cuda:0 graph."""

from __future__ import annotations

import torch


def resolve(device: torch.device | str | int) -> torch.device:
    device = torch.device(device)
    if device.index is None and device.type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(requested: torch.device | str | int, graph_device: torch.device) -> bool:
    return resolve(requested) == resolve(graph_device)


def graph_device(values: list) -> torch.device | None:
    """The device a graph (or a compiled region) runs on, from its tensor inputs: theirs, and
    where some are on an accelerator and others on the CPU, the accelerator's (the others are
    the CPU scalars and draws a model on CUDA makes beside its work: the `torch.rand([])` of a
    layer drop; nodes reading them run as eager islands, ember/partition.py)."""
    devices = [v.device for v in values if isinstance(v, torch.Tensor)]
    return next((d for d in devices if d.type not in ("cpu", "meta")),
                devices[0] if devices else None)
