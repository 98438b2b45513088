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

from ember import torch_internals


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
    n, c, h, w = x.shape
    o = weight.shape[0]
    if weight.shape[2] == weight.shape[3] == 1 and stride == [1, 1] and padding == [0, 0]:
        if not channels_last and x.is_contiguous() and _by_image_pays(n, c, h * w, o):
            # a row-major image times the weight, image by image, gives the row-major result
            # with no copy of either (the rows below would cost two); the weight is read
            # once per image, which pays unless the images have only a few positions each
            columns = weight.view(1, o, c).expand(n, o, c)
            images = x.view(n, c, h * w)
            product = torch.bmm(columns, images) if bias is None else \
                torch.baddbmm(bias.view(1, o, 1).expand(n, o, h * w), columns, images)
            return product.view(n, o, h, w)
        # (the common case in few Python calls: a 1x1 convolution is a linear layer over
        # the positions; per call this is what a squeeze-excite block's 1x1 pays for)
        product = torch.nn.functional.linear(x.permute(0, 2, 3, 1).reshape(n * h * w, c),
                                             weight.reshape(o, c), bias)
        result = product.view(n, h, w, o).permute(0, 3, 1, 2)
        return result if channels_last else result.contiguous()
    rows, columns, (n, oh, ow) = _rows(x, weight, stride, padding, dilation)
    product = torch.mm(rows, columns) if bias is None else torch.addmm(bias, rows, columns)
    result = product.view(n, oh, ow, o).permute(0, 3, 1, 2)
    return result if channels_last else result.contiguous()


def convolution_backward_as_matmul(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                   bias_sizes: list[int] | None, stride: list[int],
                                   padding: list[int], dilation: list[int], transposed: bool,
                                   output_padding: list[int], groups: int,
                                   output_mask: list[bool]) -> tuple:
    """convolution_backward (groups 1, not transposed, a 2-d image) as two GEMMs over the
    output positions: grad_weight = grad^T @ rows, and grad_input the patches' gradients
    grad @ W added back where each patch came from (one strided add per tap of the kernel;
    none for a 1x1 convolution of stride 1). Both gradients are channels-last when x or the
    weight is (`channels_last_gradients`), else row-major, as eager's are.
    Eager's oneDNN backward reorders all three tensors and takes up to 20x longer on a few
    positions (ResNet-50's last 3x3 convolution at 4x4 positions, batch 4: 66 ms vs 3)."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    layout = torch.channels_last if channels_last_gradients(x, weight) \
        else torch.contiguous_format
    if kh * kw == 1 and list(stride) == [1, 1] and not any(padding) and \
            layout == torch.contiguous_format and x.is_contiguous() and \
            grad.is_contiguous() and _by_image_pays(n, c, h * w, o):
        return _pointwise_backward_by_image(grad, x, weight, output_mask)
    grad_rows = grad.permute(0, 2, 3, 1).reshape(-1, o)
    oh, ow = grad.shape[2:]
    grad_input = grad_weight = grad_bias = None
    taps_last = not (weight.is_contiguous() or kh * kw == 1)  # (weight's order: kh, kw, c)
    if output_mask[1]:
        rows, _, _ = _rows(x, weight, stride, padding, dilation)
        flat = torch.mm(grad_rows.t(), rows)
        grad_weight = flat.view(o, kh, kw, c).permute(0, 3, 1, 2) if taps_last \
            else flat.view(weight.shape)
        grad_weight = grad_weight.contiguous(memory_format=layout)
    if output_mask[0]:
        columns = weight.permute(0, 2, 3, 1) if taps_last else weight
        patches = torch.mm(grad_rows, columns.reshape(o, -1))
        patches = patches.view(n, oh, ow, kh, kw, c) if taps_last \
            else patches.view(n, oh, ow, c, kh, kw).permute(0, 1, 2, 4, 5, 3)
        if kh * kw == 1 and list(stride) == [1, 1] and not any(padding):
            grad_input = patches.view(n, h, w, c).permute(0, 3, 1, 2).contiguous(
                memory_format=layout)
        elif list(stride) == [kh, kw] and list(dilation) == [1, 1] and not any(padding) and \
                oh * kh == h and ow * kw == w:
            # patches that tile the image (a patch embedding inside the network, PVT's
            # spatial reduction, ConvNeXt's downsampling): each input position lies in one
            # patch, so the gradient is the patches' gradients rearranged, one copy (added
            # tap by tap, a 8x8 kernel's backward was 64 strided adds)
            grad_input = torch.empty((n, c, h, w), dtype=x.dtype, device=x.device,
                                     memory_format=layout)
            grad_input.unflatten(3, (ow, kw)).unflatten(2, (oh, kh)).copy_(
                patches.permute(0, 5, 1, 3, 2, 4))
        else:
            padded = torch.zeros((n, c, h + 2 * padding[0], w + 2 * padding[1]),
                                 dtype=x.dtype, device=x.device).contiguous(
                memory_format=layout)
            for i in range(kh):
                for j in range(kw):
                    top, left = i * dilation[0], j * dilation[1]
                    padded[:, :, top:top + stride[0] * (oh - 1) + 1:stride[0],
                           left:left + stride[1] * (ow - 1) + 1:stride[1]] += \
                        patches[:, :, :, i, j].permute(0, 3, 1, 2)
            grad_input = padded[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w]
            if any(padding):
                grad_input = grad_input.contiguous(memory_format=layout)
    if output_mask[2]:
        grad_bias = grad_rows.sum(0)
    return grad_input, grad_weight, grad_bias


def _by_image_pays(n: int, c: int, positions: int, o: int) -> bool:
    """Does a row-major 1x1 convolution (n images of c channels at `positions` positions, o
    outputs) pay image by image? The weight is read once per image instead of the image and
    the result copied into and out of rows: it pays unless the images have few positions."""
    return (n - 1) * o * c <= 4 * n * positions * (c + o)


def _pointwise_backward_by_image(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                 output_mask: list[bool]) -> tuple:
    """A row-major 1x1 convolution's backward image by image, as its forward is: grad_input
    = W^T @ grad per image and grad_weight = the sum over images of grad @ x^T, with no copy
    of the gradient or the image into rows (which cost two copies and a third back)."""
    n, c, h, w = x.shape
    o = weight.shape[0]
    images, grads = x.view(n, c, h * w), grad.view(n, o, h * w)
    grad_input = grad_weight = grad_bias = None
    if output_mask[1]:
        grad_weight = torch.bmm(grads, images.transpose(1, 2)).sum(0).view(weight.shape) \
            if n > 1 else torch.mm(grads[0], images[0].t()).view(weight.shape)
    if output_mask[0]:
        columns = weight.view(o, c).t()
        grad_input = torch.bmm(columns.expand(n, c, o), grads).view(n, c, h, w)
    if output_mask[2]:
        grad_bias = grads.sum((0, 2))
    return grad_input, grad_weight, grad_bias


def channels_last_gradients(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Are eager's gradients of this convolution channels-last (x or the weight is, by
    torch's own reading of their strides)?"""
    return torch.channels_last in (torch_internals.suggest_memory_format(x),
                                   torch_internals.suggest_memory_format(weight))
