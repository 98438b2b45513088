"""Builds IR nodes with torch's semantics: broadcasting, type promotion, Python scalars.

Lowering rules call these helpers instead of `Graph.add` so that every rule promotes and
broadcasts the same way eager does. Trivial nodes (a cast to the same dtype, a reshape to the
same shape) are never built. View helpers build only view nodes, so the tracer can read a
view's index map back as the chain of nodes between the base and the view.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ember.ir import dtypes
from ember.ir.graph import Graph, Node, Shape, row_major
from ember.ir.library import Slot
from ember.ir.ops import COMPARISONS, FLOAT_ONLY, Op
from ember.ir.sizes import Dim, Size, Undecided

Scalar = bool | int | float
Operand = Node | Scalar

_WIDE_SCALAR_OPS = frozenset({Op.MUL, Op.DIV})
_WIDE_SCALAR_OPS_CUDA = _WIDE_SCALAR_OPS | {Op.ADD, Op.SUB}


def _number(value: Operand) -> bool:
    """A Python int or float (not a bool, a node or a symbolic size)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def broadcast_shapes(*shapes: Shape) -> Shape:
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for position in range(rank):
        sizes = {s[len(s) - rank + position] for s in shapes if len(s) - rank + position >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def slice_indices(start: Dim | None, stop: Dim | None, step: int, size: Dim
                  ) -> tuple[Dim, Dim, int]:
    """Python's slice(start, stop, step).indices(size) with stop >= start, where the sizes may
    be symbolic: every clamp is decided from the symbols' ranges (`x[1:]` of `[s0]` is
    [1, s0): s0 >= 2), or the slice is `Undecided` (compiled per shape)."""
    if not any(isinstance(v, Size) for v in (start, stop, size)):
        start, stop, step = slice(start, stop, step).indices(size)
        return start, max(stop, start), step
    if step <= 0:
        raise Undecided(f"a slice with step {step} of a symbolic size")

    def bound(value: Dim | None, default: Dim) -> Dim:
        if value is None or isinstance(value, int) and value >= 2 ** 62:  # (aten's "to the end")
            return default
        if isinstance(value, int) and value < 0:
            value = value + size
        if value <= 0:  # (each comparison decided from the ranges, or Undecided)
            return 0
        return size if value >= size else value

    start, stop = bound(start, 0), bound(stop, size)
    return start, (start if stop <= start else stop), step


def normalize_dim(dim: int, ndim: int) -> int:
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise IndexError(f"dim {dim} out of range for {ndim} dims")
    return dim % size


def normalize_dims(dims: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({normalize_dim(d, ndim) for d in dims}))


class Builder:
    def __init__(self, graph: Graph):
        self.graph = graph

    # -- leaves ---------------------------------------------------------------------------
    def full(self, value: Scalar, dtype: torch.dtype, shape: Sequence[int] = (),
             wide: bool = False) -> Node:
        """`value` as a tensor of `dtype`; `wide` (a half-precision dtype only): the value is
        held in float32, not rounded to `dtype` — a Python scalar as eager's kernels read it
        beside their float32 compute (`elementwise`)."""
        if wide and dtype in dtypes.REDUCED_FLOAT and isinstance(value, (int, float)):
            return self.graph.add(Op.FULL, (), value=float(value), shape=tuple(shape),
                                  dtype=dtype, wide=True)
        if isinstance(value, Size) and dtype is not torch.bool:
            pass  # a symbolic size as a value (mean's count): computed where it is used
        elif dtype is torch.bool:
            value = bool(value)
        elif dtypes.is_integral(dtype):
            value = wrap_integer(int(value), dtype)
        else:
            value = float(value)
        return self.graph.add(Op.FULL, (), value=value, shape=tuple(shape), dtype=dtype)

    def iota(self, shape: Sequence[int], dim: int, dtype: torch.dtype = torch.int64,
             start: int = 0, step: int = 1) -> Node:
        return self.graph.add(Op.IOTA, (), shape=tuple(shape), dim=dim, dtype=dtype,
                              start=start, step=step)

    # -- conversions ----------------------------------------------------------------------
    def cast(self, x: Node, dtype: torch.dtype) -> Node:
        if x.dtype == dtype:
            return x
        if x.op is Op.FULL:
            return self.full(x.attrs["value"], dtype, x.shape)
        return self.graph.add(Op.CAST, (x,), dtype=dtype)

    def operand(self, value: Operand, dtype: torch.dtype) -> Node:
        """A node of `dtype` for a node or a Python scalar."""
        if isinstance(value, Node):
            return self.cast(value, dtype)
        return self.full(value, dtype)

    # -- broadcasting ---------------------------------------------------------------------
    def broadcast_to(self, x: Node, shape: Sequence[int]) -> Node:
        shape = tuple(shape)
        if x.shape == shape:
            return x
        if x.op is Op.FULL:
            return self.full(x.attrs["value"], x.dtype, shape, x.attrs.get("wide", False))
        lead = len(shape) - x.ndim
        if lead < 0:
            raise ValueError(f"cannot broadcast {x.shape} to {shape}")
        if lead:
            x = self.reshape(x, (1,) * lead + x.shape)
        return self.expand(x, shape)

    def broadcast(self, *xs: Node) -> list[Node]:
        shape = broadcast_shapes(*(x.shape for x in xs))
        return [self.broadcast_to(x, shape) for x in xs]

    # -- pointwise ------------------------------------------------------------------------
    def unary(self, op: Op, x: Node) -> Node:
        return self.graph.add(op, (x,))

    def binary(self, op: Op, a: Node, b: Node) -> Node:
        a, b = self.broadcast(a, b)
        return self.graph.add(op, (a, b))

    def where(self, condition: Node, a: Node, b: Node) -> Node:
        condition, a, b = self.broadcast(self.cast(condition, torch.bool), a, b)
        return self.graph.add(Op.WHERE, (condition, a, b))

    def compute_dtype(self, *operands: Operand) -> torch.dtype:
        """torch.result_type over nodes (as tensors of their rank) and Python scalars."""
        return dtypes.result_type(
            (x.dtype, x.ndim) if isinstance(x, Node) else x for x in operands)

    def elementwise(self, op: Op, *operands: Operand) -> Node:
        """An op as eager's TensorIterator runs it: promote, broadcast, compute.

        Float-only ops (exp, div, ...) compute integer inputs in the default float dtype.
        """
        dtype = self.compute_dtype(*operands)
        if op in FLOAT_ONLY or op is Op.DIV:
            if not dtypes.is_float(dtype):
                dtype = torch.get_default_dtype()
        if dtype in dtypes.REDUCED_FLOAT and op in self._wide_scalar_ops():
            if self._wide_tensor_scalar(op, operands):
                # (computed in float32, rounded once: as eager's CPU kernel reads a 0-d
                # float32 tensor in the second place, as a scalar)
                a, b = operands
                return self.cast(self.binary(op, self.cast(a, torch.float32),
                                             self.cast(b, torch.float32)), dtype)
            nodes = [self.full(value, dtype, wide=True) if _number(value)
                     else self.operand(value, dtype) for value in operands]
        else:
            nodes = [self.operand(value, dtype) for value in operands]
        if len(nodes) == 1:
            return self.unary(op, nodes[0])
        return self.binary(op, *nodes)

    def _wide_scalar_ops(self) -> frozenset[Op]:
        """The ops whose half-precision kernels in eager read a Python scalar operand as a
        float32 value, unrounded: products and quotients on every device, sums and
        differences on CUDA only (the CPU's round the scalar to the tensor's type first);
        every other op rounds it. Measured per op by `python -m
        ember.bench.scalar_semantics` (torch 2.11 on the H200, 2.13 on the CPU)."""
        return _WIDE_SCALAR_OPS_CUDA if self.graph.device.type == "cuda" else _WIDE_SCALAR_OPS

    def _wide_tensor_scalar(self, op: Op, operands: Sequence[Operand]) -> bool:
        """A CPU product or quotient of a half-precision tensor by a 0-d tensor of a wider
        float type: eager's kernel reads the second operand, a CPU scalar, in float32 (the
        first it casts to the half type: `ember.bench.scalar_semantics`). On CUDA a 0-d
        tensor of the device is no scalar there; unmeasured, as eager's rounding it."""
        if self.graph.device.type != "cpu" or op not in (Op.MUL, Op.DIV) or \
                len(operands) != 2:
            return False
        a, b = operands
        return isinstance(a, Node) and a.ndim > 0 and isinstance(b, Node) and b.ndim == 0 \
            and b.dtype in (torch.float32, torch.float64)

    def compare(self, op: Op, a: Operand, b: Operand) -> Node:
        assert op in COMPARISONS
        return self.elementwise(op, a, b)

    def add(self, a: Operand, b: Operand) -> Node:
        return self.elementwise(Op.ADD, a, b)

    def sub(self, a: Operand, b: Operand) -> Node:
        return self.elementwise(Op.SUB, a, b)

    def mul(self, a: Operand, b: Operand) -> Node:
        return self.elementwise(Op.MUL, a, b)

    def div(self, a: Operand, b: Operand) -> Node:
        return self.elementwise(Op.DIV, a, b)

    def maximum(self, a: Operand, b: Operand) -> Node:
        return self.elementwise(Op.MAXIMUM, a, b)

    def minimum(self, a: Operand, b: Operand) -> Node:
        return self.elementwise(Op.MINIMUM, a, b)

    # -- reductions -----------------------------------------------------------------------
    def reduce(self, op: Op, x: Node, dims: int | Sequence[int] | None = None,
               keepdim: bool = False) -> Node:
        axes = normalize_dims(dims, x.ndim)
        if x.ndim == 0:
            # a 0-d tensor reduces to itself (through a 1-element view so kernels see an axis)
            result = self.graph.add(op, (self.reshape(x, (1,)),), axes=(0,))
            return self.reshape(result, ())
        result = self.graph.add(op, (x,), axes=axes)
        if keepdim:
            return result
        return self.squeeze(result, axes)

    # -- views ----------------------------------------------------------------------------
    def reshape(self, x: Node, shape: Sequence[int]) -> Node:
        shape = tuple(shape)
        if x.shape == shape:
            return x
        core = tuple(n for n in shape if n != 1)
        if x.numel > 0 and core == tuple(n for n in x.shape if n != 1):
            # only size-1 dims move: squeeze + unsqueeze index cheaper than a general reshape
            ones = tuple(d for d, n in enumerate(x.shape) if n == 1)
            result = self.graph.add(Op.SQUEEZE, (x,), dims=ones) if ones else x
            for d, n in enumerate(shape):
                if n == 1:
                    result = self.graph.add(Op.UNSQUEEZE, (result,), dim=d)
            return result
        return self.graph.add(Op.RESHAPE, (x,), shape=shape)

    def squeeze(self, x: Node, dims: Sequence[int]) -> Node:
        dims = tuple(d for d in sorted(set(dims)) if x.shape[d] == 1)
        if not dims:
            return x
        return self.graph.add(Op.SQUEEZE, (x,), dims=dims)

    def unsqueeze(self, x: Node, dim: int) -> Node:
        return self.graph.add(Op.UNSQUEEZE, (x,), dim=normalize_dim(dim, x.ndim + 1))

    def permute(self, x: Node, perm: Sequence[int]) -> Node:
        perm = tuple(normalize_dim(p, x.ndim) for p in perm)
        if perm == tuple(range(x.ndim)):
            return x
        return self.graph.add(Op.PERMUTE, (x,), perm=perm)

    def transpose(self, x: Node, dim0: int, dim1: int) -> Node:
        perm = list(range(x.ndim))
        if x.ndim == 0:
            return x
        d0, d1 = normalize_dim(dim0, x.ndim), normalize_dim(dim1, x.ndim)
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.permute(x, perm)

    def expand(self, x: Node, shape: Sequence[int]) -> Node:
        shape = tuple(shape)
        if x.shape == shape:
            return x
        return self.graph.add(Op.EXPAND, (x,), shape=shape)

    def slice(self, x: Node, dim: int, start: int | None = None, stop: int | None = None,
              step: int = 1) -> Node:
        dim = normalize_dim(dim, x.ndim)
        size = x.shape[dim]
        start, stop, step = slice_indices(start, stop, step, size)
        if (start, stop, step) == (0, size, 1):
            return x
        if step > 1:
            count = (stop - start + step - 1) // step
            stop = start + (count - 1) * step + 1 if count else start
        return self.graph.add(Op.SLICE, (x,), dim=dim, start=start, stop=stop, step=step)

    def flatten(self, x: Node) -> Node:
        return self.reshape(x, (x.numel,))

    # -- data movement --------------------------------------------------------------------
    def cat(self, xs: Sequence[Node], dim: int) -> Node:
        xs = [x for x in xs if not (x.ndim == 1 and x.shape[0] == 0 and len(xs) > 1)]
        dim = normalize_dim(dim, xs[0].ndim)
        xs = [x for x in xs if x.shape[dim] > 0] or xs[:1]
        if len(xs) == 1:
            return xs[0]
        return self.graph.add(Op.CAT, tuple(xs), dim=dim)

    def pad(self, x: Node, pads: Sequence[tuple[int, int, int]], value: Scalar) -> Node:
        if all(p == (0, 0, 0) for p in pads):
            return x
        return self.graph.add(Op.PAD, (x,), pads=tuple(tuple(p) for p in pads),
                              value=self.full(value, x.dtype).attrs["value"])

    def take(self, x: Node, index: Node, dim: int, wrap: bool = False) -> Node:
        """x[..., index, ...] along dim; `wrap` lets negative indices count from the end."""
        return self.graph.add(Op.TAKE, (x, index), dim=normalize_dim(dim, x.ndim), wrap=wrap)

    def gather(self, x: Node, index: Node, dim: int) -> Node:
        return self.graph.add(Op.GATHER, (x, index), dim=normalize_dim(dim, x.ndim))

    # -- library calls --------------------------------------------------------------------
    def library(self, target, args: Sequence, shape: Sequence[int], dtype: torch.dtype,
                **kwargs) -> Node:
        """A call of `target` at run time; Node arguments become its inputs. The result is
        row-major, as eager's matmul and convolution results are."""
        inputs: list[Node] = []
        template = []
        for value in args:
            if isinstance(value, Node):
                inputs.append(value)
                template.append(Slot(len(inputs) - 1))
            else:
                template.append(value)
        strides = row_major(tuple(shape))
        node = self.graph.add(Op.LIBRARY, inputs, target=target, args=tuple(template),
                              kwargs=kwargs, results=((tuple(shape), dtype, strides),),
                              tuple_result=False)
        node.strides = strides
        return node


def wrap_integer(value: int, dtype: torch.dtype) -> int:
    """`value` converted to an integer dtype as eager converts a scalar: modulo 2**bits (so -1
    becomes 255 in uint8, as `uint8_tensor > -1` sees it)."""
    bits = dtype.itemsize * 8
    value &= (1 << bits) - 1
    if dtype.is_signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value

