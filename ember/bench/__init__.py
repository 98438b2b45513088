"""Measuring ember against eager PyTorch and torch.compile (DESIGN.md, `bench/`).

harness: `benchmark` (steady state), `first_call` (cold, in a fresh process), `break_even`;
workloads: the seed workloads; cli: `python -m ember bench`; report: tables and files.
"""

from ember.bench.harness import Timing, Trial, benchmark, break_even, first_call

__all__ = ["Timing", "Trial", "benchmark", "break_even", "first_call"]
