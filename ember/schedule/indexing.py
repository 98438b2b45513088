"""Index maps: for a node read at some index, which input elements it reads.

`index_rules` maps a view's output index to its input's index (views are index maps, never
copies). `reads` walks from a node through everything that will be inlined into it and lists
the realized nodes it touches with the index of each touch; the scheduler fuses by comparing
those indices, and codegen uses the same maps to address memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ember.ir.graph import Node
from ember.ir.ops import Kind, Op
from ember.schedule.expr import (
    ZERO,
    Expr,
    Opaque,
    proved_le,
    proved_lt,
    ravel,
    symbolic_range,
    unravel,
)

Index = tuple[Expr, ...]
IndexRule = Callable[[Node, Index], Index]
index_rules: dict[Op, IndexRule] = {}


def _rule(op: Op):
    def register(fn: IndexRule) -> IndexRule:
        index_rules[op] = fn
        return fn

    return register


_reshaped: dict[tuple, Index] = {}  # (shape, source shape, index) -> the source's index
_RESHAPED_KEPT = 1 << 16


@_rule(Op.RESHAPE)
def _reshape(node: Node, index: Index) -> Index:
    """(Kept: a graph's reshapes between the same shapes are read at the same indices again
    and again, by each kernel that inlines them and each question the schedule asks.)"""
    source = node.inputs[0]
    key = (node.shape, source.shape, index)
    found = _reshaped.get(key)
    if found is None:
        if len(_reshaped) >= _RESHAPED_KEPT:
            _reshaped.clear()
        found = _reshaped[key] = _reshaped_index(index, node.shape, source.shape)
    return found


def _reshaped_index(index: Index, shape: tuple, source: tuple) -> Index:
    """The source's index of a reshape read at `index`, dims merged or split group by group
    (runs of dims whose sizes multiply to the same on both sides), not through one position
    over the whole shape: where an index is out of its dim's range under a check that skips
    the read (a pad's border, a cat's other pieces), the whole shape's position carries
    into the dims before it, and its division and remainder stay in the kernel. A depthwise
    convolution's taps over a channels-last view (timm's PVT-v2: `x.transpose(1, 2).view(B,
    C, H, W)`) read the image at `(position + 239) % 256 + 256 * ((position + 239) / 256)`
    and the like, per tap and element: the kernel took 4.7 ms where its taps are 0.3 ms of
    arithmetic (2026-12-07)."""
    groups = _reshape_groups(shape, source)
    if groups is None:
        return tuple(unravel(ravel(index, shape), source))
    result: list[Expr] = [ZERO] * len(source)
    for dims, source_dims in groups:
        within = ravel([index[d] for d in dims], [shape[d] for d in dims])
        for d, coordinate in zip(source_dims, unravel(within, tuple(source[d]
                                                                     for d in source_dims))):
            result[d] = coordinate
    return tuple(result)


def _reshape_groups(shape: tuple, source: tuple
                    ) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """Pairs (dims of `shape`, dims of `source`) covering both in order, each pair's sizes
    multiplying to the same; dims of size 1 left over on either side join no pair (their
    index is 0). None where a size is 0, or symbolic sizes do not pair off one to one."""
    if any(d == 0 for d in (*shape, *source)):
        return None
    dims = [d for d, n in enumerate(shape) if n != 1]
    source_dims = [d for d, n in enumerate(source) if n != 1]
    groups = []
    i = j = 0
    while i < len(dims) and j < len(source_dims):
        mine, theirs = [dims[i]], [source_dims[j]]
        a, b = shape[dims[i]], source[source_dims[j]]
        i, j = i + 1, j + 1
        while a != b:
            if not (isinstance(a, int) and isinstance(b, int)):
                return None
            if a < b and i < len(dims):
                a *= shape[dims[i]]
                mine.append(dims[i])
                i += 1
            elif b < a and j < len(source_dims):
                b *= source[source_dims[j]]
                theirs.append(source_dims[j])
                j += 1
            else:
                return None
        groups.append((tuple(mine), tuple(theirs)))
    if i < len(dims) or j < len(source_dims):
        return None
    return groups


@_rule(Op.PERMUTE)
def _permute(node: Node, index: Index) -> Index:
    result = [ZERO] * len(index)
    for position, axis in enumerate(node.attrs["perm"]):
        result[axis] = index[position]
    return tuple(result)


@_rule(Op.EXPAND)
def _expand(node: Node, index: Index) -> Index:
    source = node.inputs[0]
    return tuple(ZERO if n == 1 else i for i, n in zip(index, source.shape))


@_rule(Op.SLICE)
def _slice(node: Node, index: Index) -> Index:
    dim, start, step = node.attrs["dim"], node.attrs["start"], node.attrs["step"]
    result = list(index)
    result[dim] = index[dim] * step + start
    return tuple(result)


@_rule(Op.SQUEEZE)
def _squeeze(node: Node, index: Index) -> Index:
    dims = node.attrs["dims"]
    result, position = [], 0
    for d in range(node.inputs[0].ndim):
        if d in dims:
            result.append(ZERO)
        else:
            result.append(index[position])
            position += 1
    return tuple(result)


@_rule(Op.UNSQUEEZE)
def _unsqueeze(node: Node, index: Index) -> Index:
    dim = node.attrs["dim"]
    return index[:dim] + index[dim + 1:]


@_rule(Op.FLIP)
def _flip(node: Node, index: Index) -> Index:
    dims = node.attrs["dims"]
    return tuple((i * -1 + (n - 1)) if d in dims else i
                 for d, (i, n) in enumerate(zip(index, node.shape)))


@_rule(Op.AS_STRIDED)
def _as_strided(node: Node, index: Index) -> Index:
    flat = Expr.of(node.attrs["offset"])
    for position, stride in zip(index, node.attrs["strides"]):
        flat = flat + position * stride
    return tuple(unravel(flat, node.inputs[0].shape))


def pad_source(node: Node, index: Index) -> tuple[Index, list[tuple[Expr, int, int]]]:
    """The input index a pad reads at `index`, and the checks (expr, size, step) that say it
    reads the input at all: 0 <= expr < size*step and expr % step == 0 (trivial ones dropped)."""
    source, checks = pad_checks(node, index)
    return source, [check for _, *check in checks]


def pad_checks(node: Node, index: Index) -> tuple[Index, list[tuple[int, Expr, int, int]]]:
    """pad_source's answer with each check's dim: (dim, expr, size, step)."""
    source, checks = [], []
    for dim, (position, n, (low, _high, interior)) in enumerate(
            zip(index, node.inputs[0].shape, node.attrs["pads"])):
        step = interior + 1
        relative = position - low
        source.append(relative // step)
        lowest, highest = symbolic_range(relative)
        if step > 1 or not (proved_le(0, lowest) and proved_le(highest, (n - 1) * step)):
            checks.append((dim, relative, n, step))
    return tuple(source), checks


def cat_pieces(node: Node, index: Index) -> list[tuple[Node, Index, int, int]]:
    """(input, its index, first, end) per input of a cat: the input holds [first, end)."""
    dim = node.attrs["dim"]
    pieces, first = [], 0
    for source in node.inputs:
        end = first + source.shape[dim]
        local = list(index)
        local[dim] = index[dim] - first
        pieces.append((source, tuple(local), first, end))
        first = end
    return pieces


def cat_pieces_reached(node: Node, index: Index) -> list[tuple[Node, Index, int, int]]:
    """The pieces of a cat that positions in `index`'s range along the cat dim fall in (the
    first alone when that range is empty, as in a kernel over an empty extent: never run)."""
    low, high = symbolic_range(index[node.attrs["dim"]])
    pieces = cat_pieces(node, index)
    return [p for p in pieces
            if not (proved_lt(high, p[2]) or proved_le(p[3], low))] or pieces[:1]


def take_source(node: Node, index: Index, selected: Expr) -> tuple[Index, Index]:
    """(index into the index tensor, index into x) of a take, given the selected position."""
    dim = node.attrs["dim"]
    width = node.inputs[1].ndim
    return index[dim:dim + width], index[:dim] + (selected,) + index[dim + width:]


def input_indices(node: Node, index: Index) -> list[tuple[Node, Index]]:
    """The (input, index) pairs a pointwise, view or data node reads at `index`.
    Data-dependent positions (take, gather) appear as Opaque atoms."""
    kind = node.kind
    if kind is Kind.POINTWISE:
        return [(source, index) for source in node.inputs]
    if kind is Kind.VIEW:
        return [(node.inputs[0], index_rules[node.op](node, index))]
    if node.op is Op.PAD:
        return [(node.inputs[0], pad_source(node, index)[0])]
    if node.op is Op.CAT:
        return [(source, local) for source, local, _, _ in cat_pieces(node, index)]
    if node.op is Op.TAKE:
        x = node.inputs[0]
        selected = Expr.of(Opaque(f"take{node.id}", 0, x.shape[node.attrs["dim"]] - 1))
        index_at, x_at = take_source(node, index, selected)
        return [(node.inputs[1], index_at), (x, x_at)]
    if node.op is Op.GATHER:
        x, dim = node.inputs[0], node.attrs["dim"]
        selected = Expr.of(Opaque(f"gather{node.id}", 0, x.shape[dim] - 1))
        return [(node.inputs[1], index), (x, index[:dim] + (selected,) + index[dim + 1:])]
    if kind is Kind.LEAF:
        return []
    raise AssertionError(f"{node.op.value} is always realized; it has no inline index map")


def reads(node: Node, index: Index, is_boundary: Callable[[Node], bool]
          ) -> Iterator[tuple[Node, Index]]:
    """Every (boundary node, index) that computing `node` at `index` touches, inlining every
    node that is not a boundary. `node` itself is expanded even if it is a boundary."""
    seen: set[tuple[int, Index]] = set()
    stack = input_indices(node, index)
    while stack:
        current, at = stack.pop()
        key = (id(current), at)
        if key in seen:
            continue
        seen.add(key)
        if is_boundary(current):
            yield current, at
        else:
            stack.extend(input_indices(current, at))
