"""The FX graph being captured: placeholders by source, one node per tensor operation.

Every operation also runs on fake tensors (real shapes, dtypes, strides and devices, no data)
so the interpreter knows each result's metadata while the graph is built. Where sizes are
symbols (capture/symbols.py), the fakes carry SymInts; a symbolic size an operation takes
becomes FX nodes that compute it from the inputs (`x.size(0) // 2`), never a constant.
"""

from __future__ import annotations

import contextlib
import operator
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember import torch_internals
from ember.capture import fake_rules, numbers, size_warnings
from ember.capture.errors import FailedOnFakes, Unsupported
from ember.capture.guards import GuardSet, tensor_signature
from ember.capture.known_values import KnownValues, NumberReads
from ember.capture.sources import Source
from ember.capture.symbols import (
    SYMBOLIC,
    CannotRebuild,
    DynamicPolicy,
    Shapes,
    specialized,
    tracked_size,
)
from ember.capture.values import Const, DictValue, SequenceValue, SliceValue, TensorValue, Value
from ember.trees import leaves

# the modules a graph's compile and run issue an op's warnings from: ember's own, FX's
# generated code (no __name__: "<string>") and its interpreter
_EMBER_CODE = r"(ember\.|torch\.fx\.|<string>$)"


def _quiet_in_ember(message: str, category: type[Warning]) -> None:
    """An op's warning is issued from the user's line after the graph (SideEffects.warn):
    the same warning from the graph's compile and run — ember's and FX's code — is filtered
    out by a filter (not a catch_warnings around every call: that resets every module's
    registry of the warnings already shown), added where the filters lack it (a
    catch_warnings around the compile takes it away on its way out)."""
    kept = ("ignore", re.compile(re.escape(message), re.I), category, re.compile(_EMBER_CODE),
            0)
    if kept not in warnings.filters:
        warnings.filterwarnings("ignore", re.escape(message), category, _EMBER_CODE)


class GraphBuilder:
    def __init__(self, guards: GuardSet, shapes: Shapes | None = None):
        self.graph = torch.fx.Graph()
        self.shapes = shapes if shapes is not None else Shapes(DynamicPolicy(), False)
        self.fake_mode = self.shapes.fake_mode
        self.guards = guards
        self.input_sources: list[Source] = []
        self.input_values: list[torch.Tensor] = []
        self._by_source: dict[str, TensorValue] = {}
        self._by_identity: dict[int, TensorValue] = {}
        self._names: dict[str, int] = {}
        self._numbers: dict[str, torch.fx.Node] = {}  # symbolic ints' placeholders
        self._last_placeholder: torch.fx.Node | None = None
        # each tensor input's fake and its version when met (see writes_inputs)
        self._input_versions: list[tuple[torch.Tensor, int, int]] = []
        # has an op been recorded where the captured code's try statement would catch what
        # it raises? (see written_inputs)
        self.caught_inside = False
        self.op_count = 0
        self.inference_depth = 0  # inside torch.inference_mode() blocks
        self.grad_enabled = torch.is_grad_enabled()  # the captured code's mode (Session's)
        self.made_in_inference: set[torch.fx.Node] = set()
        self.known = KnownValues()  # the values of tensors made from constants alone
        # the frame whose instruction is running (interpreter.Frame.run sets it): each op's
        # node records the user's position, for errors the compiled graph raises at run time
        self.frame: Any = None
        # the warnings ops issued while captured, by the user's line (see warn)
        self.warned: set[tuple] = set()

    # -- inputs ---------------------------------------------------------------------------
    def input_tensor(self, tensor: torch.Tensor, source: Source) -> TensorValue:
        expr = source.expr()
        if expr in self._by_source:
            return self._by_source[expr]
        same = self._by_identity.get(id(tensor))
        if same is not None:
            # one tensor reached two ways (tied weights, f(x, x)): one input, and a guard that
            # both ways still reach one object
            self.guards.add("same", source, same.source)
            self._by_source[expr] = same
            return same
        if tensor.layout != torch.strided:
            raise Unsupported(f"{expr} is a {tensor.layout} tensor (ember compiles strided "
                              f"tensors only)", "sparse tensors run as eager runs them")
        fake = self.shapes.fake_tensor(tensor, source)
        if fake is None:
            self.guards.add("tensor", source, tensor_signature(tensor))
            fake = self.shapes.static_fake(tensor, source)
        else:  # (symbolic sizes and strides: checked by the relations, symbols.Shapes)
            signature = tensor_signature(tensor)
            symbolic = any(isinstance(s, torch.SymInt) for s in fake.stride())
            shape = tuple(None if isinstance(d, torch.SymInt) else d for d in fake.shape)
            strides = (None,) * fake.dim() if symbolic else signature[4]
            self.guards.add("tensor", source, (*signature[:3], shape, strides, signature[5]))
        node = self._placeholder(self._name(expr))
        node.meta["example_value"] = fake
        self._input_versions.append((fake, fake._version, len(self.input_sources)))
        value = TensorValue(node, fake, source, type(tensor))
        self.input_sources.append(source)
        self.input_values.append(tensor)
        self._by_source[expr] = value
        self._by_identity[id(tensor)] = value
        return value

    def _placeholder(self, name: str) -> torch.fx.Node:
        # placeholders stay first in the graph, in the order inputs were met
        anchor = self._last_placeholder
        context = self.graph.inserting_after(anchor) if anchor is not None else \
            self.graph.inserting_before(next(iter(self.graph.nodes), None))
        with context:
            node = self.graph.placeholder(name)
        self._last_placeholder = node
        return node

    def writes_inputs(self) -> bool:
        """Has an op of the graph written a tensor input in place, or a view of one? (A
        fake's version counter, which its views share, moves with each write. One undone by
        a roll back still counts: an answer on the safe side.)"""
        return bool(self.written_inputs())

    def written_inputs(self) -> list[int]:
        """The positions, among the graph's inputs, of the tensor inputs it writes in place
        (writes_inputs)."""
        return [position for fake, version, position in self._input_versions
                if fake._version != version]

    def input_node(self, source: Source) -> torch.fx.Node:
        """The placeholder of the tensor input read through `source`."""
        return self._by_source[source.expr()].node

    def input_number(self, source: Source, value: int, symbol: torch.SymInt) -> torch.fx.Node:
        """The placeholder of a symbolic int from the call (made the first time the graph
        needs it: an int only Python computes with needs none)."""
        expr = source.expr()
        if expr not in self._numbers:
            node = self._placeholder(self._name(expr))
            node.meta["example_value"] = symbol
            self.input_sources.append(source)
            self.input_values.append(value)
            self._numbers[expr] = node
        return self._numbers[expr]

    def size_node(self, value: Any) -> Any:
        """The FX node computing a symbolic size an operation takes; where the graph cannot
        compute it (a float of sizes, a function of them it has no operator for), the
        size's value now, guarded: correct, only specialized."""
        if not isinstance(value, torch.SymInt):
            return specialized(value, "an operation takes a symbolic float or bool")
        try:
            return self.shapes.fx_node(self, value)
        except CannotRebuild as error:
            return specialized(value, f"the graph cannot compute {error}")

    def _name(self, expr: str) -> str:
        base = "".join(c if c.isalnum() else "_" for c in expr).strip("_")[:48] or "input"
        count = self._names.get(base, 0)
        self._names[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    # -- operations -----------------------------------------------------------------------
    def call(self, kind: str, target: Any, args: tuple, kwargs: dict[str, Any],
             refuse: Callable[[Any, list], str | None] | None = None,
             run: Callable[..., Any] | None = None) -> Value:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            result = self._call(kind, target, args, kwargs, refuse, run)
            name = _name_of(target)
            if name in size_warnings.NAMES:  # (warnings the fakes do not raise)
                said += size_warnings.size_warnings(name, to_fake(args), to_fake(kwargs),
                                                    to_fake(result))
        for warning in said:
            self.warn(warning)
        return result

    def warn(self, warning: warnings.WarningMessage) -> None:
        """A warning an op issued as it ran on fakes (or on constants: known_values.py), or
        one its capture rule knows eager issues (covariance_rules.py): issued after the
        graph from the user's line, as eager issues it there, once however often the
        capture ran the op (SideEffects.warn); the graph's own compile and run of the op are
        kept from issuing it again from ember's lines (_quiet_in_ember)."""
        frame = self.frame
        if frame is None:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
            return
        location = frame.location()
        key = (location.filename, location.line, str(warning.message), warning.category)
        if key not in self.warned:
            self.warned.add(key)
            frame.session.side_effects.warn(frame, warning.message, warning.category)
            _quiet_in_ember(str(warning.message), warning.category)

    def _call(self, kind: str, target: Any, args: tuple, kwargs: dict[str, Any],
              refuse: Callable[[Any, list], str | None] | None,
              run: Callable[..., Any] | None) -> Value:
        """Add call_function/call_method `target` on tracked arguments; return the result.
        `refuse(example, fake_args)`: why the call, as run on fakes, cannot be a node (no
        node is made then: Unsupported). `run`: what runs on the fakes in the target's stead
        (it watches the run, and may settle what the target returns: a custom Function's
        apply, capture/autograd_functions.py)."""
        try:
            fx_args, fx_kwargs = to_fx(args, self.size_node), to_fx(kwargs, self.size_node)
        except Unsupported as error:  # say which call took the argument
            raise Unsupported(f"{_name_of(target)}(): {error.reason}", error.hint) from None
        fake_args, fake_kwargs = to_fake(args), to_fake(kwargs)
        versions = self.known.versions(args, kwargs)
        # A 0-d tensor made from constants alone, where the op reads it as a number
        # (`torch.arange(start, end)`, `torch.zeros(rows, n)` of such tensors), is that
        # number in the graph, as eager reads it: the fakes either fail for want of its value
        # or, where they know it, read it.
        reads = NumberReads() if self.known.has_numbers(args, kwargs) else \
            contextlib.nullcontext()
        try:
            with self.fake_mode, torch.set_grad_enabled(self.grad_enabled), reads:
                function = run if run is not None else \
                    getattr(fake_args[0], target) if kind == "call_method" else target
                positional = fake_args[1:] if kind == "call_method" else fake_args
                example = fake_rules.result(target, positional, fake_kwargs) \
                    if kind == "call_function" and run is None else None
                if example is None:
                    example = torch_internals.calling_composites(
                        lambda: function(*positional, **fake_kwargs))
        except torch_internals.data_dependent_errors() as error:
            folded = self.known.folded(args, kwargs)
            if folded is not None:
                return self._call(kind, target, *folded, refuse, run)
            known = self.known.operands(kind, target, args, kwargs) is not None
            raise Unsupported(f"{_name_of(target)} needs tensor values to know its result "
                              f"({type(error).__name__})"
                              + ("" if known else ", and they depend on the inputs"),
                              "this is a data-dependent operation; keep it outside the "
                              "compiled function or rewrite it without reading tensor values"
                              ) from None
        except Unsupported:
            raise
        except Exception as error:
            # (where a handler of the captured code may catch it, the break runs the op
            # natively, and eager's error reaches the handler)
            caught = self.frame is not None and self.frame.inside_a_handler_s_reach()
            failure = FailedOnFakes if _refused_by_the_op(error) and not caught else Unsupported
            raise failure(f"{_name_of(target)} failed while capturing: "
                          f"{type(error).__name__}: {error}",
                          "eager raises the same error; fix the call") from None
        if isinstance(reads, NumberReads) and reads.seen:
            folded = self.known.folded(args, kwargs)
            if folded is not None:
                return self._call(kind, target, *folded, refuse, run)
        if run is None and numbers.holds_numpy_scalars((fx_args, fx_kwargs)):
            fx_args, fx_kwargs = numbers.plain_numbers(fx_args), numbers.plain_numbers(fx_kwargs)
            self._check_plain_numbers(kind, target, fake_args, fake_kwargs, example)
        if refuse is not None:
            reason = refuse(example, leaves((fake_args, fake_kwargs)))
            if reason is not None:
                raise Unsupported(reason)
        node = self.graph.create_node(kind, target, fx_args, fx_kwargs,
                                      self._name(_name_of(target)))
        if self.frame is not None:
            node.meta["stack_trace"] = self.frame.stack_trace()
            if not self.caught_inside:
                self.caught_inside = self.frame.inside_a_handler_s_reach()
        self.op_count += 1
        if self.inference_depth:
            self.made_in_inference.add(node)
        result = self.wrap_result(node, example)
        # an op that returns its operand (in place: `y.add_(1)`, `F.relu(y, inplace=True)`)
        # gives the operand's own value, as eager gives the tensor itself (`is` holds); its
        # later readers come after the node that wrote it, and the graph runs in order
        result = _operand_returned(args, kwargs, example) or result
        self.known.follow(kind, target, self.known.operands(kind, target, args, kwargs),
                          result, example, versions)
        return result

    def _check_plain_numbers(self, kind: str, target: Any, fake_args: tuple, fake_kwargs: dict,
                             example: Any) -> None:
        """The graph's node takes numpy scalars as Python numbers (numbers.plain_numbers):
        refuse the call where torch reads the two differently — an np.bool_ it takes as a
        float, torch.tensor(np.float64(x)) a float64 — as a run on copies of the fakes
        shows."""
        def plain(value: Any) -> Any:
            return value.clone() if isinstance(value, torch.Tensor) else value

        try:
            with self.fake_mode, torch.set_grad_enabled(self.grad_enabled):
                args, kwargs = torch_internals.tree_map(
                    plain, numbers.plain_numbers((fake_args, fake_kwargs)))
                function = getattr(args[0], target) if kind == "call_method" else target
                positional = args[1:] if kind == "call_method" else args
                answer = torch_internals.calling_composites(
                    lambda: function(*positional, **kwargs))
        except Exception:  # noqa: BLE001 (any failure: not alike)
            answer = _UNLIKE
        if not _alike(answer, example):
            raise Unsupported(f"{_name_of(target)}() takes a numpy scalar otherwise than the "
                              "Python number it holds",
                              "pass a Python number (`.item()`) or a tensor")

    def wrap_result(self, node: torch.fx.Node, example: Any) -> Value:
        node.meta["example_value"] = example
        if isinstance(example, torch.Tensor):
            return TensorValue(node, example)
        if isinstance(example, (tuple, list)) and all(isinstance(e, torch.Tensor) or e is None
                                                      for e in example):
            # (None where a result is not asked for: attention weights with need_weights=False)
            items = []
            for index, item in enumerate(example):
                if item is None:
                    items.append(Const(None))
                    continue
                getter = self.graph.call_function(operator.getitem, (node, index))
                getter.meta["example_value"] = item
                items.append(TensorValue(getter, item))
            return SequenceValue(items, type(example))  # list, tuple or a named tuple type
        if isinstance(example, (bool, int, float, torch.dtype, torch.device, *SYMBOLIC)) or \
                example is None:
            # (computed from fake tensors: from what the guards check — shapes, dtypes,
            # devices; or read from torch's global state: call_torch guards the answer)
            return Const(example)
        if isinstance(example, torch.Size):
            return SequenceValue([Const(tracked_size(d)) for d in example], torch.Size)
        raise Unsupported(f"{_name_of(node.target)} returned a {type(example).__name__}, which "
                          "ember cannot keep in a graph")

    def last_node(self) -> torch.fx.Node | None:
        nodes = self.graph.nodes
        return next(iter(reversed(nodes)), None) if len(nodes) else None

    def rollback(self, last: torch.fx.Node | None, op_count: int) -> None:
        """Erase the operations added after `last` (placeholders stay: an unused input is
        harmless, and its guard only makes the entry more specific)."""
        for node in reversed(list(self.graph.nodes)):
            if node is last:
                break
            if node.op != "placeholder":
                self.graph.erase_node(node)
        self.op_count = op_count
        self.shapes.forget_nodes(set(self.graph.nodes))

    def output(self, values: list[TensorValue]) -> None:
        self.graph.output(tuple(v.node for v in values))

    def module(self) -> torch.fx.GraphModule:
        self.graph.lint()
        return torch.fx.GraphModule(torch.nn.Module(), self.graph)


_UNLIKE = object()


def _operand_returned(args: tuple, kwargs: dict[str, Any], example: Any) -> Value | None:
    """The tensor operand whose fake the op returned as its result, if any."""
    if not isinstance(example, torch.Tensor):
        return None
    for value in (*args, *kwargs.values()):
        if isinstance(value, TensorValue) and value.fake is example:
            return value
    return None


def _alike(a: Any, b: Any) -> bool:
    """Two results of one op with the same structure, tensors of the same dtype and rank."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
            a.dtype == b.dtype and a.dim() == b.dim()
    if isinstance(a, (tuple, list)) and type(a) is type(b):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b))
    return type(a) is type(b)


def _refused_by_the_op(error: Exception) -> bool:
    """Did the op's own checks refuse its arguments (a shape that does not broadcast, an index
    out of range), rather than the fake tensors lack a way to run it (no meta kernel, an
    operator fake tensors do not support)? (A TypeError or ValueError may be how an
    argument came to the fakes: those still break the graph there.)"""
    return isinstance(error, (RuntimeError, IndexError)) and \
        not isinstance(error, NotImplementedError) and \
        not type(error).__module__.startswith("torch._subclasses")


def _name_of(target: Any) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


def _convert(value: Any, tensor: Any, size: Any, number: Any = None) -> Any:
    """Tracked values -> Python arguments, tensors given by `tensor(value)`, symbolic sizes
    by `number(value)`."""
    if isinstance(value, TensorValue):
        return tensor(value)
    if isinstance(value, Const):
        if number is not None and isinstance(value.value, SYMBOLIC):
            return number(value.value)
        return value.value
    if isinstance(value, SequenceValue):
        items = [_convert(v, tensor, size, number) for v in value.items]
        if value.kind is torch.Size:
            return size(items)
        return list(items) if value.kind is list else tuple(items)
    if isinstance(value, SliceValue):
        return slice(*(_convert(v, tensor, size, number)
                       for v in (value.start, value.stop, value.step)))
    if isinstance(value, DictValue):
        return {k: _convert(v, tensor, size, number) for k, v in value.items.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_convert(v, tensor, size, number) for v in value)
    if isinstance(value, dict):
        return {k: _convert(v, tensor, size, number) for k, v in value.items()}
    raise Unsupported(f"a {value.describe() if isinstance(value, Value) else type(value)} "
                      "cannot be passed to a tensor operation")


def to_fx(value: Any, number: Any = specialized) -> Any:
    """Tracked values -> FX node arguments (a torch.Size stays a tuple of ints there; a
    symbolic size is `number(size)`: the node computing it)."""
    return _convert(value, lambda t: t.node, tuple, number)


def to_fake(value: Any) -> Any:
    """Tracked values -> the arguments the op runs on while capturing."""
    return _convert(value, lambda t: t.fake, torch.Size)
