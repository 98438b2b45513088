"""Kernels that compute the same thing on other buffers: a model's repeated layers schedule
one kernel per layer for each step of the layer (GPT-2's training backward: 199 Triton
kernels, 18 of them written).
Writing each costs milliseconds of a first call; writing one and renaming it for the others
costs microseconds.

`structure(kernel, plan)` is everything a kernel's writer reads of the schedule: the
kernel's space, the nodes it computes (op, attributes, inputs, shape, dtype, whether it is
a member and where it is stored), the nodes it loads (from which buffer, in what geometry)
and its stores — every node and every buffer named by the order it is first met in, not by
its identity (a constant is its value: the writers put it in as a literal, stored or
not). Two kernels of one plan with equal structures are written alike up to their
own name and the names of their buffers, the n-th met buffer of one standing where the
n-th of the other does. An attribute that is neither a plain value nor a node nor a buffer
enters by its type and repr: an object whose repr names its address never matches another.

EMBER_CHECK_REUSED_KERNELS=1 (the tests set it) writes every kernel anyway and raises where
the renamed one differs: a structure that misses what a writer reads is found there.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any

import torch

from ember import config
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.schedule.plan import Buffer, Kernel, Plan

Structure = tuple[tuple, list[Buffer]]


def structure(kernel: Kernel, plan: Plan) -> Structure | None:
    """The kernel's structure and its buffers (roots) in the order first met; None for a
    kernel that computes a matrix product (written each time)."""
    if kernel.matmul is not None:
        return None
    members = set(kernel.members)
    buffer_of = plan.buffer_of
    nodes: dict[Node, int] = {}
    described: list[tuple] = []
    roots: dict[Buffer, int] = {}

    def buffer(found: Buffer) -> tuple:
        chain = []
        while found.base is not None:
            chain.append(_geometry(found))
            found = found.base
        chain.append(_geometry(found))
        return roots.setdefault(found, len(roots)), tuple(chain)

    def value(item: Any) -> Any:
        if isinstance(item, Node):
            return "node", visit(item)
        if isinstance(item, Buffer):
            return "buffer", buffer(item)
        return _plain(item, value)

    def visit(node: Node) -> int:
        known = nodes.get(node)
        if known is not None:
            return known
        stored = buffer_of.get(node)
        if node.op is Op.FULL:  # (a literal wherever it is, stored or not)
            entry: tuple = ("full", value(node.attrs), node.dtype)
        elif stored is not None and node not in members and stored.role != "alias":
            entry = ("load", buffer(stored), node.dtype, value(node.shape))
        else:
            entry = (node.op, tuple(visit(source) for source in node.inputs),
                     value(node.attrs), value(node.shape), node.dtype, value(node.strides),
                     node in members, buffer(stored) if stored is not None else None)
        nodes[node] = len(described)
        described.append(entry)
        return nodes[node]

    stores = tuple((visit(item.node), buffer(item.buffer)) for item in kernel.stores)
    order = tuple(visit(member) for member in kernel.members)
    key = (value(kernel.shape), tuple(kernel.axes), stores, order, tuple(described))
    return key, list(roots)


def _geometry(buffer: Buffer) -> tuple:
    return (_plain(tuple(buffer.shape)), _plain(tuple(buffer.strides)), buffer.dtype,
            buffer.role, _plain(buffer.offset))


def _plain(item: Any, value: Any = None) -> Any:
    """A plain value with its type (True is not 1, 0.0 is not -0.0); containers by their
    items (`value` for items that may be nodes or buffers); anything else by type and
    repr."""
    value = value or _plain
    if item is None or isinstance(item, (bool, int, str)):
        return type(item).__name__, item
    if isinstance(item, float):
        return "float", repr(item)
    if isinstance(item, (tuple, list)):
        return type(item).__name__, tuple(value(x) for x in item)
    if isinstance(item, dict):
        return "dict", tuple((value(k), value(x)) for k, x in item.items())
    if isinstance(item, (torch.dtype, enum.Enum)):
        return type(item).__name__, str(item)
    return f"{type(item).__module__}.{type(item).__qualname__}", repr(item)


def renamed(written: Any, buffers: list[Buffer], kernel: Kernel, kernel_buffers: list[Buffer],
            prefix: str) -> Any:
    """`written` (what a kernel of the same structure was written as, over `buffers`: a C
    KernelSource, or Triton's KernelLaunches) written for `kernel` over `kernel_buffers`:
    its name and its parameters' names (`prefix` and the buffer's name) changed; each
    source says which it repeats (`same_as`). None where an argument is not among the
    buffers (written instead)."""
    mapping: dict[Any, Any] = dict(zip(buffers, kernel_buffers))
    # (a split reduction's workspaces, named after their kernel: kernel4_ws0, its own)
    spaces = getattr(written, "workspaces", None) or []
    own_spaces = [dataclasses.replace(space, name=kernel.name + space.name[len(written.name):])
                  for space in spaces]
    mapping.update(zip(spaces, own_spaces))
    sources = written.kernels if hasattr(written, "kernels") else [written]
    if any(argument not in mapping for source in sources for argument in source.arguments):
        return None
    names = {written.name: kernel.name}
    names.update((f"{prefix}{old.name}", f"{prefix}{new.name}") for old, new in mapping.items())
    names.update((old.name, new.name) for old, new in zip(spaces, own_spaces))
    for source in sources:  # (a split reduction's stages: kernel4_stage1)
        names.setdefault(source.name, kernel.name + source.name[len(written.name):])

    def rename(text: str) -> str:
        return re.sub(r"\b\w+\b", lambda word: names.get(word.group(), word.group()), text)

    def one(source: Any) -> Any:
        changes = dict(name=names[source.name], text=rename(source.text),
                       arguments=[mapping[argument] for argument in source.arguments],
                       same_as=source.same_as or source.name)
        if hasattr(source, "signature"):
            changes["signature"] = {names.get(name, name): kind
                                    for name, kind in source.signature.items()}
        return dataclasses.replace(source, **changes)

    if not hasattr(written, "kernels"):
        return one(written)
    return dataclasses.replace(written, name=kernel.name, kernels=[one(s) for s in sources],
                               workspaces=own_spaces)


def check(reused: Any, written: Any) -> None:
    """Raise where a renamed kernel differs from the kernel written (a structure that
    misses something its writer reads: a bug, never the user's)."""
    mine, theirs = getattr(reused, "kernels", [reused]), getattr(written, "kernels", [written])
    pairs = list(zip(mine, theirs))
    fields = [field.name for field in dataclasses.fields(theirs[0]) if field.name != "same_as"]
    if len(mine) != len(theirs) or getattr(reused, "row", None) != getattr(written, "row", None) \
            or _spaces(getattr(reused, "workspaces", [])) != \
            _spaces(getattr(written, "workspaces", [])) \
            or any(_comparable(getattr(a, name)) != _comparable(getattr(b, name))
                   for a, b in pairs for name in fields):
        texts = "\n".join(f"--- reused:\n{a.text}\n--- written:\n{b.text}" for a, b in pairs)
        raise AssertionError(f"{written.name}, written as a renamed kernel of the same "
                             f"structure, differs from its own writing:\n{texts}")


def _spaces(spaces: list) -> list[tuple]:
    return [(space.name, tuple(space.shape), space.dtype) for space in spaces]


def _comparable(value: Any) -> Any:
    """Arguments as the writers made them: buffers by identity (the plan's own), a split
    reduction's workspaces by name, shape and dtype (each writing makes its own)."""
    if isinstance(value, list):
        return [_spaces([item])[0] if hasattr(item, "dtype") and not isinstance(item, Buffer)
                else item for item in value]
    return value


def write_all(kernels: list[Kernel], plan: Plan, write: Any, prefix: str,
              own: Any = frozenset()) -> list[Any]:
    """`write(kernel)` for each kernel, except a kernel of a structure written before,
    renamed from that one instead (written too, and compared, under
    EMBER_CHECK_REUSED_KERNELS=1). The kernels named in `own` (max-autotune's choices) are
    written each time."""
    written_as: list[Any] = []
    first_of: dict[tuple, tuple[Any, list[Buffer]]] = {}
    for kernel in kernels:
        found = structure(kernel, plan) if kernel.name not in own else None
        earlier = first_of.get(found[0]) if found is not None else None
        reused = renamed(*earlier, kernel, found[1], prefix) if earlier else None
        if reused is None or config.settings.check_reused_kernels:
            source = write(kernel)
            if reused is not None:
                check(reused, source)
            elif found is not None:
                first_of[found[0]] = (source, found[1])
            reused = reused or source
        written_as.append(reused)
    return written_as
