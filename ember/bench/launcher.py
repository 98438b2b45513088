"""Ember's one Triton launcher against Triton's per-argument-list launchers, in one process
on a GPU (runtime/cuda_launcher.c): the same function compiled twice, once with each
(EMBER_TRITON_LAUNCHER), checked against eager, then timed in alternating rounds — the host's
time per call without a sync (what the wrapper and the launches cost the CPU) and the time per
call with a sync at the end of each round.

    python -m ember.bench.launcher [--calls 200] [--rounds 5]

The function: a small pre-norm MLP block in float32 at a size where the host dominates, so
each call is a dozen kernels of several argument lists.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, scale: torch.Tensor,
          bias: torch.Tensor) -> torch.Tensor:
    h = F.layer_norm(x, x.shape[-1:]) * scale + bias
    h = F.gelu(h @ w1)
    h = (h @ w2).softmax(-1) * x.sigmoid() + x.tanh()
    return torch.relu(h - h.mean(-1, keepdim=True)).cumsum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()

    import ember
    from ember import config

    torch.manual_seed(0)
    device = "cuda"
    x = torch.randn(16, 64, device=device)
    arguments = (x, torch.randn(64, 128, device=device) / 8,
                 torch.randn(128, 64, device=device) / 11, torch.randn(64, device=device),
                 torch.randn(64, device=device))
    want = block(*arguments)
    compiled = {}
    for ours in (True, False):
        with config.override(triton_launcher=ours):
            function = ember.compile(block)
            got = function(*arguments)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        compiled["ember's launcher" if ours else "Triton's launchers"] = function
    host = {name: [] for name in compiled}
    synced = {name: [] for name in compiled}
    for _ in range(options.rounds):
        for name, function in compiled.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(options.calls):
                function(*arguments)
            issued = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
            host[name].append((issued - start) / options.calls * 1e6)
            synced[name].append((done - start) / options.calls * 1e6)
    print(f"{'launcher':<22}{'host us/call':>14}{'with sync us/call':>20}   (best of "
          f"{options.rounds} rounds of {options.calls} calls)")
    for name in compiled:
        print(f"{name:<22}{min(host[name]):>14.1f}{min(synced[name]):>20.1f}")


if __name__ == "__main__":
    main()
