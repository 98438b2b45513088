"""The kernel a Triton compile worker (runtime/triton_worker.py) compiles when it starts, to pay
Triton's one-time costs before the graph's first kernel arrives. Imports Triton only."""

import triton
import triton.language as tl


@triton.jit
def warm(x, n, VALUE: tl.constexpr):
    offsets = tl.program_id(0) * 128 + tl.arange(0, 128)
    inside = offsets < n
    tl.store(x + offsets, tl.exp(tl.load(x + offsets, mask=inside)) + VALUE, mask=inside)
