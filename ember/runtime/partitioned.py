"""A graph that runs as compiled regions with eager islands between them: the glue function
(ember/codegen/glue.py) and what it says about itself (for explain, the logs, CUDA graphs).

An island is the graph's own torch call, run as eager runs it: under autograd, on the real
tensors (an in-place op writes the caller's tensor itself), so gradients and aliases flow
through it as in eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember import logs
from ember.partition import Partition
from ember.runtime.compiled import make_function
from ember.runtime.cudagraphs import CudaGraphed
from ember.runtime.wrappers import WrapperSource


class PartitionedGraph:
    def __init__(self, glue: WrapperSource, label: str, partition: Partition,
                 compiled: dict[int, Any], eager: dict[int, Callable], islands: list[str],
                 eager_regions: list[str], written_inputs: list[int],
                 examples: dict[int, list[Any]] | None = None):
        self.label = label
        self.partition = partition
        # region number → its inputs as they were compiled for (partition.Example; what a
        # warm start writes the glue from again)
        self.examples = examples or {}
        self.regions = compiled           # region number → its compiled form
        self.eager_forms = eager          # region number → the region's FX module's forward
        self.islands = islands + eager_regions  # what runs eagerly, and why (for explain)
        self.island_count = len(islands)
        self.region_count = len(compiled)
        self.eager_region_count = len(eager_regions)
        self.kernel_count = sum(getattr(c, "kernel_count", 0) for c in compiled.values())
        self.library_count = sum(getattr(c, "library_count", 0) for c in compiled.values())
        self.fallback_count = sum(getattr(c, "fallback_count", 0) for c in compiled.values())
        self.trains = any(type(c).__name__ == "TrainingGraph" for c in compiled.values())
        # tensor inputs the compiled regions write (islands' writes show in versions)
        self.written_inputs = written_inputs
        self._told: set[int] = set()
        glue.namespace["layout_differs"] = self.layout_differs
        self.glue_source = glue.text
        self.call = make_function(glue, f"<ember glue {label}>")

    def __call__(self, *args: Any) -> Any:
        return self.call(*args)

    def layout_differs(self, number: int, *args: Any) -> Any:
        """Region `number` given tensors with strides other than those it was compiled for
        (an island's result laid out otherwise than fake tensors said): eagerly, this call."""
        if number not in self._told:
            self._told.add(number)
            logs.channel("fallbacks").warning(
                "%s: region %d reads a tensor laid out otherwise than predicted; calls like "
                "this one run it eagerly", self.label, number)
        return self.eager_forms[number](*args)


def written_inputs(partition: Partition, compiled: dict[int, Any],
                   example_inputs: list[Any]) -> list[int]:
    """The graph's tensor inputs (numbered among its tensors) that compiled regions write."""
    placeholders = [n for n in partition.module.graph.nodes if n.op == "placeholder"]
    tensors = [n for n, x in zip(placeholders, example_inputs) if isinstance(x, torch.Tensor)]
    written = set()
    for region in partition.regions:
        run = compiled.get(region.number)
        for index in getattr(run, "written_inputs", ()):
            node = region.inputs[run.tensor_positions[index]]
            if node in tensors:
                written.add(tensors.index(node))
    return sorted(written)


def eager_islands(compiled: Any) -> list[str]:
    """What a backend's result runs eagerly, and why (seen through a CUDA-graph wrapper)."""
    if isinstance(compiled, CudaGraphed):
        compiled = compiled.compiled
    return list(getattr(compiled, "islands", ()))
