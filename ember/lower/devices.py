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
