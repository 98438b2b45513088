"""How a compiled function makes its cache entries (the Capturing half of
api.CompiledFunction): a capture of the function for the call's arguments, then the backend's
compile of the graph, the runner that calls it with its guards, the resume functions and the
functions compiled on their own at its breaks — or, where capture fails, an eager entry whose
guards say when capturing again could succeed. CacheEntry and CaptureRecord are what they
leave behind (api.py and explain() read them)."""

from __future__ import annotations

import builtins
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ember import config, dumps, logs
from ember.capture.errors import CaptureError, Unsupported
from ember.capture.guards import (
    MISS,
    LazyGuard,
    compile_guarded_runner,
    compile_guards,
    guard_source,
)
from ember.giving_up import EagerTrial, counted_eager_call
from ember.resumes import passthrough
from ember.runtime import triton_launch

if TYPE_CHECKING:
    from ember.capture.captured import Captured
    from ember.runtime.cudagraphs import CudaGraphed

# torch.compile's modes; the ones that replay CUDA graphs (ember/runtime/cudagraphs.py)
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclasses.dataclass
class CacheEntry:
    guard: Callable[[dict], bool]
    run: Callable[[dict], Any]
    captured: Captured | None
    guard_source: str
    eager_reason: Unsupported | None = None
    # guard and run as one function, MISS when a guard fails (the run fetches its inputs
    # through what the guards read)
    call: Callable[[dict], Any] | None = None
    compiled: Any = None  # what the backend returned (None for an eager entry)

    def __post_init__(self) -> None:
        if self.call is None:
            guard, run = self.guard, self.run
            self.call = lambda arguments: run(arguments) if guard(arguments) else MISS


@dataclasses.dataclass
class CaptureRecord:
    """What one capture produced, for explain()."""

    graphs: int
    ops: list[int]
    breaks: list[Unsupported]
    guards: str
    seconds: float
    graph: torch.fx.GraphModule | None = None
    cuda_graph: CudaGraphed | None = None   # mode="reduce-overhead"
    compiled: Callable | None = None         # what the backend returned


class Capturing:
    """The entry-making methods of api.CompiledFunction (its attributes are that class's)."""

    def _serves_any_shape(self) -> bool:
        """Does the backend compile a symbolic graph once for every shape (so that automatic
        dynamic pays)? ember's own does for what its C and Triton backends serve symbolically
        (issue 18, stages 2 and 4): see _automatic."""
        return getattr(self.backend, "serves_any_shape", False)

    def _automatic(self, arguments: dict[str, Any]) -> bool:
        """Does a recompile under dynamic=None make the changed sizes symbols?"""
        from ember import shapes

        return self._serves_any_shape() or (not self.symbolic_refused and shapes.automatic(
            self.backend, [v for v in arguments.values() if isinstance(v, torch.Tensor)]))

    def _for_every_shape(self, captured: Any) -> Callable:
        """A symbolic capture's compiled graph: for every shape, or per shape."""
        from ember import shapes

        compiled = shapes.for_a_capture(captured.graph_module, list(captured.example_inputs),
                                        self.backend, self.where)
        if isinstance(compiled, shapes.ShapeSpecialized) and self.dynamic is None:
            # (automatic dynamic did not pay here: later recompiles stay static, so a
            # decoding loop is not compiled per shape under each new symbolic capture)
            self.symbolic_refused = True
        return compiled

    def _capture(self, arguments: dict[str, Any]) -> CacheEntry:
        from ember import compiled_module
        from ember.capture import markers
        from ember.capture.captured import capture
        from ember.capture.symbols import DynamicPolicy

        started = time.perf_counter()
        refusal = markers.frame_refusal(self.function)
        if refusal is not None:  # (torch.compiler.disable'd: eager whatever comes in)
            logs.channel("graph_breaks").info("%s runs eagerly: %s", self.where, refusal)
            self.record(CaptureRecord(0, [], [refusal], "", time.perf_counter() - started))
            self.run_directly()
            return CacheEntry(lambda arguments: True, self.caller, None, "", refusal)
        if triton_launch.on_gpu(arguments.values()):
            triton_launch.warm_up_for_cuda()  # beside the capture and the lowering
        captured, session, error = capture(self.function, arguments, self.fullgraph,
                                           DynamicPolicy(self.dynamic, self.frame_sizes,
                                                         automatic=self._automatic(arguments)),
                                           self.where)
        logs.channel("perf").info("%s: captured in %.1f ms", self.where,
                                  (time.perf_counter() - started) * 1e3)
        for module in session.compile_apart:
            compiled_module.compile_apart(module, dict(
                fullgraph=self.fullgraph, dynamic=self.dynamic, mode=self.mode,
                backend=self.backend_option, settings=self.settings,
                recompile_limit=self.recompile_limit))
        if error is not None:
            if self.fullgraph:
                raise CaptureError(error) from None
            logs.channel("graph_breaks").info("%s runs eagerly: %s", self.where, error)
            self.record(CaptureRecord(0, [], [error], "", time.perf_counter() - started))
            scope = {"GG": session.globals_dicts, "G": self.function.__globals__,
                     "K": session.constants, "C": self.function.__closure__ or ()}
            # An eager entry runs the function as it is, right for any input: its guards only
            # say when capturing again could succeed (other types, dtypes, shapes, global
            # modes), not which objects came in (a fresh object per call would otherwise
            # make every call capture again)
            eager_guards = session.guards.only({"global", "type", "tensor", "length"})
            guard, text = compile_guards(eager_guards, scope, arguments)
            return CacheEntry(guard, self.caller, None, text, error,
                              call=counted_eager_call(self, guard))
        return self._entry(captured, arguments, started)

    def _entry(self, captured: Captured, arguments: dict[str, Any], started: float
               ) -> CacheEntry:
        """The backend's compile of a capture, its guards and its runner, as an entry."""
        from ember.autodiff import tape
        from ember.runtime.cudagraphs import CudaGraphed

        if self.site is not None:  # (EMBER_DUMP's folder: the user's line, see dumps.py)
            captured.graph_module.meta["ember_label"] = \
                f"{self.function.__qualname__} ({Path(self.site[0]).name}:{self.site[1]})"
        compiled = passthrough(captured.graph_module)
        if compiled is None and captured.symbolic and \
                not self._serves_any_shape():
            compiled = self._for_every_shape(captured)
        if compiled is None:
            # (a CUDA graph's replays run no Python: no library call's autograd record can
            # be kept for its backward, which runs the call again instead)
            with tape.kept(self.mode not in CUDA_GRAPH_MODES), \
                    config.override(**self.settings):
                compiled = self.backend(captured.graph_module, list(captured.example_inputs))
        if captured.symbolic:
            # NOTE: a symbolic lowering runs on the capture's ShapeEnv: what it guarded must
            # hold of a call as well (a relation, or a symbol it specialized)
            captured.guards.add_size_relations()
            symbols = captured.guards.symbol_reads
            logs.channel("recompiles").info(
                "%s: captured with symbolic sizes %s", self.where, ", ".join(
                    f"{name} = {read.describe()}" for name, read in symbols.items()))
        cuda_graph = None
        if self.mode in CUDA_GRAPH_MODES and not getattr(compiled, "passthrough", False):
            compiled = cuda_graph = CudaGraphed(compiled, list(captured.example_inputs),
                                                self.where)
        scope = dict(captured.scope, C=self.function.__closure__ or ())
        namespace = dict(captured.runner_namespace, **scope, compiled=compiled)
        resumes = [self.resume(resumption) for resumption in captured.resumptions]
        namespace.update((r.name, resume) for r, resume in zip(captured.resumptions, resumes))
        for name, function in captured.callees.items():
            namespace[name] = self.callee(function, captured.break_reason)
        exec(builtins.compile(captured.runner_source, f"<ember runner {self.where}>", "exec"),
             namespace)  # noqa: S102 (our own code)
        runner = namespace["run"]
        call = compile_guarded_runner(captured.guards, scope, arguments, captured.input_sources,
                                      captured.runner_lines, namespace, self.where)
        # (where the guards run inside `call`, the guard alone is asked only after a miss)
        text, guard_namespace = guard_source(captured.guards, scope, arguments)
        guard = LazyGuard(captured.guards, scope, text, guard_namespace)
        if logs.enabled("guards"):
            logs.channel("guards").info("guards of %s:\n%s", self.where, text)
        folder = dumps.dump_entry(captured, text, call, self.where)
        for resume in resumes:
            resume.dump_folder = resume.dump_folder or folder

        breaks = [captured.break_reason] if captured.break_reason is not None else []
        self.record(CaptureRecord(1, [captured.op_count], breaks, text,
                                  time.perf_counter() - started, captured.graph_module,
                                  cuda_graph, compiled))
        if breaks:  # (after record: a function compiled at a break knows its callers' lines)
            logs.channel("graph_breaks").info("graph break at %s", breaks[0].said_where())
            if config.settings.eager_trial and self.depth == 0 and not self.called_from and \
                    self.collector is None and self.mode != "reduce-overhead":
                self.trial = EagerTrial(breaks[0].location)
        return CacheEntry(guard, runner, captured, text, call=call, compiled=compiled)
