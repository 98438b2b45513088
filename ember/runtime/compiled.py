"""A compiled graph: the loaded kernels plus the generated wrapper that runs them.

The first call runs a checked wrapper (library results must have eager's strides); later
calls run the plain one. On CUDA the first call may start while the kernels still compile
(`later`: its launches wait for them, compile_plan.compiled_later); the plain wrapper is
written once they are loaded. If the check fails the graph runs eagerly from then on, with a
warning: a layout ember did not predict must never turn into a wrong answer. An error a run
raises is re-raised as eager raises it, from the user's line (runtime/errors); an error eager
does not raise is ember's fault: the graph runs eagerly from then on, with a warning.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ember import config, logs
from ember.runtime.errors import raise_located
from ember.runtime.wrappers import BuildNotKept, KernelsNotBuilt, LayoutMismatch, WrapperSource


def make_function(source: WrapperSource, filename: str) -> Callable:
    namespace = dict(source.namespace)
    exec(compile(source.text, filename, "exec"), namespace)  # noqa: S102 (our own source)
    return namespace["call"]


class CompiledGraph:
    def __init__(self, checked: WrapperSource, fast: WrapperSource | None,
                 tensor_positions: list[int], argument_count: int, eager: Callable, label: str,
                 kernel_count: int, library_count: int, written_inputs: list[int] = (),
                 fallback_count: int = 0,
                 later: concurrent.futures.Future | None = None, eager_first: bool = False):
        self.checked = make_function(checked, f"<ember wrapper {label}>")
        # `later`: the kernels still compile; it gives the checked and the plain wrapper
        # written with them (the checked one above waits for each kernel it launches)
        self._later = later
        self._settling = threading.Lock()
        self._hooks: list[Callable[[], None]] = []  # (run at the first call's end: when_settled)
        self._finished = later is None
        # calls that come while they compile run eagerly beside them (their results are
        # eager's, sooner than the slowest kernel: the kernels compile in other processes)
        self._eager_first = eager_first and later is not None
        self._eager_calls = 0  # (how many did)
        if self._eager_first:  # (then kept for a warm start once they are in, called or not)
            self.settle_when_built()
        self._wrappers: tuple[WrapperSource, WrapperSource] | None = None
        self._fast: Callable | None = None
        self.eager = eager
        self.label = label
        if later is None:
            self._settle(checked, fast)
        self.kernel_count = kernel_count
        self.library_count = library_count    # calls of aten ops at run time (matmul, ...)
        self.fallback_count = fallback_count  # of those, ops that have no lowering rule
        self.argument_count = argument_count
        self.all_tensors = tensor_positions == list(range(argument_count))
        self.tensor_positions = tensor_positions
        self.written_inputs = list(written_inputs)
        self._run = self._first_call
        self._told: set[str] = set()  # (what the fallbacks channel was told, once)
        # the schedule and the kernels' sources (set by the backend; read by ember/aot.py)
        self.plan: Any = None
        self.kernel_texts: dict[str, str] = {}
        self.workspace_bytes: dict[str, int] = {}  # (a split reduction's scratch, per kernel)
        # the plan's steps (kernels, library calls, copies): what a CUDA graph's replay saves
        # (set by the backend; kept by a warm start, which keeps no plan)
        self.step_count: int | None = None

    def _settle(self, checked: WrapperSource, fast: WrapperSource) -> None:
        self._fast = make_function(fast, f"<ember wrapper {self.label}>")
        self._wrappers = (checked, fast)

    def _settled(self) -> None:
        """Wait for the kernels compiled beside the first run (KernelsNotBuilt where they
        failed) and take the wrappers written with them."""
        if self._wrappers is not None:
            return
        try:
            checked, fast = self._later.result()
        except Exception as error:
            raise KernelsNotBuilt.because(error) from error
        self._settle(checked, fast)  # (two threads may both: the same wrappers either way)

    def _finish(self) -> None:
        """Settle and run the hooks, once: at the first call's end, on the caller's thread
        (a keep's hook hands it to warm_cache's keeping thread)."""
        with self._settling:
            hooks, self._hooks = self._hooks, []
            self._finished = True
            try:
                self._settled()
            finally:
                for hook in hooks:  # (a keep: it says itself why a graph is not kept)
                    hook()

    def _finish_quietly(self) -> None:
        """_finish, where kernels that failed are the next call's to say (KernelsNotBuilt)."""
        try:
            self._finish()
        except KernelsNotBuilt:
            pass

    def settle_when_built(self) -> None:
        """Settle and run the hooks once the kernels are in, called or not (where calls run
        eagerly meanwhile, here or at a training graph's level: its first compiled call
        may come late, or never)."""
        if self._later is not None:
            self._later.add_done_callback(lambda _: self._finish_quietly())

    def when_settled(self, then: Callable[[], None]) -> None:
        """then(), once the kernels are in (at once where they are): what keeps the graph for
        a warm start (warm_cache.when_compiled), done at the end of the first call."""
        with self._settling:
            if not self._finished:
                self._hooks.append(then)
                return
        then()

    def compiled_from_now(self) -> None:
        """Calls from now on run compiled, waiting for kernels that still compile (what a
        CUDA graph's recording needs: runtime/cudagraphs)."""
        self._eager_first = False

    @property
    def kernels_in(self) -> bool:
        """Are its kernels compiled and loaded (those compiled beside its first run too)?"""
        return self._later is None or self._later.done()

    @property
    def fast(self) -> Callable:
        """The plain wrapper (every call's after the first)."""
        self._settled()
        return self._fast

    @property
    def wrappers(self) -> tuple[WrapperSource, WrapperSource]:
        """The checked and the plain wrapper (what a warm-start entry keeps:
        runtime/warm_cache)."""
        self._settled()
        return self._wrappers

    @property
    def wrapper_source(self) -> str:
        return self.wrappers[1].text

    @property
    def runs_eagerly(self) -> bool:
        """True once a layout check failed and the graph gave up on its compiled form."""
        return self._run is None

    def _first_call(self, tensors: Any) -> Any:
        # Inputs the graph writes are saved: if the check fails midway, eager must start from
        # the values the caller passed.
        saved = {i: tensors[i].clone() for i in self.written_inputs if i < len(tensors)}
        started = time.perf_counter()
        try:
            result = self.checked(tensors)
        except LayoutMismatch as error:
            for i, value in saved.items():
                tensors[i].copy_(value)
            logs.channel("fallbacks").warning(
                "%s: a library call returned a layout eager would not (%s); this graph runs "
                "eagerly from now on", self.label, error)
            self._run = None
            raise
        except Exception:
            for i, value in saved.items():  # (__call__ asks eager next: from the same values)
                tensors[i].copy_(value)
            raise
        if self._later is not None:
            try:
                self._finish()  # (kernels the first run did not launch may have failed)
            except KernelsNotBuilt as error:
                logs.channel("fallbacks").warning("%s runs eagerly from now on: %s",
                                                  self.label, error)
                self._run = None
                return result  # (every kernel this run launched was built)
        self._run = self.fast
        logs.channel("perf").info("%s: first run (checked, its launches' first loads) in %.1f "
                                  "ms", self.label, (time.perf_counter() - started) * 1e3)
        return result

    def __call__(self, *args: Any) -> Any:
        if self._run is None:
            return self.eager(*args)
        if self._eager_first:
            if not self._later.done():
                self._eager_calls += 1
                return eager_beside_the_compile(self.eager, args, self.label,
                                                self._eager_calls)
            self._eager_first = False
            if self._eager_calls:
                logs.channel("perf").info("%s: its kernels are in after %d calls run eagerly",
                                          self.label, self._eager_calls)
        tensors = args if self.all_tensors else [args[i] for i in self.tensor_positions]
        if self.written_inputs and (
                shares_written_memory(tensors, self.written_inputs, self.label, self._told)
                or self._writes_inference(tensors)):
            return self.eager(*args)
        try:
            return self._run(tensors)
        except LayoutMismatch:
            return self.eager(*args)
        except KernelsNotBuilt as error:  # (written inputs restored by _first_call)
            logs.channel("fallbacks").warning("%s runs eagerly: %s", self.label, error)
            self._run = None
            return self.eager(*args)
        except BuildNotKept as missing:  # (before anything ran: eager answers this call)
            if ("build", self.label) not in self._told:
                self._told.add(("build", self.label))
                logs.channel("fallbacks").info("%s: %s; such calls run eagerly", self.label,
                                               missing)
            return self.eager(*args)
        except Exception as error:  # (an index out of range, a library call's refusal)
            # (a first call that raised is still the first: it restored the written inputs)
            if not self.written_inputs or self._run == self._first_call:
                return self._eager_after(error, args)
            raise_located(error, self.eager, args, self.label)

    def _eager_after(self, error: Exception, args: tuple) -> Any:
        result = eager_after(error, self.eager, args, self.label, "compiled code")
        self._run = None
        return result

    def _writes_inference(self, tensors: Any) -> bool:
        """Would the graph write an inference tensor outside inference mode? Eager refuses
        ("Inplace update to inference tensor outside InferenceMode"): so does the eager run."""
        return not torch.is_inference_mode_enabled() and \
            any(tensors[i].is_inference() for i in self.written_inputs if i < len(tensors))



def shares_written_memory(tensors: Any, written: list[int], label: str, told: set) -> bool:
    """Does an input the graph writes share memory with another input (`f(x, x[0])`, a
    buffer and its view)? The compiled graph takes its inputs as apart; eager's write shows
    through the other, so such a call runs eagerly (said once per graph on the fallbacks
    channel: `told` holds the labels said). Dynamo guards on storage overlap and recompiles;
    here the check is a few data pointers per call, made only by graphs that write inputs.
    (The same tensor passed twice fails the tensor guards and recompiles, as Dynamo's
    duplicate-input guard does. Parameters are left out: one shared between two places is
    one object, one input.)"""
    # each input's storage by where its memory begins (a view's pointer less its offset:
    # cheaper than untyped_storage(), which makes an object), counted in one pass — a
    # ResNet-50's 159 written batch-norm statistics against its 320 inputs took 1.1 ms a
    # call on the CPU counted input by input, 0.3 in one pass
    memory: list[int | None] = []
    users: dict[int, int] = {}
    for t in tensors:
        if type(t) is torch.nn.Parameter or not t.numel():
            memory.append(None)
            continue
        base = t.data_ptr() - t.storage_offset() * t.element_size()
        memory.append(base)
        users[base] = users.get(base, 0) + 1
    aliased = any(memory[i] is not None and users[memory[i]] > 1
                  for i in written if i < len(memory))
    if aliased and label not in told:
        told.add(label)
        logs.channel("fallbacks").info(
            "%s: called with inputs that share memory, one of which it writes; such calls "
            "run eagerly", label)
    return aliased


# Calls running eagerly beside their graph's compile, counted: the warm keep's thread waits
# until none runs (its encoding would take the GIL from the run it is meant to stay off: on
# the H200, GPT-2's eager first run took as long as the wait for kernels it replaced)
_running_eagerly = 0
_none_running_eagerly = threading.Condition()


def eager_beside_the_compile(eager: Callable, args: tuple, label: str, count: int = 1) -> Any:
    """A graph's call, run by `eager` while its kernels compile (the first, `count` 1, said
    on perf)."""
    global _running_eagerly
    started = time.perf_counter()
    with _none_running_eagerly:
        _running_eagerly += 1
    try:
        result = eager(*args)
    finally:
        with _none_running_eagerly:
            _running_eagerly -= 1
            _none_running_eagerly.notify_all()
    if count == 1:
        logs.channel("perf").info("%s: first call run eagerly while its kernels compile, in "
                                  "%.1f ms (so run the calls until they are in)", label,
                                  (time.perf_counter() - started) * 1e3)
    return result


def after_eager_runs(timeout: float = 30.0) -> None:
    """Return once no call runs eagerly beside its graph's compile (or after `timeout` s)."""
    with _none_running_eagerly:
        _none_running_eagerly.wait_for(lambda: _running_eagerly == 0, timeout)


def eager_after(error: Exception, eager: Callable, args: tuple, label: str, what: str) -> Any:
    """A compiled run raised (and wrote nothing the caller passed): eager answers. Where eager
    raises too, the error is eager's, from the user's line; where it does not, the fault is
    ember's: said as a warning (the caller then runs eagerly from now on) and the user's
    program goes on."""
    try:
        result = eager(*args)
    except Exception:  # noqa: BLE001 (eager raises as well: the error is the user's)
        raise_located(error, eager, args, label)
    if "raise" in config.settings.logs:
        raise error
    logs.channel("fallbacks").warning(
        "%s: its %s raised %s: %s, where eager does not; this graph runs eagerly from now on "
        "(a fault of ember's: please report it)", label, what, type(error).__name__,
        str(error).split("\n")[0])
    return result
