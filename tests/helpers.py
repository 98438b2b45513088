"""Shared test machinery: compile a function with ember, run it beside eager, compare.

Every comparison also checks that ember really compiled the graph (a silent fallback to
eager would make any comparison pass) and, when asked, how many kernels it generated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from ember.backends import compile_graph
from ember.runtime.compiled import CompiledGraph

TOLERANCES = {
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float64: dict(rtol=1e-9, atol=1e-9),
}


def capture(fn: Callable, args: tuple) -> torch.fx.GraphModule:
    """An FX graph of `fn` the way Dynamo hands it to a backend."""
    graphs: list[torch.fx.GraphModule] = []

    def grab(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=grab, fullgraph=True, dynamic=False)(*copy.deepcopy(args))
    assert len(graphs) == 1, f"expected one graph, Dynamo made {len(graphs)}"
    return graphs[0]


def compile_fn(fn: Callable, args: tuple, dynamo: bool = False) -> Callable:
    if dynamo:
        gm = capture(fn, args)
    else:
        gm = torch.fx.symbolic_trace(fn)
    return compile_graph(gm, list(args))


def assert_close(actual: Any, expected: Any, **tolerance: Any) -> None:
    flat_actual, _ = tree_flatten(actual)
    flat_expected, _ = tree_flatten(expected)
    assert len(flat_actual) == len(flat_expected)
    for got, want in zip(flat_actual, flat_expected):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
            assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
            assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
            options = dict(TOLERANCES.get(want.dtype, dict(rtol=0, atol=0)))
            options.update(tolerance)
            torch.testing.assert_close(got, want, equal_nan=True, **options)
        else:
            assert got == want


def check(fn: Callable, *args: Any, kernels: int | None = None, dynamo: bool = False,
          strides: bool = True, **tolerance: Any) -> CompiledGraph:
    """Compile `fn`, run it and eager on copies of `args`, and compare results, strides and
    what happened to the arguments (in-place mutation)."""
    with torch.no_grad():
        compiled = compile_fn(fn, args, dynamo=dynamo)
        assert isinstance(compiled, CompiledGraph), "ember fell back to eager for this graph"
        eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
        expected = fn(*eager_args)
        for _ in range(2):  # the first call runs the checked wrapper, the second the fast one
            got_args = copy.deepcopy(compiled_args)
            actual = compiled(*got_args)
            assert_close(actual, expected, **tolerance)
            assert_close(got_args, eager_args, **tolerance)
            if strides:
                for got, want in zip(tree_flatten(actual)[0], tree_flatten(expected)[0]):
                    if isinstance(want, torch.Tensor) and want.numel() > 1:
                        assert got.stride() == want.stride(), \
                            f"strides {got.stride()} != eager's {want.stride()}"
    if kernels is not None:
        assert compiled.kernel_count == kernels, \
            f"{compiled.kernel_count} kernels, expected {kernels}"
    return compiled
