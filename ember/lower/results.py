"""What lowering gives: the IR graph and how the compiled function makes each output of the
FX graph from the IR's outputs and inputs (OutputSpec)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ember.ir.graph import Graph
from ember.ir.sizes import any_symbolic, evaluate


@dataclasses.dataclass
class OutputSpec:
    """How the compiled function produces one output of the FX graph.

    kind: "node"    the value of graph.outputs[index]
          "input"   graph input `index` itself
          "view"    a view (size, stride, offset) of graph input `index`, or of graph output
                    `index` when `of_output` is set; of its memory read as `dtype` when set
                    (x.view(torch.int32)); offset counts elements of the view's dtype
          "same"    the same object as output `index`
          "value"   the Python value `value`
    """

    kind: str
    index: int = -1
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0
    of_output: bool = False
    value: Any = None
    dtype: torch.dtype | None = None
    from_storage_start: bool = False  # offset counts from the storage's start (as_strided's)
    # a view: made where eager's autograd recorded it (True: it has a grad_fn), or not (False:
    # made under no_grad inside the function); None: as the call's grad mode says
    recorded: bool | None = None

    def view_of(self, base: torch.Tensor,
                bindings: Mapping[str, int] | None = None) -> torch.Tensor:
        """This view of `base`'s memory (the wrapper inlines the same-dtype case); a symbolic
        graph's geometry at this call's symbol values `bindings`."""
        size, stride, offset = self.size, self.stride, self.offset
        if bindings is not None and any_symbolic((*size, *stride, offset)):
            size = tuple(evaluate(d, bindings) for d in size)
            stride = tuple(evaluate(d, bindings) for d in stride)
            offset = evaluate(offset, bindings)
        if self.dtype is None or self.dtype == base.dtype:
            return base.as_strided(size, stride, self.start(base) + offset)
        start = self.start(base) * base.element_size() // self.dtype.itemsize
        # complex <-> its real pairs through torch's own views, which autograd differentiates
        # (a storage set_ below is a view autograd does not see: no gradient reached the base)
        if base.is_complex() and not base.is_conj() and self.dtype == base.dtype.to_real():
            return torch.view_as_real(base).as_strided(size, stride, start + offset)
        if self.dtype.is_complex and base.dtype == self.dtype.to_real():
            pairs = base.as_strided((*size, 2), (*(2 * s for s in stride), 1),
                                    2 * (start + offset))
            return torch.view_as_complex(pairs)
        view = torch.empty(0, dtype=self.dtype, device=base.device)
        return view.set_(base.untyped_storage(), start + offset, size, stride)

    def start(self, base: torch.Tensor) -> int:
        """Where the offset counts from in `base`'s storage."""
        return 0 if self.from_storage_start else base.storage_offset()


@dataclasses.dataclass
class Lowered:
    graph: Graph
    outputs: list[OutputSpec]
    output_tree: Any                   # pytree spec of the FX graph's result
    attributes: list[str]              # get_attr targets fed as extra inputs, in order
    constants: list[torch.Tensor]      # tensors created while tracing, fed as extra inputs
    library_calls: int = 0
