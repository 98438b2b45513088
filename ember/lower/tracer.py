"""FX GraphModule → ember IR, by running the graph on meta tensors under a dispatch mode.

Every aten op that reaches the mode is lowered at once through the `lowerings` table (or
becomes a library node). Meta tensors give each op's true result shape, dtype and strides, which
each lowering is checked against. Mutation is made functional (ember/lower/storage.py: every
tensor remembers its storage root and the chain of view nodes leading to it, an in-place op
gives the root a new value, scattered through the chain), and graph inputs whose root changed
are written back at the end. This module must not decide fusion or layout; it only says what
values the graph computes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.fx

from ember import logs, torch_internals
from ember.ir import dtypes
from ember.ir.graph import Graph, Node
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.lower import (
    meta_results,
    rules,  # noqa: F401  (fills the lowerings table)
)
from ember.lower.builder import Builder, row_major
from ember.lower.devices import graph_device, resolve, same_device
from ember.lower.layout import ROW_MAJOR_RESULTS, eager_layout
from ember.lower.meta_interpreter import MetaInterpreter, contained_leaves, turns_grad_on
from ember.lower.mutation import (
    scatter_through,
)
from ember.lower.registry import ByDesign, Decline, Unsupported, find_rule
from ember.lower.results import Lowered, OutputSpec
from ember.lower.schemas import (
    DIFFERENTIABLE_TWINS,
    UNTRACKED_VIEWS,
    WRITES_UNDECLARED,
    WRITTEN_UNDECLARED,
)
from ember.lower.storage import Storage, TensorState, ViewChain, ViewsAndWrites
from ember.lower.symbolic import SymbolTable, symbolic_arguments
from ember.runtime import switches
from ember.torch_internals import tree_flatten
from ember.trees import leaves, map_leaves

_METADATA = {torch.ops.prim.device.default, torch.ops.aten.sym_size.int,
             torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
             torch.ops.aten.sym_storage_offset.default, torch.ops.aten.is_contiguous.default,
             torch.ops.aten.is_contiguous.memory_format}

def to_meta(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype,
                               device="meta")


class Tracer(ViewsAndWrites, torch_internals.TorchDispatchMode):
    def __init__(self, graph: Graph, symbols: SymbolTable | None = None):
        super().__init__()
        self.graph = graph
        # symbolic graphs: torch's SymInts -> ember's sizes (None: every size is an int)
        self.symbols = symbols
        self.builder = Builder(graph)
        self.states: dict[int, TensorState] = {}
        self.keep_alive: list[torch.Tensor] = []
        self.constants: list[torch.Tensor] = []
        self.library_calls = 0
        self.detached_views: set[int] = set()  # (ids of tensors: see stop_gradient)
        # a training graph: values eager's autograd does not track stop the gradient
        self.stops = False
        self.input_metas: set[int] = set()  # (ids: an input returned is that object itself)
        self.from_storage_start: set[int] = set()  # (ids: see _counts_from_storage)
        # (ids of views: was grad mode on where the graph made them? see OutputSpec.recorded)
        self.views_made_with_grad: dict[int, bool] = {}

    def dims(self, values: Any) -> tuple:
        """Sizes, strides or an offset as the IR holds them (SymInts become `Size`)."""
        return tuple(values) if self.symbols is None else self.symbols.dims(values)

    # -- tensor bookkeeping ---------------------------------------------------------------
    def bind(self, meta: torch.Tensor, node: Node, storage: Storage | None = None,
             chain: ViewChain | None = ()) -> None:
        if storage is None:
            storage = Storage(node, None)
        storage.holders += 1
        self.states[id(meta)] = TensorState(storage, chain, node, storage.version)
        self.keep_alive.append(meta)
        if node.strides is None and node.op not in (Op.INPUT, Op.FULL) and meta.ndim:
            node.strides = self.dims(meta.stride())

    def bind_input(self, meta: torch.Tensor, index: int) -> None:
        node = self.graph.inputs[index]
        self.bind(meta, node, Storage(node, index))
        self.input_metas.add(id(meta))

    def state(self, tensor: torch.Tensor) -> TensorState:
        try:
            return self.states[id(tensor)]
        except KeyError:
            raise Unsupported("a tensor ember did not see being created") from None

    def current(self, tensor: torch.Tensor) -> Node:
        """The tensor's value now, re-derived from its root if the root changed since."""
        state = self.state(tensor)
        if state.version != state.storage.version:
            if state.chain is None:
                raise Unsupported("a view ember cannot re-derive was read after its base changed")
            node = state.storage.value
            for op, attrs in state.chain:
                node = self.graph.add(op, (node,), **attrs)
            state.node, state.version = node, state.storage.version
        return state.node

    def stop_gradient(self, tensor: torch.Tensor) -> None:
        """`tensor` holds a value eager's autograd does not track (detached, or made under
        torch.no_grad() in a training graph): its own value from now on, behind a
        STOP_GRADIENT that the backward does not cross. If other tensors see its memory (a
        detached view), writes through it would no longer reach them: they are refused."""
        if not tensor.dtype.is_floating_point or id(tensor) not in self.states:
            return
        storage = self.state(tensor).storage
        self.bind(tensor, self.builder.unary(Op.STOP_GRADIENT, self.current(tensor)))
        if storage.holders > 1:
            self.detached_views.add(id(tensor))

    def call_library(self, func, args, kwargs, out) -> None:
        """`func` called as eager calls it, a library call by design (not for want of a rule),
        its result `out` (a meta tensor with the real result's layout) bound to it."""
        self._bind_results(out, self._library(func, args, kwargs, kwargs, out, counted=False))

    def assign(self, tensor: torch.Tensor, value: Node) -> None:
        """Give `tensor` a new value, updating its root (and so every alias of it)."""
        if id(tensor) in self.detached_views:
            raise Unsupported("an in-place write to a detached view in a training graph")
        state = self.state(tensor)
        if state.chain is None:
            raise Unsupported("an in-place write through a view ember cannot invert")
        value = self.builder.broadcast_to(self.builder.cast(value, state.node.dtype),
                                          state.node.shape)
        storage = state.storage
        storage.value = scatter_through(self.builder, storage.value, state.chain, value)
        storage.version += 1
        state.node, state.version = value, storage.version

    def to_nodes(self, tree: Any) -> Any:
        if self.symbols is not None:
            tree = self.symbols.convert(tree)
        return map_leaves(lambda v: self.current(v) if isinstance(v, torch.Tensor) else v, tree)

    def adopt_constant(self, tensor: torch.Tensor) -> torch.Tensor:
        """A real tensor met while tracing (torch.tensor(...) in the graph): a constant input."""
        meta = to_meta(tensor)
        self.constants.append(tensor)
        node = self.graph.add_input(tensor.shape, tensor.dtype, tensor.stride())
        self.bind(meta, node, Storage(node, node.attrs["index"]))
        return meta

    # -- the dispatch hook ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _METADATA:  # (fake tensors ask for their device and sizes through here)
            return func(*args, **kwargs)
        func = self._declared_twin(func, args, kwargs)
        template_kwargs = dict(kwargs)
        schema = torch_internals.schema_of(func)
        if "device" in kwargs or any(a.name == "device" and a.kwarg_only
                                     for a in schema.arguments):
            # every tensor made while tracing is a meta tensor (torch.zeros(3) names no device)
            device = kwargs.get("device")
            device = torch.device(device) if device is not None else None
            # x.to(dtype), zeros_like(x), x.new_zeros(n): no device means x's, the graph's
            follows_input = bool(args) and isinstance(args[0], torch.Tensor)
            if device is None and not follows_input and \
                    not same_device(torch.get_default_device(), self.graph.device):
                raise Unsupported(f"{func} creates a tensor on the default device "
                                  f"{torch.get_default_device()}, the graph is on "
                                  f"{self.graph.device}")
            if device is not None and device.type == "meta":
                # an op called on our meta tensors from inside another (x.to(dtype) in
                # softmax(x, dtype=...)) names their device: the graph's device at run time
                template_kwargs["device"] = self.graph.device
            elif device is not None and not same_device(device, self.graph.device):
                raise Unsupported(f"{func} creates a tensor on {device}, the graph is on "
                                  f"{self.graph.device}")
            kwargs["device"] = "meta"
        args, kwargs = map_leaves(self._meta_argument, (args, kwargs))
        written = [(position, argument) for position, argument in enumerate(schema.arguments)
                   if argument.alias_info is not None and argument.alias_info.is_write]
        before = [self._geometry(t) for t in self._written_tensors(written, args, kwargs)]
        fresh = not written and func not in UNTRACKED_VIEWS and \
            not any(r.alias_info is not None for r in schema.returns)
        try:
            # (a functional op's meta result, kept by its arguments' geometry: meta_results)
            out = meta_results.call(func, args, kwargs) if fresh else func(*args, **kwargs)
        except Exception as error:
            decomposed = None if written else \
                self._decomposed_instead(func, args, kwargs, error)
            if decomposed is not None:
                return decomposed
            if isinstance(error, torch_internals.ConcreteSizesAsked):
                raise  # (the graph's call that asked is run again by the MetaInterpreter)
            raise Unsupported(f"{func} cannot run on meta tensors: {error}") from error
        if written:
            after = [self._geometry(t) for t in self._written_tensors(written, args, kwargs)]
            if before != after:
                self._restride(func, args, kwargs, out, before[0])
                return out
            if func in ROW_MAJOR_RESULTS:  # results it returns besides what it writes
                out = eager_layout(func, args, kwargs, out, self.graph.device.type)
            self._lower_mutation(func, args, kwargs, template_kwargs, out, written)
        elif any(r.alias_info is not None for r in schema.returns) or func in UNTRACKED_VIEWS:
            self._lower_view(func, args, kwargs, template_kwargs, out)
            for view in leaves(out):  # (grad mode's own state, which autograd records by)
                self.views_made_with_grad[id(view)] = torch.is_grad_enabled()
        else:
            out = eager_layout(func, args, kwargs, out, self.graph.device.type)
            self._bind_results(out, self._lower(func, args, kwargs, template_kwargs, out))
        return out

    def _decomposed_instead(self, func, args: tuple, kwargs: dict, error: Exception) -> Any:
        """torch's decomposition of `func`, traced op by op, where `func`'s own meta kernel
        refuses symbolic sizes (the refusal capture's fake mode retries with torch's Python
        kernels, torch_internals; `constant_pad_nd` on the meta device); None where that is
        not the refusal or torch has no decomposition."""
        if not torch_internals.refuses_symbolic_sizes(error) or self.symbols is None:
            return None
        decomposition = torch_internals.decomposition_of(func)
        if decomposition is None:
            return None
        with self:  # (its ops come back through this tracer, each lowered as it is)
            return decomposition(*args, **kwargs)

    def _declared_twin(self, func, args: tuple, kwargs: dict):
        """`func`, or its twin that declares the writes `func` makes without saying so (batch
        norm in training writes its running statistics: a BatchNorm's buffers, or instance
        norm's repeated statistics): the twin's functional form is lowered — generated
        kernels, the buffers' new values written back as any in-place write to an input."""
        twin = WRITES_UNDECLARED.get(func)
        if twin is None:
            return func
        schema = torch_internals.schema_of(func)
        values = dict(zip((a.name for a in schema.arguments), args)) | kwargs
        written = [values.get(name) for name in WRITTEN_UNDECLARED[func]]
        if not values.get("training") or not all(isinstance(t, torch.Tensor) for t in written):
            return func
        return twin

    def _counts_from_storage(self, func, args, kwargs) -> bool:
        """Does this view of an input's memory place itself from the start of the input's
        storage (as_strided's explicit storage offset), not from the input's own start? An
        input's meta tensor starts its storage where the input starts, and the input's real
        offset in its storage is known only at run time: such a view, and any view of it, is
        placed from the storage's start when it is returned."""
        base = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if base is None:
            return False
        if id(base) in self.from_storage_start:
            return True
        offset = torch_internals.arguments_by_name(func, args, kwargs).get("storage_offset")
        return offset is not None and self.state(base).storage.input_index is not None

    def _meta_argument(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            return self.adopt_constant(value)
        return value

    @staticmethod
    def _geometry(tensor: torch.Tensor) -> tuple:
        return tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()

    @staticmethod
    def _written_tensors(written, args, kwargs) -> list[torch.Tensor]:
        tensors = []
        for position, argument in written:
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            tensors.extend(t for t in leaves(value) if isinstance(t, torch.Tensor))
        return tensors

    # -- functional ops -------------------------------------------------------------------
    def _lower(self, func, args, kwargs, template_kwargs, out) -> Any:
        """IR nodes for a functional op's results, shaped like `out`."""
        flat_out = leaves(out)
        tensors_in = [t for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        supported = all(t.dtype in dtypes.SUPPORTED for t in tensors_in + flat_out
                        if isinstance(t, torch.Tensor))
        rule = find_rule(func)
        if rule is not None and supported:
            try:
                # rules see the device the op runs on, not the meta device of the tracing
                rule_kwargs = {key: (template_kwargs.get(key) if key == "device" else value)
                               for key, value in kwargs.items()}
                result = rule(self.builder, *self.to_nodes(args), **self.to_nodes(rule_kwargs))
                if self._matches(result, out):
                    return result
                # (a fault of the rule's, not a case it declines: said where the fallbacks
                # channel is on, so that a benchmark's report shows it)
                logs.channel("fallbacks").info(
                    "%s runs as a library call: its rule's result disagrees with eager's %s",
                    func, self._describe(out))
            except ByDesign:
                return self._library(func, args, kwargs, template_kwargs, out, counted=False)
            except Decline as reason:
                logs.channel("fallbacks").debug("%s runs as a library call: %s", func, reason)
        return self._library(func, args, kwargs, template_kwargs, out)

    def _matches(self, result: Any, out: Any) -> bool:
        flat_result = leaves(result)
        flat_out = leaves(out)
        if len(flat_result) != len(flat_out):
            return False
        for node, meta in zip(flat_result, flat_out):
            if isinstance(meta, torch.Tensor):
                if not isinstance(node, Node) or node.shape != self.dims(meta.shape) \
                        or node.dtype != meta.dtype:
                    return False
            elif node != (self.symbols.size(meta) if self.symbols is not None else meta):
                return False
        return True

    @staticmethod
    def _describe(out: Any) -> str:
        flat = leaves(out)
        return ", ".join(f"{t.dtype}{list(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)
                         for t in flat)

    def _library(self, func, args, kwargs, template_kwargs, out, counted: bool = True) -> Any:
        """A library call of `func` (`counted`: an op without a working rule, not one called
        by design)."""
        inputs: list[Node] = []
        operand_strides: list[tuple[int, ...]] = []
        if self.stops:
            # (an op eager picks where no input requires grad — the traced tensors require
            # none — whose twin has the backward: embedding_bag's)
            func = DIFFERENTIABLE_TWINS.get(func, func)

        def slot(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                inputs.append(self.current(value))
                operand_strides.append(self.dims(value.stride()))
                return Slot(len(inputs) - 1)
            return self.symbols.size(value) if self.symbols is not None else value

        template_args = _options_per_dim(func, args, map_leaves(slot, args))
        template_kwargs = {key: (map_leaves(slot, kwargs[key]) if key != "device" else value)
                           for key, value in template_kwargs.items()}
        flat_out, spec = tree_flatten(out)
        if not all(isinstance(t, torch.Tensor) for t in flat_out):
            raise Unsupported(f"{func} returns non-tensor values")
        if any(t.is_conj() or t.is_neg() for t in flat_out + tensors_of(args, kwargs)):
            # torch's lazy conjugation and negation are bits on a view: a library call's
            # result keeps its memory, not its bit, and what reads it next would miss it
            # (the imaginary part of a conjugate came back with its sign flipped)
            raise Unsupported(f"{func} on a lazily conjugated or negated view (torch's "
                              f"conj/neg bits): the graph runs eagerly")
        results = tuple((self.dims(t.shape), t.dtype, self.dims(t.stride())) for t in flat_out)
        tuple_result = not isinstance(out, torch.Tensor)
        switched = switches.active()  # (made inside `with torch.backends.cudnn.flags(...)`)
        node = self.graph.add(Op.LIBRARY, inputs, target=func, args=template_args,
                              kwargs=template_kwargs, results=results,
                              tuple_result=tuple_result, operand_strides=tuple(operand_strides),
                              **({"switches": switched} if switched else {}))
        self.library_calls += counted
        if not tuple_result:
            node.strides = results[0][2]
            return node
        items = []
        for index, (_shape, _dtype, strides) in enumerate(results):
            item = self.graph.add(Op.ITEM, (node,), index=index)
            item.strides = strides
            items.append(item)
        return spec.unflatten(items) if hasattr(spec, "unflatten") else items

    def _bind_results(self, out: Any, result: Any) -> None:
        flat_out = leaves(out)
        flat_result = leaves(result)
        for meta, node in zip(flat_out, flat_result):
            if isinstance(meta, torch.Tensor):
                self.bind(meta, node)

    # -- results --------------------------------------------------------------------------
    def finish(self, out: Any) -> tuple[list[OutputSpec], Any]:
        flat, tree = tree_flatten(out)
        specs: list[OutputSpec] = []
        seen: dict[int, int] = {}
        for storage in {id(s.storage): s.storage for s in self.states.values()}.values():
            if storage.input_index is not None and storage.version > 0:
                self.graph.writebacks.append((storage.input_index, storage.value))
        root_outputs: dict[int, int] = {}
        for position, value in enumerate(flat):
            if not isinstance(value, torch.Tensor):
                specs.append(OutputSpec("value", value=value))
                continue
            if id(value) in seen:
                specs.append(OutputSpec("same", index=seen[id(value)]))
                continue
            seen[id(value)] = position
            state = self.state(value)
            storage = state.storage
            geometry = dict(size=self.dims(value.shape), stride=self.dims(value.stride()),
                            offset=self.dims([value.storage_offset()])[0],
                            dtype=value.dtype if value.dtype != storage.value.dtype else None)
            if storage.input_index is not None:
                root = self.graph.inputs[storage.input_index]
                if id(value) in self.input_metas and state.chain == () and \
                        geometry["stride"] == root.strides:
                    specs.append(OutputSpec("input", index=storage.input_index))
                else:
                    specs.append(OutputSpec("view", index=storage.input_index, **geometry,
                                            from_storage_start=id(value) in
                                            self.from_storage_start,
                                            recorded=self.views_made_with_grad.get(id(value))))
            elif state.chain is not None and id(storage) in root_outputs:
                # memory another output already holds: a view of that output, as in eager
                specs.append(OutputSpec("view", index=root_outputs[id(storage)],
                                        of_output=True, **geometry))
            elif state.chain != ():
                # a view of memory that no other output holds yet: its root becomes an output
                # (also when ember cannot re-derive the view: its geometry still says where
                # its elements live)
                key = id(storage)
                if key not in root_outputs:
                    root_outputs[key] = len(self.graph.outputs)
                    root_meta = self._root_meta(storage)
                    self.graph.outputs.append(storage.value)
                    self.graph.output_strides.append(root_meta)
                specs.append(OutputSpec("view", index=root_outputs[key], of_output=True,
                                        **geometry))
            else:
                if state.chain == ():
                    root_outputs[id(storage)] = len(self.graph.outputs)
                specs.append(OutputSpec("node", index=len(self.graph.outputs)))
                self.graph.outputs.append(self.current(value))
                self.graph.output_strides.append(self.dims(value.stride()))
        return specs, tree

    def _root_meta(self, storage: Storage) -> tuple[int, ...]:
        """Eager's strides of a storage's root tensor (those of its meta tensor: the root's
        node may be another buffer's value, such as an input that round() returned as is)."""
        root = self._root_tensor(storage)
        return self.dims(root.stride()) if root is not None else row_major(storage.value.shape)

    def _root_tensor(self, storage: Storage) -> torch.Tensor | None:
        """The meta tensor that is a storage's root itself, if one is still bound to it."""
        for meta in self.keep_alive:
            state = self.states.get(id(meta))
            if state is not None and state.storage is storage and state.chain == ():
                return meta
        return None


def _refuse_readers_elsewhere(module: torch.fx.GraphModule, example_inputs: list[Any],
                              device: torch.device) -> None:
    """Raise at the first node that reads an input on another device than the graph's (a
    tensor a model keeps on the CPU beside its work on CUDA): that node, and the others
    like it, run as eager islands (ember/partition.py). An input no node reads (ConViT's
    CPU tensor, whose size alone is asked) is passed and left alone."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        if not isinstance(value, torch.Tensor) or same_device(value.device, device):
            continue
        if value.device.type not in ("cpu", "cuda") or device.type not in ("cpu", "cuda"):
            raise Unsupported(f"inputs live on several devices ({value.device}, {device})")
        readers = [user for user in node.users if user.op != "output"]
        if readers:
            error = Unsupported(f"reads a tensor on {value.device}, the graph runs on {device}")
            error.at(readers[0].name)
            raise error


def trace(module: torch.fx.GraphModule, example_inputs: list[Any],
          symbolic: bool = False) -> Lowered:
    """Lower an FX graph for the given (concrete) inputs; `symbolic`: for every shape its
    placeholders' symbolic fake values allow (sizes in the IR are then `Size`s)."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    device = graph_device(tensors) or resolve(torch.get_default_device())
    _refuse_readers_elsewhere(module, example_inputs, device)
    graph = Graph(device)
    if symbolic:
        tracer = Tracer(graph, SymbolTable(graph))
        mode, arguments = symbolic_arguments(tracer, module, example_inputs)
    else:
        tracer, mode, arguments = Tracer(graph), contextlib.nullcontext(), []
    for value in example_inputs if not symbolic else ():
        if isinstance(value, torch.Tensor):
            meta = to_meta(value)
            graph.add_input(value.shape, value.dtype, value.stride())
            tracer.bind_input(meta, len(graph.inputs) - 1)
            arguments.append(meta)
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise Unsupported("symbolic scalar input")
        else:
            arguments.append(value)
    attributes: dict[str, torch.Tensor] = {}
    attribute_names = []
    for fx_node in module.graph.nodes:
        if fx_node.op == "get_attr" and fx_node.target not in attributes:
            value = _fetch_attr(module, fx_node.target)
            if isinstance(value, torch.Tensor):
                meta = to_meta(value)
                graph.add_input(value.shape, value.dtype, value.stride())
                tracer.bind_input(meta, len(graph.inputs) - 1)
                attributes[fx_node.target] = meta
                attribute_names.append(fx_node.target)
    for name in attribute_names:
        value = _fetch_attr(module, name)
        # a 0-d constant on the CPU (torch.tensor(7.0) in the code) joins a CUDA graph as
        # eager lets it: the backend copies it to the graph's device once
        if value.device != device and not (value.dim() == 0 and value.device.type == "cpu"):
            raise Unsupported(f"graph attribute {name} lives on {value.device}, the graph on "
                              f"{device}")
    stops = any(t.requires_grad for t in tensors) and (torch.is_grad_enabled() or
                                                         turns_grad_on(module))
    # (the graph's grad-mode switches run as it is traced: the caller's mode is restored)
    tracer.stops = stops
    leaves_inside = contained_leaves(module, example_inputs)
    placeholders = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    require_grad = {name: value.requires_grad for name, value in zip(placeholders, example_inputs)
                    if isinstance(value, torch.Tensor)}
    with mode, tracer, torch.set_grad_enabled(torch.is_grad_enabled()), switches.contained():
        out = MetaInterpreter(module, attributes, device, tracer, stops,
                              leaves_inside, require_grad).run(*arguments)
    specs, tree = tracer.finish(out)
    return Lowered(graph, specs, tree, attribute_names, tracer.constants, tracer.library_calls)




def _fetch_attr(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def tensors_of(args: Any, kwargs: Any) -> list[torch.Tensor]:
    return [t for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


# where aten's convolutions take an option per spatial dim (stride, padding, dilation,
# output_padding), and which argument's dims count them
_PER_DIM_OPTIONS = {torch.ops.aten.convolution.default: (0, (3, 4, 5, 7)),
                    torch.ops.aten.convolution_backward.default: (1, (4, 5, 6, 8))}


def _options_per_dim(func: Any, args: tuple, template: tuple) -> tuple:
    """A convolution's options, one value per spatial dim: aten also takes one value for
    all of them (F.conv2d(padding="valid") passes `[0]`), which cuDNN's entry point, the
    backward's rule and the convolution passes' index arithmetic do not."""
    where = _PER_DIM_OPTIONS.get(func)
    if where is None or len(args) <= max(where[1]):
        return template
    spatial = args[where[0]].ndim - 2
    return tuple(list(value) * spatial
                 if k in where[1] and isinstance(value, (list, tuple)) and len(value) == 1
                 and spatial > 1 else value
                 for k, value in enumerate(template))
