"""What aten's schemas leave unsaid, for the tracer: ops whose results alias their inputs or
whose writes the schema does not declare, and ops eager swaps for a twin where autograd needs
one. Each entry is a fact about torch's op, not a choice of ember's."""

from __future__ import annotations

import torch

aten = torch.ops.aten

# Results that are views of the input although the schema says nothing of it (the "unsafe"
# splits: views autograd does not track as views).
UNTRACKED_VIEWS = {aten.unsafe_split.Tensor, aten.unsafe_split_with_sizes.default}

# Ops that write arguments their schema does not mark, and the twin whose schema does:
# native_batch_norm in training updates the running statistics it is given.
WRITES_UNDECLARED = {aten.native_batch_norm.default: aten._native_batch_norm_legit.default}
WRITTEN_UNDECLARED = {aten.native_batch_norm.default: ("running_mean", "running_var")}

# An op eager picks where no input requires grad, and its twin that has the backward.
DIFFERENTIABLE_TWINS = {
    aten._embedding_bag_forward_only.default: aten._embedding_bag.default,
}
