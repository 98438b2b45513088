"""What a compiled function does once ember gives up on it: its calls that run eagerly are
counted, and past EAGER_CALLS_BEFORE_DIRECT in a row the function is called directly
(GivingUp, a base of api.CompiledFunction); an eager entry's call and a kept version's call
past the recompile limit, as they count.
"""

from __future__ import annotations

import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import logs
from ember.capture.errors import Unsupported
from ember.capture.guards import MISS

if TYPE_CHECKING:
    from ember.api import CompiledFunction

# NOTE: giving up is free. A function whose calls all run eagerly — every cache entry is an
# eager one (its capture failed), or it is past the recompile limit and its kept versions
# served none of them — is called directly after this many such calls in a row: __call__ then
# costs one attribute read and a grad-mode test over the function itself, not a bind and the
# entries' guards (microseconds per call). What the eager entries' guards watched for (another
# type, dtype or shape, that capture could succeed on) is no longer asked, as Dynamo no longer
# asks of a frame it skipped; grad mode still is (training after eval: a capture under the
# other mode is tried, and the direct call serves only the modes whose calls all ran
# eagerly). ember.reset() forgets it. Said once, on EMBER_LOGS=fallbacks.
EAGER_CALLS_BEFORE_DIRECT = 8

# NOTE: a function whose graph breaks can cost more than eager: each graph adds its guards,
# its runner and, in training, an autograd node per call, and a break between small graphs
# leaves little for the kernels to win (XMOD's per-language adapters, a masked select in
# every layer: 27 graphs for 120 ops, 1.33x eager's training step). Such a function is put
# on trial once its compiles are done: TRIAL_WARM calls run compiled, then TRIAL_ROUNDS
# rounds each run one call eagerly and the next compiled, timed (the device synchronized
# around each); where the median of the rounds' compiled/eager ratios is above
# TRIAL_MARGIN, the function is called directly from then on in that grad mode, said once
# on EMBER_LOGS=fallbacks (ember.reset() tries again); otherwise the trial ends and costs
# nothing more. Eager's calls give the same answers: only the time differs. A training
# call's backward runs after the call returns and is not in its time. EMBER_EAGER_TRIAL=0
# turns it off.
TRIAL_WARM = 2
TRIAL_ROUNDS = 5
TRIAL_MARGIN = 1.10
grad_enabled = torch.is_grad_enabled
# (asked first on every call, bound once: True while torch.compile traces code that calls a
# compiled function or module, which then traces the function itself, not ember's runtime)
dynamo_compiling = torch.compiler.is_dynamo_compiling


class GivingUp:
    """The policy over a compiled function's own state, which its __call__ reads first on
    every call: `direct` (what it then calls at once, in the grad modes of `direct_modes`),
    `eager_streak` (calls in a row that ran eagerly since the last capture) and `given_up`
    (past the recompile limit)."""

    given_up: bool
    direct: Callable | None
    direct_modes: frozenset[bool]
    eager_streak: int
    trial: EagerTrial | None

    def ran_eagerly(self) -> None:
        """One more call ran eagerly: past EAGER_CALLS_BEFORE_DIRECT in a row, with no
        compiled version left that later calls could take, the function is called directly
        in this grad mode."""
        self.eager_streak += 1
        if self.eager_streak < EAGER_CALLS_BEFORE_DIRECT or not (
                self.given_up or all(entry.captured is None for entry in self.entries)):
            return
        if self.direct is None:
            why = "past the recompile limit" if self.given_up else \
                str(self.entries[0].eager_reason) if self.entries else "ember gave up"
            logs.channel("fallbacks").info(
                "%s: its last %d calls ran eagerly (%s); it is called directly from now on "
                "(ember.reset() tries again)", self.where, self.eager_streak, why)
        self.run_directly()

    def run_directly(self) -> None:
        """Calls in the current grad mode go straight to the function (see
        EAGER_CALLS_BEFORE_DIRECT)."""
        self.direct = self.function if self.bound_self is None else \
            types.MethodType(self.function, self.bound_self)
        self.direct_modes = self.direct_modes | {grad_enabled()}


class EagerTrial:
    """Compiled calls against eager ones, for a function whose graph breaks (see
    TRIAL_ROUNDS): `call` takes the calls while the trial runs."""

    def __init__(self, breaks_at: Any):
        self.breaks_at = breaks_at  # (the first break's Location)
        self.grad_enabled = grad_enabled()  # (the mode it judges: calls in the other pass)
        self.warm = 0
        self.eager_seconds: float | None = None  # (the round's eager call, its compiled next)
        self.ratios: list[float] = []

    def takes_calls(self) -> bool:
        """False while compiles ember started beside the calls still run (its calls then
        run eagerly, or share the host with them)."""
        from ember.runtime.background import compiling_beside

        return not compiling_beside()

    def call(self, compiled: CompiledFunction, args: tuple, kwargs: dict) -> Any:
        if grad_enabled() != self.grad_enabled:
            return _untried(compiled, args, kwargs)
        if self.warm < TRIAL_WARM:
            self.warm += 1
            return _untried(compiled, args, kwargs)
        _synchronize()
        start = time.perf_counter()
        if self.eager_seconds is None:
            result = compiled._eager(args, kwargs)
            _synchronize()
            self.eager_seconds = time.perf_counter() - start
            return result
        result = _untried(compiled, args, kwargs)
        _synchronize()
        self.ratios.append((time.perf_counter() - start) / max(self.eager_seconds, 1e-9))
        self.eager_seconds = None
        if len(self.ratios) == TRIAL_ROUNDS:
            self.judge(compiled)
        return result

    def judge(self, compiled: CompiledFunction) -> None:
        ratio = statistics.median(self.ratios)
        compiled.trial = None
        if ratio <= TRIAL_MARGIN:
            logs.channel("perf").info("%s: its compiled calls take %.2fx eager's time (the "
                                      "median of %d rounds): compiled it stays",
                                      compiled.where, ratio, len(self.ratios))
            return
        logs.channel("fallbacks").info(
            "%s: its compiled calls took %.2fx eager's time (the median of %d rounds; its "
            "graph breaks at %s); it is called directly from now on in this grad mode "
            "(ember.reset() tries again)", compiled.where, ratio, len(self.ratios),
            f"{self.breaks_at.filename}:{self.breaks_at.line}" if self.breaks_at else "a call")
        compiled.run_directly()


def _untried(compiled: CompiledFunction, args: tuple, kwargs: dict) -> Any:
    """The compiled function's call as it is without its trial."""
    trial, compiled.trial = compiled.trial, None
    try:
        return compiled(*args, **kwargs)
    finally:
        if compiled.trial is None:  # (a recompile that broke again started a new one)
            compiled.trial = trial


def _synchronize() -> None:
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        cuda.synchronize()


# what plain tensors' and parameters' __torch_function__ are (a subclass that keeps them
# adds no hook of its own)
_PLAIN_TORCH_FUNCTIONS = (torch.Tensor.__torch_function__.__func__,
                          torch.nn.Parameter.__torch_function__)


def hooked_arguments(arguments: dict[str, Any]
                     ) -> tuple[Unsupported, Callable[[dict], bool]] | None:
    """Why arguments of tensor subclasses with a __torch_function__ of their own run as
    eager runs them — the hook runs on every torch call on them, attribute reads included,
    so it would see the warm-start key's, the capture's and the guards' reads (a count, a
    log) where eager's are not — and the eager entry's guard, which reads only types."""
    hooked = hooked_tensor_types(arguments)
    if not hooked:
        return None
    refusal = Unsupported(f"tensors of {', '.join(hooked)} call their own "
                          f"__torch_function__, which would see ember's reads")
    return refusal, lambda arguments: hooked_tensor_types(arguments) == hooked


def hooked_tensor_types(arguments: dict[str, Any]) -> list[str]:
    """The tensor subclasses among the arguments with a __torch_function__ of their own."""
    found = set()
    for value in arguments.values():
        if isinstance(value, torch.Tensor) and type(value) not in (torch.Tensor,
                                                                   torch.nn.Parameter):
            hook = type(value).__torch_function__
            if getattr(hook, "__func__", hook) not in _PLAIN_TORCH_FUNCTIONS:
                found.add(type(value).__qualname__)
    return sorted(found)


def counted_eager_call(compiled: CompiledFunction, guard: Callable[[dict], bool]
                       ) -> Callable[[dict], Any]:
    """An eager entry's call: its guards, then the function as it is, counted towards
    calling it directly."""
    caller = compiled.caller

    def call(arguments: dict[str, Any]) -> Any:
        if not guard(arguments):
            return MISS
        compiled.ran_eagerly()
        return caller(arguments)

    return call


def ending_the_streak(compiled: CompiledFunction, call: Callable[[dict], Any]
                      ) -> Callable[[dict], Any]:
    """A kept version's call past the recompile limit: a call it serves ends the run of
    eager calls (the version is still wanted)."""
    def serve(arguments: dict[str, Any]) -> Any:
        result = call(arguments)
        if result is not MISS:
            compiled.eager_streak = 0
        return result

    return serve
