"""Vector-Jacobian products of library calls with several results (batch norm, dropout,
max pooling, top-k, attention kernels): each backward is eager's own backward kernel, called
by the backward graph on what the forward kept (its mask, indices, statistics,
log-sum-exp), as eager's autograd calls it — never the forward run again, nor eager's
autograd record. `library_rule` is what autodiff/differentiate.py asks; NotImplemented sends
a call to its generic backward (vjp.library_vjp, or the step's tape). `avg_pool2d` (one
result) is asked by vjp's rule of single-result calls, its layouts found as max pooling's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember import torch_internals
from ember.autodiff.vjp import Primal
from ember.ir.graph import Node, row_major, suggested_layout
from ember.ir.library import Slot, fill
from ember.ir.ops import Op
from ember.ir.sizes import Size
from ember.lower.builder import Builder
from ember.lower.layout import run_on_stand_ins

aten = torch.ops.aten


def library_rule(b: Builder, node: Node, primal: Primal, grads: dict[int, Node],
                 item: Callable[[int], Node]) -> list[Node | None]:
    """Rules for multi-result library calls: `grads` by result index; `item(k)` is the
    forward's result k (made in the forward graph if the forward did not use it)."""
    if node.attrs["target"] is aten.native_batch_norm.default:
        return _batch_norm(b, node, primal, grads, item)
    if node.attrs["target"] is aten.native_dropout.default:
        return _dropout(b, node, primal, grads, item)
    if node.attrs["target"] is aten._scaled_dot_product_flash_attention_for_cpu.default:
        return _flash_attention_cpu(b, node, primal, grads, item)
    if node.attrs["target"] is aten._scaled_dot_product_efficient_attention.default:
        return _efficient_attention(b, node, primal, grads, item)
    if node.attrs["target"] is aten.max_pool2d_with_indices.default:
        return _max_pool2d(b, node, primal, grads, item)
    if node.attrs["target"] is aten.topk.default:
        return _topk(b, node, primal, grads, item)
    return NotImplemented


def _topk(b: Builder, node: Node, primal: Primal, grads: dict[int, Node],
          item: Callable[[int], Node]) -> list[Node | None]:
    """topk(x, k, dim=-1, largest, sorted) -> (values, indices): eager's backward of the
    values, value_selecting_reduction_backward (the gradient scattered at the indices into
    zeros of x's shape), from the forward's indices (taped, each step ran a nested autograd
    call for it: Mixtral's router)."""
    g = grads.get(0)
    args = node.attrs["args"]
    if g is None or node.attrs["kwargs"] or not args or not isinstance(args[0], Slot) or \
            any(isinstance(a, Slot) for a in args[1:]):
        return NotImplemented
    x = node.inputs[args[0].index]
    if any(isinstance(d, Size) for d in x.shape) or x.ndim == 0:
        return NotImplemented
    dim = (args[2] if len(args) > 2 else -1) % x.ndim
    call = b.library(aten.value_selecting_reduction_backward.default,
                     [g, dim, primal(item(1)), list(x.shape), True], x.shape, g.dtype)
    found: list[Node | None] = [None] * len(node.inputs)
    found[args[0].index] = call
    return found


def _max_pool2d(b: Builder, node: Node, primal: Primal, grads: dict[int, Node],
                item: Callable[[int], Node]) -> list[Node | None]:
    """max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode) ->
    (out, indices): eager's max_pool2d_with_indices_backward, from the forward's indices
    (_pool_backward: the layouts)."""
    g = grads.get(0)
    x = _pooled(node)
    if g is None or x is None:
        return NotImplemented
    args = node.attrs["args"]
    options = list(args[1:]) + [[], 0, 1, False][len(args) - 2:]
    return _pool_backward(b, node, aten.max_pool2d_with_indices_backward.default,
                          [g, primal(x), primal(item(1))], (Slot(0), Slot(1), *options, Slot(2)))


def avg_pool2d(b: Builder, node: Node, primal: Primal, g: Node) -> list[Node | None]:
    """avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
    divisor_override): eager's avg_pool2d_backward, called by the backward graph, its
    layouts as max_pool2d's (a taped call cost a nested autograd run each step: DenseNet's
    three transitions). Asked by vjp's rule of single-result library calls."""
    x = _pooled(node)
    if x is None:
        return NotImplemented
    args = node.attrs["args"]
    options = list(args[1:]) + [[], 0, False, True, None][len(args) - 2:]
    return _pool_backward(b, node, aten.avg_pool2d_backward.default, [g, primal(x)],
                          (Slot(0), Slot(1), *options))


def _pooled(node: Node) -> Node | None:
    """A pooling call's input, where its template is the input then constants only, at
    concrete sizes (the backward's layout comes from a run at them); else None."""
    args = node.attrs["args"]
    if node.attrs["kwargs"] or not args or not isinstance(args[0], Slot) or \
            any(isinstance(a, Slot) for a in args[1:]):
        return None
    x = node.inputs[args[0].index]
    if any(isinstance(d, Size) for d in x.shape) or \
            any(strides is None for _, _, strides in node.attrs["results"]):
        return None
    return x


def _pool_backward(b: Builder, node: Node, target: Any, operands: list[Node],
                   template: tuple) -> list[Node | None]:
    """The pooling backward `target` on `operands` (the incoming gradient first, handed over
    laid out as the forward's result: a channels-last model's next layer gives it so, and a
    row-major one sent eager's kernel down its slow path to come back row-major, for the
    relu before it to read across the grain); the result's layout is the kernel's own, from
    one run on stand-ins."""
    operand_strides = (node.attrs["results"][0][2],
                       *(o.strides or row_major(o.shape) for o in operands[1:]))
    metas = [torch.empty_strided(o.shape, strides, dtype=o.dtype, device="meta")
             for o, strides in zip(operands, operand_strides)]
    ran = run_on_stand_ins(target, fill(template, metas), {}, None, b.graph.device.type,
                           row_major_as_meta=False)
    call = b.graph.add(Op.LIBRARY, tuple(operands), target=target, args=template, kwargs={},
                       results=((tuple(ran.shape), ran.dtype, tuple(ran.stride())),),
                       tuple_result=False, operand_strides=operand_strides)
    call.strides = tuple(ran.stride())
    found: list[Node | None] = [None] * len(node.inputs)
    found[node.attrs["args"][0].index] = call
    return found


def _efficient_attention(b: Builder, node: Node, primal: Primal, grads: dict[int, Node],
                         item: Callable[[int], Node]) -> list[Node | None]:
    """_scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_log_sumexp,
    dropout_p, is_causal, *, scale) -> (out, logsumexp, philox_seed, philox_offset), CUDA's
    memory-efficient kernel: its backward kernel as eager's autograd calls it, from the
    forward's result and log-sum-exp (the random state is unused without dropout). Its
    gradients come back in the kernel's own layout (one packed buffer where q, k and v view
    one projection, as eager's do), not copied out of it as a tape's were. The mask gets no
    gradient (lower/attention.py takes this kernel only where it needs none)."""
    g = grads.get(0)
    bound = torch_internals.arguments_by_name(node.attrs["target"], node.attrs["args"],
                                              node.attrs["kwargs"])
    q, k, v = (bound.get(name) for name in ("query", "key", "value"))
    mask = bound.get("attn_bias")
    if not all(isinstance(a, Slot) for a in (q, k, v)) or bound.get("dropout_p") or \
            not bound.get("compute_log_sumexp") or not (mask is None or isinstance(mask, Slot)):
        return NotImplemented
    found: list[Node | None] = [None] * len(node.inputs)
    if g is None:
        return found
    q, k, v = (node.inputs[a.index] for a in (q, k, v))
    if any(isinstance(d, Size) for n in (q, k, v) for d in n.shape):
        return NotImplemented  # (the result layouts come from a run at concrete sizes)
    operands = [g, primal(q), primal(k), primal(v), primal(item(0)), primal(item(1)),
                primal(item(2)), primal(item(3))]
    bias: Any = None
    if mask is not None:
        bias = Slot(len(operands))
        operands.append(primal(node.inputs[mask.index]))
    template = (Slot(0), Slot(1), Slot(2), Slot(3), bias, Slot(4), Slot(5), Slot(6), Slot(7),
                0.0, [True, True, True, False], bool(bound.get("is_causal", False)))
    kwargs = {"scale": bound.get("scale")}
    # the forward's operands as it was handed them (eager's layouts), its results as its
    # kernel laid them out; the incoming gradient in the forward result's layout
    forward_strides = node.attrs.get("operand_strides") or (None,) * len(node.inputs)
    results = node.attrs["results"]
    slots = [bound[name] for name in ("query", "key", "value")] + \
        ([mask] if mask is not None else [])

    def handed(slot: Slot) -> tuple:
        source = node.inputs[slot.index]
        return tuple(forward_strides[slot.index] or source.strides or row_major(source.shape))

    operand_strides = (tuple(results[0][2]), *(handed(slot) for slot in slots[:3]),
                       *(tuple(r[2]) for r in results[:4]),
                       *(handed(slot) for slot in slots[3:]))
    return _attention_backward(b, aten._scaled_dot_product_efficient_attention_backward.default,
                               operands, operand_strides, template, kwargs, slots[:3], found)


def _flash_attention_cpu(b: Builder, node: Node, primal: Primal, grads: dict[int, Node],
                         item: Callable[[int], Node]) -> list[Node | None]:
    """_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *,
    attn_mask, scale) -> (out, logsumexp): its backward kernel, as eager's autograd calls it,
    from the forward's output and log-sum-exp (nothing computed twice). The mask gets no
    gradient (one that requires grad sends eager to the math composite, traced instead)."""
    g = grads.get(0)
    args, kwargs = node.attrs["args"], node.attrs["kwargs"]
    if len(args) < 3 or not all(isinstance(a, Slot) for a in args[:3]) or \
            set(kwargs) - {"attn_mask", "scale"} or (len(args) > 3 and args[3] != 0.0):
        return NotImplemented
    found: list[Node | None] = [None] * len(node.inputs)
    if g is None:
        return found
    q, k, v = (node.inputs[a.index] for a in args[:3])
    if any(isinstance(d, Size) for n in (q, k, v) for d in n.shape):
        return NotImplemented  # (the result layouts come from a run at concrete sizes)
    is_causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
    mask = kwargs.get("attn_mask")
    operands = [g, primal(q), primal(k), primal(v), primal(item(0)), primal(item(1))]
    backward_kwargs: dict[str, Any] = {"scale": kwargs.get("scale")}
    if isinstance(mask, Slot):
        backward_kwargs["attn_mask"] = Slot(len(operands))
        operands.append(primal(node.inputs[mask.index]))
    template = (*(Slot(i) for i in range(6)), 0.0, is_causal)
    operand_strides = tuple(o.strides or row_major(o.shape) for o in operands)
    return _attention_backward(
        b, aten._scaled_dot_product_flash_attention_for_cpu_backward.default, operands,
        operand_strides, template, backward_kwargs, args[:3], found)


def _attention_backward(b: Builder, target: Any, operands: list[Node],
                        operand_strides: tuple, template: tuple, kwargs: dict,
                        slots: list[Slot], found: list[Node | None]) -> list[Node | None]:
    """An attention kernel's backward kernel called on `operands` laid out by
    `operand_strides`: its first three results are the gradients of the forward's operands
    at `slots` (query, key, value), laid out as one run of the kernel on stand-ins lays them
    out (its kernel's own layouts, not its meta function's)."""
    metas = [torch.empty_strided(o.shape, s, dtype=o.dtype, device="meta")
             for o, s in zip(operands, operand_strides)]
    ran = run_on_stand_ins(target, fill(template, metas), fill(kwargs, metas), None,
                           b.graph.device.type, row_major_as_meta=False)
    results = tuple((tuple(r.shape), r.dtype, tuple(r.stride())) for r in ran[:3])
    call = b.graph.add(Op.LIBRARY, tuple(operands), target=target, args=template,
                       kwargs=kwargs, results=results, tuple_result=True,
                       operand_strides=operand_strides)
    for index, slot in enumerate(slots):
        found[slot.index] = b.graph.add(Op.ITEM, (call,), index=index)
        found[slot.index].strides = results[index][2]
    return found


def _dropout(b: Builder, node: Node, primal: Primal, grads: dict[int, Node],
             item: Callable[[int], Node]) -> list[Node | None]:
    """native_dropout(x, p, train) -> (out, mask): grad * mask * (1 / (1 - p)), eager's
    native_dropout_backward, from the forward's mask (never drawn again)."""
    args = node.attrs["args"]
    g = grads.get(0)
    if g is None or len(args) != 3 or node.attrs["kwargs"] or args[2] is not True or \
            not isinstance(args[0], Slot):
        return NotImplemented
    found: list[Node | None] = [None] * len(node.inputs)
    found[args[0].index] = b.mul(b.mul(g, b.cast(primal(item(1)), g.dtype)), 1.0 / (1.0 - args[1]))
    return found


def _batch_norm(b: Builder, node: Node, primal: Primal, grads: dict[int, Node],
                item: Callable[[int], Node]) -> list[Node | None]:
    """native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
    -> (out, save_mean, save_invstd): eager's native_batch_norm_backward, from the saved
    batch statistics (the running ones, updated in place by the forward, are not read)."""
    g = grads.get(0)
    args = node.attrs["args"]
    if g is None or len(args) != 8 or node.attrs["kwargs"] or args[5] is not True:
        return NotImplemented
    slots = [a.index if isinstance(a, Slot) else None for a in args[:5]]
    if slots[0] is None:
        return NotImplemented
    x = node.inputs[slots[0]]
    weight = node.inputs[slots[1]] if slots[1] is not None else None
    wanted = [True, slots[1] is not None, slots[2] is not None]
    operands = [g, primal(x)] + ([primal(weight)] if weight is not None else []) + \
        [primal(item(1)), primal(item(2))]
    template = (Slot(0), Slot(1), Slot(2) if weight is not None else None, None, None,
                Slot(len(operands) - 2), Slot(len(operands) - 1), True, args[7], wanted)
    channels = (x.shape[1],)
    # eager's kernel lays grad_input out in the input's memory format (channels-last models);
    # the incoming gradient is handed over in that format too, as eager's autograd has it
    layout = row_major(x.shape) if x.strides is None else suggested_layout(
        x.shape, torch.empty_strided(x.shape, x.strides, device="meta"))
    results = ((x.shape, x.dtype, layout),
               (channels, x.dtype, row_major(channels)),
               (channels, x.dtype, row_major(channels)))
    operand_strides = (layout, x.strides or row_major(x.shape)) + tuple(
        row_major(o.shape) for o in operands[2:])
    call = b.graph.add(Op.LIBRARY, tuple(operands), target=aten.native_batch_norm_backward.default,
                       args=template, kwargs={}, results=results, tuple_result=True,
                       operand_strides=operand_strides)
    parts = [b.graph.add(Op.ITEM, (call,), index=k) for k in range(3)]
    found: list[Node | None] = [None] * len(node.inputs)
    for k, slot in enumerate(slots[:3]):
        if slot is not None:
            found[slot] = parts[k]
    return found
