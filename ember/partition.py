"""An FX graph and the nodes ember cannot compile (its eager islands) → compiled regions and
eager islands, in the order they run, and example inputs for each region.

Regions are maximal groups of the other nodes: a node joins the earliest region its inputs
allow, a node whose every user comes later sinks to them (so a chain is not cut where it need
not be). Nodes whose order is observable — in-place ops, random draws, grad-mode switches,
module calls — keep their place relative to every other node. This module only splits the
graph and says what flows between the pieces; it compiles nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from typing import Any

import torch
import torch.fx

from ember import config, logs, torch_internals
from ember.lower import Unsupported, trace
from ember.lower.devices import graph_device, same_device
from ember.runtime import switches

CALLS = ("call_function", "call_method", "call_module")

# In-place spellings of Python operators (x += y on tensors: operator.iadd, Tensor.__iadd__)
_IN_PLACE_OPERATORS = {operator.setitem, operator.iadd, operator.isub, operator.imul,
                       operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow,
                       operator.iand, operator.ior, operator.ixor, operator.ilshift,
                       operator.irshift, operator.imatmul}
# Words in the names of ops that draw random numbers: their order decides what they draw.
_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "normal", "multinomial", "rrelu", "uniform",
                 "exponential", "poisson", "cauchy", "geometric", "seed")


@dataclasses.dataclass
class Region:
    """Nodes compiled together; `inputs` come from outside it (placeholders, earlier pieces),
    `outputs` are read outside it (later pieces, the graph's result)."""

    number: int
    nodes: list[torch.fx.Node]
    inputs: list[torch.fx.Node] = dataclasses.field(default_factory=list)
    outputs: list[torch.fx.Node] = dataclasses.field(default_factory=list)
    grad_enabled: bool = True  # the grad mode it runs in
    switches: tuple = ()  # the backend switches it runs under (runtime/switches.py)

    def key(self) -> tuple:
        """Equal keys: the same region (its compiled form can be reused)."""
        return (tuple(n.name for n in self.nodes), tuple(n.name for n in self.inputs),
                tuple(n.name for n in self.outputs), self.grad_enabled,
                tuple(map(repr, self.switches)))


@dataclasses.dataclass
class Island:
    """A node run as eager runs it. `reason`: why ember cannot compile it; None for glue the
    partition adds itself (an item of an island's tuple, a grad-mode or backend switch)."""

    node: torch.fx.Node
    reason: str | None

    @property
    def summary(self) -> str:
        """The reason's first sentence (torch's errors go on to advice about custom ops)."""
        line = (self.reason or "").splitlines()[0] if self.reason else ""
        end = line.find(". ", 40)
        return line[:end + 1] if end != -1 else line

    @property
    def note(self) -> str:
        """What explain lists: `rand (rand_1): makes a tensor on cpu, ...`."""
        return f"{describe(self.node)} ({self.node.name}): {self.summary}"


@dataclasses.dataclass
class Partition:
    module: torch.fx.GraphModule
    pieces: list[Region | Island]   # in the order they run

    @property
    def regions(self) -> list[Region]:
        return [p for p in self.pieces if isinstance(p, Region)]

    @property
    def islands(self) -> list[Island]:
        return [p for p in self.pieces if isinstance(p, Island) and p.reason is not None]


# How the fallbacks channel says a node runs eagerly inside a compiled graph (an island, not
# a graph run eagerly: the bench's report tells the two apart by it).
ISLAND_SAYS = "runs as an eager island"


def log_islands(label: str, partition: Partition) -> None:
    for island in partition.islands:
        logs.channel("fallbacks").info("%s: %s " + ISLAND_SAYS + ": %s", label,
                                       describe(island.node), island.reason)


def describe(node: torch.fx.Node) -> str:
    """The op a node calls, as the user wrote it (adaptive_avg_pool2d, Tensor.add_)."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return f"module {node.target}"
    return getattr(node.target, "__name__", str(node.target))


def switches_grad_mode(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch_internals.set_grad_enabled


def switches_mode(node: torch.fx.Node) -> bool:
    """Does the node switch a global mode: grad mode, or a backend switch entered or left
    (runtime/switches.py)?"""
    return switches_grad_mode(node) or node.op == "call_function" and (
        isinstance(node.target, switches.Switch) or node.target is switches.leave)


def keeps_its_place(node: torch.fx.Node, device: torch.device | None = None) -> bool:
    """Is the node's order among the others observable (it writes memory, draws random
    numbers, switches a global mode, or is a module call ember cannot see into)? A draw on
    another device than the graph's `device` uses that device's generator: its order among
    the graph's own nodes is not observable (among other draws there, islands keep it)."""
    return _changes_state(node) or (draws(node) and elsewhere(node, device) is None)


def only_draws(node: torch.fx.Node) -> bool:
    """Does the node keep its place only for the numbers it draws? Its order matters among
    the graph's other draws and writes, not beside a pure island's."""
    return draws(node) and not _changes_state(node)


def _changes_state(node: torch.fx.Node) -> bool:
    """Does the node write memory, switch a global mode or call a module ember cannot see
    into?"""
    return node.op == "call_module" or switches_mode(node) or writes(node)


def _name(node: torch.fx.Node) -> str:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return name if isinstance(name, str) else ""


def draws(node: torch.fx.Node) -> bool:
    return any(w in _name(node) for w in _RANDOM_WORDS)


def writes(node: torch.fx.Node) -> bool:
    """Does the node write memory (an in-place method or operator, inplace=True, out=)?"""
    if node.op == "call_function" and node.target in _IN_PLACE_OPERATORS:
        return True
    name = _name(node)
    in_place_method = name.endswith("_") and not name.startswith("_")
    in_place_dunder = name == "__setitem__" or (name.startswith("__i") and name.endswith("__"))
    if in_place_method or in_place_dunder:
        return True
    if node.kwargs.get("inplace") is True or "out" in node.kwargs or _in_place_by_position(node):
        return True
    if torch_internals.is_op_overload(node.target):
        schema = torch_internals.schema_of(node.target)
        return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return False


def _in_place_by_position(node: torch.fx.Node) -> bool:
    """F.relu(x, True): a function's `inplace` parameter given by position."""
    if node.op != "call_function" or True not in node.args:
        return False
    try:
        parameters = list(inspect.signature(node.target).parameters)
    except (TypeError, ValueError):
        return False
    return "inplace" in parameters and parameters.index("inplace") < len(node.args) and \
        node.args[parameters.index("inplace")] is True


def example_value(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def module_device(module: torch.fx.GraphModule) -> torch.device | None:
    """The device the graph's compiled regions run on (lower/devices.graph_device), from its
    placeholders' example values; None where they have none."""
    return graph_device([example_value(n) for n in module.graph.nodes if n.op == "placeholder"])


def elsewhere(node: torch.fx.Node, device: torch.device | None) -> str | None:
    """Why a call cannot be compiled with a graph on `device`: it makes or reads a tensor on
    another device (a layer drop's `torch.rand([])` on the CPU beside a model on CUDA, and
    the comparison that reads it); None where it does not, or nothing says."""
    if device is None:
        return None
    for source, verb in [(node, "makes")] + [(s, "reads") for s in node.all_input_nodes]:
        for value in torch_internals.tree_flatten(example_value(source))[0]:
            if isinstance(value, torch.Tensor) and not same_device(value.device, device):
                return f"{verb} a tensor on {value.device}, the graph runs on {device}"
    return None


def split(module: torch.fx.GraphModule, islands: dict[str, str]) -> Partition:
    """Regions and islands of `module`, `islands` naming the nodes that run eagerly (by node
    name, with the reason)."""
    calls = [n for n in module.graph.nodes if n.op in CALLS]
    device = module_device(module)
    reasons: dict[torch.fx.Node, str | None] = {}
    for node in calls:
        if node.name in islands:
            reasons[node] = islands[node.name]
        elif switches_mode(node) or (node.target is operator.getitem and
                                     node.args[0] in reasons):
            reasons[node] = None  # (glue: run where it stands, between the regions)
    fixed = {n for n in calls if keeps_its_place(n, device)}
    levels = _levels(calls, reasons, fixed, {n for n in fixed if only_draws(n)})
    by_level: dict[int, list[torch.fx.Node]] = {}
    for node in calls:
        if node not in reasons:
            by_level.setdefault(levels[node], []).append(node)
    pieces: list[Region | Island] = []
    for level in range(max(levels.values(), default=-1) + 1):
        if level in by_level:
            number = sum(isinstance(piece, Region) for piece in pieces)
            pieces.append(Region(number, by_level[level]))
        pieces.extend(Island(n, reasons[n]) for n in calls if n in reasons and levels[n] == level)
    _connect(module, pieces)
    return Partition(module, pieces)


def _levels(calls: list[torch.fx.Node], islands: dict[torch.fx.Node, Any],
            fixed: set[torch.fx.Node], drawing: set[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """Region number for each node (islands: the region they follow). Region k runs, then
    the islands of level k in the graph's order, then region k + 1. `fixed` nodes keep their
    place; those of them only `drawing` keep it among the fixed only (a pure island may run
    after a dropout that came later in the graph)."""
    level: dict[torch.fx.Node, int] = {}
    floor_region = floor_island = 0        # what nodes placed in order must wait for
    last_region, last_island = 0, -1       # the latest levels placed so far
    last_fixed_island = -1                 # (of the islands that keep their place)
    for node in calls:
        island = node in islands
        bound = floor_island if island else floor_region
        for source in node.all_input_nodes:
            if source in level:
                after = source in islands and not island  # (an island's result: next region)
                bound = max(bound, level[source] + after)
        if node in fixed:
            before = last_fixed_island if node in drawing else last_island
            bound = max(bound, last_region, before + (not island))
        level[node] = bound
        if island:
            last_island = max(last_island, bound)
            if node in fixed:
                last_fixed_island = max(last_fixed_island, bound)
        else:
            last_region = max(last_region, bound)
        if node in fixed:
            floor_region = max(floor_region, bound + island)
            floor_island = max(floor_island, bound)
    # sink: a node whose users all come later joins the earliest of them, unless a node that
    # keeps its place stands between (it may write what the node reads)
    ceiling = max(level.values(), default=0)
    for node in reversed(calls):
        if node in fixed:
            ceiling = min(ceiling, level[node])
            continue
        users = [u for u in node.users if u in level]
        if node in islands or not users or len(users) != len(node.users):
            continue
        target = min(min(level[u] for u in users), ceiling)
        if target > level[node]:
            level[node] = target
    return level


def _connect(module: torch.fx.GraphModule, pieces: list[Region | Island]) -> None:
    """Each region's inputs and outputs, and the grad mode and backend switches it runs
    in."""
    owner: dict[torch.fx.Node, Region] = {}
    for piece in pieces:
        if isinstance(piece, Region):
            owner.update((node, piece) for node in piece.nodes)
    grad = torch.is_grad_enabled()
    entered: dict[torch.fx.Node, switches.Switch] = {}
    for piece in pieces:
        if isinstance(piece, Island):
            if switches_grad_mode(piece.node):
                grad = bool(piece.node.args[0])
            elif switches_mode(piece.node):
                if piece.node.target is switches.leave:
                    entered.pop(piece.node.args[0], None)
                else:
                    entered[piece.node] = piece.node.target
            continue
        piece.grad_enabled = grad
        piece.switches = tuple(entered.values())
        for node in piece.nodes:
            for source in node.all_input_nodes:
                if owner.get(source) is not piece and source.op != "get_attr" and \
                        source not in piece.inputs:
                    piece.inputs.append(source)
    for node in module.graph.nodes:
        for source in node.all_input_nodes:
            region = owner.get(source)
            if region is not None and owner.get(node) is not region and \
                    source not in region.outputs:
                region.outputs.append(source)


def region_module(module: torch.fx.GraphModule, region: Region) -> torch.fx.GraphModule:
    """The region as a GraphModule of its own: its inputs are placeholders (named as the
    nodes they stand for), its result the tuple of its outputs."""
    graph = torch.fx.Graph()
    values: dict[torch.fx.Node, torch.fx.Node] = {}
    for source in region.inputs:
        values[source] = graph.placeholder(source.name)
        values[source].meta = dict(source.meta)
    for node in region.nodes:
        for source in node.all_input_nodes:
            if source.op == "get_attr" and source not in values:
                values[source] = graph.get_attr(source.target)
        values[node] = graph.node_copy(node, lambda n: values[n])
    graph.output(tuple(values[n] for n in region.outputs))
    return torch.fx.GraphModule(module, graph)


class Unknowable(Exception):
    """Nodes whose results ember cannot know before the graph runs (a shape that depends on
    data): they, and what reads them, run eagerly."""

    def __init__(self, islands: dict[str, str]):
        super().__init__(", ".join(islands))
        self.islands = islands


@dataclasses.dataclass
class Example:
    """What a region input is like when the region starts: tensor metadata, else the value."""

    tensor: bool
    value: Any = None
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    requires_grad: bool = False

    def stand_in(self, real: Any = None) -> Any:
        """A tensor like it (`real` itself when that one is already like it)."""
        if not self.tensor:
            return self.value
        if isinstance(real, torch.Tensor) and (tuple(real.shape), tuple(real.stride()),
                                               real.dtype, real.requires_grad) == \
                (self.shape, self.stride, self.dtype, self.requires_grad):
            return real
        tensor = torch.empty_strided(self.shape, self.stride, dtype=self.dtype,
                                     device=self.device)
        return tensor.requires_grad_() if self.requires_grad else tensor


def _example(value: Any) -> Example:
    if isinstance(value, torch.Tensor):
        return Example(True, shape=tuple(value.shape), stride=tuple(value.stride()),
                       dtype=value.dtype, device=value.device,
                       requires_grad=value.requires_grad)
    return Example(False, value)


def region_examples(partition: Partition, example_inputs: list[Any]
                    ) -> tuple[dict[int, list[Example]], dict[int, set[str]],
                               dict[int, set[int]]]:
    """Each region's inputs as they are when it starts, from a run of the pieces in their order
    on fake tensors (metadata, no data); each region's outputs that share memory with one
    of its inputs or an earlier output (aliases eager makes, which a later piece may write
    through); and the positions of each region's inputs that share memory with another of
    its inputs. Raises Unknowable where a region would read what only the data decides."""
    module = partition.module
    mode = torch_internals.make_fake_mode()
    interpreter = torch.fx.Interpreter(module, garbage_collect_values=False)
    env = interpreter.env
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        if isinstance(value, torch.Tensor):
            fake = torch_internals.fake_of(mode, value.detach())
            env[node] = fake.requires_grad_() if value.requires_grad else fake
        else:
            env[node] = value
    for node in module.graph.nodes:
        if node.op == "get_attr":
            env[node] = interpreter.run_node(node)
    eager = {piece.node.name for piece in partition.pieces if isinstance(piece, Island)}
    examples: dict[int, list[Example]] = {}
    aliased: dict[int, set[str]] = {}
    shared: dict[int, set[int]] = {}
    # (the graph may switch grad mode, and enter backend switches an error leaves entered)
    with mode, torch.set_grad_enabled(torch.is_grad_enabled()), switches.contained():
        for piece in partition.pieces:
            if isinstance(piece, Island):
                nodes = [piece.node]
            else:
                nodes = piece.nodes
                examples[piece.number] = [_example(env[n]) for n in piece.inputs]
                shared[piece.number] = _sharing_inputs([env[n] for n in piece.inputs])
                refused = {n: _refusal(env[n]) for n in piece.inputs if _refusal(env[n])}
                if refused:  # (a region takes plain tensors and plain values)
                    raise Unknowable({n.name: refused[s] for n in piece.nodes
                                      for s in n.all_input_nodes if s in refused})
            for node in nodes:
                try:
                    env[node] = interpreter.run_node(node)
                except Exception as error:  # noqa: BLE001 (the real run decides)
                    unknown = {node.name: f"its result depends on the data "
                                          f"({type(error).__name__})", **_followers(node)}
                    if set(unknown) - eager:
                        raise Unknowable(unknown) from None
                    # (already eager, it and its readers: nothing compiled waits on it)
            if isinstance(piece, Region):
                aliased[piece.number] = _aliases(piece, env)
    return examples, aliased, shared


def _sharing_inputs(values: list[Any]) -> set[int]:
    """Positions of the tensors among `values` whose memory another of them shares (a
    parameter and its detached alias from state_dict())."""
    by_storage: dict[int, list[int]] = {}
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.numel():
            by_storage.setdefault(torch_internals.storage_identity(value), []).append(position)
    return {p for positions in by_storage.values() if len(positions) > 1 for p in positions}


def _writes_to_shared(region: Region, lowered: Any, examples: list[Example],
                      shared: set[int]) -> dict[str, str]:
    """The region's in-place ops on an input whose memory another of its inputs shares: run
    eagerly. Compiled, the region takes the two as separate values, so a write through one
    is not seen through the other (an EMA's lerp_ through state_dict()'s detached alias,
    then mul_ through the parameter, each computed from the original values)."""
    if not shared:
        return {}
    tensors = [position for position, example in enumerate(examples) if example.tensor]
    written = {region.inputs[tensors[index]] for index, _ in lowered.graph.writebacks
               if index < len(tensors) and tensors[index] in shared}
    return {node.name: "it writes memory that another input of its compiled region shares"
            for node in region.nodes
            if keeps_its_place(node) and node.args and node.args[0] in written}


def _aliases(region: Region, env: dict[torch.fx.Node, Any]) -> set[str]:
    """The region's outputs whose memory is an input's or an earlier output's."""
    seen = {torch_internals.storage_identity(env[n]) for n in region.inputs
            if isinstance(env[n], torch.Tensor)}
    found = set()
    for node in region.outputs:
        value = env.get(node)
        if isinstance(value, torch.Tensor):
            key = torch_internals.storage_identity(value)
            if key in seen:
                found.add(node.name)
            seen.add(key)
    return found


def _refusal(value: Any) -> str | None:
    """Why a compiled region cannot take `value` from another piece, or None."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.is_nested:
            return f"reads a {value.layout} tensor an eager island made"
        if value.is_conj() or value.is_neg():  # (kernels read memory, not torch's bits)
            return "reads a lazily conjugated or negated tensor (torch's conj/neg bits)"
        return None
    if any(isinstance(v, torch.Tensor) for v in torch_internals.tree_flatten(value)[0]):
        return "reads a container of tensors an eager island made"
    return None


def _followers(node: torch.fx.Node) -> dict[str, str]:
    """Every node that reads `node`'s result, directly or not."""
    found: dict[str, str] = {}
    stack = list(node.users)
    while stack:
        user = stack.pop()
        if user.op in CALLS and user.name not in found:
            found[user.name] = f"reads {node.name}, whose shape depends on the data"
            stack.extend(user.users)
    return found


# Past this many rounds of finding islands (each lowers the regions that changed) a graph
# runs eagerly as a whole.
MAX_ROUNDS = 32


def find_islands(gm: torch.fx.GraphModule, example_inputs: list[Any],
                  islands: dict[str, str]) -> tuple | None:
    """Partition and lower until no region refuses a node: the partition, each region's
    example inputs, and region key → (its module, example inputs, its Lowered or what
    lowering raised); None past MAX_ROUNDS."""
    lowered: dict[tuple, tuple] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    device = module_device(gm)
    for node in gm.graph.nodes:  # (found at once, not a lowering round each)
        why = elsewhere(node, device) if node.op in CALLS and node.name not in islands else None
        if why is not None:
            islands[node.name] = why
    for _ in range(MAX_ROUNDS):
        partition = split(gm, islands)
        try:
            examples, aliased, shared = region_examples(partition, example_inputs)
        except Unknowable as unknown:
            islands.update({k: v for k, v in unknown.islands.items() if k not in islands})
            continue
        found = {}
        for region in partition.regions:
            if region.key() not in lowered:
                lowered[region.key()] = _lower_region(gm, region, examples[region.number],
                                                      placeholders, example_inputs)
            result = lowered[region.key()][2]
            if isinstance(result, Unsupported) and result.node not in (None, *islands):
                found[result.node] = result.reason
            elif not isinstance(result, Exception):
                found.update(_copies(region, result, aliased[region.number]))
                found.update(_writes_to_shared(region, result, examples[region.number],
                                               shared[region.number]))
        if not found:
            return partition, examples, lowered
        islands.update(found)
    return None


def _copies(region: Region, lowered: Any, aliased: set[str]) -> dict[str, str]:
    """Outputs that alias memory in eager but that the compiled region would hand over as
    fresh buffers (a detached value in a training graph: its own value from then on): run
    eagerly, so that a later write through them reaches what they alias."""
    if len(lowered.outputs) != len(region.outputs):  # (an output is a container: not checked)
        return {}
    return {node.name: "in eager its result shares memory that a later op may write; "
                       "compiled, it would be a copy"
            for node, spec in zip(region.outputs, lowered.outputs)
            if node.name in aliased and spec.kind == "node"}


def _lower_region(gm: torch.fx.GraphModule, region: Region, examples: list[Example],
                  placeholders: list[torch.fx.Node], example_inputs: list[Any]) -> tuple:
    """(the region's module, its example inputs, its Lowered or the exception lowering
    raised)."""
    module = region_module(gm, region)
    inputs = [example.stand_in(example_inputs[placeholders.index(node)]
                               if node.op == "placeholder" else None)
              for node, example in zip(region.inputs, examples)]
    try:
        with torch.set_grad_enabled(region.grad_enabled), switches.Switched(region.switches):
            return module, inputs, trace(module, inputs)
    except Unsupported as error:
        return module, inputs, error
    except Exception as error:  # an ember bug: this region runs eagerly, with a warning
        if "raise" in config.settings.logs:
            raise
        logs.channel("fallbacks").warning(
            "a region runs eagerly after an internal error in ember (please report it): "
            "%s: %s", type(error).__name__, error)
        return module, inputs, error
