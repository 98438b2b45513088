"""EMBER_BACKEND=interp: run the optimized IR with the reference interpreter, no kernels.

For debugging: when a compiled graph disagrees with eager, the interpreter tells whether the
lowering or the kernels are at fault. It honours the same output and write-back contract.
"""

from __future__ import annotations

from typing import Any

import torch

from ember.ir.graph import Graph
from ember.ir.interpreter import interpret
from ember.lower.tracer import OutputSpec


class InterpretedGraph:
    def __init__(self, graph: Graph, outputs: list[OutputSpec], output_tree: Any,
                 extras: list[torch.Tensor], tensor_positions: list[int], label: str):
        self.graph = graph
        self.outputs = outputs
        self.output_tree = output_tree
        self.extras = extras
        self.tensor_positions = tensor_positions
        self.label = label
        self.kernel_count = 0
        self.library_count = 0
        self.fallback_count = 0

    def __call__(self, *args: Any) -> Any:
        inputs = [args[i] for i in self.tensor_positions] + list(self.extras)
        values, written = interpret(self.graph, inputs)
        for (index, _), value in zip(self.graph.writebacks, written):
            inputs[index].copy_(value)
        laid_out = []
        for value, strides in zip(values, self.graph.output_strides):
            buffer = torch.empty_strided(value.shape, strides, dtype=value.dtype,
                                         device=value.device)
            laid_out.append(buffer.copy_(value))
        results: list[Any] = []
        bindings = self.graph.symbol_values(inputs)
        for spec in self.outputs:
            if spec.kind == "node":
                results.append(laid_out[spec.index])
            elif spec.kind == "input":
                results.append(inputs[spec.index])
            elif spec.kind == "view":
                base = laid_out[spec.index] if spec.of_output else inputs[spec.index]
                results.append(spec.view_of(base, bindings))
            elif spec.kind == "same":
                results.append(results[spec.index])
            else:
                results.append(spec.value)
        return self.output_tree.unflatten(results)
