"""A compiled training graph: the forward and backward graphs that autodiff split it into,
each compiled, joined by a torch.autograd.Function so `loss.backward()` runs the compiled
backward and any optimizer sees ordinary .grad tensors."""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from ember import logs
from ember.autodiff import tape
from ember.ir.sizes import evaluate
from ember.runtime import collector
from ember.runtime.compiled import eager_after, eager_beside_the_compile, shares_written_memory
from ember.runtime.errors import raise_located, raise_located_backward
from ember.torch_internals import tree_flatten, tree_unflatten

if TYPE_CHECKING:
    from ember.autodiff.differentiate import Split
    from ember.lower.results import OutputSpec


# backwards compiled per set of outputs given no gradient, at most (past it the backward for
# every output serves the other sets, given zeros)
MAX_BACKWARDS = 4


class TrainingGraph:
    def __init__(self, forward: Any, backward: Any, split: Split, specs: list[OutputSpec],
                 output_tree: Any, output_count: int, tensor_positions: list[int],
                 extras: list[torch.Tensor], label: str, eager: Any, grad_inside: bool = False,
                 without: Any = None, ahead: dict | None = None,
                 start_backward: Callable[[], None] | None = None, eager_first: bool = False):
        self.forward_graph = forward
        # a first call that comes while the forward's kernels, or the backward compiled
        # ahead, still compile runs eagerly beside them (the graph as eager runs it, under
        # autograd); so do the next ones while only kernels compile (in other processes),
        # where a backward still compiling on a thread of this process is waited for (a run
        # beside it would slow it by the GIL it needs)
        self._eager_first = eager_first
        if eager_first and hasattr(forward, "settle_when_built"):  # (kept once they are in)
            forward.settle_when_built()
        self._eager_calls = 0
        # (the backward for every output: compiled, or a Future of it — compiled on a thread
        # from the first call after a backward ran, or when a backward first needs it: see
        # backends.compile_training)
        self._backward = backward
        # (starts that compile: see after_backward)
        self._start_backward = start_backward
        self._taking = threading.Lock()  # (the backward taken in once from its Future)
        self._backward_ran = False
        # (what wraps the backward once it is compiled: see wrap_backward)
        self._backward_wrapper: Callable[[Any], Any] | None = None
        # compiles the backward of calls that give some outputs no gradient (None: the
        # backward above serves them, with zeros: a warm-started or CUDA-graphed graph)
        self.without = without if not split.forward.symbols else None
        # (`ahead`: such backwards compiled beside the forward, or Futures of them, by the
        # outputs absent; and by a call's set of missing gradients, the backward it runs
        # and what stands in)
        self._backwards: dict[frozenset[int], Any] = dict(ahead or {})
        self._chosen: dict[frozenset[int], tuple[Any, dict[int, torch.Tensor]]] = {}
        self.split = split
        self.output_tree = output_tree
        self.output_count = output_count
        self.specs = specs  # how each user output comes from the graph's outputs and inputs
        self.tensor_positions = tensor_positions
        self.extras = extras
        self.label = label
        self.eager = eager
        # entered under no_grad, the graph turns grad mode on inside (its results made
        # after that are differentiable): the autograd.Function runs under enable_grad
        self.grad_inside = grad_inside
        self._told: set[str] = set()  # (what the fallbacks channel was told, once)
        self._broken = False  # (its compiled forward raised where eager did not)
        # (forward outputs that are views, by position, with the saved values over the same
        # memory; and whether any saved value is an output's memory: found on the first
        # call, see _views_among)
        self.output_views: dict[int, list[int]] | None = None
        self.saves_outputs = False
        self.fallback_count = forward.fallback_count
        # the backward's inputs: which forward inputs it reads (the rest are gradients and
        # saved values)
        self.inputs_read = sorted({k for kind, k in split.backward_inputs if kind == "input"})
        differentiable = set(split.differentiable_outputs)
        self.non_differentiable = [i for i in range(output_count) if i not in differentiable]

    @property
    def backward_graph(self) -> Any:
        pending = self._backward
        if isinstance(pending, concurrent.futures.Future):
            self._start_deferred_backward()  # (not started yet: now, and waited for)
            backward = pending.result()
            with self._taking:  # (the warm cache's thread may take it in at the same time)
                if self._backward is pending:
                    wrapper, self._backward_wrapper = self._backward_wrapper, None
                    self._backward = wrapper(backward) if wrapper is not None else backward
        return self._backward

    @backward_graph.setter
    def backward_graph(self, compiled: Any) -> None:
        self._backward = compiled

    @property
    def backward_compiled(self) -> bool:
        """Is the backward for every output compiled and taken (not still to come)?"""
        return not isinstance(self._backward, concurrent.futures.Future)

    def wrap_backward(self, wrapper: Callable[[Any], Any]) -> None:
        """Replace the backward for every output by `wrapper(backward)` (a CUDA-graph
        recording of it): now where it is compiled, else when it is first taken — a graph
        whose calls take no backward (a decoding loop under grad mode) never compiles it."""
        with self._taking:
            if self.backward_compiled:
                self._backward = wrapper(self._backward)
            else:
                self._backward_wrapper = wrapper

    def _compiling(self) -> str | None:
        """What of the forward and the backwards compiled ahead is not in: "graphs" (one
        still compiles on a thread), "kernels" (only kernels, in their workers), or None."""
        kernels = False
        for graph in (self.forward_graph, *self._backwards.values()):
            if isinstance(graph, concurrent.futures.Future):
                if not graph.done():
                    return "graphs"
                graph = graph.result() if graph.exception() is None else None
            kernels = kernels or not getattr(graph, "kernels_in", True)
        return "kernels" if kernels else None

    def after_backward(self) -> None:
        """A backward has run (compiled, or eager's through a call run eagerly): the backward
        for every output, not compiled yet, starts with the next call of the graph
        (compiling beside the first call's runs, its Python held the GIL they need: after
        the first backward it still slowed that call's optimizer step). Calls that take no
        backward never compile it."""
        self._backward_ran = True

    def _watch_backward(self, results: Any) -> None:
        """Call after_backward when a gradient first reaches one of `results` (a call's
        outputs as eager made them, under autograd)."""
        owner = weakref.ref(self)

        def reached(_: torch.Tensor) -> None:
            graph = owner()
            if graph is not None and not graph._backward_ran:
                graph.after_backward()

        for value in tree_flatten(results)[0]:
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                value.register_hook(reached)

    def _start_deferred_backward(self) -> None:
        start, self._start_backward = self._start_backward, None
        if start is not None:
            start()

    @property
    def backward_started(self) -> bool:
        """Has the backward for every output begun to compile (or is it compiled)?"""
        return self._start_backward is None

    @property
    def pending(self) -> concurrent.futures.Future | None:
        """The backward for every output while it still compiles (warm_cache keeps the graph
        once it is done), else None."""
        backward = self._backward
        return backward if isinstance(backward, concurrent.futures.Future) and \
            not backward.done() else None

    @property
    def kernel_count(self) -> int:
        return self.forward_graph.kernel_count + self.backward_graph.kernel_count

    @property
    def library_count(self) -> int:
        return self.forward_graph.library_count + self.backward_graph.library_count

    def backward_for(self, missing: frozenset[int]) -> tuple[Any, dict[int, torch.Tensor]]:
        """The compiled backward for a call whose gradients of the forward outputs `missing`
        are None, and what stands in for those it was built without (one zero, expanded:
        never read). Chosen once per set, then a lookup on every backward."""
        chosen = self._chosen.get(missing)
        if chosen is None:
            with collector.paused():  # (it may compile that backward now)
                chosen = self._chosen[missing] = self._choose(missing)
        return chosen

    def _choose(self, missing: frozenset[int]) -> tuple[Any, dict[int, torch.Tensor]]:
        outputs = self.split.forward.outputs
        absent = frozenset(k for k in missing if outputs[k].dtype.is_floating_point)
        if absent and self.without is not None and absent not in self._backwards and \
                len(self._backwards) < MAX_BACKWARDS:  # (complex zeros: the general one)
            self._backwards[absent] = self._compiled(absent, lambda: self.without(absent))
        built = self._backwards.get(absent) if self.without is not None else None
        if isinstance(built, concurrent.futures.Future):  # (built ahead: maybe still compiling)
            built = self._backwards[absent] = self._compiled(absent, built.result)
        if built is None:
            return self.backward_graph, {}
        device = self.split.forward.device
        return built, {k: torch.zeros((), dtype=outputs[k].dtype, device=device)
                       .expand(outputs[k].shape) for k in absent}

    def _compiled(self, absent: frozenset[int], compile: Callable[[], Any]) -> Any:
        """The backward without gradients for outputs `absent`, or None where its compile
        failed (the backward for every output serves, given zeros)."""
        try:
            return compile()
        except Exception as error:
            logs.channel("fallbacks").info(
                "%s: the backward without gradients for outputs %s did not compile (%s: %s); "
                "the backward for every output runs, given zeros", self.label, sorted(absent),
                type(error).__name__, error)
            return None

    def saved_positions(self) -> tuple[int, ...]:
        """The backward's argument positions that hold values the forward saved for it (the
        others: gradients of the forward's outputs and forward inputs)."""
        return tuple(k for k, (kind, _) in enumerate(self.split.backward_inputs)
                     if kind == "saved")

    def input(self, args: tuple, index: int) -> torch.Tensor:
        """Forward graph input `index`: a tensor argument, or a graph attribute after them."""
        if index < len(self.tensor_positions):
            return args[self.tensor_positions[index]]
        return self.extras[index - len(self.tensor_positions)]

    def symbol_values(self, args: tuple) -> dict[str, int]:
        """A symbolic forward's symbols at this call's sizes."""
        return {name: self.input(args, index).shape[dim] for name, (index, dim)
                in self.split.forward.symbols.items()}

    def _eager_after(self, error: Exception, args: tuple) -> Any:
        """The compiled forward raised and wrote nothing the caller passed: the graph as eager
        runs it answers, under autograd (the forward's IR interpreted may share the fault)."""
        result = eager_after(error, self.eager, args, self.label, "compiled training step")
        self._broken = True
        return result

    def _gave_up(self) -> bool:
        """Did the forward's first call find a library call laid out otherwise than eager's
        meta kernel said (rfftn's result)? Its IR's layout is then not eager's: the graph as
        eager runs it answers from then on (unless the forward writes inputs: it has)."""
        forward = self.forward_graph
        return self._broken or \
            getattr(forward, "runs_eagerly", False) and not forward.written_inputs

    def _aliased(self, args: tuple) -> bool:
        """Does an input the forward writes share memory with another input? (see
        shares_written_memory: the graph as eager runs it answers such calls, under autograd;
        the forward's own eager form, the IR interpreted, would take the inputs as apart)"""
        written = getattr(self.forward_graph, "written_inputs", ())
        return bool(written) and shares_written_memory(
            [args[i] for i in self.tensor_positions], written, self.label, self._told)

    def __call__(self, *args: Any) -> Any:
        if self._backward_ran and self._start_backward is not None:
            self._start_deferred_backward()
        if self._eager_first:
            compiling = self._compiling()
            if compiling is None:
                self._eager_first = False
            elif not self._eager_calls or compiling == "kernels":
                self._eager_calls += 1
                results = eager_beside_the_compile(self.eager, args, self.label,
                                                   self._eager_calls)
                if not self._backward_ran and torch.is_grad_enabled():
                    self._watch_backward(results)
                return results
        if self._gave_up() or self._aliased(args):
            return self.eager(*args)
        try:
            if torch.is_grad_enabled():
                results = _Step.apply(self, *args)
            elif self.grad_inside:
                with torch.enable_grad():
                    results = _Step.apply(self, *args)
            else:  # (called under no_grad: no backward to prepare)
                results = self.forward_graph(*args)[:self.output_count]
        except Exception as error:  # (an index out of range, a library call's refusal)
            # (the forward's own eager form is its IR: the FX graph says where eager raises)
            if getattr(self.forward_graph, "written_inputs", ()):
                raise_located(error, self.eager, args, self.label)
            return self._eager_after(error, args)
        if self._gave_up():
            return self.eager(*args)
        leaves: list[Any] = []
        bindings = self.symbol_values(args) if self.split.forward.symbols else None
        for spec in self.specs:  # (views are taken here, outside the Function: autograd
            if spec.kind == "node":  # sees them as the views they are)
                leaves.append(results[spec.index])
            elif spec.kind == "input":
                leaves.append(self.input(args, spec.index))
            elif spec.kind == "view":
                base = results[spec.index] if spec.of_output else self.input(args, spec.index)
                if spec.recorded is None or spec.recorded is torch.is_grad_enabled():
                    leaves.append(spec.view_of(base, bindings))
                else:  # (a view the function made under a grad mode of its own)
                    with torch.set_grad_enabled(spec.recorded):
                        leaves.append(spec.view_of(base, bindings))
            elif spec.kind == "same":
                leaves.append(leaves[spec.index])
            else:
                leaves.append(spec.value)
        return tree_unflatten(leaves, self.output_tree)


class _Step(torch.autograd.Function):
    """The compiled forward and backward; apply(owner, *args) takes the graph's arguments as
    the compiled forward does (non-tensors in place)."""

    @staticmethod
    def forward(ctx, owner: TrainingGraph, *args: Any):
        # (the library calls whose backward is eager's autograd keep its records here)
        # (a graph with none pays nothing for them: no tape, no context on this path)
        ctx.tape = tape.Tape(owner.split.tapes) if owner.split.tapes else None
        if ctx.tape is None:
            results = owner.forward_graph(*args)
        else:
            with tape.using(ctx.tape):
                results = owner.forward_graph(*args)
        outputs, saved = results[:owner.output_count], results[owner.output_count:]
        if owner.output_views is None:
            owner.output_views, owner.saves_outputs = _views_among(outputs, saved)
        ctx.shared = None  # (saved values the backward takes from an output's memory)
        if owner.output_views:
            outputs, saved, ctx.shared = _outputs_of_their_own(outputs, saved,
                                                               owner.output_views)
        ctx.owner = owner
        ctx.count = len(args)
        # (a graph whose sizes are symbols: this call's values, for a gradient made here)
        ctx.sizes = owner.symbol_values(args)
        # (weakly: only to say where an error of the backward comes from, if they still live)
        ctx.arguments = [weakref.ref(a) if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*[owner.input(args, k) for k in owner.inputs_read], *saved)
        ctx.mark_non_differentiable(*[outputs[i] for i in owner.non_differentiable])
        # (outputs given no gradient come to the backward as None, not as zeros it reads)
        ctx.set_materialize_grads(owner.without is None)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        owner = ctx.owner
        try:
            stored = ctx.saved_tensors
        except RuntimeError as error:
            if owner.saves_outputs and "modified by an inplace operation" in str(error):
                raise RuntimeError(
                    f"{owner.label}: an output of this compiled call was written in place "
                    f"before its backward ran, and ember's backward reads that output's "
                    f"memory (a value it saved, such as the logits a loss inside the call "
                    f"read: stored once, not twice). Write that output out of place "
                    f"(`logits = logits * 2`, not `logits.mul_(2)`), or set "
                    f"EMBER_SAVED_OUTPUTS=0 to store a copy.") from error
            raise
        reads = dict(zip(owner.inputs_read, stored[:len(owner.inputs_read)]))
        saved = stored[len(owner.inputs_read):]
        if ctx.shared:
            saved = list(saved)
            for k, (offset, size, stride) in ctx.shared.items():
                saved[k] = _on_storage(saved[k], offset, size, stride)
        forward_outputs = owner.split.forward.outputs
        backward, stand_ins = owner.backward_for(frozenset(
            k for kind, k in owner.split.backward_inputs if kind == "grad" and grads[k] is None))
        arguments = []
        for kind, k in owner.split.backward_inputs:
            if kind == "grad":
                grad = grads[k]
                if k in stand_ins:  # (a backward built without it: never read)
                    grad = stand_ins[k]
                elif grad is None:
                    node = forward_outputs[k]
                    grad = torch.zeros([evaluate(d, ctx.sizes) for d in node.shape],
                                       dtype=node.dtype, device=owner.split.forward.device)
                else:
                    grad = grad.contiguous()
                arguments.append(grad)
            elif kind == "saved":
                arguments.append(saved[k])
            else:
                arguments.append(reads[k])
        try:
            if ctx.tape is None:
                found = backward(*arguments)
            else:
                with tape.using(ctx.tape):
                    found = backward(*arguments)
        except Exception as error:  # (a library call's backward refusing, an index check)
            located_backward(error, owner, ctx.arguments, grads)
        owner.after_backward()
        result: list[torch.Tensor | None] = [None] * (1 + ctx.count)
        for index, grad in zip(owner.split.wrt, found):
            result[1 + owner.tensor_positions[index]] = grad
        return tuple(result)


def _on_storage(tensor: torch.Tensor, offset: int, size: Any, stride: Any) -> torch.Tensor:
    """A tensor over `tensor`'s memory, of its own (no autograd view of it)."""
    made = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return made.set_(tensor.untyped_storage(), offset, size, stride)


def _views_among(outputs: tuple, saved: tuple) -> tuple[dict[int, list[int]], bool]:
    """Which outputs are views (of a library result the schedule stored once), each with the
    saved values over the same memory (a model's logits that the loss's backward reads);
    and whether any saved value is an output's memory (an in-place write to that output
    then stops the backward). The schedule is the same every call: found on the first."""
    storages: dict[int, list[int]] = {}
    for k, value in enumerate(saved):
        if isinstance(value, torch.Tensor):
            storages.setdefault(value.untyped_storage().data_ptr(), []).append(k)
    tensors = [(i, output) for i, output in enumerate(outputs)
               if isinstance(output, torch.Tensor)]
    views = {i: storages.get(output.untyped_storage().data_ptr(), [])
             for i, output in tensors if output._base is not None}
    shared = any(output.untyped_storage().data_ptr() in storages for _, output in tensors)
    return views, shared


def _outputs_of_their_own(outputs: tuple, saved: tuple, views: dict[int, list[int]]
                          ) -> tuple[tuple, tuple, dict | None]:
    """Outputs that are views returned as tensors of their own over the same memory: a
    custom Function's output that is a view refuses in-place ops that eager allows. A saved
    value over an output's memory is then taken from the output in the backward: autograd
    saves the output with its version, so an in-place write to it before the backward is an
    error there, never a wrong gradient. Returns (outputs, saved, {saved position: (offset,
    size, stride)} or None)."""
    outputs, saved, shared = list(outputs), list(saved), {}
    for i, ks in views.items():
        output = outputs[i]
        outputs[i] = _on_storage(output, output.storage_offset(), output.size(),
                                 output.stride())
        memory = output.untyped_storage().data_ptr()
        for k in ks:
            value = saved[k]
            if value.untyped_storage().data_ptr() != memory:
                continue  # (not this call: a replayed CUDA graph's outputs are copies)
            shared[k] = (value.storage_offset(), value.size(), value.stride())
            saved[k] = outputs[i]
    return tuple(outputs), tuple(saved), shared or None


def located_backward(error: Exception, owner: TrainingGraph, arguments: list[Any],
                     grads: tuple) -> NoReturn:
    """Raise `error` of the compiled backward as eager's backward raises it, from the user's
    line of the forward op whose backward raised (raise_located_backward)."""
    args = tuple(a() if isinstance(a, weakref.ref) else a for a in arguments)
    if any(a is None for a, kept in zip(args, arguments) if isinstance(kept, weakref.ref)):
        error.add_note(f"(raised in the backward of ember's compiled {owner.label})")
        raise error
    outputs = [grads[spec.index] if spec.kind == "node" else None for spec in owner.specs]
    raise_located_backward(error, owner.eager, args, outputs, owner.label)
