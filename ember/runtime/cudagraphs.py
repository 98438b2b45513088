"""mode="reduce-overhead": a compiled graph's launches recorded once as a CUDA graph, replayed.

A replay launches every kernel and library call of the graph with one call, so the time a
small graph spends in Python and in launching goes away. What the recording needs and how it
is kept safe:

- Static inputs. The graph reads fixed addresses: each call copies its input tensors into the
  buffers the graph was recorded with. Parameters are read in place (not copied) as long as
  the graph does not write them and they stay where they were; if one moves, the graph is
  recorded again.
- A private memory pool holds the graph's temporaries and outputs, so nothing else allocates
  over them between replays.
- Outputs the caller keeps are never overwritten: a replay's outputs are copied out of the
  pool (views of inputs are rebuilt on the caller's tensors instead), so the results of
  earlier calls stay as they were.
- Training graphs: the forward's saved values and the backward's gradients are handed out
  uncopied (aliases of the pool), and the backward reads the saved values where the forward's
  replay left them. Before each replay the pool's handed-out memory must be free again (no
  alias alive: autograd released its saved values, zero_grad() dropped the gradients); where
  it is not (gradient accumulation, retain_graph), or the saved values come from elsewhere,
  the call runs without the CUDA graph, so nothing anyone holds is overwritten.
- Inputs the graph writes (in-place ops) are copied back into the caller's tensors.
- A recording is kept only where it can pay: a replay saves each launch's host work but adds
  the copies in and out, which cost a pass over memory each. A graph of a few kernels over
  large tensors (a softmax over 16 MB: one launch saved, 64 MB copied) runs faster without
  one; it is said on EMBER_LOGS=perf and the graph runs as in the default mode.
- The first call runs normally (it also warms up lazy initialization), then the graph is
  recorded. Where it cannot be (CPU tensors, a host synchronization inside the graph, an
  error while recording), the graph runs without CUDA graphs and the reason is logged on
  EMBER_LOGS=perf and reported by ember.explain.
- A graph compiled once for every shape (symbolic sizes, issue 18) keeps one recording per
  shape met (`ShapeGraphs`): a shape's first call runs without a graph, its second records
  one (a decoding loop whose every step is a new shape records nothing), at most
  EMBER_CUDA_GRAPH_SHAPES of them, least recently used dropped; each on EMBER_LOGS=perf.
- Eager islands (ember/runtime/partitioned.py) are recorded with the compiled regions around
  them, as any CUDA work is; one that synchronizes with the host makes the recording fail, as
  above. A training graph with islands runs without CUDA graphs.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from ember import config, logs, torch_internals
from ember.runtime import library_warmup

# After this many recordings (parameters that keep moving), stop recording.
MAX_RECORDINGS = 4
# What a replay saves per launch it replaces (the wrapper's Python and the launch itself), and
# the bandwidth of the copies in and out of the recording (an H200's reach ~3 TB/s; less for
# small ones). The copies' own launches are left out: they are the same few whatever the
# graph, and small beside the launches of graphs worth recording.
LAUNCH_SECONDS = 4e-6
COPY_BYTES_PER_SECOND = 2.5e12


def replay_loses(launches: int, copied_bytes: int) -> str | None:
    """Why replaying costs more than the launches it saves (None: it pays): `launches` the
    graph makes per call; `copied_bytes` copied in and out around each replay (each read
    once and written once)."""
    saved = launches * LAUNCH_SECONDS
    cost = 2 * copied_bytes / COPY_BYTES_PER_SECOND
    if cost <= saved:
        return None
    return (f"copying {copied_bytes / 2**20:.1f} MiB in and out of the recording each call "
            f"(~{cost * 1e6:.0f} us) costs more than the {launches} launches a replay saves "
            f"(~{saved * 1e6:.0f} us)")


def _per_shape(compiled: Any) -> bool:
    """Is `compiled` a symbolic capture compiled per concrete shape (shapes.ShapeSpecialized)?"""
    from ember.shapes import ShapeSpecialized

    return isinstance(compiled, ShapeSpecialized)


def serves_several_shapes(compiled: Any) -> bool:
    """Is `compiled` a graph whose sizes are symbols (compiled once for every shape, or per
    shape under one capture)?"""
    if _per_shape(compiled):
        return True
    split = getattr(compiled, "split", None)  # (a training graph: its forward's symbols)
    if split is not None:
        return bool(split.forward.symbols)
    plan = getattr(compiled, "plan", None)
    return bool(plan is not None and getattr(plan.graph, "symbols", None))


class CudaGraphed:
    def __init__(self, compiled: Callable, example_inputs: list[Any], where: str,
                 kept_from: int | None = None, fixed: tuple[int, ...] = (),
                 one_shape: bool = False):
        self.compiled = compiled
        self.where = where
        # output leaves from this position on are handed out uncopied (see the module's doc)
        self.kept_from = kept_from
        # argument positions read where they are (another address: run without the graph)
        self.fixed = fixed
        self.calls = 0
        self.reason: str | None = None
        self.recorded = False
        self.recordings = 0
        self.graph: Any = None
        tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        devices = {t.device.type for t in tensors}
        self.training = False
        # (a graph that serves several shapes: one recording per shape, ShapeGraphs)
        self.shapes: ShapeGraphs | None = None
        # NOTE: a recording holds one shape's buffers; replayed for another, the copies into
        # them would fail or broadcast: a graph of symbolic sizes records per shape met
        several = not one_shape and serves_several_shapes(compiled)
        if not tensors:
            self.give_up("no tensor inputs")
        elif devices != {"cuda"}:
            self.give_up(f"tensors on {', '.join(sorted(devices))} (CUDA graphs replay CUDA "
                         f"work only)")
        elif len({t.device for t in tensors}) > 1:
            self.give_up("tensors on several CUDA devices")
        elif several and _per_shape(compiled):
            self.give_up("symbolic sizes compiled per shape (CUDA graphs per shape are kept "
                         "for graphs compiled once for every shape)")
        elif getattr(compiled, "runs_eagerly", False) or type(compiled).__name__ == "EagerGraph":
            self.give_up(f"the graph runs eagerly ({getattr(compiled, 'reason', 'see log')})")
        elif getattr(compiled, "trains", False):
            # (a training graph with eager islands: its regions' forwards and backwards are
            # autograd.Functions between eager ops, not one forward and one backward to record)
            self.give_up("a training graph with eager islands")
        elif type(compiled).__name__ == "TrainingGraph" and compiled.split.tapes:
            # (compiled outside ember.compile's reduce-overhead mode: its library calls keep
            # eager's autograd records in Python, which a replay would not run)
            self.give_up("a training graph whose library calls' backward is eager's autograd")
        elif type(compiled).__name__ == "TrainingGraph":
            # its forward and its backward are each recorded (each on its first call); the
            # autograd.Function between them stays in Python
            self.training = True
            saved = compiled.saved_positions()
            graphed = ShapeGraphs if several else CudaGraphed
            compiled.forward_graph = graphed(compiled.forward_graph, tensors,
                                             f"{where} (forward)",
                                             kept_from=compiled.output_count)
            compiled.wrap_backward(lambda backward: graphed(
                backward, tensors, f"{where} (backward)", kept_from=0, fixed=saved))
            compiled.without = None  # (the recorded backward serves every call, given zeros)
        elif several:
            self.shapes = ShapeGraphs(compiled, tensors, where)

    @property
    def pending(self) -> Any:
        """What of the graph recorded still compiles (warm_cache.when_compiled)."""
        return getattr(self.compiled, "pending", None)

    def give_up(self, reason: str) -> None:
        self.reason = reason
        logs.channel("perf").info("%s: no CUDA graph: %s; the graph runs without one",
                                  self.where, reason)

    def status(self) -> str:
        if self.training:
            backward = (self.compiled.backward_graph.status()
                        if self.compiled.backward_compiled else "not compiled yet")
            return f"forward {self.compiled.forward_graph.status()}, backward {backward}"
        if self.reason is not None:
            return f"not used: {self.reason}"
        if self.shapes is not None:
            return self.shapes.status()
        return "recorded" if self.recorded else "not recorded yet"

    # -- calls ----------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        if self.shapes is not None:
            return self.shapes(*args)
        if self.reason is not None or self.training:
            return self.compiled(*args)
        if not self.recorded:
            self.calls += 1
            result = self.compiled(*args)   # the first call runs normally ...
            # ... then the graph is recorded (a backward at its second call: its first
            # reads saved values of a forward that ran before its own graph was recorded)
            if self.calls >= (2 if self.fixed else 1):
                self.record(args)
            return result
        positions = self.positions
        if self.in_place and not self.pointers_equal(args, self.in_place):
            self.recorded = False           # a parameter moved: record again
            return self(*args)
        if self.fixed and not self.pointers_equal(args, self.fixed):
            return self.compiled(*args)     # saved values from a forward run without a graph
        if self.kept and any(map(_held, self.kept, self.kept_counts)):
            return self.compiled(*args)     # what the last replay handed out is still held
        for position, target, spanned in self.copied:
            target.copy_(_span_of(args[position]) if spanned else args[position])
        self.graph.replay()
        for position, static in self.written:
            args[position].copy_(static)
        leaves = []
        for kind, value in self.outputs:
            if kind == "pool":
                leaves.append(value.clone())
            elif kind == "kept":
                leaves.append(_detach(value))
            elif kind == "input":
                position, size, stride, offset = value
                user = args[positions[position]]
                leaves.append(user.as_strided(size, stride, user.storage_offset() + offset))
            else:
                leaves.append(value)
        return self.unflatten(leaves)

    # -- recording ------------------------------------------------------------------------
    def record(self, args: tuple) -> None:
        if self.recordings >= MAX_RECORDINGS:
            self.give_up(f"recorded {MAX_RECORDINGS} times (parameters keep moving)")
            return
        self.recordings += 1
        try:
            self._record(args)
        except Exception as error:  # a host sync, an op capture refuses, ...
            torch.cuda.synchronize()
            self.graph = None
            islands = getattr(self.compiled, "island_count", 0)
            self.give_up(f"recording failed: {type(error).__name__}: {error}".splitlines()[0]
                         + (f" (the graph has {islands} eager islands, recorded with it: "
                            f"one may not be capturable)" if islands else ""))

    def _record(self, args: tuple) -> None:
        positions = [i for i, x in enumerate(args) if isinstance(x, torch.Tensor)]
        self.positions = positions
        # inputs the compiled graph writes (known for ember's graphs; any, for others)
        known = getattr(self.compiled, "written_inputs", None)
        writes = {positions[i] for i in known} if known is not None else set(positions)
        statics = list(args)
        for position in positions:
            tensor = args[position]
            if (not isinstance(tensor, torch.nn.Parameter) or position in writes) and \
                    position not in self.fixed:
                statics[position] = _copy_of(tensor)
        versions = [statics[p]._version for p in positions]
        # (a graph whose kernels still compile would run eagerly: recorded so, its replays
        # would be eager's kernels)
        getattr(self.compiled, "compiled_from_now", lambda: None)()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.compiled(*statics)         # warm-up on the recording stream
        torch.cuda.current_stream().wait_stream(stream)
        # (ember's kernels write memory without bumping versions: hence `known`)
        written = {p for p, v in zip(positions, versions) if statics[p]._version != v}
        if known is not None:
            written |= {positions[i] for i in known}
        graph = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()
        library_warmup.settle()  # (another thread's launches would break the recording)
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            static_result = self.compiled(*statics)
        leaves, spec = torch_internals.tree_flatten(static_result)
        storages = {statics[p].untyped_storage().data_ptr(): i
                    for i, p in enumerate(positions)}
        outputs = []
        for number, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                outputs.append(("constant", leaf))
                continue
            owner = storages.get(leaf.untyped_storage().data_ptr())
            if owner is None:
                kept = self.kept_from is not None and number >= self.kept_from
                outputs.append(("kept" if kept else "pool", leaf))
            else:  # a view of an input: rebuilt on the caller's tensor
                base = statics[positions[owner]]
                outputs.append(("input", (owner, leaf.size(), leaf.stride(),
                                          leaf.storage_offset() - base.storage_offset())))
        self.graph, self.pool, self.statics = graph, pool, statics
        self.outputs = outputs
        self.unflatten = (lambda leaves: leaves[0]) if spec.is_leaf() else spec.unflatten
        # arguments read where they are: their addresses, checked on every call
        self.in_place = [p for p in positions if statics[p] is args[p] and p not in self.fixed]
        self.fixed = list(self.fixed)
        pointers: list[int | None] = [None] * len(args)
        for position in (*self.in_place, *self.fixed):
            pointers[position] = args[position].data_ptr()
        self.pointers_equal = torch_internals.data_pointers_checker(pointers)
        # (a dense buffer takes the argument as it is: the guards hold its strides to the
        # buffer's; an overlapping or gapped one takes the memory it spans, in one copy)
        self.copied = [(p, statics[p], False) if statics[p].is_contiguous()
                       else (p, _span_of(statics[p]), True)
                       for p in positions if statics[p] is not args[p]]
        self.written = [(p, statics[p]) for p in positions if p in written]
        for position in self.fixed:  # (holding them would keep their owner's pool busy)
            statics[position] = None
        del static_result, leaves
        self.kept = [value for kind, value in outputs if kind == "kept"]
        self.kept_counts = [torch_internals.storage_use_count(t) for t in self.kept]
        steps = getattr(self.compiled, "step_count", None)  # (a warm start keeps no plan)
        if steps is not None and not self.training:
            pooled = [value for kind, value in outputs if kind == "pool"]
            loses = replay_loses(steps,
                                 sum(_bytes(t) for _, t, _ in self.copied)
                                 + sum(_bytes(t) for _, t in self.written)
                                 + sum(_bytes(t) for t in pooled))
            if loses is not None:
                self.graph = self.statics = self.outputs = None
                self.give_up(loses)
                return
        self.recorded = True
        islands = getattr(self.compiled, "island_count", 0)
        logs.channel("perf").info("%s: recorded a CUDA graph (%d inputs copied in, %d read in "
                                  "place%s)", self.where, len(self.copied), len(self.in_place),
                                  f", {islands} eager islands inside" if islands else "")


class ShapeGraphs:
    """One CudaGraphed per shape met, for a graph compiled once for every shape: a shape's
    first call runs without a CUDA graph, its second makes the recording (CudaGraphed records
    after a call that runs normally), later ones replay it. At most EMBER_CUDA_GRAPH_SHAPES
    recordings are kept, the least recently used dropped (its memory pool freed once nothing
    it handed out is held). Each recording, drop and graphless first call is said on
    EMBER_LOGS=perf. `options` go to each CudaGraphed (a training graph's forward and
    backward: what they hand out uncopied, what they read in place)."""

    def __init__(self, compiled: Callable, example_inputs: list[Any], where: str,
                 **options: Any):
        self.compiled = compiled
        self.where = where
        self.options = options
        self.graphs: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        # shapes met once (bounded: a loop whose every call is a new shape keeps the last few)
        self.seen: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self.recorded = 0
        self.dropped = 0

    def make(self, args: tuple, where: str) -> Any:
        """The recording of one shape (what a test without CUDA stands in for)."""
        return CudaGraphed(self.compiled, list(args), where, one_shape=True, **self.options)

    def status(self) -> str:
        return f"one per shape: {len(self.graphs)} kept, {self.recorded} recorded, " \
               f"{self.dropped} dropped (EMBER_CUDA_GRAPH_SHAPES=" \
               f"{config.settings.cuda_graph_shapes})"

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor))
        graphed = self.graphs.get(key)
        if graphed is not None:
            self.graphs.move_to_end(key)
            return graphed(*args)
        if key not in self.seen:
            self.seen[key] = None
            while len(self.seen) > 4 * config.settings.cuda_graph_shapes:
                self.seen.popitem(last=False)
            logs.channel("perf").info("%s: shapes %s met first: run without a CUDA graph (one "
                                      "is recorded on their second call)", self.where,
                                      _shapes(key))
            return self.compiled(*args)
        del self.seen[key]
        where = f"{self.where} at shapes {_shapes(key)}"
        graphed = self.graphs[key] = self.make(args, where)
        self.recorded += 1
        while len(self.graphs) > config.settings.cuda_graph_shapes:
            dropped, _ = self.graphs.popitem(last=False)
            self.dropped += 1
            logs.channel("perf").info("%s: dropped the CUDA graph of shapes %s (least recently "
                                      "used; EMBER_CUDA_GRAPH_SHAPES=%d)", self.where,
                                      _shapes(dropped), config.settings.cuda_graph_shapes)
        return graphed(*args)


def _shapes(key: tuple) -> str:
    return ", ".join(str(list(shape)) for shape, _ in key)


_detach = torch.Tensor.detach


def _held(tensor: torch.Tensor, alone: int) -> bool:
    """Does anyone beside this graph hold `tensor`'s memory (an alias a replay handed out)?"""
    return torch_internals.storage_use_count(tensor) != alone


def _bytes(tensor: torch.Tensor) -> int:
    return _span(tensor) * tensor.element_size()


def _span(tensor: torch.Tensor) -> int:
    """Elements from the tensor's first to its last (its layout, gaps and overlaps included)."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(tensor.size(), tensor.stride()))


def _span_of(tensor: torch.Tensor) -> torch.Tensor:
    """The memory `tensor` spans, as a 1-D tensor (copying it copies any layout, expanded
    and strided ones included, in one contiguous copy)."""
    return tensor.as_strided((_span(tensor),), (1,), tensor.storage_offset())


def _copy_of(tensor: torch.Tensor) -> torch.Tensor:
    """A buffer laid out like `tensor` (same strides), holding its values."""
    base = torch.empty(_span(tensor), dtype=tensor.dtype, device=tensor.device)
    base.copy_(_span_of(tensor))
    return base.as_strided(tensor.size(), tensor.stride(), 0)
