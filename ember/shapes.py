"""Graphs whose sizes are symbols: one compile for the family of shapes where ember's C or
Triton backend serves it (issue 18, stages 2 to 5: kernels with symbolic extents, training
graphs whose backward takes the forward's symbols), else a compile per concrete shape
(`ShapeSpecialized`), never a wrong answer.

`for_every_shape` is what ember's backend does with a symbolic graph (from ember's capture or
Dynamo's). It must not change the static path: static graphs never come here.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember import config, logs
from ember.lower.devices import graph_device
from ember.lower.symbolic import describe_placeholders


def for_every_shape(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                    per_shape: Callable | None = None) -> Callable:
    """The graph compiled once for every shape its symbols allow, or per shape (by
    `per_shape`, ember's compile_graph by default) where that cannot be done."""
    from ember import backends

    compiled, reason = compile_symbolic(gm, example_inputs, label)
    if compiled is not None:
        return compiled
    logs.channel("recompiles").info("%s: compiled per shape: %s", label, reason)
    return ShapeSpecialized(gm, per_shape or backends.compile_graph, label, reason)


def automatic(backend: Callable, tensors: list[torch.Tensor]) -> bool:
    """Under dynamic=None, does a recompile for `backend` make the changed sizes symbols?
    For ember's own while its tensors go to a backend whose kernels take sizes as arguments
    (C, Triton; not the IR interpreter). (A backend that serves any shape is asked by the
    caller.)"""
    from ember import backends

    devices = {t.device.type for t in tensors}
    if not is_embers_backend(backend) or not devices <= {"cpu", "cuda"} or len(devices) > 1:
        return False
    return backends.kernel_backend(devices.pop() if devices else "cpu") in ("c", "triton")


def for_a_capture(gm: torch.fx.GraphModule, example_inputs: list[Any], backend: Callable,
                  where: str) -> Callable:
    """A symbolic capture of ember.compile, for a backend that does not serve any shape:
    ember's own compiles once for every shape where it can; any other, per shape."""
    if not is_embers_backend(backend):
        return ShapeSpecialized(gm, backend, where)
    return for_every_shape(gm, example_inputs, where)


def is_embers_backend(backend: Callable) -> bool:
    """ember's own backend, or a wrapper of it that says so with __wrapped__ (the bench's,
    which counts what it compiles): the one test of every "ember's own" choice here."""
    from ember import backends

    return inspect.unwrap(backend) is backends.backend


def symbolic_reason(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> str | None:
    """Why stage 2 cannot compile this graph once for all its shapes, or None."""
    from ember import backends, torch_internals

    reason = backends.eager_reason(example_inputs)
    if reason is not None:
        return reason
    device = graph_device(example_inputs)
    chosen = backends.kernel_backend(device.type if device is not None else "cpu")
    if chosen not in ("c", "triton"):
        return f"symbolic sizes reach the C and Triton backends only (this graph: {chosen})"
    if torch_internals.autocast_state() is not None or backends._autocast_regions(gm):
        return "autocast with symbolic sizes"
    return None


def compile_symbolic(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str
                     ) -> tuple[Callable | None, str]:
    """(the graph compiled for every shape, "") or (None, why not)."""
    from ember import backends
    from ember.runtime import warm_cache

    reason = symbolic_reason(gm, example_inputs)
    if reason is not None:
        return None, reason
    stages = backends.graph_label(gm)
    positions = value_scalars(gm, example_inputs)
    if positions:  # (the original graph stays as it is: the per-shape path compiles it)
        gm, example_inputs = scalars_as_tensors(gm, example_inputs, positions)
    # (where only such ints were symbols, the graph is lowered at its one shape)
    symbolic = not positions or _symbolic_tensors(gm, example_inputs)
    recompile = functools.partial(_compile_again, symbolic=symbolic)
    described = _described(gm, example_inputs, stages)
    try:
        with torch.set_grad_enabled(torch.is_grad_enabled()):
            # (no description: neither looked for nor kept, rather than kept as a static
            # graph's would be)
            warm = warm_cache.Entry(gm, example_inputs, stages, recompile,
                                    symbolic=described) if described is not None else None
            compiled = warm.compiled if warm is not None else None
            if compiled is None:
                compiled, said = _compile_symbolic(gm, example_inputs, stages, symbolic,
                                                   bool(positions))
                if compiled is None:
                    return None, said
                if warm is not None:
                    warm.keep(compiled)
            else:
                said = "its symbols (from the warm cache)"
            if positions:
                compiled = ScalarsAsTensors(compiled, positions, _device(example_inputs))
            if warm is not None and warm.key is not None:
                compiled.kept_for_every_shape = KeptForEveryShape(
                    warm.key, tuple(positions), symbolic, described)
    except Exception as error:  # noqa: BLE001 (whatever stage 2 cannot do compiles per shape)
        if "raise" in config.settings.logs and not _expected(error):
            raise
        first_line = (str(error).splitlines() or [""])[0]  # (not the FX node's traceback)
        return None, f"{type(error).__name__}: {first_line}"
    logs.channel("recompiles").info("%s: compiled once (%s) for every shape of %s", label,
                                    stages, ", ".join(
                                        [said] + [f"the int input {i} (as a 0-d tensor)"
                                                  for i in positions]))
    return compiled, ""


@dataclasses.dataclass(frozen=True)
class KeptForEveryShape:
    """Where a graph compiled for every shape is kept in the warm cache and how it was
    compiled (its int inputs taken as 0-d tensors, lowered on symbolic fakes or at its one
    shape, its placeholders' symbolic examples): what a function's entry kept before
    capture finds it again by (ember/warm_entries.py; `from_the_warm_cache`)."""

    key: str
    scalars: tuple[int, ...]
    symbolic: bool
    placeholders: dict


def _described(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str
               ) -> dict | None:
    """The placeholders' symbolic examples as plain data (lower/symbolic.py), None where they
    cannot be described: the graph is then neither looked for in the warm cache nor kept
    (said on EMBER_LOGS=perf), and serves this process all the same."""
    try:
        return describe_placeholders(gm, example_inputs)
    except Exception as error:  # noqa: BLE001 (an odd example: no warm start)
        logs.channel("perf").info("%s: no warm start for its symbolic examples (%s: %s)",
                                  label, type(error).__name__, error)
        return None


def from_the_warm_cache(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                        kept: KeptForEveryShape) -> Callable | None:
    """The graph compiled for every shape, rebuilt from the warm cache under `kept.key`
    (`gm`: the graph as a function's entry keeps it, without symbolic examples; they are
    made again only if the rare call its compiled form gives away needs a cold compile),
    or None (not there)."""
    from ember.lower.symbolic import restore_placeholders
    from ember.runtime import warm_cache

    if kept.scalars:
        gm, example_inputs = scalars_as_tensors(gm, example_inputs, list(kept.scalars))

    def recompile(module: torch.fx.GraphModule, stand_ins: list[Any], name: str) -> Callable:
        restored = restore_placeholders(module, kept.placeholders)
        return _compile_again(restored, stand_ins, name, kept.symbolic)

    compiled = warm_cache.Entry(gm, example_inputs, label, recompile, key=kept.key).compiled
    if compiled is not None and kept.scalars:
        compiled = ScalarsAsTensors(compiled, list(kept.scalars), _device(example_inputs))
    return compiled


def _compile_symbolic(gm: torch.fx.GraphModule, example_inputs: list[Any], stages: str,
                      symbolic: bool, scalars: bool) -> tuple[Callable | None, str]:
    """(the graph lowered on symbolic fakes and compiled, its symbols in words), or (None,
    why not); `scalars`: some int inputs are taken as 0-d tensors."""
    from ember import backends
    from ember.lower import trace

    started = time.perf_counter()
    lowered = trace(gm, example_inputs, symbolic=symbolic)
    if logs.enabled("perf"):
        logs.channel("perf").info("%s lowered on symbolic fakes in %.1f ms", stages,
                                  (time.perf_counter() - started) * 1e3)
    if not lowered.graph.symbols and not scalars:
        return None, "no symbol is a tensor input's size"
    compiled = backends.compile_stages(gm, example_inputs, stages, lowered)
    return compiled, ", ".join(f"{name} = input {i} size {d}"
                               for name, (i, d) in lowered.graph.symbols.items())


def _compile_again(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str,
                   symbolic: bool) -> Callable:
    """A symbolic graph rebuilt from the warm cache, compiled cold for the rare call its
    compiled form gives away: for every shape again (a static compile would serve only
    the stand-ins' shape)."""
    from ember import backends
    from ember.lower import trace

    return backends.compile_stages(gm, example_inputs, label,
                                   trace(gm, example_inputs, symbolic=symbolic))


def value_scalars(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[int]:
    """The positions of symbolic int inputs that no tensor input's geometry and no output
    holds: a count a cache keeps as a Python int and the graph only computes with (a
    sliding-window cache layer's length, added to an arange for the mask). The kernels
    cannot read such a symbol from a tensor's shape, but the graph can take its value as a
    0-d tensor."""
    from ember import torch_internals
    from ember.lower.symbolic import placeholder_examples

    examples = placeholder_examples(gm, example_inputs)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = [n.meta.get("example_value", n.meta.get("val"))
               for n in output.all_input_nodes]
    held: set = set()
    tensors = [value for value in examples if isinstance(value, torch.Tensor)]
    for value in [*tensors, *torch_internals.tree_flatten(results)[0]]:
        dims = ((*value.shape, *value.stride(), value.storage_offset())
                if isinstance(value, torch.Tensor) else (value,))
        for dim in dims:
            held |= getattr(torch_internals.symbolic_expression(dim), "free_symbols", set())
    positions = []
    for index, value in enumerate(examples):
        if isinstance(value, torch.SymInt):
            expression = torch_internals.symbolic_expression(value)
            if torch_internals.is_symbol(expression) and expression not in held:
                positions.append(index)
    return positions


def scalars_as_tensors(gm: torch.fx.GraphModule, example_inputs: list[Any],
                       positions: list[int]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """A copy of the graph whose inputs at `positions` are 0-d int64 tensors (their
    placeholders' symbolic ints dropped: the lowering takes the examples), and the
    examples so."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    device = _device(example_inputs)
    examples = list(example_inputs)
    for index in positions:
        for key in ("example_value", "val"):
            placeholders[index].meta.pop(key, None)
        examples[index] = torch.tensor(int(examples[index]), device=device)
    return torch.fx.GraphModule(gm, graph), examples


def _symbolic_tensors(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    from ember import torch_internals
    from ember.lower.symbolic import placeholder_examples

    return any(isinstance(value, torch.Tensor) and torch_internals.is_symbolic(value)
               for value in placeholder_examples(gm, example_inputs))


def _device(example_inputs: list[Any]) -> torch.device:
    return graph_device(example_inputs) or torch.device("cpu")


class ScalarsAsTensors:
    """A graph compiled with some int inputs taken as 0-d tensors (`value_scalars`): each
    call passes those ints so. Everything else is the compiled graph's."""

    def __init__(self, compiled: Callable, positions: list[int], device: torch.device):
        self.compiled = compiled
        self.positions = positions
        self.device = device

    def __call__(self, *args: Any) -> Any:
        args = list(args)
        for index in self.positions:
            # (torch.full: the value rides in a fill kernel's arguments; torch.tensor on
            # CUDA would copy it from pageable memory, which waits for the device's queue)
            args[index] = torch.full((), args[index], dtype=torch.int64, device=self.device)
        return self.compiled(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


def _expected(error: Exception) -> bool:
    """Refusals (not bugs): a question the symbols' ranges cannot answer, a construct the
    lowering or stage 2 does not cover."""
    from ember.ir.sizes import Undecided
    from ember.lower import Unsupported

    return isinstance(error, (Undecided, Unsupported))


class ShapeSpecialized:
    """A graph whose sizes are symbols (Dynamo's, or an ember capture's), compiled once per
    concrete input signature by `compile`: one capture serves the family of shapes, but the
    kernels are built per shape, for what `compile_symbolic` does not cover (`reason`:
    autocast, Triton's symbolic strides, sizes that need divisibility facts). The
    EMBER_SHAPE_COMPILES most recently used shapes are kept; each compile and each drop is
    said on EMBER_LOGS=recompiles.

    Past EMBER_RECOMPILE_LIMIT shape compiles a shape not kept runs the graph eagerly (its
    FX module, op by op, as eager runs them): a decoding loop whose cache grows a token a
    step would otherwise build kernels at every step, costing far more than eager."""

    def __init__(self, gm: torch.fx.GraphModule, compile: Callable, label: str,
                 reason: str = ""):
        self.gm = gm
        self.reason = reason  # (why the graph is not compiled once for every shape)
        self.compile = compile
        self.label = label
        self.cache: collections.OrderedDict[Any, Callable] = collections.OrderedDict()
        self.compiles = 0
        self.eager_calls = 0
        self.compiling = threading.RLock()

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad)
                    if isinstance(a, torch.Tensor) else (type(a), a) for a in args)
        compiled = self.cache.get(key)
        if compiled is None:
            with self.compiling:  # (threads that bring one new shape together compile it once)
                compiled = self.cache.get(key)
                if compiled is None and self.compiles < config.settings.recompile_limit:
                    compiled = self._compile(key, args)
            if compiled is None:
                return self._run_eagerly(args)
        with contextlib.suppress(KeyError):  # (dropped by another thread meanwhile)
            self.cache.move_to_end(key)
        return compiled(*args)

    def _run_eagerly(self, args: tuple) -> Any:
        if not self.eager_calls:
            logs.channel("recompiles").warning(
                "%s: %d shapes compiled (EMBER_RECOMPILE_LIMIT); new shapes run eagerly (%s)",
                self.label, self.compiles, self.reason or "compiled per shape")
        self.eager_calls += 1
        return self.gm(*args)

    def _compile(self, key: tuple, args: tuple) -> Callable:
        self.compiles += 1
        channel = logs.channel("recompiles")
        channel.info("%s: symbolic sizes, compiled for the concrete shapes %s (kernels per "
                     "shape: %s; shape compile %d)", self.label, _shapes(key),
                     self.reason or "not compiled symbolically", self.compiles)
        compiled = self.cache[key] = self.compile(self.gm, list(args))
        while len(self.cache) > max(1, config.settings.shape_compiles):
            dropped, _ = self.cache.popitem(last=False)
            channel.info("%s: dropped the compiled version for shapes %s (least recently "
                         "used; EMBER_SHAPE_COMPILES)", self.label, _shapes(dropped))
        return compiled


def _shapes(key: tuple) -> list:
    """A ShapeSpecialized key in words: each tensor's shape, each other argument's value."""
    return [list(part[0]) if isinstance(part[0], tuple) else part[1] for part in key]
