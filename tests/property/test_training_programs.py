"""Random float programs (pointwise chains with broadcasting, where, casts, views, data
movement, reductions) compiled for training: outputs and the gradients of every input match
eager's under random cotangents (tests/helpers.py check_grad)."""

import torch
from helpers import check_grad
from hypothesis import given
from property.strategies import examples, programs, tolerance


@examples(120)
@given(programs(reductions=True, dtypes=(torch.float32, torch.float64), gradients=True))
def test_gradients_of_random_programs_match_eager(program):
    limits = tolerance(program) or dict(rtol=1e-7, atol=1e-7)
    limits = {k: max(v, 1e-4) for k, v in limits.items()}  # (a backward adds its own rounding)
    # gradients under random cotangents are never exact: one that flows through a half-precision
    # cast is rounded there, in another order than eager's — half-precision tolerance
    halves = {v.dtype for v in program.values} & {torch.float16, torch.bfloat16}
    if halves:
        floor = 1e-2 if torch.bfloat16 in halves else 2e-3
        limits = {k: max(v, floor) for k, v in limits.items()}
    check_grad(program.function(), *program.inputs, **limits)
