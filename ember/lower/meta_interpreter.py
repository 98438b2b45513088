"""The FX interpreter that runs a graph on meta tensors under the tracer (ember/lower/tracer.py).

It runs the graph as Python calls it, so that the tracer's dispatch mode sees each aten op, and
it steps in where running the graph's torch-level calls on meta tensors would not give what
eager gives on the graph's device:

- dropout on CUDA and scaled_dot_product_attention on CUDA and the CPU: eager calls fused
  kernels there (other random draws, other rounding and layouts than the composites a meta
  tensor decomposes into); they are called as eager calls them (attention's composite is
  traced where eager itself would run it);
- in a training graph, results eager's autograd would not track (detached values, values
  made under torch.no_grad()) stop the gradient;
- a function the user marked torch.compiler.allow_in_graph is one library call of it, not
  traced into;
- a new autograd leaf (x.requires_grad_(), a factory's requires_grad=True) that stays inside
  the graph is the value it was, its gradient stopped there; one the caller sees runs as an
  eager island;
- x.new_tensor(numbers), which a meta tensor makes out of the tracer's sight, is the real
  constant torch.tensor makes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from ember import torch_internals
from ember.lower import attention, matmul_folds
from ember.lower.registry import Unsupported
from ember.meta_keys import REQUIRES_GRAD
from ember.runtime import switches
from ember.trees import leaves, map_leaves

if TYPE_CHECKING:
    from ember.lower.tracer import Tracer

# Calls whose result is detached: Tensor.detach in its spellings, and Dynamo's `tensor.data`.
_DETACHES = {"detach", torch.detach, torch.Tensor.detach, torch.ops.aten.detach.default,
             *torch_internals.data_attribute_getters()}


def turns_grad_on(module: torch.fx.GraphModule) -> bool:
    """Does the graph enable grad mode somewhere (a torch.enable_grad() region, or a
    no_grad region it leaves)? A graph entered under no_grad is then a training graph too."""
    return any(n.op == "call_function" and n.target is torch_internals.set_grad_enabled and
               n.args and n.args[0] is True for n in module.graph.nodes)


@dataclasses.dataclass
class EagerAutograd:
    """What eager's autograd makes of a graph's results: whether each (flat) result requires
    grad, and which tensor inputs (numbered among the tensors) it reaches from them."""

    requires_grad: list[bool]
    reached: set[int]


def eager_autograd(module: torch.fx.GraphModule, example_inputs: list[Any]
                   ) -> EagerAutograd | None:
    """The graph run on fake tensors under autograd, as eager runs it. Its answers differ from
    the IR's data flow where lowering dropped a dependence eager keeps (a piece of a cat with
    no elements: eager gives such an input a gradient of zeros, not None; fill's result still
    requires grad) or where eager's derivative formulas mark a result non-differentiable
    (layer norm's mean and rstd, lu's pivots). None when the graph cannot run on fakes."""
    run = _recorded_run(module, example_inputs) or \
        _run_on_fakes(module, example_inputs, torch.fx.Interpreter)
    if run is None:
        return None
    flat, leaf_numbers = run
    reached = {leaf_numbers[leaf] for value in flat for leaf in _leaves_reached(value)
               if leaf in leaf_numbers}
    return EagerAutograd([isinstance(v, torch.Tensor) and v.requires_grad for v in flat],
                         reached)


def contained_leaves(module: torch.fx.GraphModule, example_inputs: list[Any]) -> set[str]:
    """The graph's nodes that make a new autograd leaf (`x.requires_grad_()` of a tensor the
    graph made, a factory's requires_grad=True) whose leaf stays inside the graph, as
    eager's autograd sees it: no result is the leaf or a view of it, and every result that
    requires grad through it also requires grad through an input. Eager's gradient of such a
    leaf reaches only the leaf's .grad, which nobody can read, so the compiled graph may
    stop the gradient there (a feature extractor that sets requires_grad on its first
    hidden state, for gradient checkpointing). Empty when the graph cannot run on fakes."""
    if not any(_makes_leaf(n.target, n.args, n.kwargs) for n in module.graph.nodes
               if n.op in ("call_function", "call_method")):
        return set()

    made: dict[int, str] = {}  # id of a leaf the graph made -> the node that made it
    outside: set[int] = set()  # ids of the inputs and attributes (the caller's tensors)
    kept: list[torch.Tensor] = []  # (the leaves, alive while their ids are compared)

    class Recording(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.op in ("placeholder", "get_attr"):
                outside.add(id(result))
            elif n.op in ("call_function", "call_method") and \
                    _makes_leaf(n.target, n.args, n.kwargs) and \
                    isinstance(result, torch.Tensor) and id(result) not in outside:
                made[id(result)] = n.name
                kept.append(result)
            return result

    run = _run_on_fakes(module, example_inputs, Recording)
    if run is None:
        return set()
    flat, leaf_numbers = run
    exposed = set()
    for value in flat:
        reached = _leaves_reached(value)
        mine = {made[leaf] for leaf in reached if leaf in made}
        if mine and not any(leaf in leaf_numbers for leaf in reached):
            exposed |= mine
    return set(made.values()) - exposed


def _recorded_run(module: torch.fx.GraphModule, example_inputs: list[Any]
                  ) -> tuple[list[Any], dict[int, int]] | None:
    """_run_on_fakes's answer from the fake values the capture ran the graph on (each node's
    example value, made under autograd as eager's are), without running it again (a BERT
    training graph's run took 130 ms of its first call). None where a value is missing or
    the inputs' fakes are not the leaves the inputs are (a graph a pass rewrote, a region),
    and where the capture's Python may have changed a fake's autograd state after its node:
    a result that is a leaf requiring grad but no input (`y.requires_grad_()` after the graph,
    replayed as a side effect), a graph that makes leaves."""
    if any(_makes_leaf(n.target, n.args, n.kwargs) for n in module.graph.nodes
           if n.op in ("call_function", "call_method")):
        return None
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return None
    leaf_numbers: dict[int, int] = {}
    number = 0
    for node, x in zip(placeholders, example_inputs):
        if not isinstance(x, torch.Tensor):
            continue
        fake = node.meta.get("example_value")
        if not isinstance(fake, torch.Tensor) or fake.requires_grad != x.requires_grad or \
                (x.requires_grad and fake.grad_fn is not None):
            return None
        if x.requires_grad:
            leaf_numbers[id(fake)] = number
        number += 1
    (output,) = (n for n in module.graph.nodes if n.op == "output")
    flat = []
    for value in leaves(output.args[0]):
        if isinstance(value, torch.fx.Node):
            if "example_value" not in value.meta:
                return None
            value = value.meta["example_value"]
        flat.extend(leaves(value))
    if any(isinstance(v, torch.Tensor) and v.requires_grad and v.grad_fn is None and
           id(v) not in leaf_numbers for v in flat):
        return None
    return flat, leaf_numbers


def _run_on_fakes(module: torch.fx.GraphModule, example_inputs: list[Any],
                  interpreter: type[torch.fx.Interpreter]
                  ) -> tuple[list[Any], dict[int, int]] | None:
    """The graph's flat results on fakes of the inputs, those that require grad as eager's
    do, and the ids of those fake inputs (numbered among the tensors). None when an op
    cannot run on fakes."""
    mode = torch_internals.make_fake_mode()
    leaf_numbers: dict[int, int] = {}  # id of a fake input that requires grad -> its number
    try:
        args = [torch_internals.fake_of(mode, x.detach()) if isinstance(x, torch.Tensor)
                else x for x in example_inputs]
        tensors = [(fake, x) for fake, x in zip(args, example_inputs)
                   if isinstance(x, torch.Tensor)]
        for number, (fake, x) in enumerate(tensors):
            if x.requires_grad:
                leaf_numbers[id(fake.requires_grad_())] = number
        with mode, torch.set_grad_enabled(torch.is_grad_enabled()), switches.contained():
            result = interpreter(module).run(*args)  # (the graph may switch grad mode)
    except Exception:  # noqa: BLE001 (an op fake tensors cannot run: the IR's answer stands)
        return None
    return leaves(result), leaf_numbers


def _leaves_reached(value: Any) -> set[int]:
    """The ids of the autograd leaves a result's gradient reaches (itself, if it is one)."""
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return set()
    if value.grad_fn is None:
        return {id(value)}
    reached: set[int] = set()
    seen: set[Any] = set()
    stack = [value.grad_fn]
    while stack:
        function = stack.pop()
        if function in seen:
            continue
        seen.add(function)
        variable = getattr(function, "variable", None)  # (AccumulateGrad: a leaf)
        if variable is not None:
            reached.add(id(variable))
        stack.extend(f for f, _ in function.next_functions if f is not None and f not in seen)
    return reached


class MetaInterpreter(torch.fx.Interpreter):
    def __init__(self, module: torch.fx.GraphModule, attributes: dict[str, torch.Tensor],
                 device: torch.device, tracer: Tracer, stops: bool = False,
                 leaves_inside: set[str] | frozenset[str] = frozenset(),
                 inputs_require_grad: dict[str, bool] | None = None):
        super().__init__(module)
        self.inputs_require_grad = inputs_require_grad or {}  # (tensor placeholders' flags)
        self.propagated_requires_grad: dict[str, bool] = {}  # (see run_node)
        self.leaves_inside = leaves_inside  # (see contained_leaves)
        self.attribute_metas = attributes
        self.device = device
        self.tracer = tracer
        self.stops = stops  # a training graph: values eager's autograd does not track stop

    def run_node(self, n: torch.fx.Node) -> Any:
        self.node = n
        try:
            result = super().run_node(n)
        except Unsupported as error:
            if n.op in ("call_function", "call_method", "call_module"):
                error.at(n.name)  # (before torch.fx adds its own note to the message)
            raise
        if n.op in ("call_function", "call_method") and "example_value" not in n.meta:
            # (eager's flag where the graph keeps no example value: a graph made by
            # torch.fx.symbolic_trace. A float result of an op with an operand requiring
            # grad, made with grad on, requires grad)
            self.propagated_requires_grad[n.name] = \
                torch.is_grad_enabled() and n.target not in _DETACHES and \
                isinstance(result, torch.Tensor) and result.is_floating_point() and \
                any(self._requires_grad_in_eager(a) for a in leaves((n.args, n.kwargs)))
        if self.stops and n.op in ("call_function", "call_method") and (
                not torch.is_grad_enabled() or n.target in _DETACHES):
            # made under torch.no_grad() (the graph's _set_grad_enabled nodes switch it while
            # this runs) or detached: eager's result requires no grad, so the backward must
            # not reach through it. (An in-place op's result is its input itself — a buffer
            # updated under no_grad — and keeps its binding: its writes must reach the input.)
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            operands = {id(t) for t in leaves((args, kwargs))
                        if isinstance(t, torch.Tensor)}
            for value in leaves(result):
                if isinstance(value, torch.Tensor) and id(value) not in operands:
                    self.tracer.stop_gradient(value)
        return result

    def get_attr(self, target, args, kwargs):
        if target in self.attribute_metas:
            return self.attribute_metas[target]
        return super().get_attr(target, args, kwargs)

    def call_function(self, target, args, kwargs):
        if _makes_leaf(target, args, kwargs):
            return self._new_leaf(target, args, kwargs, super().call_function)
        if torch_internals.allowed_in_graph(target) or getattr(target, "one_call", False) \
                or target in _RECURRENT_LAYERS:
            return _opaque_call(self.tracer, self.device, target, args, kwargs)
        if self.device.type == "cuda" and target in _DROPOUTS:
            fused = _fused_dropout(target, args, kwargs)
            if fused is not None:
                return fused
        if target in attention.ATTENTIONS and \
                self.device.type in attention.FUSED_ATTENTION_DEVICES:
            fused = attention.fused_attention(self.tracer, self.device, args, kwargs,
                                              self._operands_wanting_grad())
            if fused is not None:
                return fused
        if target in _MATMULS or target in _LINEARS:
            folded = self._folded_product(target, args, kwargs)
            if folded is not None:
                return folded
        if target in (operator.getitem, operator.setitem) and \
                isinstance(args[0], torch.Tensor) and len(args) > 1:
            # x[[0, 2]]: torch makes the list an index tensor on x's device — for a meta
            # tensor, one without values; as a real tensor the tracer keeps it as a constant
            args = (args[0], _listed_indices(args[1]), *args[2:])
        # (a C++ composite that asks symbolic sizes as ints: run again as torch's Python
        # decomposition, see torch_internals.calling_composites)
        call = super().call_function
        return torch_internals.calling_composites(lambda: call(target, args, kwargs))

    def _operands_wanting_grad(self) -> frozenset[str] | None:
        """In a training graph, the attention call's operands that require grad in eager; None
        where that is not known (a graph made by torch.fx.symbolic_trace keeps no example
        values)."""
        if not self.stops or not torch.is_grad_enabled():
            return frozenset()
        node = self.node
        bound = dict(zip(attention.ARGUMENT_NAMES, node.args), **node.kwargs)
        wanted = set()
        for name, value in bound.items():
            if not isinstance(value, torch.fx.Node):
                continue
            requires_grad = self._requires_grad_in_eager(value)
            if requires_grad is None:
                return None
            if requires_grad:
                wanted.add(name)
        return frozenset(wanted)

    def _requires_grad_in_eager(self, value: Any) -> bool | None:
        """Does the graph's value `value` (an argument of the node being run) require grad in
        eager? By the captured example value, or the module's own tensor (the meta values
        here carry no autograd state); None where that is not known."""
        if not isinstance(value, torch.fx.Node):
            return False
        if value.op == "get_attr":
            example = self.fetch_attr(value.target)
        else:
            example = value.meta.get("example_value", value.meta.get("val"))
        if isinstance(example, torch.Tensor):
            return example.requires_grad
        if value.op == "placeholder" and value.name in self.inputs_require_grad:
            return self.inputs_require_grad[value.name]
        # (a graph rebuilt from a warm-start record holds no example values: their bit, as
        # eager's value had it; else propagated through a symbolically traced graph)
        recorded = value.meta.get(REQUIRES_GRAD)
        if recorded is not None:
            return recorded
        return self.propagated_requires_grad.get(value.name)

    def _folded_product(self, target, args, kwargs) -> Any:
        """A matmul or linear whose batched operand eager folds because the other requires
        grad (matmul_folds); None where the call is traced as it is."""
        linear = target in _LINEARS
        names = ("input", "weight", "bias") if linear else ("input", "other")
        bound = dict(zip(names, args), **kwargs)
        operands = dict(zip(names, self.node.args), **self.node.kwargs)
        tensors = [bound.get(name) for name in names[:2]]
        if not all(isinstance(t, torch.Tensor) for t in tensors) or \
                max(t.dim() for t in tensors) < 3:
            return None
        wants_grad = tuple(bool(self._requires_grad_in_eager(operands.get(name)))
                           for name in names[:2])
        if not any(wants_grad):
            return None
        if linear:
            bias = bound.get("bias")
            return matmul_folds.folded_linear(
                *tensors, bias if isinstance(bias, torch.Tensor) else None, wants_grad)
        return matmul_folds.folded_matmul(*tensors, wants_grad)

    def call_method(self, target, args, kwargs):
        if _makes_leaf(target, args, kwargs):
            return self._new_leaf(target, args, kwargs, super().call_method)
        if target in ("__getitem__", "__setitem__") and len(args) > 1:
            args = (args[0], _listed_indices(args[1]), *args[2:])
        if target in ("matmul", "__matmul__"):
            folded = self._folded_product(torch.matmul, args, kwargs)
            if folded is not None:
                return folded
        if target == "new_tensor":
            made = self._new_tensor(*args, **kwargs)
            if made is not None:
                return made
        call = super().call_method
        return torch_internals.calling_composites(lambda: call(target, args, kwargs))

    def _new_tensor(self, base: torch.Tensor, data: Any, dtype: torch.dtype | None = None,
                    device: Any = None, **options: Any) -> torch.Tensor | None:
        """x.new_tensor(data) of Python numbers: the real tensor torch.tensor makes of them,
        with x's dtype and device (the graph's) where the call names none, which the tracer
        keeps as a constant, as it keeps torch.tensor(...)'s. (On a meta tensor torch makes
        it without an op the tracer sees.) None where data holds tensors."""
        if any(isinstance(v, torch.Tensor) for v in leaves(data)):
            return None
        return torch.tensor(data, dtype=dtype if dtype is not None else base.dtype,
                            device=device if device is not None else self.device, **options)

    def _new_leaf(self, target, args, kwargs, call) -> torch.Tensor:
        """x.requires_grad_() and torch.zeros(..., requires_grad=True) make a leaf that
        autograd tracks from then on. Where the leaf stays inside the graph
        (contained_leaves), it is the value it was, and in a training graph its gradient
        stops there: what eager computes past it is the leaf's own .grad, which nobody reads.
        Elsewhere the call runs eagerly (an eager island), and what follows it sees the real
        leaf."""
        name = getattr(target, "__name__", target)
        if self.node.name not in self.leaves_inside:
            raise Unsupported(f"{name} makes a tensor that requires grad (a new autograd "
                              f"leaf) that the caller sees: a tensor from outside, a result, "
                              f"or a result's only way to require grad")
        if target in _REQUIRES_GRAD:
            made = args[0]
        else:
            made = call(target, args, {k: v for k, v in kwargs.items() if k != "requires_grad"})
        if self.stops:
            self.tracer.stop_gradient(made)
        return made


_REQUIRES_GRAD = ("requires_grad_", torch.Tensor.requires_grad_)
_MATMULS = (torch.matmul, operator.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
_LINEARS = (torch.nn.functional.linear,)


def _makes_leaf(target, args, kwargs) -> bool:
    """Does the call make a new autograd leaf (x.requires_grad_(), a factory's
    requires_grad=True)?"""
    if target in _REQUIRES_GRAD:
        return bool(args[1] if len(args) > 1 else kwargs.get("requires_grad", True))
    return bool(kwargs.get("requires_grad", False))


def _listed_indices(index: Any) -> Any:
    """An index with its flat lists of integers as int64 tensors, as torch's indexing reads
    them. (A list holding lists is read as a tuple of indices — deprecated, kept as it is.)"""
    def integers(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)

    if integers(index):
        return torch.tensor(index, dtype=torch.int64)
    if isinstance(index, tuple):
        return tuple(torch.tensor(i, dtype=torch.int64) if integers(i) else i for i in index)
    return index


def _opaque_call(tracer: Tracer, device: torch.device, target, args, kwargs) -> Any:
    """A function the user marked torch.compiler.allow_in_graph, or a target capture made to
    stay one call (`one_call`: a custom autograd.Function's apply, whose backward is the
    user's): one library call of it, run as eager runs it (its Python too, on every call),
    never traced into; its results' layout from a run on fake tensors of the graph's
    device."""
    def stand_in(value: Any, on: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=on)

    # (cuDNN's recurrent layers lay their results out otherwise than their fake kernels say —
    # a batch-first output is a transposed view: one run on the device, uninitialized, tells)
    real = target in _RECURRENT_LAYERS and device.type == "cuda"
    with torch_internals.outside_dispatch_modes(), torch.no_grad():
        with contextlib.nullcontext() if real else torch_internals.make_fake_mode():
            fake_args, fake_kwargs = map_leaves(lambda v: stand_in(v, device), (args, kwargs))
            result = target(*fake_args, **fake_kwargs)
        out = map_leaves(lambda v: stand_in(v, "meta"), result)
    tracer.call_library(target, args, kwargs, out)
    return out


# A recurrent layer over a whole sequence (nn.LSTM, nn.GRU and nn.RNN call these) is one
# library call, as eager makes it: eager runs each layer as one oneDNN call on the CPU
# (mkldnn_rnn_layer) and one cuDNN call on CUDA, while the composite a meta tensor gets is
# the time steps one by one — a small matrix product and a gates kernel per step. Traced,
# a 2-layer bidirectional LSTM over 20 steps (batch 16, hidden 48; 2026-12-07) took 4.3x
# eager's time in inference and 12.8x in training; timm's Sequencer2D 1.5x and 2.5x. In
# training the call's gradient is eager's own autograd, kept on the step's tape. (The
# cells, one step each, are traced and fuse with what is around them.)
_RECURRENT_LAYERS = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)


# Dropout on a CUDA tensor: eager runs native_dropout's fused kernel (at::dropout checks
# is_fused_kernel_acceptable), which draws its random numbers differently from the bernoulli_
# that dropout's composite form (all a meta tensor gets) calls: the fused op is called here.
_DROPOUTS = {torch.nn.functional.dropout: ("input", "p", "training", "inplace"),
             torch.dropout: ("input", "p", "train"),
             torch.ops.aten.dropout.default: ("input", "p", "train")}


def _fused_dropout(target, args, kwargs) -> Any:
    names = _DROPOUTS[target]
    bound = dict(zip(names, args), **kwargs)
    x, p = bound.get("input"), bound.get("p", 0.5)
    training = bound.get("training", bound.get("train", True))
    if bound.get("inplace") or training is not True or not isinstance(x, torch.Tensor) or \
            not isinstance(p, float) or not 0 < p < 1 or x.numel() == 0:
        return None
    return torch.ops.aten.native_dropout.default(x, p, True)[0]
