"""Values a graph makes from constants on another device, computed once when it compiles.

Models build small tables on the CPU and move them to their device on every call: ConViT's
relative positions (`torch.zeros`, `arange`, writes into the table, `.to(device)`), MPNet's
position buckets, XLNet's and Data2Vec's `arange`/`eye`. In a graph on CUDA each such node is
an eager island (partition.elsewhere): an eager call per node per call, and a copy from the
host. Such work depends on nothing the graph takes (no input, no attribute of the model), draws
no random numbers and writes only into tensors it made: its result is the same on every call
the graph's guards admit. It is computed here as eager computes it, op by op on the same
devices, and where it reaches the graph's device its result becomes a constant of the graph
(an attribute of the GraphModule, as a model's buffers are), so the graph compiles whole. An
index made on the CPU that only picks from a tensor on the graph's device (`table[index]`:
Data2Vec-Vision's and BEiT's relative positions; torch moves such an index itself) is moved
there once, as a constant too.

A result is kept only where nothing after reads it in a way that could tell: neither it nor a
view of it is written by a later node, no view of it is an output (a caller may write into
what it gets; it is returned itself as a copy made per call), and it holds at most
MOST_ELEMENTS elements.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ember import torch_internals
from ember.lower.devices import same_device
from ember.partition import (
    CALLS,
    draws,
    elsewhere,
    example_value,
    module_device,
    switches_mode,
    writes,
)

MOST_ELEMENTS = 1 << 20


def fold_constants_elsewhere(gm: torch.fx.GraphModule) -> int:
    """Fold, in place, the work `gm` does from constants on another device than its own
    (module docstring); the number of constants it now holds for it (0: unchanged)."""
    device = module_device(gm)
    if device is None:
        return 0
    _drop_unread_comparisons(gm, device)
    constant = _constant_nodes(gm)
    foreign = [n for n in constant if _on_another_device(n, device)]
    if not foreign:
        return 0
    component = _component(foreign, constant)
    boundary = [n for n in component if any(u not in constant for u in n.users)]
    if not boundary or not all(_keepable(n, device) for n in boundary):
        return 0
    values = _evaluate(gm, component)
    for k, node in enumerate(boundary):
        name = f"_ember_constant_{k}"
        while hasattr(gm, name):
            name += "_"
        value = values[node]
        index = not same_device(example_value(node).device, device)  # (_an_index_only)
        moved = value.to(device) if index else value
        gm.register_buffer(name, moved, persistent=False)
        with gm.graph.inserting_before(node):
            attribute = gm.graph.get_attr(name)
        attribute.meta.update(node.meta)
        if index:  # (now on the graph's device: its example too)
            attribute.meta["example_value"] = torch_internals.fake_of(
                torch_internals.fake_mode_of(example_value(node)), moved)
        node.replace_all_uses_with(attribute)
        for output in [u for u in attribute.users if u.op == "output"]:
            # (a caller gets a tensor of its own each call, as eager's: ConViT keeps it as
            # an attribute of the model)
            with gm.graph.inserting_before(output):
                copy = gm.graph.call_method("clone", (attribute,))
            copy.meta.update(node.meta)
            output.replace_input_with(attribute, copy)
    for node in reversed(_erasable(component)):
        gm.graph.erase_node(node)
    gm.recompile()
    return len(boundary)


# Python's operators on tensors that only compute (no in-place spelling, no item assignment)
_PURE_OPERATORS = {operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
                   operator.ne, operator.not_, operator.neg, operator.pos, operator.abs,
                   operator.invert, operator.and_, operator.or_, operator.xor, operator.add,
                   operator.sub, operator.mul, operator.truediv, operator.floordiv,
                   operator.mod, operator.pow}


def _drop_unread_comparisons(gm: torch.fx.GraphModule, device: torch.device) -> None:
    """Erase the operators on another device's tensors whose results nothing reads: a layer
    drop's `torch.rand([]) < p` on the CPU once the capture decided its branch (BART, Whisper
    and wav2vec2 in training: otherwise an eager island per layer beside the draw, which stays
    for the generator). Only Python's own operators: an op ember does not know may be an
    error check with no result."""
    erased = 0
    for node in reversed(list(gm.graph.nodes)):  # (a chain: its last node first)
        if node.op == "call_function" and node.target in _PURE_OPERATORS and \
                not node.users and elsewhere(node, device) is not None:
            gm.graph.erase_node(node)
            erased += 1
    if erased:
        gm.recompile()


def _constant_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Calls that depend on no placeholder and no attribute, draw nothing, switch no mode,
    call no module and make nothing that requires grad; their writes land in tensors made by
    such calls only (their every input is one)."""
    constant: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op not in CALLS or node.op == "call_module" or draws(node) or \
                switches_mode(node) or node.kwargs.get("requires_grad") is True:
            continue
        if all(source in constant for source in _sources(node)):
            constant.add(node)
    return constant


def _sources(node: torch.fx.Node) -> list[torch.fx.Node]:
    """What a call's value depends on: its input nodes, but for `x.to(other)` `x` alone
    (`other` gives only its device and dtype, which the graph's guards hold: XLNet's
    `-torch.eye(qlen).to(attn_mask)`)."""
    if _moved_like(node) is not None:
        return [node.args[0]]
    return node.all_input_nodes


def _moved_like(node: torch.fx.Node) -> torch.Tensor | None:
    """`other`'s example value where `node` is `x.to(other)`, else None."""
    if node.op != "call_method" or node.target != "to" or len(node.args) != 2 or \
            not isinstance(node.args[0], torch.fx.Node) or \
            not isinstance(node.args[1], torch.fx.Node):
        return None
    value = example_value(node.args[1])
    return value if isinstance(value, torch.Tensor) else None


def _on_another_device(node: torch.fx.Node, device: torch.device) -> bool:
    return any(isinstance(value, torch.Tensor) and not same_device(value.device, device)
               for value in torch_internals.tree_flatten(example_value(node))[0])


def _component(foreign: list[torch.fx.Node], constant: set[torch.fx.Node]
               ) -> list[torch.fx.Node]:
    """The constant nodes that lead to the foreign ones or follow from them, in graph order
    (what their values need, and what they feed up to the graph's own nodes)."""
    found: set[torch.fx.Node] = set()
    stack = list(foreign)
    while stack:  # (downstream, within the constant nodes: the writes into them included)
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(u for u in node.users if u in constant)
    stack = list(found)
    while stack:  # (and what those read)
        node = stack.pop()
        for source in _sources(node):
            if source not in found:
                found.add(source)
                stack.append(source)
    graph_order = {n: i for i, n in enumerate(next(iter(found)).graph.nodes)}
    return sorted(found, key=graph_order.__getitem__)


def _keepable(node: torch.fx.Node, device: torch.device) -> bool:
    """May `node`'s value be computed once and kept? A tensor on the graph's device, small,
    and no view of it is returned, nor it or a view written, by what follows (it may be
    returned itself: the caller gets a copy)."""
    value = example_value(node)
    if not isinstance(value, torch.Tensor) or value.numel() > MOST_ELEMENTS:
        return False
    if not same_device(value.device, device) and not _an_index_only(node, device):
        return False
    memory = torch_internals.storage_identity(value)
    aliases = {node}
    after = False
    for later in node.graph.nodes:
        after = after or later is node
        if not after or later is node or not any(s in aliases for s in later.all_input_nodes):
            continue
        if later.op == "output":
            if any(a in aliases - {node} for a in later.all_input_nodes):
                return False
            continue
        if later.op == "call_module" or writes(later):
            return False
        if any(isinstance(v, torch.Tensor) and torch_internals.storage_identity(v) == memory
               for v in torch_internals.tree_flatten(example_value(later))[0]):
            aliases.add(later)
    return True


def _an_index_only(node: torch.fx.Node, device: torch.device) -> bool:
    """Is `node` (a tensor on another device than the graph's) read only as the index of
    `source[node]` where `source` lies on the graph's device? Then it may move there: torch
    moves such an index itself (Data2Vec-Vision's and BEiT's relative position index, made on
    the CPU per call, picks from a CUDA table)."""
    if torch_internals.fake_mode_of(example_value(node)) is None or not node.users:
        return False
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem or \
                len(user.args) != 2 or user.args[1] is not node or user.args[0] is node:
            return False
        source = example_value(user.args[0]) if isinstance(user.args[0], torch.fx.Node) \
            else None
        if not isinstance(source, torch.Tensor) or not same_device(source.device, device):
            return False
    return True


def _evaluate(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, Any]:
    """The nodes' real values, run in graph order as eager runs them."""
    values: dict[torch.fx.Node, Any] = {}
    with torch.no_grad():
        for node in nodes:
            model = _moved_like(node)
            if model is not None:
                kwargs = torch.fx.node.map_arg(node.kwargs, values.__getitem__)
                values[node] = values[node.args[0]].to(device=model.device, dtype=model.dtype,
                                                       **kwargs)
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
            if node.op == "call_method":
                receiver, *rest = args
                values[node] = getattr(receiver, node.target)(*rest, **kwargs)
            else:
                values[node] = node.target(*args, **kwargs)
    return values


def _erasable(component: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The component's nodes nothing reads any more (their boundary's readers now read the
    constants), in graph order; a write stays while what it writes into stays."""
    erasable = set(component)
    changed = True
    while changed:
        changed = False
        for node in component:
            if node not in erasable:
                continue
            read_elsewhere = any(u not in erasable for u in node.users)
            writes_kept = writes(node) and any(s not in erasable for s in node.all_input_nodes)
            if read_elsewhere or writes_kept:
                erasable.discard(node)
                changed = True
    return [n for n in component if n in erasable]
