"""Ahead of time: capture a call's graph, compile it as an explicit step, and read what the
compiler planned before anything runs — jax.jit's lower().compile(), for ember.

    lowered = ember.compile(fn).lower(*args, **kwargs)   # capture only, nothing runs
    lowered.as_text()                    # the captured FX graph, its guards, ember's IR
    compiled = lowered.compile()          # kernels built, wrapper written
    compiled(*args, **kwargs)             # arguments like those lowered for; else an error
    compiled.as_text()                    # per graph: the IR after passes, kernels, wrapper
    compiled.memory_analysis()            # bytes planned: arguments, outputs, temps, peak
    compiled.cost_analysis()              # flops and bytes accessed, per kernel and in all

A lowered call is one graph: a function that breaks its graph (a training step breaks at
backward() and step()) cannot be lowered whole, and lower() says where it breaks; lower its
model's forward instead. A module called with parameters that require grad compiles to a
training graph: its forward and backward are analysed each, and as one step.

The analyses read the schedule (schedule/plan.py) the wrapper follows: buffers are allocated
where the wrapper allocates them, freed where it deletes them, and a buffer that takes a
dead temporary's memory allocates nothing. Library calls' results count as allocated when the
call returns; what a library allocates inside itself (cuBLAS workspaces) does not count.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
import torch.utils.flop_counter

from ember.capture.captured import capture
from ember.capture.errors import AssumptionFailed, CaptureError
from ember.capture.guards import MISS, compile_guards, first_failure
from ember.capture.symbols import DynamicPolicy
from ember.ir.graph import Node
from ember.ir.library import called_target, fill
from ember.ir.ops import Kind, Op
from ember.runtime import warm_cache
from ember.schedule.plan import Buffer, Kernel, LibraryCall, Plan

# IR ops counted as transcendentals (as XLA's cost analysis counts them apart from flops).
TRANSCENDENTAL = frozenset({
    Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SQRT, Op.RSQRT, Op.SIN,
    Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.TANH, Op.ASINH, Op.ACOSH,
    Op.ATANH, Op.ERF, Op.ERFC, Op.SIGMOID, Op.POW, Op.ATAN2, Op.HYPOT,
})


class ArgumentMismatch(TypeError):
    """A Compiled called with arguments other than those it was lowered for."""


class AnalysisUnavailable(RuntimeError):
    """The graph was not compiled into kernels (it runs eagerly): nothing was planned."""


def lower(function: Any, args: tuple, kwargs: dict[str, Any], prefix: tuple = ()) -> Lowered:
    """`function` (an api.CompiledFunction) captured as one graph for these arguments, without
    running it; `prefix`: arguments that come first in every call (a module, for its
    forward)."""
    started = time.perf_counter()
    if function.bound_self is not None:
        prefix = (function.bound_self, *prefix)
    arguments = function.binder(*prefix, *args, **kwargs)
    captured, session, error = capture(function.function, arguments, True,
                                       DynamicPolicy(function.dynamic, function.frame_sizes,
                                                     automatic=False), function.where)
    if error is not None:
        raise CaptureError(error) from None
    if session.compile_apart:
        raise CaptureError(f"{function.where}: submodules with hooks are compiled apart; "
                           "lower() takes one graph (call the ember.compile'd module "
                           "instead)")
    return Lowered(function, captured, arguments, prefix, time.perf_counter() - started)


class Lowered:
    """A captured graph, not compiled yet."""

    def __init__(self, function: Any, captured: Any, arguments: dict[str, Any], prefix: tuple,
                 seconds: float):
        self.function = function
        self.prefix = prefix
        self.captured = captured
        self.capture_seconds = seconds
        scope = dict(captured.scope, C=function.function.__closure__ or ())
        self._guard, self.guard_text = compile_guards(captured.guards, scope, arguments)
        self._arguments = arguments

    def as_text(self) -> str:
        """The captured FX graph, its guards, and ember's IR as lowering makes it."""
        from ember.lower import trace

        captured = self.captured
        sections = [f"# {self.function.where}: captured in {self.capture_seconds * 1e3:.1f} ms",
                    "## FX graph", captured.graph_module.code.strip(),
                    "## guards", self.guard_text.strip() or "(none)"]
        try:
            with torch.set_grad_enabled(torch.is_grad_enabled()):
                ir = str(trace(captured.graph_module, list(captured.example_inputs)).graph)
        except Exception as error:  # noqa: BLE001 (the text says what lowering refused)
            ir = f"(not lowered: {type(error).__name__}: {error})"
        sections += ["## IR", ir]
        return "\n\n".join(sections) + "\n"

    def compile(self) -> Compiled:
        """The graph compiled: kernels built and loaded, the wrapper written."""
        with warm_cache.bypassed():
            entry = self.function._entry(self.captured, self._arguments, time.perf_counter())
        return Compiled(self, entry)


class Compiled:
    """A compiled graph, called only with arguments like those it was lowered for."""

    def __init__(self, lowered: Lowered, entry: Any):
        self.lowered = lowered
        self.entry = entry
        self.compiled = entry.compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        function = self.lowered.function
        arguments = function.binder(*self.lowered.prefix, *args, **kwargs)
        try:
            result = self.entry.call(arguments)
        except AssumptionFailed:  # (a check the graph assumed passes does not: eager's turn)
            return function.function(*self.lowered.prefix, *args, **kwargs)
        if result is MISS:
            captured = self.lowered.captured
            scope = dict(captured.scope, L=arguments,
                         C=function.function.__closure__ or ())
            why = first_failure(captured.guards, scope) or "a guard failed"
            raise ArgumentMismatch(
                f"{function.where}: this Compiled was lowered for other arguments: {why}. "
                f"Call lower() again with these arguments (or call the ember.compile'd "
                f"function, which compiles a version for them)")
        return result

    # -- what was planned -------------------------------------------------------------------
    def parts(self) -> list[tuple[str, Any]]:
        """The compiled graphs (name, CompiledGraph): one, or a training graph's forward and
        backward. AnalysisUnavailable where a graph runs eagerly."""
        compiled = getattr(self.compiled, "compiled", self.compiled)  # (under a CUDA graph)
        if type(compiled).__name__ == "TrainingGraph":
            found = [("forward", compiled.forward_graph), ("backward", compiled.backward_graph)]
            found = [(name, getattr(part, "compiled", part)) for name, part in found]
        else:
            found = [("graph", compiled)]
        for name, part in found:
            if getattr(part, "plan", None) is None:
                reason = getattr(part, "reason", None) or \
                    f"{type(part).__name__}: not compiled into kernels"
                raise AnalysisUnavailable(f"{self.lowered.function.where} ({name}): {reason}")
        return found

    def as_text(self) -> str:
        """Per compiled graph: the IR after passes, the kernels' sources and the wrapper."""
        sections = []
        for name, part in self.parts():
            sections += [f"# {name} ({part.label})", "## IR", str(part.plan.graph),
                         "## kernels"] + [text.strip() for text in part.kernel_texts.values()] \
                + ["## wrapper", part.wrapper_source.strip()]
        return "\n\n".join(sections) + "\n"

    def memory_analysis(self) -> MemoryAnalysis:
        """The bytes the wrapper will hold, as planned (jax's field names); a training graph's
        as one step: its forward, then its backward with the forward's saved values held."""
        parts = [(name, plan_memory(part.plan, part.workspace_bytes))
                 for name, part in self.parts()]
        if len(parts) == 1:
            return parts[0][1]
        (_, forward), (_, backward) = parts
        training = self.compiled
        saved = sum(_output_bytes(self.parts()[0][1].plan)[training.output_count:])
        return MemoryAnalysis(
            argument_size_in_bytes=forward.argument_size_in_bytes,
            output_size_in_bytes=forward.output_size_in_bytes - saved
            + backward.output_size_in_bytes,
            temp_size_in_bytes=max(forward.temp_size_in_bytes, backward.temp_size_in_bytes),
            alias_size_in_bytes=forward.alias_size_in_bytes + backward.alias_size_in_bytes,
            peak_size_in_bytes=max(forward.peak_size_in_bytes,
                                   forward.argument_size_in_bytes + forward.output_size_in_bytes
                                   - saved + backward.peak_size_in_bytes),
            buffer_count=forward.buffer_count + backward.buffer_count,
            parts=dict(parts))

    def cost_analysis(self) -> CostAnalysis:
        """Flops, transcendentals and bytes accessed, per kernel and library call and in all."""
        steps = []
        for name, part in self.parts():
            steps += [dataclasses.replace(step, name=f"{name}.{step.name}")
                      if name != "graph" else step for step in plan_cost(part.plan)]
        return CostAnalysis(steps)


@dataclasses.dataclass
class MemoryAnalysis:
    argument_size_in_bytes: int   # the inputs: arguments, parameters, constants
    output_size_in_bytes: int     # outputs the graph allocates (not its inputs, not views)
    temp_size_in_bytes: int       # temporaries allocated over the call (after reuse)
    alias_size_in_bytes: int      # outputs that are inputs or views of them
    peak_size_in_bytes: int       # the most held at once, arguments included
    buffer_count: int             # allocations the call makes (kernels' and libraries')
    parts: dict[str, MemoryAnalysis] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        fields = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                  if f.name != "parts"]
        return f"MemoryAnalysis({', '.join(fields)})"


@dataclasses.dataclass
class StepCost:
    name: str                 # the kernel's name, or library:<op>
    flops: int
    transcendentals: int
    bytes_accessed: int


@dataclasses.dataclass
class CostAnalysis:
    steps: list[StepCost]

    @property
    def flops(self) -> int:
        return sum(step.flops for step in self.steps)

    @property
    def transcendentals(self) -> int:
        return sum(step.transcendentals for step in self.steps)

    @property
    def bytes_accessed(self) -> int:
        return sum(step.bytes_accessed for step in self.steps)

    def __getitem__(self, key: str) -> int:  # (jax's dictionary form: cost["flops"])
        return {"flops": self.flops, "transcendentals": self.transcendentals,
                "bytes accessed": self.bytes_accessed}[key]

    def __str__(self) -> str:
        lines = [f"{'step':<40} {'flops':>14} {'transc.':>12} {'bytes':>14}"]
        lines += [f"{s.name:<40} {s.flops:>14} {s.transcendentals:>12} {s.bytes_accessed:>14}"
                  for s in self.steps]
        lines.append(f"{'total':<40} {self.flops:>14} {self.transcendentals:>12} "
                     f"{self.bytes_accessed:>14}")
        return "\n".join(lines)


# -- memory ---------------------------------------------------------------------------------
def plan_memory(plan: Plan, workspaces: dict[str, int] | None = None) -> MemoryAnalysis:
    """Walk the plan as the wrapper runs it (codegen/wrapper.py): a kernel's stores are
    allocated before it runs (a reused buffer takes a dead one's memory: nothing new), and
    its scratch (`workspaces`, bytes by kernel name: a split reduction's partial results)
    while it runs; a library call's results when it returns; temporaries freed after their
    last use."""
    workspaces = workspaces or {}
    arguments = sum(b.nbytes for b in plan.inputs)
    held: dict[Buffer, int] = {}       # allocations alive now, by their root buffer
    made: set[Buffer] = set(plan.inputs)
    allocated = {"temp": 0, "output": 0}
    count = 0
    peak = 0
    outputs = {b.root() for b in plan.outputs}
    reused = set(plan.reuse.values())

    def allocate(buffer: Buffer) -> None:
        nonlocal count
        root = buffer.root()
        if root in made:
            return
        made.add(root)
        if root in plan.reuse:
            held[root] = held.pop(plan.reuse[root], 0)
            return
        if root.role == "input":
            return
        held[root] = root.nbytes
        allocated["output" if root in outputs else "temp"] += root.nbytes
        count += 1

    for position, step in enumerate(plan.steps):
        scratch = 0
        if isinstance(step, Kernel):
            for store in step.stores:
                allocate(store.buffer)
            scratch = workspaces.get(step.name, 0)
            if scratch:
                allocated["temp"] += scratch
                count += 1
        elif isinstance(step, LibraryCall):
            for buffer in step.outputs:
                if buffer is not None:
                    allocate(buffer)
        peak = max(peak, sum(held.values()) + scratch)
        for buffer in plan.frees[position]:
            if buffer not in reused and buffer.root() not in outputs:
                held.pop(buffer.root(), None)
    for buffer in plan.outputs:
        allocate(buffer)
    peak = max(peak, sum(held.values()))
    aliases = sum(b.nbytes for b in plan.outputs if b.root().role == "input")
    return MemoryAnalysis(arguments, allocated["output"], allocated["temp"], aliases,
                          arguments + peak, count)


def _output_bytes(plan: Plan) -> list[int]:
    """Each output's allocation (0 for an input or a view of one)."""
    return [0 if b.root().role == "input" else b.root().nbytes for b in plan.outputs]


# -- cost -----------------------------------------------------------------------------------
def plan_cost(plan: Plan) -> list[StepCost]:
    costs = []
    for step in plan.steps:
        if isinstance(step, Kernel):
            costs.append(_kernel_cost(plan, step))
        elif isinstance(step, LibraryCall):
            costs.append(_library_cost(step))
    return costs


def _kernel_cost(plan: Plan, kernel: Kernel) -> StepCost:
    """Every node the kernel computes (realized or inlined into it) counts one flop per
    element (a reduction: per element reduced); bytes: each buffer read once, each stored."""
    members = set(kernel.members) | {store.node for store in kernel.stores}
    computed: set[Node] = set()
    read: set[Buffer] = set()
    stack = list(members)
    while stack:
        node = stack.pop()
        if node in computed:
            continue
        buffer = plan.buffer_of.get(node)
        if node not in members and buffer is not None:
            read.add(buffer)
            continue
        computed.add(node)
        stack.extend(node.inputs)
    flops = transcendentals = 0
    for node in computed:
        if node.kind is Kind.POINTWISE and node.op not in (Op.CAST, Op.STOP_GRADIENT):
            flops += node.numel
            transcendentals += node.numel if node.op in TRANSCENDENTAL else 0
        elif node.kind is Kind.REDUCTION:
            flops += node.inputs[0].numel
    if kernel.matmul is not None:
        a, result = kernel.matmul.a, kernel.matmul.result
        flops += 2 * result.numel * a.shape[-1]
        read |= {kernel.matmul.a, kernel.matmul.b}
    stored = {store.buffer for store in kernel.stores}
    return StepCost(kernel.name, flops, transcendentals,
                    sum(b.nbytes for b in read | stored))


def _library_cost(step: LibraryCall) -> StepCost:
    """A library call's flops as torch's flop counter has them (matmuls, convolutions,
    attention), run on meta tensors; bytes: its operands read and its results written."""
    attrs = step.node.attrs
    target, args, kwargs = called_target(attrs), attrs["args"], attrs["kwargs"]
    if attrs.get("keeps_operands"):  # (a training graph's taped call: the op inside it)
        args, kwargs = args[0].args, args[0].kwargs
    name = getattr(target, "__name__", str(target))
    flops = 0
    try:
        metas = [torch.empty_strided(b.shape, b.strides, dtype=b.dtype, device="meta")
                 for b in step.inputs]
        with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
            target(*fill(args, metas), **fill(kwargs, metas))
        flops = counter.get_total_flops()
    except Exception:  # noqa: BLE001 (a call meta tensors cannot run: its flops unknown, 0)
        pass
    moved = sum(b.nbytes for b in step.inputs) + sum(b.nbytes for b in step.outputs
                                                    if b is not None)
    return StepCost(f"library:{name}", flops, 0, moved)

