"""calls_for(ops): pointwise ops a code generator cannot compute become library calls.

The Triton backend only uses functions Triton's interpreter also runs (ember/codegen/
triton_rules.py); the few ops those cannot build to eager's accuracy (asin, atan2, erfc, ...)
run as a call of the op itself at run time, which is exactly eager. The call's result is a
kernel boundary; everything around it still fuses.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from ember.ir.graph import Graph, Node, row_major
from ember.ir.interpreter import interpret_rules
from ember.ir.library import Slot
from ember.ir.ops import Op
from ember.passes.rewrite import rewrite


class PointwiseCall:
    """The op applied to tensors, as the library call's target: eager's result, row-major."""

    def __init__(self, node: Node):
        self.op = node.op
        self.rule = interpret_rules[node.op]
        self.node = node
        self.__name__ = f"{node.op.value}"

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        result = self.rule(self.node, list(tensors)).to(self.node.dtype)
        return result.contiguous()

    def __repr__(self) -> str:
        return f"ember.{self.__name__}"


def calls_for(ops: Collection[Op]) -> Callable[[Graph], int]:
    def to_library_calls(graph: Graph) -> int:
        def visit(node: Node) -> Node | None:
            if node.op not in ops:
                return None
            template = tuple(Slot(i) for i in range(len(node.inputs)))
            strides = row_major(node.shape)
            call = graph.add(Op.LIBRARY, node.inputs, target=PointwiseCall(node), args=template,
                             kwargs={}, results=((node.shape, node.dtype, strides),),
                             tuple_result=False)
            call.strides = strides
            return call

        return rewrite(graph, visit)

    return to_library_calls
