"""Neural-network aten ops: matmul family, normalisations, losses, dropout in eval."""

from __future__ import annotations

import math

import torch

from ember.ir import dtypes
from ember.ir.graph import Node
from ember.ir.ops import Op
from ember.lower.builder import Builder
from ember.lower.registry import ByDesign, Decline, aten, lowering
from ember.lower.rules.reductions import mean


# -- matmul: a library call, with bias and scaling as a fusible epilogue ------------------
@lowering(aten.mm.default)
def _mm(b: Builder, x: Node, y: Node) -> Node:
    return b.library(aten.mm.default, (x, y), (x.shape[0], y.shape[1]), x.dtype)


@lowering(aten.bmm.default)
def _bmm(b: Builder, x: Node, y: Node) -> Node:
    return b.library(aten.bmm.default, (x, y), (x.shape[0], x.shape[1], y.shape[2]), x.dtype)


@lowering(aten.mv.default)
def _mv(b: Builder, x: Node, y: Node) -> Node:
    return b.library(aten.mv.default, (x, y), (x.shape[0],), x.dtype)


@lowering(aten.dot.default)
def _dot(b: Builder, x: Node, y: Node) -> Node:
    return b.library(aten.dot.default, (x, y), (), x.dtype)


def _epilogue(b: Builder, bias: Node, product: Node, beta, alpha) -> Node:
    if alpha != 1:
        product = b.mul(product, alpha)
    if beta == 0:
        return product  # eager ignores bias (even NaN) when beta is 0
    scaled = bias if beta == 1 else b.mul(bias, beta)
    return b.add(product, b.cast(scaled, product.dtype))


def _rounds_once(b: Builder, target, bias: Node, x: Node, y: Node, shape, beta, alpha
                 ) -> Node | None:
    """In float16/bfloat16, eager adds the bias to the product before it rounds (BLAS's beta,
    cuBLASLt's bias epilogue): a product rounded first and then added rounds twice, up to an
    ulp apart (1/128 of the value in bfloat16). There the whole op is the library call."""
    if x.dtype not in dtypes.REDUCED_FLOAT or beta == 0:
        return None
    return b.library(target, (bias, x, y), shape, x.dtype, beta=beta, alpha=alpha)


@lowering(aten.addmm.default)
def _addmm(b: Builder, bias: Node, x: Node, y: Node, *, beta=1, alpha=1) -> Node:
    whole = _rounds_once(b, aten.addmm.default, bias, x, y, (x.shape[0], y.shape[1]), beta,
                         alpha)
    return whole if whole is not None else _epilogue(b, bias, _mm(b, x, y), beta, alpha)


@lowering(aten.baddbmm.default)
def _baddbmm(b: Builder, bias: Node, x: Node, y: Node, *, beta=1, alpha=1) -> Node:
    whole = _rounds_once(b, aten.baddbmm.default, bias, x, y,
                         (x.shape[0], x.shape[1], y.shape[2]), beta, alpha)
    return whole if whole is not None else _epilogue(b, bias, _bmm(b, x, y), beta, alpha)


@lowering(aten.addmv.default)
def _addmv(b: Builder, bias: Node, x: Node, y: Node, *, beta=1, alpha=1) -> Node:
    whole = _rounds_once(b, aten.addmv.default, bias, x, y, (x.shape[0],), beta, alpha)
    return whole if whole is not None else _epilogue(b, bias, _mv(b, x, y), beta, alpha)


@lowering(aten.addbmm.default)
def _addbmm(b: Builder, bias: Node, x: Node, y: Node, *, beta=1, alpha=1) -> Node:
    # the sum of the batch of products, then the same epilogue as addmm
    whole = _rounds_once(b, aten.addbmm.default, bias, x, y, (x.shape[1], y.shape[2]), beta,
                         alpha)
    if whole is not None:
        return whole
    return _epilogue(b, bias, b.reduce(Op.SUM, _bmm(b, x, y), [0]), beta, alpha)


@lowering(aten.convolution.default)
def _convolution(b: Builder, x: Node, weight: Node, bias: Node | None, stride, padding,
                 dilation, transposed: bool, output_padding, groups: int) -> Node:
    """A 1x1 convolution of single-position images (a squeeze-excite block's, on the pooled
    channels) is a linear layer over the channels: a matmul on views, its bias added in the
    kernel after it. Eager's convolution takes 8-20 us a call there for a few hundred
    multiply-adds (its dispatch and im2col), a matmul 3. Any other convolution is a library
    call (ember/passes choose its layout and whether it runs as a GEMM)."""
    spatial = (*x.shape[2:], *weight.shape[2:])
    if transposed or groups != 1 or x.ndim != 4 or any(padding) or \
            any(type(d) is not int or d != 1 for d in spatial) or \
            not all(type(d) is int for d in (x.shape[1], weight.shape[0])) or \
            not dtypes.is_float(x.dtype) or weight.dtype != x.dtype or \
            (bias is not None and bias.dtype != x.dtype):
        raise ByDesign("a convolution other than 1x1 over single-position images")
    n, c, o = x.shape[0], x.shape[1], weight.shape[0]
    rows = b.reshape(x, (n, c))
    columns = b.permute(b.reshape(weight, (o, c)), (1, 0))
    product = _mm(b, rows, columns) if bias is None else _addmm(b, bias, rows, columns)
    return b.reshape(product, (n, o, 1, 1))


@lowering(aten.addr.default)
def _addr(b: Builder, x: Node, first: Node, second: Node, *, beta=1, alpha=1) -> Node:
    if not dtypes.is_float(b.compute_dtype(x, first, second)):
        raise Decline("addr of integers or bools")
    outer = b.mul(b.unsqueeze(first, 1), b.unsqueeze(second, 0))
    return _epilogue(b, x, outer, beta, alpha)


# -- normalisations -----------------------------------------------------------------------
def _statistics_dtype(x: Node) -> torch.dtype:
    return torch.float32 if x.dtype in dtypes.REDUCED_FLOAT else x.dtype


def _normalize(b: Builder, x: Node, axes: list[int],
               eps: float) -> tuple[Node, Node, Node, Node]:
    """(x - mean) * rstd, mean, rstd and the (biased) variance over `axes` (kept as size-1
    dims), in float32 or wider."""
    x = b.cast(x, _statistics_dtype(x))
    center = mean(b, x, axes, keepdim=True)
    deviation = b.sub(x, center)
    var = mean(b, b.mul(deviation, deviation), axes, keepdim=True)
    rstd = b.unary(Op.RSQRT, b.add(var, eps))
    return b.mul(deviation, rstd), center, rstd, var


@lowering(aten.native_layer_norm.default)
def _layer_norm(b: Builder, x: Node, normalized_shape, weight, bias, eps: float):
    if not dtypes.is_float(x.dtype):
        raise Decline("layer_norm of integers")
    axes = list(range(x.ndim - len(normalized_shape), x.ndim))
    out, center, rstd, _ = _normalize(b, x, axes, eps)
    if weight is not None:
        out = b.mul(out, b.cast(weight, out.dtype))
    if bias is not None:
        out = b.add(out, b.cast(bias, out.dtype))
    return b.cast(out, x.dtype), center, rstd


@lowering(aten.native_group_norm.default)
def _group_norm(b: Builder, x: Node, weight, bias, N: int, C: int, HxW: int, group: int,
                eps: float):
    if not dtypes.is_float(x.dtype):
        raise Decline("group_norm of integers")
    grouped = b.reshape(x, (N, group, (C // group) * HxW))
    out, center, rstd, _ = _normalize(b, grouped, [2], eps)
    out = b.reshape(out, x.shape)
    channel_shape = (1, C) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = b.mul(out, b.reshape(b.cast(weight, out.dtype), channel_shape))
    if bias is not None:
        out = b.add(out, b.reshape(b.cast(bias, out.dtype), channel_shape))
    return (b.cast(out, x.dtype), b.reshape(center, (N, group)), b.reshape(rstd, (N, group)))


def _batch_norm_eval(b: Builder, x: Node, weight, bias, running_mean, running_var,
                     eps: float) -> Node:
    channel_shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    dtype = _statistics_dtype(x)

    def per_channel(value: Node) -> Node:
        return b.reshape(b.cast(value, dtype), channel_shape)

    invstd = b.unary(Op.RECIPROCAL, b.unary(Op.SQRT, b.add(per_channel(running_var), eps)))
    scale = b.mul(per_channel(weight), invstd) if weight is not None else invstd
    shift = b.sub(per_channel(bias) if bias is not None else b.full(0.0, dtype),
                  b.mul(per_channel(running_mean), scale))
    return b.cast(b.add(b.mul(b.cast(x, dtype), scale), shift), x.dtype)


@lowering(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_inference(b: Builder, x: Node, weight, bias, running_mean, running_var,
                          momentum: float, eps: float):
    out = _batch_norm_eval(b, x, weight, bias, running_mean, running_var, eps)
    return (out, *_eval_statistics(b, x))


def _eval_statistics(b: Builder, x: Node) -> tuple[Node, Node]:
    """The statistics batch norm returns in eval: empty from the CPU kernel; per channel from
    CUDA's, which leaves them unwritten (zeros here: no one reads them)."""
    shape = (0,) if b.graph.device.type == "cpu" else (x.shape[1],)
    empty = b.full(0, _statistics_dtype(x), shape)
    return empty, empty


@lowering(aten.native_batch_norm.default)
def _native_batch_norm(b: Builder, x: Node, weight, bias, running_mean, running_var,
                       training: bool, momentum: float, eps: float):
    if not training and running_mean is not None:
        out = _batch_norm_eval(b, x, weight, bias, running_mean, running_var, eps)
        return (out, *_eval_statistics(b, x))
    if running_mean is not None:
        # (the tracer hands such a call over as its twin that declares the writes,
        # _native_batch_norm_legit, whose functional form is below)
        raise Decline("batch norm in training mode updates running statistics")
    return _batch_norm_training(b, x, weight, bias, eps)[:3]


def _batch_norm_training(b: Builder, x: Node, weight, bias, eps: float):
    """Batch statistics over every dim but the channels: (out, mean, 1/std, biased variance)
    (instance_norm)."""
    if not dtypes.is_float(x.dtype):
        raise Decline("batch norm of integers")
    axes = [0] + list(range(2, x.ndim))
    out, center, rstd, var = _normalize(b, x, axes, eps)
    channel_shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = b.mul(out, b.reshape(b.cast(weight, out.dtype), channel_shape))
    if bias is not None:
        out = b.add(out, b.reshape(b.cast(bias, out.dtype), channel_shape))
    channels = (x.shape[1],)
    return (b.cast(out, x.dtype), b.reshape(center, channels), b.reshape(rstd, channels),
            b.reshape(var, channels))


@lowering(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(b: Builder, x: Node, weight, bias, training: bool, momentum: float,
                         eps: float):
    return _batch_norm_training(b, x, weight, bias, eps)[:3]


@lowering(aten._native_batch_norm_legit_functional.default)
def _batch_norm_updating(b: Builder, x: Node, weight, bias, running_mean: Node,
                         running_var: Node, training: bool, momentum: float, eps: float):
    """Batch norm in training with its running statistics (a BatchNorm's buffers): the
    normalized batch and its statistics, then the running statistics' new values, which the
    tracer writes back as eager's kernel writes them in place: `(1 - momentum) * running +
    momentum * batch`, the variance unbiased (n / (n - 1), n the values per channel), with no
    gradient through them."""
    if not training:
        out = _batch_norm_eval(b, x, weight, bias, running_mean, running_var, eps)
        return (out, *_eval_statistics(b, x), running_mean, running_var)
    out, center, rstd, var = _batch_norm_training(b, x, weight, bias, eps)
    count = math.prod(x.shape[d] for d in range(x.ndim) if d != 1)
    unbiased = b.div(b.mul(var, count), count - 1)

    def updated(running: Node, batch: Node) -> Node:
        # (eager's kernel writes them outside autograd: no gradient flows through them)
        batch = b.unary(Op.STOP_GRADIENT, batch)
        mixed = b.add(b.mul(b.cast(running, batch.dtype), 1.0 - momentum), b.mul(batch, momentum))
        return b.cast(mixed, running.dtype)

    return out, center, rstd, updated(running_mean, center), updated(running_var, unbiased)


# -- losses -------------------------------------------------------------------------------
@lowering(aten.binary_cross_entropy_with_logits.default)
def _bce_with_logits(b: Builder, x: Node, target: Node, weight=None, pos_weight=None,
                     reduction: int = 1) -> Node:
    # eager's formula: (1 - target) * x - log_sigmoid(x) * (1 + (pos_weight - 1) * target)
    log_sigmoid = b.sub(b.minimum(x, 0.0),
                        b.unary(Op.LOG1P, b.unary(Op.EXP, b.unary(Op.NEG, b.unary(Op.ABS, x)))))
    if pos_weight is not None:
        log_sigmoid = b.mul(log_sigmoid, b.add(b.mul(b.sub(pos_weight, 1), target), 1))
    loss = b.sub(b.mul(b.sub(1, target), x), log_sigmoid)
    if weight is not None:
        loss = b.mul(loss, weight)
    return _reduce_loss(b, loss, reduction)


def _reduce_loss(b: Builder, loss: Node, reduction: int) -> Node:
    if reduction == 0:
        return loss
    if reduction == 1:
        return mean(b, loss)
    return b.reduce(Op.SUM, loss, None)


def _nll(b: Builder, x: Node, target: Node, weight, reduction: int, ignore_index: int,
         class_dim: int):
    valid = b.compare(Op.NE, target, ignore_index)
    safe = b.where(valid, target, b.full(0, target.dtype))
    picked = b.gather(x, b.unsqueeze(safe, class_dim), class_dim)
    picked = b.squeeze(picked, [class_dim])
    if weight is not None:
        weights = b.take(weight, safe, 0)
    else:
        weights = b.full(1.0, x.dtype, safe.shape)
    weights = b.where(valid, weights, b.full(0.0, x.dtype))
    losses = b.mul(b.unary(Op.NEG, picked), weights)
    if reduction == 0:
        return losses, b.full(0.0, x.dtype, ())
    total_weight = b.reduce(Op.SUM, weights, None)
    total = b.reduce(Op.SUM, losses, None)
    if reduction == 1:
        return b.div(total, total_weight), total_weight
    return total, total_weight


@lowering(aten.nll_loss_forward.default)
def _nll_loss(b: Builder, x: Node, target: Node, weight, reduction: int, ignore_index: int):
    if x.ndim == 1:
        x, target = b.unsqueeze(x, 0), b.unsqueeze(target, 0)
        losses, total_weight = _nll(b, x, target, weight, reduction, ignore_index, 1)
        return (b.reshape(losses, ()) if reduction == 0 else losses), total_weight
    return _nll(b, x, target, weight, reduction, ignore_index, 1)


@lowering(aten.nll_loss2d_forward.default)
def _nll_loss2d(b: Builder, x: Node, target: Node, weight, reduction: int, ignore_index: int):
    return _nll(b, x, target, weight, reduction, ignore_index, 1)


@lowering(aten.mse_loss.default)
def _mse_loss(b: Builder, x: Node, target: Node, reduction: int = 1) -> Node:
    difference = b.sub(x, target)
    return _reduce_loss(b, b.mul(difference, difference), reduction)


@lowering(aten.l1_loss.default)
def _l1_loss(b: Builder, x: Node, target: Node, reduction: int = 1) -> Node:
    return _reduce_loss(b, b.unary(Op.ABS, b.sub(x, target)), reduction)


@lowering(aten.smooth_l1_loss.default)
def _smooth_l1_loss(b: Builder, x: Node, target: Node, reduction: int = 1,
                    beta: float = 1.0) -> Node:
    distance = b.unary(Op.ABS, b.sub(x, target))
    if beta == 0:
        return _reduce_loss(b, distance, reduction)
    quadratic = b.div(b.mul(b.mul(distance, distance), 0.5), beta)
    linear = b.sub(distance, 0.5 * beta)
    return _reduce_loss(b, b.where(b.compare(Op.LT, distance, beta), quadratic, linear),
                        reduction)


@lowering(aten.huber_loss.default)
def _huber_loss(b: Builder, x: Node, target: Node, reduction: int = 1,
                delta: float = 1.0) -> Node:
    distance = b.unary(Op.ABS, b.sub(x, target))
    quadratic = b.mul(b.mul(distance, distance), 0.5)
    linear = b.mul(b.sub(distance, 0.5 * delta), delta)
    return _reduce_loss(b, b.where(b.compare(Op.LT, distance, delta), quadratic, linear),
                        reduction)


@lowering(aten.binary_cross_entropy.default)
def _binary_cross_entropy(b: Builder, x: Node, target: Node, weight=None,
                          reduction: int = 1) -> Node:
    log_x = b.maximum(b.unary(Op.LOG, x), -100.0)
    log_rest = b.maximum(b.unary(Op.LOG, b.sub(1.0, x)), -100.0)
    loss = b.unary(Op.NEG, b.add(b.mul(target, log_x), b.mul(b.sub(1.0, target), log_rest)))
    if weight is not None:
        loss = b.mul(loss, weight)
    return _reduce_loss(b, loss, reduction)


# -- dropout ------------------------------------------------------------------------------
@lowering(aten.native_dropout.default)
def _native_dropout(b: Builder, x: Node, p: float, train) -> tuple[Node, Node]:
    if train:
        raise Decline("dropout in training draws random numbers")
    return x, b.full(True, torch.bool, x.shape)
