"""Matrix products folded as eager folds them when an operand requires grad.

torch.matmul of a batched operand (3-d or more) and a matrix or vector folds the batch into
one matrix product; where folding would copy the batched operand (a transposed activation,
`linear(x.transpose(1, 2), w)`), eager folds anyway when the matrix requires grad — even
under no_grad: ATen's `should_fold` reads the flag, not the grad mode — so that the matrix's
gradient is one product over the folded rows, not a batched product summed over the batch
(a result batch times as large). F.linear calls matmul for an input that is not 2-d or a
contiguous one with a bias. The meta tensors ember traces carry no autograd state, so the
composite took its no-grad branch there: a batched product of the expanded weight, and in a
training graph's backward the batched weight gradient and its sum (timm's ResMLP-12, whose
token-mixing linears read transposed activations: 1.25x eager's training step on the CPU,
2026-12-07). `folded_matmul` and `folded_linear` make eager's ops for those cases and
return None where eager's branch does not depend on the flag.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def folded_matmul(a: torch.Tensor, b: torch.Tensor, wants_grad: tuple[bool, bool]
                  ) -> torch.Tensor | None:
    """matmul(a, b) where eager's composite folds (or drops a batch of one) because an operand
    requires grad (`wants_grad`: do eager's a and b); None where it would not, or where its
    no-grad branch does the same."""
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        # (a batch of one against another batch: eager drops it from an operand that
        # requires grad, whose gradient is then no sum over the other's batch)
        if a.shape[0] == 1 and wants_grad[0]:
            a = a.squeeze(0)
        elif b.shape[0] == 1 and wants_grad[1]:
            b = b.squeeze(0)
        else:
            return None
        folded = folded_matmul(a, b, wants_grad)
        return folded if folded is not None else torch.matmul(a, b)
    larger, smaller, smaller_wants = (a, b, wants_grad[1]) if a.dim() >= b.dim() else \
        (b, a, wants_grad[0])
    if larger.dim() < 3 or smaller.dim() > 2 or not smaller_wants:
        return None
    transposed = b.dim() > a.dim()
    rows_of = larger.mT if transposed else larger
    other = (a.t() if a.dim() == 2 else a) if transposed else b
    shape = list(rows_of.shape[:-1])
    rows = rows_of.reshape(math.prod(shape), rows_of.shape[-1])
    if other.dim() == 1:
        return aten._unsafe_view(rows.mv(other), shape)
    product = aten._unsafe_view(rows.mm(other), [*shape, other.shape[1]])
    return product.mT.contiguous() if transposed else product


def folded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  wants_grad: tuple[bool, bool]) -> torch.Tensor | None:
    """F.linear(x, weight, bias) where eager's matmul inside it folds because the weight
    requires grad (`wants_grad`: do eager's x and weight); None elsewhere (a 2-d input with a
    bias is one addmm; a contiguous one with a bias is flattened without matmul)."""
    if bias is not None and (x.dim() == 2 or x.is_contiguous() and
                             (x.dim() == 3 or bias.dim() == 1)):
        return None
    product = folded_matmul(x, weight.t(), wants_grad)
    if product is not None and bias is not None:
        product.add_(bias)
    return product
