"""Convolutions run as one matrix product (GEMM), called by a compiled graph's wrapper.

oneDNN, which eager's CPU convolution calls, reorders the weight into its blocked layout on
every call; where the output has few positions (small images, late stages, a batch of a few)
that reorder costs more than the product itself (ResNet-50's 1x1 convolutions at 4x4: 0.9 ms
of which 0.35 is the product). A GEMM reads the weight where it lies. These functions take
convolution's own arguments and give its result in eager's layout; the pass that chooses
them is `passes/convolution_matmul.py`.
"""

from __future__ import annotations

import torch


def _rows(x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int],
          dilation: list[int]) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """(rows, columns, (n, oh, ow)): rows[n*oh*ow, k] @ columns[k, o] is the convolution of
    x by weight (groups 1): each row the input patch under one output position, in the order
    the weight's memory holds its (c, kh, kw) — so `columns` is a view of the weight."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    if any(padding):
        x = torch.constant_pad_nd(x, (padding[1], padding[1], padding[0], padding[0]))
        h, w = h + 2 * padding[0], w + 2 * padding[1]
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    sn, sc, sh, sw = x.stride()
    position = (n, oh, ow), (sn, sh * stride[0], sw * stride[1])
    tap = (kh, kw), (sh * dilation[0], sw * dilation[1])
    if weight.is_contiguous() or kh * kw == 1:  # (c, kh, kw)
        patches = x.as_strided((*position[0], c, *tap[0]), (*position[1], sc, *tap[1]),
                               x.storage_offset())
        columns = weight.reshape(o, c * kh * kw).t()
    else:  # channels-last weight: (kh, kw, c)
        patches = x.as_strided((*position[0], *tap[0], c), (*position[1], *tap[1], sc),
                               x.storage_offset())
        columns = weight.permute(0, 2, 3, 1).reshape(o, c * kh * kw).t()
    return patches.reshape(n * oh * ow, c * kh * kw), columns, (n, oh, ow)


def convolution_as_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          stride: list[int], padding: list[int], dilation: list[int],
                          channels_last: bool) -> torch.Tensor:
    """convolution(x, weight, bias, stride, padding, dilation, groups=1) of a 2-d image,
    channels-last when `channels_last` (else row-major), as eager lays it out."""
    rows, columns, (n, oh, ow) = _rows(x, weight, stride, padding, dilation)
    product = torch.mm(rows, columns) if bias is None else torch.addmm(bias, rows, columns)
    result = product.view(n, oh, ow, -1).permute(0, 3, 1, 2)
    return result if channels_last else result.contiguous()


def pointwise_convolution_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                   bias_sizes: list[int] | None, stride: list[int],
                                   padding: list[int], dilation: list[int], transposed: bool,
                                   output_padding: list[int], groups: int,
                                   output_mask: list[bool]) -> tuple:
    """convolution_backward for a 1x1 convolution of a channels-last image (groups 1, no
    padding), as two GEMMs over the positions: grad_input = grad @ W, grad_weight = grad^T @
    x; both views where the stride is 1. Eager's oneDNN backward reorders both and takes up
    to 20x longer on a few positions (ResNet-50's last downsampling at 4x4: 24 ms vs 1.3)."""
    n, c = x.shape[:2]
    o = weight.shape[0]
    sampled = x[:, :, ::stride[0], ::stride[1]] if any(s != 1 for s in stride) else x
    grad_rows = grad.permute(0, 2, 3, 1).reshape(-1, o)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        rows = torch.mm(grad_rows, weight.reshape(o, c))
        picked = rows.view(n, sampled.shape[2], sampled.shape[3], c).permute(0, 3, 1, 2)
        if sampled is x:
            grad_input = picked
        else:
            grad_input = torch.zeros_like(x, memory_format=torch.channels_last)
            grad_input[:, :, ::stride[0], ::stride[1]] = picked
    if output_mask[1]:
        rows = sampled.permute(0, 2, 3, 1).reshape(-1, c)
        grad_weight = torch.mm(grad_rows.t(), rows).view(weight.shape)
    if output_mask[2]:
        grad_bias = grad_rows.sum(0)
    return grad_input, grad_weight, grad_bias
