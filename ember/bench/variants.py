"""The ways a workload can run: eagerly, through torch.compile's Inductor, through ember.

`ember` is ember.compile (ember's own bytecode capture and its kernels); `dynamo+ember` is
torch.compile(backend="ember") (Dynamo's capture, ember's kernels); `dynamo-eager` is Dynamo's
capture alone (torch.compile(backend="eager")) and `ember-eager` ember's capture alone
(ember.compile(backend="eager")), for capture time and per-call overhead. `prepare(variant, fn,
workload)` gives the callable to time plus a `Compiles` record the ember variants fill in.
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
    eager_graphs: int | None = None
    training_graphs: list = dataclasses.field(default_factory=list)
    # (CompiledGraph, TrainingGraph, PartitionedGraph: compiled regions and eager islands)
    compiled: list = dataclasses.field(default_factory=list)

    @property
    def kernels(self) -> int | None:
        """The kernels of the graphs compiled, counted when asked: a training graph's count
        waits for its backward's build, which goes on beside the first calls (counted as
        each graph came, the bench's first call of a training step waited for it: 11.6 s
        of MobileNetV3's on the CPU, where a user's took 1.7)."""
        if self.graphs is None:
            return None
        return sum(graph.kernel_count for graph in self.compiled)


def _eager(fn: Callable[..., Any], workload: Workload, compiles: Compiles) -> Callable[..., Any]:
    return fn


def _inductor(fn: Callable[..., Any], workload: Workload,
              compiles: Compiles) -> Callable[..., Any]:
    if hasattr(fn, "model_slot"):  # a training step: torch.compile(model), the usual way
        return _with_model(fn, torch.compile(fn.model_slot[0], mode=workload.mode))
    return torch.compile(fn, mode=workload.mode)


def _with_model(fn: Callable[..., Any], model: Callable[..., Any]) -> Callable[..., Any]:
    """A step (workloads.build_s3_step, a zoo step) with its model replaced by `model`."""
    fn.model_slot[0] = model
    return fn


def recording_backend(compiles: Compiles) -> Callable:
    """ember's backend, wrapped only to count what it returns (a fallback to eager would
    otherwise look like a fast, correct run)."""
    from ember.backends import EagerGraph, backend
    from ember.runtime.compiled import CompiledGraph
    from ember.runtime.partitioned import PartitionedGraph
    from ember.runtime.training import TrainingGraph

    compiles.graphs = compiles.eager_graphs = 0

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        result = backend(gm, example_inputs)
        compiles.graphs += 1
        if isinstance(result, TrainingGraph):
            compiles.training_graphs.append(result)
        if isinstance(result, (CompiledGraph, TrainingGraph, PartitionedGraph)):
            compiles.compiled.append(result)
        elif isinstance(result, EagerGraph):
            compiles.eager_graphs += 1
        return result

    # (what it wraps: ember.compile treats it as ember's own backend — automatic dynamic
    # among it, ember/shapes.is_embers_backend. Unsaid, the bench's decoding loops compiled
    # per cache length up to the recompile limit and then ran eagerly, as no user's did. A
    # graph compiled once for every shape goes to ember's backend directly: not counted.)
    record.__wrapped__ = backend
    return record


def _ember(fn: Callable[..., Any], workload: Workload, compiles: Compiles) -> Callable[..., Any]:
    import ember

    if workload.compile_model:  # (the zoo: ember.compile(model), as users write it)
        return _with_model(fn, ember.compile(fn.model_slot[0], mode=workload.mode,
                                             backend=recording_backend(compiles)))
    return ember.compile(fn, backend=recording_backend(compiles), mode=workload.mode)


def _dynamo_ember(fn: Callable[..., Any], workload: Workload,
                  compiles: Compiles) -> Callable[..., Any]:
    if hasattr(fn, "model_slot"):
        return _with_model(fn, torch.compile(fn.model_slot[0],
                                             backend=recording_backend(compiles)))
    return torch.compile(fn, backend=recording_backend(compiles))


def _ember_model(fn: Callable[..., Any], workload: Workload,
                 compiles: Compiles) -> Callable[..., Any]:
    """A training step with ember.compile(model) inside (the whole step: the `ember` variant)."""
    import ember

    if not hasattr(fn, "model_slot"):
        return _ember(fn, workload, compiles)
    return _with_model(fn, ember.compile(fn.model_slot[0], backend=recording_backend(compiles)))


def _ember_eager(fn: Callable[..., Any], workload: Workload,
                 compiles: Compiles) -> Callable[..., Any]:
    import ember

    return ember.compile(fn, backend="eager")


def _dynamo_eager(fn: Callable[..., Any], workload: Workload,
                  compiles: Compiles) -> Callable[..., Any]:
    return torch.compile(fn, backend="eager")


variant_rules: dict[str, Callable[[Callable[..., Any], Workload, Compiles], Callable[..., Any]]] = {
    "eager": _eager,
    "inductor": _inductor,
    "ember": _ember,
    "dynamo+ember": _dynamo_ember,
    "ember-model": _ember_model,
    "dynamo-eager": _dynamo_eager,
    "ember-eager": _ember_eager,
}

# What a run compares by default (dynamo-eager only serves the overhead measurement).
VARIANTS: tuple[str, ...] = ("eager", "inductor", "ember", "dynamo+ember")


def prepare(variant: str, fn: Callable[..., Any],
            workload: Workload) -> tuple[Callable[..., Any], Compiles]:
    compiles = Compiles()
    return variant_rules[variant](fn, workload, compiles), compiles
