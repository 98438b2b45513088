"""Which resource bounds a workload: the roofline of the seeds' method.

A call that moves B bytes and does F flops cannot take less than max(B / bandwidth, F / peak)
on this machine. Measured against that floor, a steady-state time t is

    overhead-bound    the floor is tiny (under OVERHEAD_FLOOR_S) and t is more than
                      OVERHEAD x the floor: launches, Python, allocation dominate
    compute-bound     otherwise, when F / peak > B / bandwidth
    cache-resident    otherwise, when t is under B / bandwidth: the data stays in the
                      caches between calls, and DRAM's bandwidth bounds nothing
    bandwidth-bound   otherwise

with the attained fraction floor / t beside it (how much of the bound resource the call
uses; an eager chain of ops that each pass over memory attains a few percent).

The ceilings are measured at the start of a run (`measure_ceilings`): a large tensor copy
for bandwidth, a float32 matmul for compute. A workload's work (`count_work`) is counted on
one eager call: flops by torch's FlopCounterMode (matmuls, convolutions, attention: what
dominates compute), bytes as the least a call must move — every input, parameter and buffer
read once and every output written once (and the parameters written back by a training step).
Elementwise math is not counted as flops: those workloads show as bandwidth-bound, with the
fraction of the copy bandwidth they attain.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

# A time more than this many times a floor under OVERHEAD_FLOOR_S is overhead-bound.
OVERHEAD = 4.0
OVERHEAD_FLOOR_S = 50e-6


@dataclasses.dataclass(frozen=True)
class Ceilings:
    bandwidth_gb_s: float   # bytes read + written per second by a large copy, / 1e9
    peak_gflop_s: float     # float32 matmul flops per second, / 1e9
    device: str = "cpu"

    @property
    def ridge(self) -> float:
        """Flops per byte where compute starts to bound instead of bandwidth."""
        return self.peak_gflop_s / self.bandwidth_gb_s

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Work:
    bytes: int
    flops: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclasses.dataclass(frozen=True)
class Regime:
    name: str          # "bandwidth", "compute", "overhead" or "cache-resident"
    floor_s: float     # the roofline's least time for this work
    attained: float    # floor / measured time: the fraction of the bound resource used

    def __str__(self) -> str:
        if self.name == "cache-resident":
            return "cache-resident"
        return f"{self.name} ({self.attained:.0%})"

    def to_json(self) -> dict[str, Any]:
        return {"regime": self.name, "floor_s": self.floor_s,
                "attained": None if self.name == "cache-resident" else self.attained}


def regime(work: Work, ceilings: Ceilings, seconds: float) -> Regime:
    memory = work.bytes / (ceilings.bandwidth_gb_s * 1e9)
    compute = work.flops / (ceilings.peak_gflop_s * 1e9)
    floor = max(memory, compute)
    attained = floor / seconds if seconds > 0 else 0.0
    if floor <= 0 or (floor < OVERHEAD_FLOOR_S and seconds > OVERHEAD * floor):
        return Regime("overhead", floor, attained)
    if attained > 1.0 and memory >= compute:
        # faster than the copy bandwidth allows: the data lives in the caches between calls
        # (the ceiling is DRAM's), so no fraction of that ceiling says anything
        return Regime("cache-resident", floor, attained)
    return Regime("compute" if compute > memory else "bandwidth", floor, attained)


def _best(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def measure_ceilings(device: str = "cpu", copy_mib: int = 256, matmul_n: int = 1024,
                     repeats: int = 5) -> Ceilings:
    """Bandwidth from a copy of `copy_mib` MiB of float32 (read + write), peak from an n x n
    float32 matmul (2 n^3 flops); the best of `repeats` each."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    elements = copy_mib * 2**20 // 4
    copy_s = _copy_time(torch, elements, device, sync, repeats)
    a = torch.rand(matmul_n, matmul_n, device=device)
    b = torch.rand(matmul_n, matmul_n, device=device)
    matmul_s = _best(lambda: a @ b, sync, repeats)
    return Ceilings(2 * elements * 4 / copy_s / 1e9, 2 * matmul_n**3 / matmul_s / 1e9, device)


def _copy_time(torch: Any, elements: int, device: str, sync: Callable[[], None],
               repeats: int) -> float:
    source = torch.rand(elements, device=device)
    target = torch.empty_like(source)
    return _best(lambda: target.copy_(source), sync, repeats)


def count_work(fn: Callable[..., Any], args: tuple[Any, ...]) -> Work:
    """Flops and least bytes of one call of `fn` (which it runs once, eagerly)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ember.torch_internals import tree_flatten

    read: dict[int, torch.Tensor] = {}
    for value in tree_flatten(list(args))[0]:
        if isinstance(value, torch.Tensor):
            read[id(value)] = value
    modules = [fn] if isinstance(fn, torch.nn.Module) else []
    modules += [m for m in getattr(fn, "model_slot", []) if isinstance(m, torch.nn.Module)]
    trained = [p for m in modules for p in m.parameters() if p.requires_grad] \
        if torch.is_grad_enabled() else []
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            read[id(tensor)] = tensor
    counter = FlopCounterMode(display=False)
    with counter:
        result = fn(*args)
    written = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    total = sum(t.numel() * t.element_size() for t in [*read.values(), *written, *trained])
    return Work(int(total), float(counter.get_total_flops()))
