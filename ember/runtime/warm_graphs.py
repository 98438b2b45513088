"""A compiled graph as a warm-cache record, and back (ember/runtime/warm_cache.py keeps and
finds the records): inference or training, whole or as compiled regions between eager
islands; and the graph compiled cold, which a rebuilt graph hands the rare calls its
compiled form gives away."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import logs
from ember.runtime.compiled import CompiledGraph
from ember.runtime.warm_values import Decoder, Encoder, NotKept
from ember.runtime.wrappers import WrapperSource

if TYPE_CHECKING:
    from ember.runtime.warm_cache import Entry


class Cold:
    """A graph compiled cold (once, on stand-ins of its example inputs, in the grad mode it
    was compiled in): what a rebuilt graph hands the rare calls its compiled form gives
    away (a library call's unforeseen layout, aliased inputs, CUDA's misaligned inputs)."""

    def __init__(self, gm: torch.fx.GraphModule, stand_ins: Callable[[], list[Any]],
                 grad_enabled: bool, label: str,
                 recompile: Callable[[torch.fx.GraphModule, list[Any], str], Any]):
        self.gm = gm
        self.stand_ins = stand_ins
        self.grad_enabled = grad_enabled
        self.label = label
        self.recompile = recompile
        self.compiled: Any = None

    def __call__(self) -> Any:
        if self.compiled is None:
            logs.channel("fallbacks").info("%s: a warm-started graph needs its eager form: "
                                           "the graph is compiled again for it", self.label)
            with torch.set_grad_enabled(self.grad_enabled):
                self.compiled = self.recompile(self.gm, self.stand_ins(), f"{self.label}_cold")
        return self.compiled


def as_record(compiled: Any, gm: torch.fx.GraphModule, whole: bool = True) -> dict:
    """`compiled`, the graph `gm` compiled, as plain data (`whole`: the graph itself, not a
    region of it)."""
    from ember.runtime.partitioned import PartitionedGraph
    from ember.runtime.training import TrainingGraph

    if type(compiled) is TrainingGraph:
        return _training_record(compiled, gm)
    if type(compiled) is PartitionedGraph and whole:
        return _partitioned_record(compiled, gm)
    if type(compiled) is not CompiledGraph:
        raise NotKept(f"a {type(compiled).__name__} (graphs compiled into C or Triton kernels, "
                      f"for inference or training, whole or between eager islands, are kept)")
    if compiled.runs_eagerly:
        raise NotKept("it runs eagerly")
    encoder = Encoder(gm)
    checked, fast = compiled.wrappers
    return {
        "kind": "compiled",
        "checked": [checked.text, encoder.namespace(checked.namespace, checked.text)],
        "fast": [fast.text, encoder.namespace(fast.namespace, fast.text)],
        "libraries": encoder.libraries,
        "modules": encoder.modules,
        "tensors": encoder.tensors,
        "tensor_positions": list(compiled.tensor_positions),
        "argument_count": compiled.argument_count,
        "counts": [compiled.kernel_count, compiled.library_count, compiled.fallback_count],
        "step_count": compiled.step_count,
        "written_inputs": list(compiled.written_inputs),
    }


def rebuild(record: dict, entry: Entry) -> Any:
    if record["kind"] == "partitioned":
        return _partitioned_graph(record, entry)
    return _rebuild_graph(record, entry.gm, entry.cold, entry.label)


def _rebuild_graph(record: dict, gm: torch.fx.GraphModule, cold: Cold, label: str) -> Any:
    if record["kind"] == "training":
        return _training_graph(record, gm, cold, label)
    if record["kind"] != "compiled":
        raise ValueError(f"a {record['kind']} record where a graph's was expected")
    return _compiled_graph(record, gm, gm.forward, label, cold)


def _compiled_graph(record: dict, gm: torch.fx.GraphModule, eager: Callable, label: str,
                    cold: Callable[[], CompiledGraph]) -> CompiledGraph:
    decoder = Decoder(gm, record["libraries"], record["tensors"], record["modules"], cold)
    wrappers = [WrapperSource(text, decoder.namespace(namespace))
                for text, namespace in (record["checked"], record["fast"])]
    kernel_count, library_count, fallback_count = record["counts"]
    compiled = CompiledGraph(wrappers[0], wrappers[1], list(record["tensor_positions"]),
                             record["argument_count"], eager, label, kernel_count,
                             library_count, list(record["written_inputs"]), fallback_count)
    compiled.step_count = record["step_count"]
    return compiled


def _training_record(graph: Any, gm: torch.fx.GraphModule) -> dict:
    """A training graph: its compiled forward and backward, and what of autodiff's split the
    autograd.Function reads (runtime/training.py)."""
    encoder = Encoder(gm)
    split = graph.split
    return {
        "kind": "training",
        "forward": as_record(graph.forward_graph, gm),
        # (None: not compiled yet, compiled cold once a backward needs it)
        "backward": None if graph.pending is not None else as_record(graph.backward_graph, gm),
        "specs": [encoder.value(spec) for spec in graph.specs],
        "output_tree": encoder.value(graph.output_tree),
        "extras": [encoder.value(tensor) for tensor in graph.extras],
        "tensors": encoder.tensors,
        "output_count": graph.output_count,
        "tensor_positions": list(graph.tensor_positions),
        "grad_inside": graph.grad_inside,
        "backward_inputs": [list(pair) for pair in split.backward_inputs],
        "wrt": list(split.wrt),
        "differentiable_outputs": list(split.differentiable_outputs),
        "tapes": split.tapes,
        "forward_outputs": [[encoder.value(list(node.shape)),
                             str(node.dtype).replace("torch.", "")]
                            for node in split.forward.outputs],
        "device": str(split.forward.device),
        # (a graph compiled for every shape: each symbol's input and dim)
        "symbols": [[name, list(place)] for name, place in split.forward.symbols.items()],
    }


def _training_graph(record: dict, gm: torch.fx.GraphModule, cold: Cold, label: str) -> Any:
    from ember.runtime.training import TrainingGraph

    decoder = Decoder(gm, [], record["tensors"])
    forward = _compiled_graph(record["forward"], gm, _ColdPart(cold, "forward_graph"), label,
                              lambda: cold().forward_graph)
    start_backward = None
    if record["backward"] is None:
        from ember.backends import Deferred

        deferred = Deferred(lambda: _cold_backward(cold, record, label))
        backward, start_backward = deferred.future, deferred.start
    else:
        backward = _compiled_graph(record["backward"], gm, _ColdPart(cold, "backward_graph"),
                                   f"{label}_backward", lambda: cold().backward_graph)
    outputs = [types.SimpleNamespace(shape=tuple(decoder.value(shape)),
                                      dtype=getattr(torch, dtype))
               for shape, dtype in record["forward_outputs"]]
    split = types.SimpleNamespace(  # (the fields of autodiff's Split that training.py reads)
        forward=types.SimpleNamespace(outputs=outputs, device=torch.device(record["device"]),
                                      symbols={name: tuple(place)
                                               for name, place in record["symbols"]}),
        backward_inputs=[tuple(pair) for pair in record["backward_inputs"]],
        wrt=list(record["wrt"]), differentiable_outputs=list(record["differentiable_outputs"]),
        tapes=record["tapes"])
    return TrainingGraph(forward, backward, split, [decoder.value(c) for c in record["specs"]],
                         decoder.value(record["output_tree"]), record["output_count"],
                         list(record["tensor_positions"]),
                         [decoder.value(c) for c in record["extras"]], label,
                         gm.forward, grad_inside=record["grad_inside"],
                         start_backward=start_backward)


def _cold_backward(cold: Cold, record: dict, label: str) -> Any:
    """The backward of a graph kept with its forward alone, compiled cold: it takes what the
    kept forward saves only where the cold compile splits the graph as the kept one was
    (autodiff is deterministic: another split, or a cold compile without a backward, is a
    fault of ember's, said as one, never a gradient from the wrong values)."""
    graph = cold()
    split = getattr(graph, "split", None)
    if split is None or [list(pair) for pair in split.backward_inputs] != \
            record["backward_inputs"] or len(split.forward.outputs) != \
            len(record["forward_outputs"]):
        raise RuntimeError(
            f"{label}: the graph's backward, compiled again for a graph kept for a warm start "
            f"with its forward alone, does not take what that forward saved (a fault of "
            f"ember's: please report it). Run with EMBER_WARM_START=0, or clear the cache "
            f"with `python -m ember cache --clear`.")
    return graph.backward_graph


class _ColdPart:
    """The eager form of a rebuilt training graph's forward or backward (in a graph compiled
    cold: the IR interpreter's run of it), for the calls a compiled graph gives to its eager
    form (a library call's unforeseen layout, aliased inputs): the graph compiled cold."""

    def __init__(self, cold: Cold, part: str):
        self.cold = cold
        self.part = part

    def __call__(self, *args: Any) -> Any:
        return getattr(self.cold(), self.part).eager(*args)


def _partitioned_record(graph: Any, gm: torch.fx.GraphModule) -> dict:
    """Compiled regions with eager islands between them: each region's compiled graph, and
    what finds the partition again from the FX graph alone (the islands' nodes by name, with
    their reasons; each region's example inputs): the islands are the graph's own calls,
    made again from the new process's graph, and so is the glue between the pieces."""
    from ember.codegen.glue import write_glue
    from ember.partition import region_module, split

    if graph.eager_region_count:
        raise NotKept("a region of it runs eagerly (" + "; ".join(
            graph.islands[graph.island_count:]) + "): compiled again in a new process")
    partition = graph.partition
    islands = {island.node.name: island.reason for island in partition.islands}
    again = split(gm, islands)
    if [r.key() for r in again.regions] != [r.key() for r in partition.regions]:
        raise NotKept("its islands do not give the same regions again")
    glue = write_glue(again, {**graph.eager_forms, **graph.regions}, graph.examples,
                      set(graph.regions))
    if glue.text != graph.glue_source:
        raise NotKept("the glue written again differs")
    encoder = Encoder(gm)
    regions = [[region.number, as_record(graph.regions[region.number],
                                          region_module(gm, region), whole=False)]
               for region in partition.regions]
    return {
        "kind": "partitioned",
        "islands": [[name, reason] for name, reason in islands.items()],
        "regions": regions,
        "examples": [[number, [encoder.value(example) for example in examples]]
                     for number, examples in graph.examples.items()],
        "tensors": encoder.tensors,
        "notes": graph.islands[:graph.island_count],
        "written_inputs": list(graph.written_inputs),
        "glue": graph.glue_source,
    }


def _partitioned_graph(record: dict, entry: Entry) -> Any:
    from ember.codegen.glue import write_glue
    from ember.partition import log_islands, region_module, split
    from ember.runtime.partitioned import PartitionedGraph

    gm, label = entry.gm, entry.label
    partition = split(gm, dict(record["islands"]))
    decoder = Decoder(gm, [], record["tensors"])
    examples = {number: [decoder.value(code) for code in codes]
                for number, codes in record["examples"]}
    kept = dict(record["regions"])
    if sorted(kept) != [region.number for region in partition.regions]:
        raise ValueError("the islands give other regions")
    runs, eager = {}, {}
    for region in partition.regions:
        module = region_module(gm, region)
        name = f"{label}_region{region.number}"
        stand_ins = functools.partial(_region_stand_ins, examples[region.number])
        cold = Cold(module, stand_ins, region.grad_enabled, name, entry.recompile)
        eager[region.number] = module.forward
        runs[region.number] = _rebuild_graph(kept[region.number], module, cold, name)
    glue = write_glue(partition, {**eager, **runs}, examples, set(runs))
    if glue.text != record["glue"]:
        raise ValueError("the glue written again differs from the one kept")
    log_islands(label, partition)  # (said as a cold compile says them)
    return PartitionedGraph(glue, label, partition, runs, eager, list(record["notes"]), [],
                            list(record["written_inputs"]), examples)


def _region_stand_ins(examples: list[Any]) -> list[Any]:
    return [example.stand_in() for example in examples]
