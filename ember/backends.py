"""The backend contract: an FX graph and example inputs in, a compiled callable out.

`backend` is what `torch.compile(model, backend="ember")` calls (registered through the
`torch_dynamo_backends` entry point). `compile_graph` lists the stages in order. A node ember
cannot lower runs as an eager island inside the compiled graph (`compile_with_islands`); a
graph ember cannot compile at all runs eagerly; either way the reason is logged, and ember
never stops the user's program.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember import config, dumps, logs, torch_internals, tuning
from ember.autodiff import tape
from ember.autodiff.differentiate import differentiate
from ember.codegen.c import write_source
from ember.codegen.glue import write_glue
from ember.codegen.triton import (
    Workspace,
    readers,
    reads_product_elsewhere,
    row_length,
    write_module,
)
from ember.codegen.triton_sizes import RowClasses
from ember.codegen.triton_tiling import row_class
from ember.codegen.triton_rules import TRITON_LIBRARY_OPS
from ember.codegen.wrapper import write_wrapper
from ember.dumps import graph_label
from ember.ir.graph import Graph
from ember.lower import Lowered, Unsupported, trace
from ember.lower.meta_interpreter import eager_autograd, turns_grad_on
from ember.lower.tracer import OutputSpec
from ember.partition import MAX_ROUNDS, describe, find_islands
from ember.passes.library_ops import calls_for
from ember.passes.pipeline import after_differentiation, run_passes
from ember.runtime import triton_launch, tune_c, tune_triton, warm_cache
from ember.runtime.build import BuildError, build, kernel_function, load
from ember.runtime.compiled import CompiledGraph, make_function
from ember.runtime.interpreted import InterpretedGraph
from ember.runtime.partitioned import PartitionedGraph, written_inputs
from ember.runtime.training import TrainingGraph
from ember.schedule.epilogue import fuse_matmul_epilogues
from ember.schedule.fuse import schedule
from ember.schedule.plan import Buffer, LibraryCall, Plan
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
    with tape.kept(not graphs), config.override(**resolved.settings, **tuned):
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
    if len({t.device for t in tensors}) > 1:
        return "tensors on several devices: " + ", ".join(sorted({str(t.device) for t in tensors}))
    return _codegen_reason(kernel_backend("cuda" if "cuda" in devices else "cpu"))


def _autocast_regions(gm: torch.fx.GraphModule) -> bool:
    """Does the graph enter or leave autocast regions (as Dynamo hands them over)?"""
    return any(node.op == "call_function" and getattr(node.target, "__name__", "") in
               ("_enter_autocast", "_exit_autocast", "_set_autocast_enabled")
               for node in gm.graph.nodes)


def kernel_backend(device_type: str) -> str:
    """Which code generator compiles for this device: EMBER_BACKEND, else C on the CPU and
    Triton on CUDA."""
    chosen = config.settings.backend
    if chosen:
        return chosen
    return "triton" if device_type == "cuda" else "c"


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
        self.forward = gm.forward
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
    return compile_ir(graph, lowered.outputs, lowered.output_tree, extras, tensor_positions,
                      len(example_inputs), gm.forward, label, dump, clock,
                      lowered.library_calls,
                      _example_sizes(graph, example_inputs, tensor_positions, extras))


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
    notes = []
    for island in partition.islands:
        notes.append(f"{describe(island.node)} ({island.node.name}): {island.summary}")
        logs.channel("fallbacks").info("%s: %s runs as an eager island: %s", label,
                                       describe(island.node), island.reason)
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
    def run(*args: Any) -> Any:
        return gm.forward(*args)

    run.islands = island_report(gm, example_inputs)
    return run


explaining_backend.serves_any_shape = True  # (it runs the graph as eager does)


def island_report(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[str]:
    """What ember's backend would run eagerly in this graph, and why, from lowering alone."""
    reason = eager_reason(example_inputs)
    if reason is not None or any(torch_internals.is_symbolic(x) for x in example_inputs):
        return [f"the whole graph: {reason}"] if reason else []
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
    report = [f"{describe(i.node)} ({i.node.name}): {i.summary}" for i in partition.islands]
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
    # The backward compiles beside the forward: their kernels' builds (a C compiler run, or
    # Triton's compiles and ptxas) overlap instead of queueing.
    with concurrent.futures.ThreadPoolExecutor(1, "ember-backward") as side:
        sizes = _example_sizes(split.forward, example_inputs, tensor_positions, extras)
        backward_job = side.submit(
            compile_ir, backward, backward_specs, backward_tree, [], positions, count,
            InterpretedGraph(backward, backward_specs, backward_tree, [], positions,
                             f"{label}_backward"),
            f"{label}_backward", backward_dump, _Stages(f"{label}_backward"), 0, sizes)
        specs, tree = flat(len(split.forward.outputs))
        forward = compile_ir(split.forward, specs, tree, extras, tensor_positions,
                             len(example_inputs),
                             InterpretedGraph(split.forward, specs, tree, extras,
                                              tensor_positions, label),
                             label, dump, clock, lowered.library_calls, sizes)
        backward_compiled = backward_job.result()
    return TrainingGraph(forward, backward_compiled, split, lowered.outputs,
                         lowered.output_tree, output_count, tensor_positions, extras, label,
                         gm.forward, grad_inside=not torch.is_grad_enabled())


def _eager_differentiable(specs: list[OutputSpec], eager: Any) -> set[int] | None:
    """The graph outputs whose user results eager's autograd tracks (the root of a view
    returned: as its view), or None when eager's answer is not known."""
    if eager is None or len(eager.requires_grad) != len(specs):
        return None
    return {spec.index for spec, tracked in zip(specs, eager.requires_grad)
            if tracked and (spec.kind == "node" or (spec.kind == "view" and spec.of_output))}


def compile_ir(graph: Graph, outputs: list[OutputSpec], output_tree: Any,
               extras: list[torch.Tensor], tensor_positions: list[int], argument_count: int,
               eager: Callable, label: str, dump: Any, clock: _Stages,
               fallback_count: int = 0, sizes: dict[str, int] | None = None
               ) -> CompiledGraph | InterpretedGraph:
    """schedule → codegen → build → wrapper, for an IR graph after its passes. `extras` are
    tensors appended to the arguments (graph attributes, constants); `eager` runs the graph
    when its compiled form gives up; `sizes`: a symbolic graph's symbols in the call it is
    compiled for (its first build serves that call's row classes)."""
    device = graph.device
    chosen = kernel_backend(device.type)
    if chosen == "interp":
        return InterpretedGraph(graph, outputs, output_tree, extras, tensor_positions, label)
    if chosen == "c" and device.type != "cpu":
        raise Unsupported(f"EMBER_BACKEND=c compiles for the CPU; these tensors are on {device}")
    if chosen == "triton" and device.type == "cpu" and not triton_launch.interpreting():
        raise Unsupported("EMBER_BACKEND=triton on CPU tensors needs TRITON_INTERPRET=1")
    if chosen == "triton":
        calls = calls_for(TRITON_LIBRARY_OPS)(graph)
        if calls:
            logs.dump(dump, "ir_triton_library_calls.txt", lambda: str(graph))
    plan = schedule(graph)
    clock("schedule")
    logs.dump(dump, "schedule.txt", plan.describe)
    # (a symbolic plan's reductions over rows of symbolic length: one build per class of
    # their lengths, chosen per call; see ember/codegen/triton_sizes.py)
    classes = RowClasses.of((row_length(k), math.prod(k.shape)) for k in plan.kernels) \
        if chosen == "triton" and plan.graph.symbols else None
    key = None
    if classes is not None:
        key = classes.key(sizes) if sizes and all(s.name in sizes for s in classes.symbols) \
            else classes.guessed()
    known: dict = {}  # (kernels compiled by one build, reused by the others)
    if chosen == "triton":
        sources, functions, misaligned = _triton_kernels(
            plan, label, dump, build=classes.build(key) if classes else None, known=known)
    else:
        sources, functions, misaligned = _c_kernels(plan, label, dump)
    clock("kernels")

    def wrap(functions: dict[str, Any], checked: bool, fallback: Callable | None,
             wide: Callable | None = None, kernels: dict[str, Any] = sources,
             key: tuple | None = key):
        wrapper = write_wrapper(plan, outputs, output_tree, kernels, functions,
                                device, checked, check_alignment=fallback is not None,
                                check_reach=wide is not None,
                                rows=(classes.key_text(), key) if key is not None else None)
        wrapper.namespace["misaligned"] = fallback
        wrapper.namespace["wide"] = wide
        if key is not None:
            wrapper.namespace.update(rows=by_rows, row_class=row_class)
        for position, tensor in enumerate(extras, start=len(tensor_positions)):
            wrapper.namespace[f"extra{position}"] = tensor
        if extras and (fallback is not None or wide is not None or key is not None):
            # (the other builds are given args with the extras; a build called by another
            # gets them so)
            wrapper.text = wrapper.text.replace(
                "def call(args):\n",
                f"def call(args):\n    if len(args) == {len(tensor_positions)}: args = (*args, "
                + ", ".join(f"extra{p}" for p in range(len(tensor_positions),
                                                       len(tensor_positions) + len(extras)))
                + ",)\n", 1)
        return wrapper

    # misaligned inputs take a build that does not assume 16-byte alignment (made on demand)
    wide = None
    if chosen == "triton" and plan.graph.symbols:
        def wide_build() -> Callable:
            """Calls whose sizes take an offset past int32 run kernels with int64 indices."""
            wide_sources, wide_functions, _ = _triton_kernels(plan, label, dump, wide=True)
            return make_function(wrap(wide_functions, False, None, None, wide_sources, None),
                                 f"<ember wrapper {label} (int64 indices)>")

        wide = _Lazy(wide_build)
    by_rows = None
    if classes is not None:
        def rows_build(key: tuple) -> Callable:
            """The build for calls whose rows are of other classes (made on the first)."""
            logs.channel("perf").info("%s: kernels for row classes %s (%s)", label, key,
                                      classes.key_text())
            built_sources, built, unaligned = _triton_kernels(
                plan, label, dump, build=classes.build(key), known=known, first=False)
            # (called by the first build's wrapper once it has checked the reach and found
            # the key: these check neither)
            fallback = _Lazy(lambda: make_function(
                wrap(unaligned(), False, None, None, built_sources, None),
                f"<ember wrapper {label} (rows {key}, misaligned inputs)>"))
            return make_function(wrap(built, False, fallback, None, built_sources, None),
                                 f"<ember wrapper {label} (rows {key})>")

        by_rows = _Builds(rows_build)
    # (the misaligned build checks the reach too: its kernels index in int32 as well)
    fallback = _Lazy(lambda: make_function(wrap(misaligned(), False, None, wide),
                                           f"<ember wrapper {label} (misaligned inputs)>"))
    wrappers = [wrap(functions, checked, fallback, wide) for checked in (True, False)]
    logs.dump(dump, "wrapper.py", wrappers[1].text)
    logs.show_code(label, "wrapper (Python that launches the kernels)", wrappers[1].text)
    clock("wrapper")
    clock.report()
    library_calls = sum(1 for step in plan.steps if isinstance(step, LibraryCall))
    written = [index for index, _ in graph.writebacks]
    compiled = CompiledGraph(wrappers[0], wrappers[1], tensor_positions, argument_count,
                             eager, label, len(sources), library_calls, written,
                             fallback_count)
    # (what ahead-of-time analysis reads: ember/aot.py)
    compiled.plan = plan
    compiled.step_count = len(plan.steps)
    compiled.kernel_texts = {name: source.text if hasattr(source, "text") else
                             "\n\n".join(kernel.text for kernel in source.kernels)
                             for name, source in sources.items()}
    compiled.workspace_bytes = {
        name: sum(math.prod(space.shape) * space.dtype.itemsize for space in source.workspaces)
        for name, source in sources.items() if getattr(source, "workspaces", None)}
    return compiled


def _c_kernels(plan: Plan, label: str, dump: Any):
    """One C file for the plan, built with the C compiler and loaded."""
    tunings = tuning.guarded(label, tune_c.choose, plan, label) \
        if config.settings.max_autotune else None
    source, kernels = write_source(plan, tunings)
    logs.dump(dump, "kernels.c", source)
    logs.show_code(label, "C kernels", source)
    functions = {}
    if kernels:
        path, cached = build(source, ["-lmvec", "-lm"])
        library = load(path)
        functions = {k.name: kernel_function(library, k.name, len(k.arguments), len(k.sizes))
                     for k in kernels}
        logs.channel("kernels").info("%s: %d kernels, %s %s", label, len(kernels),
                                     "cache hit" if cached else "built", path)
    return {k.name: k for k in kernels}, functions, None


def _triton_kernels(plan: Plan, label: str, dump: Any, wide: bool = False,
                    build: tuple[dict, dict[str, int]] | None = None,
                    known: dict | None = None, first: bool = True):
    """One Triton module for the plan; its kernels compiled for the GPU (or interpreted).
    `wide`: a symbolic plan's build with int64 indices (made on the first call that needs
    it: its inputs' alignment is not assumed either). `build`: the row classes it serves and
    the divisibility promised of the symbols (RowClasses.build); `known`: kernels compiled by the
    plan's other builds, by what they compile to; `first`: the plan's first build (the one
    that fuses matmul epilogues into the plan)."""
    rows, divisible = build or (None, {})
    first = first and not wide
    fused = first and config.settings.matmul_epilogue and \
        fuse_matmul_epilogues(plan, readers(plan), reads_product_elsewhere)
    if fused:
        logs.dump(dump, "schedule_fused.txt", plan.describe)
    device_index = None
    if not triton_launch.interpreting():
        device_index = plan.graph.device.index
        if device_index is None:
            device_index = torch.cuda.current_device()
    dependent = device_index is not None and config.settings.dependent_launch and \
        triton_launch.dependent_launch_supported(device_index)
    tilings = tuning.guarded(label, tune_triton.choose, plan, label, device_index,
                             dependent) if config.settings.max_autotune else None
    text, launches = write_module(plan, dependent, wide, tilings, rows)
    if first or wide:
        logs.dump(dump, "kernels_int64.py" if wide else "kernels.py", text)
    logs.show_code(label, "Triton kernels" + (" (int64 indices)" if wide else ""), text)
    module = triton_launch.load_module(text)
    sources = {launch.name: launch for launch in launches}
    kernels = [kernel for launch in launches for kernel in launch.kernels]
    if device_index is None:
        logs.channel("kernels").info("%s: %d Triton kernels, interpreted (%s)", label,
                                     len(kernels), module.__name__)
        launches = triton_launch.interpreted_kernels(module, kernels)
        return sources, {k.name: f for k, f in zip(kernels, launches)}, None
    inputs = set(plan.inputs)

    # (a symbol's divisibility promised to the kernels of rows of symbolic length)
    sized = [[divisible.get(name, 1) if launch.row is not None and
              not isinstance(launch.row, int) else 1 for name in k.sizes]
             for launch in launches for k in launch.kernels]

    def compiled(assume_inputs_aligned: bool) -> dict[str, Any]:
        aligned = [[_known_aligned(b, inputs, assume_inputs_aligned) for b in k.arguments]
                   + promised for k, promised in zip(kernels, sized)]
        start = time.perf_counter()
        launches = triton_launch.compile_kernels(module, kernels, aligned, device_index,
                                                 known)
        logs.channel("kernels").info("%s: %d Triton kernels in %.3f s", label, len(kernels),
                                     time.perf_counter() - start)
        return {k.name: f for k, f in zip(kernels, launches)}

    if wide:
        return sources, compiled(False), None
    return sources, compiled(True), lambda: compiled(False)


def _known_aligned(buffer: Buffer | Workspace, inputs: set[Buffer], assume_inputs: bool) -> bool:
    """May the kernel assume this argument's data is 16-byte aligned? Ember allocates temps and
    outputs (the caching allocator aligns them); inputs are checked by the wrapper on each
    call; a library result that views its operands may start anywhere."""
    if buffer in inputs:
        return assume_inputs
    if isinstance(buffer, Workspace):
        return True  # allocated by the wrapper
    if buffer.role == "library":
        return False
    return True


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


class _Builds:
    """Builds made on demand, one per key: `rows(key, args)` runs the build for `key`."""

    def __init__(self, make: Callable[[tuple], Callable]):
        self.make = make
        self.built: dict[tuple, Callable] = {}

    def __call__(self, key: tuple, args: Any) -> Any:
        function = self.built.get(key)
        if function is None:
            function = self.built[key] = self.make(key)
        return function(args)


class _Lazy:
    """A function built on its first call."""

    def __init__(self, make: Callable[[], Callable]):
        self.make = make
        self.function: Callable | None = None

    def __call__(self, *args: Any) -> Any:
        if self.function is None:
            self.function = self.make()
        return self.function(*args)


def _fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value
