"""torch.vmap (and torch.func.vmap) in the capture, unrolled over the batch: the function is
called once per index of the mapped dims (torch.select of each mapped argument) and its
results are stacked along out_dims. Exact for any function — vmap's answer is each example's
answer, stacked — at the cost of a graph `batch` times the function's; so only batches of a
known size up to MAX_BATCH are unrolled, and a larger or symbolic one is refused.

torch's associative_scan (its generic mode, the CPU's) vmaps the combine function over
halving batches: Mamba's selective scan in transformers, which takes that path when it sees a
compiler at work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ember import torch_internals
from ember.capture.calls import call_torch, call_value, rule
from ember.capture.errors import Unsupported
from ember.capture.inlining import inline_function
from ember.capture.semantics import python_value
from ember.capture.values import (
    Const,
    DictValue,
    FunctionValue,
    SequenceValue,
    TensorValue,
    Value,
    VmappedValue,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session

MAX_BATCH = 256


@rule(torch.vmap, torch.func.vmap)
def _vmap(session: Session, function: Value, in_dims: Value | None = None,
          out_dims: Value | None = None, randomness: Value | None = None,
          **_: Any) -> Value:
    # (each example is its own call: random ops draw apart, as randomness="different" asks;
    # chunk_size changes nothing)
    if randomness is not None and python_value(randomness) == "same":
        raise Unsupported('vmap with randomness="same" (unrolled, each example draws apart)')
    return VmappedValue(function, 0 if in_dims is None else python_value(in_dims),
                        0 if out_dims is None else python_value(out_dims))


def call_vmapped(session: Session, vmapped: VmappedValue, args: list[Value],
                 kwargs: dict[str, Value], frame: Frame | None) -> Value:
    dims = vmapped.in_dims
    if isinstance(dims, (tuple, list)):
        if len(dims) != len(args):
            raise Unsupported("vmap's in_dims do not match its arguments")
    else:
        dims = [dims] * len(args)
    sizes = {size for value, dim in zip(args, dims) for size in _batch_sizes(value, dim)}
    if len(sizes) != 1:
        raise Unsupported("vmap over arguments without one known batch size")
    (batch,) = sizes
    if batch > MAX_BATCH:
        raise Unsupported(f"vmap over a batch of {batch} (unrolled up to {MAX_BATCH})")
    if batch == 0:
        # (no example to call it with: one of zeros gives the results' shapes, none kept)
        result = call_value(session, vmapped.function,
                            [_select(session, value, dim, None) for value, dim in zip(args, dims)],
                            kwargs, frame)
        return _empty(session, result, vmapped.out_dims)
    results = [call_value(session, vmapped.function,
                          [_select(session, value, dim, index) for value, dim in zip(args, dims)],
                          kwargs, frame)
               for index in range(batch)]
    return _stack(session, results, vmapped.out_dims)


def _batch_sizes(value: Value, dim: Any) -> list[int]:
    if dim is None:
        return []
    if isinstance(value, TensorValue) and isinstance(dim, int):
        size = value.fake.shape[dim]
        if type(size) is not int:
            raise Unsupported("vmap over a symbolic batch size")
        return [size]
    if isinstance(value, SequenceValue):
        inner = dim if isinstance(dim, int) else list(dim)
        if not isinstance(inner, int) and len(inner) != len(value.items):
            raise Unsupported("vmap's in_dims do not match its arguments")
        return [size for k, item in enumerate(value.items)
                for size in _batch_sizes(item, inner if isinstance(inner, int) else inner[k])]
    if isinstance(value, DictValue) and isinstance(dim, int):
        return [size for item in value.items.values() for size in _batch_sizes(item, dim)]
    raise Unsupported(f"vmap of {value.describe()} over in_dims {dim!r}")


def _select(session: Session, value: Value, dim: Any, index: int | None) -> Value:
    """Example `index` of `value` along `dim`; index None: an example of zeros."""
    if dim is None:
        return value
    if isinstance(value, TensorValue):
        if index is None:
            shape = [size for d, size in enumerate(value.fake.shape) if d != dim % value.fake.ndim]
            return call_torch(session, torch.zeros, [Const(tuple(shape))],
                              {"dtype": Const(value.fake.dtype),
                               "device": Const(value.fake.device)})
        return call_torch(session, torch.select, [value, Const(dim), Const(index)], {})
    if isinstance(value, SequenceValue):
        return SequenceValue([_select(session, item, dim if isinstance(dim, int) else dim[k],
                                      index) for k, item in enumerate(value.items)],
                             value.kind)
    return DictValue({key: _select(session, item, dim, index)
                      for key, item in value.items.items()})


def _empty(session: Session, result: Value, out_dims: Any) -> Value:
    """`result`'s form with a batch of none along out_dims."""
    if isinstance(result, TensorValue) and isinstance(out_dims, int):
        batched = call_torch(session, torch.unsqueeze, [result, Const(out_dims)], {})
        return call_torch(session, torch.narrow, [batched, Const(out_dims), Const(0), Const(0)],
                          {})
    if isinstance(result, SequenceValue):
        dims = [out_dims] * len(result.items) if isinstance(out_dims, int) else list(out_dims)
        return SequenceValue([_empty(session, item, dims[k])
                              for k, item in enumerate(result.items)], result.kind)
    raise Unsupported(f"vmap returning {result.describe()} (out_dims {out_dims!r})")


def _stack(session: Session, results: list[Value], out_dims: Any) -> Value:
    first = results[0]
    if isinstance(first, TensorValue) and isinstance(out_dims, int) and \
            all(isinstance(r, TensorValue) for r in results):
        return call_torch(session, torch.stack, [SequenceValue(list(results), list)],
                          {"dim": Const(out_dims)})
    if isinstance(first, SequenceValue) and \
            all(isinstance(r, SequenceValue) and len(r.items) == len(first.items)
                for r in results):
        dims = [out_dims] * len(first.items) if isinstance(out_dims, int) else list(out_dims)
        return SequenceValue([_stack(session, [r.items[k] for r in results], dims[k])
                              for k in range(len(first.items))], first.kind)
    raise Unsupported(f"vmap returning {first.describe()} (out_dims {out_dims!r})")


_ASSOCIATIVE_SCAN = torch_internals.associative_scan_function()
if _ASSOCIATIVE_SCAN is not None:

    @rule(_ASSOCIATIVE_SCAN)
    def _associative_scan(session: Session, combine_fn: Value, xs: Value, dim: Value,
                          reverse: Value | None = None, combine_mode: Value | None = None,
                          frame: Frame | None = None, **_: Any) -> Value:
        """Inlined in its generic mode: the combine function vmapped over halving batches (its
        pointwise mode, on CUDA, hands the scan to torch.compile). The answers are the same:
        the pointwise mode asks a pointwise combine function, which the generic mode takes
        too."""
        mode = "pointwise" if combine_mode is None else python_value(combine_mode)
        leaves = _tree_leaves(session, xs).items
        if mode == "pointwise" and all(isinstance(v, TensorValue) and
                                       v.fake.device.type in ("cuda", "xpu") for v in leaves):
            mode = "generic"  # (elsewhere the pointwise mode raises, in the inlined code too)
        keywords = {"reverse": reverse if reverse is not None else Const(False),
                    "combine_mode": Const(mode)}
        return inline_function(session, FunctionValue(_ASSOCIATIVE_SCAN, None),
                               [combine_fn, xs, dim], keywords, frame)


@rule(torch_internals.pytree_leaves_function())
def _tree_leaves(session: Session, tree: Value, is_leaf: Value | None = None,
                 **_: Any) -> Value:
    """torch's pytree leaves of containers made or read in the capture: tuples, lists, named
    tuples and torch.Size by their items, dicts by their values in order, anything else (None
    too) a leaf. (The scan's generic form asks them of the combine function's results.)"""
    if is_leaf is not None and python_value(is_leaf) is not None:
        raise Unsupported("tree_leaves with is_leaf")
    leaves: list[Value] = []

    def walk(value: Value) -> None:
        if isinstance(value, SequenceValue):
            for item in value.items:
                walk(item)
        elif isinstance(value, DictValue):
            for item in value.items.values():
                walk(item)
        else:
            leaves.append(value)

    walk(tree)
    return SequenceValue(leaves, list)

