"""The backend contract: an FX graph and example inputs in, a compiled callable out.

`backend` is what `torch.compile(model, backend="ember")` calls (registered through the
`torch_dynamo_backends` entry point). `compile_graph` lists the stages in order. A graph ember
cannot compile runs eagerly with the reason logged; ember never stops the user's program.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember import config, logs, torch_internals
from ember.codegen.c import write_source
from ember.codegen.wrapper import write_wrapper
from ember.ir.ops import Op
from ember.lower import Unsupported, trace
from ember.passes.pipeline import run_passes
from ember.runtime.build import BuildError, build, kernel_function, load
from ember.runtime.compiled import CompiledGraph
from ember.runtime.interpreted import InterpretedGraph
from ember.schedule.fuse import schedule

_labels = itertools.count()


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    """torch.compile backend: compile `gm` for inputs like `example_inputs`."""
    if config.settings.disable:
        return gm.forward
    if any(torch_internals.is_symbolic(x) for x in example_inputs):
        return ShapeSpecialized(gm)
    return compile_graph(gm, example_inputs)


def eager_reason(example_inputs: list[Any]) -> str | None:
    """Why this graph must run eagerly for now, or None."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "inputs require grad while grad mode is on (training graphs run eagerly for now)"
    if config.settings.backend not in ("", "c", "interp"):
        return f"EMBER_BACKEND={config.settings.backend} is not available (use c or interp)"
    devices = {t.device.type for t in tensors}
    if devices - {"cpu"}:
        return f"tensors on {', '.join(sorted(devices - {'cpu'}))} (only the CPU backend exists)"
    return None


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    label = f"graph{next(_labels)}"
    reason = eager_reason(example_inputs)
    if reason is not None:
        logs.channel("fallbacks").info("%s runs eagerly: %s", label, reason)
        return gm.forward
    try:
        return compile_stages(gm, example_inputs, label)
    except Unsupported as error:
        logs.channel("fallbacks").info("%s runs eagerly: %s", label, error)
    except BuildError as error:
        logs.channel("fallbacks").warning("%s runs eagerly: %s", label, error)
    except Exception as error:  # an ember bug must not stop the user's program
        logs.channel("fallbacks").warning(
            "%s runs eagerly after an internal error in ember (please report it): %s: %s",
            label, type(error).__name__, error)
        if "raise" in config.settings.logs:
            raise
    return gm.forward


def compile_stages(gm: torch.fx.GraphModule, example_inputs: list[Any],
                   label: str) -> CompiledGraph | InterpretedGraph:
    """lower → passes → schedule → codegen → build → wrapper."""
    dump = logs.dump_folder(label)
    logs.dump(dump, "fx_graph.py", gm.code)
    lowered = trace(gm, example_inputs)
    logs.dump(dump, "ir_00_lowered.txt", str(lowered.graph))
    graph = run_passes(lowered.graph, dump)
    extras = [_fetch(gm, name) for name in lowered.attributes] + lowered.constants
    tensor_positions = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
    if config.settings.backend == "interp":
        return InterpretedGraph(graph, lowered.outputs, lowered.output_tree, extras,
                                tensor_positions, label)
    plan = schedule(graph)
    logs.dump(dump, "schedule.txt", plan.describe())
    source, kernels = write_source(plan)
    logs.dump(dump, "kernels.c", source)
    functions = {}
    if kernels:
        path, cached = build(source, ["-lmvec", "-lm"])
        library = load(path)
        functions = {k.name: kernel_function(library, k.name, len(k.arguments)) for k in kernels}
        logs.channel("kernels").info("%s: %d kernels, %s %s", label, len(kernels),
                                     "cache hit" if cached else "built", path)
    sources = {k.name: k for k in kernels}
    wrappers = [write_wrapper(plan, lowered.outputs, lowered.output_tree, sources, functions,
                              graph.device, checked) for checked in (True, False)]
    for wrapper in wrappers:
        for position, tensor in enumerate(extras, start=len(tensor_positions)):
            wrapper.namespace[f"extra{position}"] = tensor
        if extras:
            wrapper.text = wrapper.text.replace(
                "def call(args):\n",
                "def call(args):\n    args = (*args, "
                + ", ".join(f"extra{p}" for p in range(len(tensor_positions),
                                                       len(tensor_positions) + len(extras)))
                + ",)\n", 1)
    logs.dump(dump, "wrapper.py", wrappers[1].text)
    library_calls = sum(1 for node in graph.nodes if node.op is Op.LIBRARY)
    written = [index for index, _ in graph.writebacks]
    return CompiledGraph(wrappers[0], wrappers[1], tensor_positions, len(example_inputs),
                         gm.forward, label, len(kernels), library_calls, written)


def _fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


class ShapeSpecialized:
    """For graphs Dynamo made shape-symbolic: compile once per concrete input signature."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.cache: dict[Any, Callable] = {}

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad)
                    if isinstance(a, torch.Tensor) else (type(a), a) for a in args)
        compiled = self.cache.get(key)
        if compiled is None:
            compiled = self.cache[key] = compile_graph(self.gm, list(args))
        return compiled(*args)
