"""The ways a workload can run: eagerly, through torch.compile's Inductor, through ember.

`prepare(variant, fn, workload)` gives the callable to time plus a `Compiles` record that the
ember variant fills in as Dynamo hands it graphs. A new variant (ember's own frontend, a
reduce-overhead mode) is one more entry in `variant_rules`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ember.bench.workloads import Workload


@dataclasses.dataclass
class Compiles:
    """What the ember backend made of the graphs Dynamo gave it (None: not recorded)."""

    graphs: int | None = None
    kernels: int | None = None
    eager_graphs: int | None = None


def _eager(fn: Callable[..., Any], workload: Workload, compiles: Compiles) -> Callable[..., Any]:
    return fn


def _inductor(fn: Callable[..., Any], workload: Workload,
              compiles: Compiles) -> Callable[..., Any]:
    return torch.compile(fn, mode=workload.mode)


def _ember(fn: Callable[..., Any], workload: Workload, compiles: Compiles) -> Callable[..., Any]:
    from ember.backends import EagerGraph, backend
    from ember.runtime.compiled import CompiledGraph

    compiles.graphs = compiles.kernels = compiles.eager_graphs = 0

    # The same backend function `backend="ember"` finds in Dynamo's registry, wrapped only to
    # count what it returns (a fallback to eager would otherwise look like a fast, correct run).
    def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        result = backend(gm, example_inputs)
        compiles.graphs += 1
        if isinstance(result, CompiledGraph):
            compiles.kernels += result.kernel_count
        elif isinstance(result, EagerGraph):
            compiles.eager_graphs += 1
        return result

    return torch.compile(fn, backend=recording_backend)


variant_rules: dict[str, Callable[[Callable[..., Any], Workload, Compiles], Callable[..., Any]]] = {
    "eager": _eager,
    "inductor": _inductor,
    "ember": _ember,
}

VARIANTS: tuple[str, ...] = tuple(variant_rules)


def prepare(variant: str, fn: Callable[..., Any],
            workload: Workload) -> tuple[Callable[..., Any], Compiles]:
    compiles = Compiles()
    return variant_rules[variant](fn, workload, compiles), compiles
