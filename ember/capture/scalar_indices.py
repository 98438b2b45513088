"""Subscripts with 0-d integer tensors: `x[i]`, `x[:, i]`, `x[i] = v` where `i` is a 0-d
integer tensor (a diffusion scheduler's `alphas[t]`, a loop over `torch.arange(n)`).

Eager reads i's value and indexes with that number: `x[i]` is the view `x.select(d, i)`,
whose offset depends on a tensor's value, which a graph cannot make. Capture takes a gather
instead — `aten.index` with `i` at dimension d — which gives eager's values, eager's
IndexError for an index out of range (negative ones count from the end as select's do) and
eager's gradient. It differs from eager's view only where something writes the result or the
tensor it came from afterwards, or the result leaves the graph (as an output, a resumed
frame's local, a side effect's value): the capture assumes none of that happens and checks at
its end (`check`); where one does, it starts again with that subscript refused
(ViewsRefused), which then breaks the graph as it did before.

`x[i] = v` writes through the view eager makes; where the rest of the subscript is full
slices, the write is `index_put_` at the same elements, exact with no assumption.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from ember import torch_internals
from ember.capture.errors import ViewsRefused
from ember.capture.values import Const, SequenceValue, SliceValue, TensorValue, Value

if TYPE_CHECKING:
    from ember.capture.session import Session

_INDEX = torch.ops.aten.index.Tensor


@dataclasses.dataclass
class CopiedView:
    """A gather standing for eager's select view (`copy` of `base`), with each one's version
    counter as it was when the gather was made (views share their base's counter: a write
    to either, or to any view of either, moves it)."""

    base: torch.Tensor
    base_version: int
    copy: torch.Tensor
    copy_version: int
    site: tuple  # the subscript's (code, instruction offset)
    key: Value   # (as the subscript took it: `x[t] += v` stores through the same one)


def _as_items(key: Value) -> list[Value] | None:
    if isinstance(key, SequenceValue) and key.kind is tuple:
        return list(key.items)
    return [key]


def _is_scalar_index(item: Value) -> bool:
    """A 0-d integer tensor, which eager indexes with as a number (bool and uint8 ones are
    masks: `x[torch.tensor(True)]` adds a dimension)."""
    return isinstance(item, TensorValue) and item.fake.dim() == 0 and \
        not item.fake.dtype.is_floating_point and not item.fake.dtype.is_complex and \
        item.fake.dtype not in (torch.bool, torch.uint8)


def _dims_consumed(item: Value) -> int | None:
    """How many of the indexed tensor's dimensions a subscript item consumes; None for
    Ellipsis, and for anything this walk does not know (the subscript is left alone)."""
    if isinstance(item, SliceValue):
        return 1
    if isinstance(item, TensorValue):
        if item.fake.dtype in (torch.bool, torch.uint8):
            return item.fake.dim()
        return 1
    if isinstance(item, SequenceValue) and item.kind is list:
        return 1
    if isinstance(item, Const):
        value = item.value
        if value is None or isinstance(value, bool):
            return 0
        if isinstance(value, (int, torch.SymInt)):
            return 1
    return None


def scalar_positions(items: list[Value], ndim: int) -> dict[int, int] | None:
    """{item's position: the dimension it indexes} for the 0-d integer tensors of a
    subscript of a tensor of `ndim` dimensions; None where it has none, or an item this
    walk does not know."""
    ellipses = [i for i, item in enumerate(items)
                if isinstance(item, Const) and item.value is Ellipsis]
    consumed = [0 if i in ellipses else _dims_consumed(item) for i, item in enumerate(items)]
    if len(ellipses) > 1 or any(c is None for c in consumed):
        return None
    positions, dim = {}, 0
    for i, item in enumerate(items):
        if i in ellipses:
            dim += ndim - sum(consumed)
        elif _is_scalar_index(item):
            positions[i] = dim
        dim += consumed[i]
    return positions or None


def get_item(session: Session, container: TensorValue, key: Value) -> Value | None:
    """`container[key]` with 0-d integer tensors in the key, as a gather per such tensor
    then the rest of the subscript; None where the key has none or the capture may not
    assume (the caller's subscript breaks the graph)."""
    from ember.capture.item_semantics import get_item as plain_get_item

    frame = session.builder.frame
    site = (frame.code, frame.current.offset) \
        if frame is not None and frame.current is not None else None
    if site is None or site in session.views_refused:
        return None
    items = _as_items(key)
    positions = scalar_positions(items, container.fake.dim())
    if positions is None or (container.fake.device.type != "cpu" and not session.assuming):
        return None
    gathered = container
    for position in sorted(positions, key=positions.__getitem__, reverse=True):
        dim = positions[position]
        index = _in_range(session, gathered, dim, items[position])
        if index is None:
            return None
        indices = [Const(None)] * dim + [index]
        gathered = session.builder.call("call_function", _INDEX,
                                        (gathered, SequenceValue(indices, list)), {})
    session.copied_views.append(CopiedView(container.fake, container.fake._version,
                                           gathered.fake, gathered.fake._version, site, key))
    rest = [item for i, item in enumerate(items) if i not in positions]
    if not rest:
        return gathered
    return plain_get_item(session, gathered, SequenceValue(rest, tuple))


def set_item(session: Session, container: TensorValue, key: Value, value: Value) -> bool:
    """`container[key] = value` where the key holds 0-d integer tensors beside basic items
    (slices, numbers, None, an Ellipsis): the rest of the key, with each 0-d tensor kept as a
    full slice, is the view eager writes through; `index_put_` of the value at the 0-d
    tensors' dimensions of that view (the value cast to the container's dtype and device, as
    copy_ casts it). False where the key holds anything else (an advanced index beside)."""
    from ember.capture.item_semantics import get_item as plain_get_item

    items = _as_items(key)
    positions = scalar_positions(items, container.fake.dim())
    if positions is None:
        return False
    kept = _kept_dims(items, positions, container.fake.dim())
    if kept is None or (container.fake.device.type != "cpu" and not session.assuming):
        return False
    fake = container.fake
    if isinstance(value, TensorValue):
        if value.fake.dim() > fake.dim() - len(positions):
            return False  # (copy_ drops the value's leading ones; index_put_ does not)
    elif not (isinstance(value, Const) and isinstance(value.value, (int, float, complex))):
        return False
    written_back = _written_back(session, container, key, value)
    target = container
    if not all(i in positions or _full_slice(item) or _is_ellipsis(item)
               for i, item in enumerate(items)):
        full = SliceValue(Const(None), Const(None), Const(None))
        target = plain_get_item(session, container, SequenceValue(
            [full if i in positions else item for i, item in enumerate(items)], tuple))
    indices: list[Value] = [Const(None)] * (max(kept.values()) + 1)
    for position, dim in kept.items():
        index = _in_range(session, target, dim, items[position])
        if index is None:
            return False
        indices[dim] = index
    if isinstance(value, TensorValue):
        if torch_internals.storage_identity(value.fake) == \
                torch_internals.storage_identity(fake):
            # (`x[t] += v` resumed after a break: the value is eager's view of the very
            # elements written; index_put_ refuses a source that overlaps its target)
            value = session.builder.call("call_method", "clone", (value,), {})
        if value.fake.dtype != fake.dtype or value.fake.device != fake.device:
            value = session.builder.call("call_method", "to", (value,),
                                         {"dtype": Const(fake.dtype),
                                          "device": Const(fake.device)})
    else:
        value = session.builder.call("call_function", torch.scalar_tensor, (value,),
                                     {"dtype": Const(fake.dtype), "device": Const(fake.device)})
    session.builder.call("call_function", torch.ops.aten.index_put_.default,
                         (target, SequenceValue(indices, list), value), {})
    if written_back is not None:  # (the gather was the statement's own temporary: gone)
        session.copied_views.remove(written_back)
    return True


def _kept_dims(items: list[Value], positions: dict[int, int], ndim: int
               ) -> dict[int, int] | None:
    """{item's position: its dimension in the view the key makes with each 0-d tensor taken
    as a full slice}; None where an item is not basic (a tensor or list index, a bool)."""
    consumed = sum(_dims_consumed(item) or 0 for item in items if not _is_ellipsis(item))
    kept, dim = {}, 0
    for i, item in enumerate(items):
        if i in positions:
            kept[i] = dim
            dim += 1
        elif _is_ellipsis(item):
            dim += ndim - consumed
        elif isinstance(item, SliceValue) or (isinstance(item, Const) and item.value is None):
            dim += 1
        elif not (isinstance(item, Const) and isinstance(item.value, (int, torch.SymInt)) and
                  not isinstance(item.value, bool)):
            return None
    return kept


def _is_ellipsis(item: Value) -> bool:
    return isinstance(item, Const) and item.value is Ellipsis


def _written_back(session: Session, container: TensorValue, key: Value, value: Value
                  ) -> CopiedView | None:
    """The gather that `container[key] = value` writes back, where the store ends an
    augmented assignment `x[t] += v` (or `x[t, 1:] *= v`) of it: the value is the gather or
    a view of it made by that statement's subscript (the same key), written once by its
    in-place operator, and nothing ran since but the stack's swaps — so no one read the base
    between, eager's base holds after the store what ember's holds, and the temporary the
    gather stood for is gone with the statement."""
    frame = session.builder.frame
    if frame is None or frame.current is None or frame.current.opname != "STORE_SUBSCR" or \
            not isinstance(value, TensorValue):
        return None
    before = frame.index_of[frame.current.offset] - 1
    while before >= 0 and frame.instructions[before].opname == "SWAP":
        before -= 1
    operator_ = frame.instructions[before] if before >= 0 else None
    if operator_ is None or operator_.opname != "BINARY_OP" or \
            not operator_.argrepr.endswith("="):
        return None
    shared = torch_internals.storage_identity(value.fake)
    for view in session.copied_views:
        if torch_internals.storage_identity(view.copy) == shared and \
                view.base is container.fake and view.key is key and \
                view.site[0] is frame.code and view.copy._version == view.copy_version + 1:
            return view
    return None


def _in_range(session: Session, tensor: TensorValue, dim: int, index: TensorValue
              ) -> TensorValue | None:
    """The index the gather (or index_put_) takes at `dim`. On the CPU the index itself: the
    kernel raises eager's IndexError for one out of range. On a GPU an index out of range is a
    device-side assert, which ends the process's use of the device, where eager reads the
    number and raises IndexError: there the gather takes the index modulo the size (always
    in range; eager's element for any index in range), and the capture assumes the index is
    in range — the runner tests it after the graph, and where it is not, the call runs
    eagerly from its start (AssumptionFailed: eager's IndexError). None where the capture may
    not assume, or the dimension is empty (the caller's subscript breaks)."""
    from ember.capture.calls import call_tensor_method
    from ember.capture.semantics import binary

    on_cpu = tensor.fake.device.type == "cpu"
    if not on_cpu and (not session.assuming or tensor.fake.shape[dim] == 0):
        return None  # (before any node is made: the caller's break finds the graph as it was)
    index = _long(session, index, tensor.fake.device)
    if on_cpu:
        return index
    size = call_tensor_method(session, tensor, "size", [Const(dim)], {})
    below = binary(session, "<", index, size)
    above = binary(session, ">=", binary(session, "+", index, size), Const(0))
    frame = session.builder.frame
    session.assumptions.append((binary(session, "&", below, above), True, frame.location()))
    return binary(session, "%", index, size)


def _long(session: Session, index: TensorValue, device: torch.device) -> TensorValue:
    """The index as the gather takes it: int64 or int32 (eager's number reads any integer),
    on the indexed tensor's device (eager reads a CPU index's number for a CUDA tensor)."""
    if index.fake.dtype in (torch.int64, torch.int32) and index.fake.device == device:
        return index
    return session.builder.call("call_method", "to", (index,),
                                {"device": Const(device), "dtype": Const(torch.int64)})


def _full_slice(item: Value) -> bool:
    return isinstance(item, SliceValue) and all(
        isinstance(part, Const) and part.value is None
        for part in (item.start, item.stop, item.step))


def check(session: Session, outputs: list[TensorValue]) -> None:
    """At a graph's end: refuse (ViewsRefused: the capture starts again, each such subscript
    a break) the gathers standing for views that were written, whose base was written after
    them, or that (or a view of them) leave the graph."""
    leaving = {torch_internals.storage_identity(v.fake) for v in outputs}
    refused = {view.site for view in session.copied_views
               if view.base._version != view.base_version or
               view.copy._version != view.copy_version or
               torch_internals.storage_identity(view.copy) in leaving}
    if refused:
        raise ViewsRefused(refused)
