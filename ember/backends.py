"""The backend contract: an FX graph and example inputs in, a compiled callable out.

`backend` is what `torch.compile(model, backend="ember")` calls (registered through the
`torch_dynamo_backends` entry point). `compile_graph` lists the stages in order. A node ember
cannot lower runs as an eager island inside the compiled graph (`compile_with_islands`); a
graph ember cannot compile at all runs eagerly; either way the reason is logged, and ember
never stops the user's program.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember import config, dumps, logs, torch_internals
from ember.autodiff import tape
from ember.autodiff.differentiate import differentiate
from ember.codegen.glue import write_glue
from ember.compile_plan import compile_ir, kernel_backend
from ember.dumps import graph_label
from ember.folding import fold_constants_elsewhere
from ember.ir.graph import Graph
from ember.ir.ops import Op
from ember.lower import Lowered, Unsupported, trace
from ember.lower.meta_interpreter import eager_autograd, turns_grad_on
from ember.lower.tracer import OutputSpec
from ember.partition import MAX_ROUNDS, find_islands, log_islands
from ember.passes.pipeline import after_differentiation, run_passes
from ember.runtime import collector, switches, triton_launch, warm_cache
from ember.runtime.background import (  # noqa: F401  (re-exported: the harness, warm starts)
    Deferred,
    compiling_beside,
    wait_for_background_compiles,
)
from ember.runtime.build import BuildError
from ember.runtime.compiled import CompiledGraph
from ember.runtime.interpreted import InterpretedGraph
from ember.runtime.partitioned import PartitionedGraph, written_inputs
from ember.runtime.training import TrainingGraph
from ember.shapes import ShapeSpecialized, for_every_shape  # noqa: F401  (ShapeSpecialized:

# the per-shape fallback, named here for callers that knew it in this module)


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None,
            options: dict[str, Any] | None = None) -> Callable:
    """torch.compile backend: compile `gm` for inputs like `example_inputs`. torch.compile
    hands over its `mode` or `options` (`torch.compile(m, backend="ember", mode=...)`):
    reduce-overhead's CUDA graphs, and the options ember knows (ember/options.py)."""
    if config.settings.disable:
        return EagerGraph(gm, "EMBER_DISABLE=1")
    from ember import options as compile_options
    from ember.runtime.cudagraphs import CudaGraphed

    if mode not in (None, "default", "reduce-overhead", "max-autotune",
                    "max-autotune-no-cudagraphs"):
        raise ValueError(f"ember backend: unknown mode {mode!r}")
    resolved = compile_options.resolve(options)
    graphs = resolved.cuda_graphs or mode in ("reduce-overhead", "max-autotune")
    tuned = {"max_autotune": True} if mode in compile_options.TUNING_MODES else {}
    with tape.kept(not graphs), config.override(**resolved.settings, **tuned), \
            collector.paused():
        if any(torch_internals.is_symbolic(x) for x in example_inputs):
            compiled = for_every_shape(gm, example_inputs, graph_label(gm))
        else:
            compiled = compile_graph(gm, example_inputs)
    if graphs:
        compiled = CudaGraphed(compiled, list(example_inputs), f"graph of {type(gm).__name__}")
    return compiled


def eager_reason(example_inputs: list[Any]) -> str | None:
    """Why this graph must run eagerly for now, or None."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    subclasses = sorted({type(t).__name__ for t in tensors
                         if type(t) not in (torch.Tensor, torch.nn.Parameter)})
    if subclasses:  # (a DTensor, FSDP's sharded parameters: no memory of its own to hand a kernel)
        return f"tensor subclass inputs ({', '.join(subclasses)}) run as torch runs them"
    devices = {t.device.type for t in tensors}
    if devices - {"cpu", "cuda"}:
        return f"tensors on {', '.join(sorted(devices - {'cpu', 'cuda'}))} (ember compiles for " \
               f"CPU and CUDA devices)"
    # (inputs on several devices: the nodes reading those not on the graph's run as eager
    # islands, lower/tracer._refuse_readers_elsewhere)
    return _codegen_reason(kernel_backend("cuda" if "cuda" in devices else "cpu"))


def _autocast_regions(gm: torch.fx.GraphModule) -> bool:
    """Does the graph enter or leave autocast regions (as Dynamo hands them over)?"""
    return any(node.op == "call_function" and getattr(node.target, "__name__", "") in
               ("_enter_autocast", "_exit_autocast", "_set_autocast_enabled")
               for node in gm.graph.nodes)


def _codegen_reason(chosen: str) -> str | None:
    if chosen not in ("c", "triton", "interp"):
        return f"EMBER_BACKEND={chosen} is not a backend (use c, triton or interp)"
    if chosen == "triton":
        missing = triton_launch.available()
        if missing:
            return f"{missing}: CUDA graphs run eagerly (pip install triton)"
    return None


class EagerGraph:
    """A graph ember runs eagerly, and why (what `backend` returns when it cannot compile)."""

    kernel_count = 0
    library_count = 0
    fallback_count = 0

    def __init__(self, gm: torch.fx.GraphModule, reason: str):
        self.forward = switches.restoring(gm)
        self.reason = reason

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)

    @property
    def islands(self) -> list[str]:
        return [f"the whole graph: {self.reason}"]


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    label = graph_label(gm)
    reason = eager_reason(example_inputs)
    if reason is not None:
        logs.channel("fallbacks").info("%s runs eagerly: %s", label, reason)
        return EagerGraph(gm, reason)
    _fold_constants_elsewhere(gm, label)
    warm = warm_cache.Entry(gm, example_inputs, label, compile_stages)  # (a warm start)
    if warm.compiled is not None:
        return warm.compiled
    try:
        compiled = compile_stages(gm, example_inputs, label)
        warm.keep(compiled)
        return compiled
    except Unsupported as error:
        if error.node is not None and torch_internals.autocast_state() is None and \
                not _autocast_regions(gm):
            compiled = compile_with_islands(gm, example_inputs, label,
                                            {error.node: error.reason})
            if isinstance(compiled, PartitionedGraph):
                warm.keep(compiled)
            return compiled
        logs.channel("fallbacks").info("%s runs eagerly: %s", label, error)
        reason = str(error)
    except BuildError as error:
        logs.channel("fallbacks").warning("%s runs eagerly: %s", label, error)
        reason = str(error)
    except OSError as error:  # the machine's fault (a full disk, a file it may not write)
        reason = _environment_error(label, error)
    except Exception as error:  # an ember bug must not stop the user's program
        reason = _internal_error(label, error)
    return EagerGraph(gm, reason)


def _fold_constants_elsewhere(gm: torch.fx.GraphModule, label: str) -> None:
    """Tables the graph makes from constants on another device and moves to its own, computed
    once (ember/folding.py); where that fails, their nodes stay (eager islands)."""
    try:
        count = fold_constants_elsewhere(gm)
    except Exception as error:  # noqa: BLE001 (an ember bug must not stop the user's program)
        logs.channel("fallbacks").info("%s: constants made on another device not folded "
                                       "(%s: %s)", label, type(error).__name__, error)
        if "raise" in config.settings.logs:
            raise
        return
    if count:
        logs.channel("perf").info("%s: %d values made from constants on another device "
                                  "computed once, as constants of the graph", label, count)


def _environment_error(label: str, error: OSError) -> str:
    """An operating-system error met while compiling, said as what it is (not as a bug of
    ember's); the graph's reason."""
    reason = f"the system refused a file or process operation ({type(error).__name__}: " \
             f"{error}); check that the disk has space and that EMBER_CACHE_DIR and " \
             f"EMBER_DUMP are writable"
    logs.channel("fallbacks").warning("%s runs eagerly: %s", label, reason)
    return reason


def _internal_error(label: str, error: Exception) -> str:
    """Say an internal error once (re-raised under EMBER_LOGS=raise); the graph's reason."""
    logs.channel("fallbacks").warning(
        "%s runs eagerly after an internal error in ember (please report it): %s: %s",
        label, type(error).__name__, error)
    if "raise" in config.settings.logs:
        raise error
    return f"internal error {type(error).__name__}: {error}"


def compile_stages(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                   lowered: Lowered | None = None) -> CompiledGraph | InterpretedGraph:
    """lower → passes → schedule → codegen → build → wrapper (`lowered`: the graph already
    lowered, for these inputs)."""
    with torch.set_grad_enabled(torch.is_grad_enabled()):  # (tracing runs the graph's
        return _compile_stages(gm, example_inputs, label, lowered)  # grad-mode switches)


def _compile_stages(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                    lowered: Lowered | None) -> CompiledGraph | InterpretedGraph:
    dump = dumps.folder_for(gm, label)
    logs.dump(dump, "fx_graph.py", lambda: dumps.graph_text(gm))
    clock = _Stages(label)
    if any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs) and \
            kernel_backend("cuda") == "triton":
        triton_launch.warm_up()  # Triton's start-up, beside the lowering
    training = _training(gm, example_inputs)
    if torch_internals.autocast_state() is not None or _autocast_regions(gm):
        # autocast's casts made explicit: the graph as aten ops traced under it (a region's
        # enter and exit run while tracing, so the ops between them are cast)
        gm = torch_internals.trace_under_autocast(gm, example_inputs)
        clock("autocast")
    if lowered is None:
        lowered = trace(gm, example_inputs)
    clock("lower")
    logs.dump(dump, "ir_00_lowered.txt", lambda: str(lowered.graph))
    graph = run_passes(lowered.graph, dump, merge=not training)
    clock("passes")
    extras = [_fetch(gm, name) for name in lowered.attributes] + lowered.constants
    if graph.device.type != "cpu":  # 0-d CPU constants, copied to the graph's device once
        extras = [t.to(graph.device) if t.device != graph.device else t for t in extras]
    tensor_positions = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
    if training:
        return compile_training(graph, lowered, extras, tensor_positions, example_inputs,
                                gm, label, dump, clock)
    # (an ahead-of-time compile's first call is its compiled form's: ember/aot.py)
    return compile_ir(graph, lowered.outputs, lowered.output_tree, extras, tensor_positions,
                      len(example_inputs), switches.restoring(gm), label, dump, clock,
                      lowered.library_calls,
                      _example_sizes(graph, example_inputs, tensor_positions, extras),
                      eager_first=config.settings.eager_first and
                      not warm_cache.is_bypassed())


def _example_sizes(graph: Graph, example_inputs: list[Any], tensor_positions: list[int],
                   extras: list[torch.Tensor]) -> dict[str, int]:
    """A symbolic graph's symbols at the example inputs' sizes (its forward's and backward's
    symbols share their names)."""
    return graph.symbol_values([example_inputs[i] for i in tensor_positions] + extras) \
        if graph.symbols else {}


def compile_with_islands(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                         islands: dict[str, str]) -> Callable:
    """The graph as compiled regions with eager islands between them: `islands` (node name →
    reason) grows with each node that lowering refuses until every region lowers; then each
    region is compiled, one that cannot be (a build failure) running eagerly as a whole."""
    try:
        found = find_islands(gm, example_inputs, islands)
    except Exception as error:  # an ember bug must not stop the user's program
        return EagerGraph(gm, _internal_error(label, error))
    if found is None:
        reason = f"still more nodes ember cannot compile after {MAX_ROUNDS} rounds"
        logs.channel("fallbacks").info("%s runs eagerly: %s", label, reason)
        return EagerGraph(gm, reason)
    partition, examples, lowered = found
    notes = [island.note for island in partition.islands]
    log_islands(label, partition)
    runs, eager, eager_regions = {}, {}, []
    for region in partition.regions:
        module, inputs, result = lowered[region.key()]
        eager[region.number] = module.forward
        name = f"{label}_region{region.number}"
        if isinstance(result, Lowered):
            with torch.set_grad_enabled(region.grad_enabled):
                result = _compiled_or_reason(module, inputs, name, result)
        if isinstance(result, (str, Exception)):  # (a build failure, a graph-wide reason)
            eager_regions.append(f"region {region.number} ({len(region.nodes)} ops): {result}")
        else:
            runs[region.number] = result
    if not runs:
        reason = "; ".join(notes + eager_regions)
        logs.channel("fallbacks").info("%s runs eagerly: no region compiles (%s)", label, reason)
        return EagerGraph(gm, reason)
    glue = write_glue(partition, {**eager, **runs}, examples, set(runs))
    graph = PartitionedGraph(glue, label, partition, runs, eager, notes, eager_regions,
                             written_inputs(partition, runs, example_inputs), examples)
    logs.dump(logs.dump_folder(label), "glue.py", glue.text)
    logs.show_code(label, "glue between compiled regions and eager islands", glue.text)
    logs.channel("fallbacks").info("%s: %d compiled regions, %d eager islands", label,
                                   graph.region_count, graph.island_count)
    return graph


def explaining_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    """explain()'s backend: the graph runs as backend="eager" runs it, and says which of its
    nodes ember's backend would run as eager islands (found by lowering; nothing is built)."""
    forward = switches.restoring(gm)

    def run(*args: Any) -> Any:
        return forward(*args)

    run.islands = island_report(gm, example_inputs)
    return run


explaining_backend.serves_any_shape = True  # (it runs the graph as eager does)


def island_report(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[str]:
    """What ember's backend would run eagerly in this graph, and why, from lowering alone."""
    reason = eager_reason(example_inputs)
    if reason is not None or any(torch_internals.is_symbolic(x) for x in example_inputs):
        return [f"the whole graph: {reason}"] if reason else []
    _fold_constants_elsewhere(gm, graph_label(gm))  # (as compile_graph does)
    try:
        with torch.set_grad_enabled(torch.is_grad_enabled()):
            trace(gm, example_inputs)
        return []
    except Unsupported as error:
        if error.node is None or torch_internals.autocast_state() is not None or \
                _autocast_regions(gm):
            return [f"the whole graph: {error.reason or error}"]
        found = find_islands(gm, example_inputs, {error.node: error.reason})
    except Exception as error:  # noqa: BLE001 (a report, not a compile: say it and go on)
        return [f"the whole graph: internal error {type(error).__name__}: {error}"]
    if found is None:
        return [f"the whole graph: still more nodes ember cannot compile after {MAX_ROUNDS} "
                f"rounds"]
    partition, _, lowered = found
    report = [island.note for island in partition.islands]
    for region in partition.regions:
        result = lowered[region.key()][2]
        if isinstance(result, Exception):
            report.append(f"region {region.number} ({len(region.nodes)} ops): {result}")
    return report


def _compiled_or_reason(module: torch.fx.GraphModule, inputs: list[Any], label: str,
                        lowered: Lowered) -> Callable | str:
    """A region compiled, or why it runs eagerly."""
    try:
        return compile_stages(module, inputs, label, lowered)
    except Unsupported as error:
        logs.channel("fallbacks").info("%s runs eagerly: %s", label, error)
        return str(error)
    except BuildError as error:
        logs.channel("fallbacks").warning("%s runs eagerly: %s", label, error)
        return str(error)
    except OSError as error:
        return _environment_error(label, error)
    except Exception as error:  # an ember bug must not stop the user's program
        return _internal_error(label, error)


def _training(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Inputs that require grad, and grad mode on where the graph is entered or inside it."""
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) and \
        (torch.is_grad_enabled() or turns_grad_on(gm))


def compile_training(graph: Graph, lowered: Any, extras: list[torch.Tensor],
                     tensor_positions: list[int], example_inputs: list[Any],
                     gm: torch.fx.GraphModule, label: str, dump: Any, clock: _Stages
                     ) -> TrainingGraph:
    """A graph whose inputs require grad: split by autodiff into a forward that also returns
    what the backward needs and a backward, each compiled; an autograd.Function joins them."""
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in extras):
        raise Unsupported("a graph attribute requires grad (pass parameters as inputs)")
    wrt = [index for index, position in enumerate(tensor_positions)
           if example_inputs[position].requires_grad]
    written = {index for index, _ in graph.writebacks}
    if written & set(wrt):
        raise Unsupported("a training graph writes an input that requires grad (in-place "
                          "ops on leaves are not differentiated yet)")
    output_count = len(graph.outputs)
    eager = eager_autograd(gm, example_inputs)
    split = differentiate(graph, wrt, eager.reached if eager is not None else None,
                          _eager_differentiable(lowered.outputs, eager), tape.keeping())
    after_differentiation(split.forward)  # (kept apart for the differentiation)
    if any(kind == "input" and k in written for kind, k in split.backward_inputs):
        raise Unsupported("the backward would read an input the forward writes (not "
                          "differentiated yet)")
    logs.dump(dump, "ir_forward.txt", lambda: str(split.forward))
    backward_dump = logs.dump_folder(f"{label}_backward")
    specializing = config.settings.absent_gradients and not split.forward.symbols
    # (for backwards of calls where gradients are absent: passes rewrite nodes in place)
    unpassed = split.backward.copy() if specializing else None
    backward = run_passes(split.backward, backward_dump)
    split.backward = backward
    clock("autodiff")

    def flat(count: int) -> tuple[list[OutputSpec], Any]:
        """Every graph output, in order, as a flat tuple."""
        return [OutputSpec("node", i) for i in range(count)], \
            torch_internals.tree_flatten(tuple(range(count)))[1]

    count = len(backward.inputs)
    backward_specs, backward_tree = flat(len(backward.outputs))
    positions = list(range(count))

    def build_without(absent: frozenset[int], kernels_later: bool = False) -> Any:
        """The backward of calls that give no gradient to the forward outputs `absent`:
        zeros there, folded into its kernels (GPT-2's logits, which the loss computed inside
        the model made: a 400 MB fill and a read of it, every step)."""
        graph = unpassed.copy()
        zeros = {}
        for position, (kind, k) in enumerate(split.backward_inputs):
            if kind == "grad" and k in absent:
                node = graph.inputs[position]
                zeros[node] = graph.add(Op.FULL, (), value=0.0, shape=node.shape,
                                        dtype=node.dtype)
        made = set(zeros.values())  # (first: the nodes that read them come later)
        graph.nodes = [*zeros.values(), *(n for n in graph.nodes if n not in made)]
        graph.replace_uses(zeros)
        run_passes(graph)
        name = f"{label}_backward (gradients of outputs {sorted(absent)} absent)"
        return compile_ir(graph, backward_specs, backward_tree, [], positions, count,
                          InterpretedGraph(graph, backward_specs, backward_tree, [],
                                           positions, name),
                          name, None, _Stages(name), 0, sizes, kernels_later=kernels_later)

    predicted = likely_absent(split) if specializing else frozenset()
    interpreted = InterpretedGraph(backward, backward_specs, backward_tree, [], positions,
                                   f"{label}_backward")
    settings = config.settings

    def build_backward() -> Any:
        """The backward for every output, compiled after the forward: a failure is not the
        forward's (its graph interpreted serves)."""
        try:  # (config.settings is the process's: a thread cannot override it for itself)
            return compile_ir(backward, backward_specs, backward_tree, [], positions, count,
                              interpreted, f"{label}_backward", backward_dump,
                              _Stages(f"{label}_backward"), 0, sizes)
        except Exception as error:
            logs.channel("fallbacks").warning(
                "%s_backward did not compile (%s: %s): its graph runs interpreted", label,
                type(error).__name__, error)
            return interpreted

    # (one job: the backward built ahead, where the first calls most likely take it)
    side = concurrent.futures.ThreadPoolExecutor(1, "ember-backward")
    try:
        sizes = _example_sizes(split.forward, example_inputs, tensor_positions, extras)
        later = config.settings.eager_first and not warm_cache.is_bypassed()
        # The backward the first call most likely takes (likely_absent): where the first
        # calls run eagerly while kernels build, its graph is written here, before them,
        # its kernels building beside them; else on a thread, beside the forward's compile.
        # (Written on a thread beside an eager first call, its Python took the GIL from
        # that call's ops: BERT's first training call on an H100 2.83 s, 2.47 with it
        # written first; device call 117, 2026-12-06.)
        ahead_job = None
        if predicted and later:
            ahead_job = concurrent.futures.Future()
            try:
                ahead_job.set_result(build_without(predicted, kernels_later=True))
            except Exception as error:  # noqa: BLE001 (said where the backward is taken)
                ahead_job.set_exception(error)
        elif predicted:
            ahead_job = side.submit(build_without, predicted)
        specs, tree = flat(len(split.forward.outputs))
        forward = compile_ir(split.forward, specs, tree, extras, tensor_positions,
                             len(example_inputs),
                             InterpretedGraph(split.forward, specs, tree, extras,
                                              tensor_positions, label),
                             label, dump, clock, lowered.library_calls, sizes,
                             kernels_later=later)
        # The one built ahead may still compile: the first call's forward runs meanwhile,
        # and its backward waits for it (TrainingGraph.backward_for). The backward for
        # every output compiles from the graph's first call after a backward has run, or
        # when a backward first needs it: never for calls that take no backward, such as
        # a decoding loop's under grad mode (compiled with the forward, it was 0.5 s of
        # GPT-2's 1.8 s first decoding call on the CPU, twice: the prompt's graph and the
        # tokens'). (GPT-2's first training call paid for both backwards, 7.0 s against
        # torch.compile's 24.9 on the H200; compiling beside the first call's runs, its
        # Python held the GIL they wait on: BERT's first backward run 0.65-0.95 s against
        # 0.09; started after the first backward, it still slowed the optimizer step:
        # BERT's first call 4.04-4.25 s against 3.20-3.42, 2026-12-04.)
        ahead = {predicted: ahead_job} if ahead_job is not None else {}
        deferred = Deferred(build_backward)
    finally:
        side.shutdown(wait=False)

    def without(absent: frozenset[int]) -> Any:
        """build_without, under the settings the graph was compiled with (it is made on the
        backward's first call that needs it)."""
        with config.using(settings):
            return build_without(absent)

    return TrainingGraph(forward, deferred.future, split, lowered.outputs,
                         lowered.output_tree, output_count, tensor_positions, extras, label,
                         switches.restoring(gm), grad_inside=not torch.is_grad_enabled(),
                         without=without if specializing else None, ahead=ahead,
                         start_backward=deferred.start,
                         # (not an ahead-of-time compile's: ember/aot.py)
                         eager_first=config.settings.eager_first and
                         not warm_cache.is_bypassed())


def likely_absent(split: Any) -> frozenset[int]:
    """The forward outputs that a call's backward most likely gives no gradient: where one
    output is a float scalar (a loss computed inside the model), every other (its logits, a
    cache) — `loss.backward()`. Only a guess, compiled beside the forward: a backward whose
    gradients are otherwise gets its own build when it first runs."""
    outputs = split.forward.outputs
    graded = [k for kind, k in split.backward_inputs if kind == "grad"]
    losses = [k for k in graded if len(outputs[k].shape) == 0 and
              outputs[k].dtype.is_floating_point]
    if len(losses) != 1:
        return frozenset()
    return frozenset(k for k in graded if k != losses[0] and
                     outputs[k].dtype.is_floating_point)


def _eager_differentiable(specs: list[OutputSpec], eager: Any) -> set[int] | None:
    """The graph outputs whose user results eager's autograd tracks (the root of a view
    returned: as its view), or None when eager's answer is not known."""
    if eager is None or len(eager.requires_grad) != len(specs):
        return None
    return {spec.index for spec, tracked in zip(specs, eager.requires_grad)
            if tracked and (spec.kind == "node" or (spec.kind == "view" and spec.of_output))}


class _Stages:
    """How long each compile stage took (EMBER_LOGS=perf)."""

    def __init__(self, label: str):
        self.label = label
        self.times: list[tuple[str, float]] = []
        self.last = self.start = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.times.append((stage, now - self.last))
        self.last = now

    def report(self) -> None:
        if logs.enabled("perf"):
            stages = ", ".join(f"{stage} {seconds * 1e3:.1f}" for stage, seconds in self.times)
            logs.channel("perf").info("%s compiled in %.1f ms: %s", self.label,
                                      (self.last - self.start) * 1e3, stages)


def _fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value
