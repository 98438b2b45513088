"""Session 6: is ember_erf_f32 libdevice's erff to the bit, and how do both compare with eager's
CUDA erf and with float64?  Also times the three in one S2-like chain kernel (not needed: the
bench does that)."""
import importlib.util
import json
import sys

import os

import torch
import triton
import triton.language as tl

from ember.codegen import triton_rules

DEVICE = os.environ.get("PROBE_DEVICE", "cuda")
STRIDE = int(os.environ.get("PROBE_STRIDE", "7"))

text = triton_rules.prelude() + '''

@triton.jit
def ember_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, ember_erf_f32(x), mask=i < n)


@triton.jit
def libdevice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, tl.math.erf(x), mask=i < n)
'''
path = sys.argv[1] + "/erf_module.py"
open(path, "w").write(text)
spec = importlib.util.spec_from_file_location("erf_module", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)

# every float32 in [-6, 6] (positive and negative) would be 2^31; take a dense stride instead
bits = torch.arange(0, 0x40C00000, STRIDE, dtype=torch.int64, device=DEVICE).to(torch.int32)
x = bits.view(torch.float32)
x = torch.cat([x, -x, torch.tensor([1e-40, -1e-40, 1e-30, float("inf"), -float("inf"),
                                   float("nan")], device=DEVICE)])
n = x.numel()
results = {"eager": torch.erf(x)}
for name in ("ember", "libdevice"):
    y = torch.empty_like(x)
    getattr(module, f"{name}_kernel")[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    results[name] = y
exact = torch.erf(x.double())


def ulps(a, b):
    ia = a.view(torch.int32).to(torch.int64)
    ib = b.view(torch.int32).to(torch.int64)
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return (ia - ib).abs()


finite = torch.isfinite(x)
report = {"n": n}
for a, b in (("ember", "libdevice"), ("ember", "eager"), ("libdevice", "eager")):
    d = ulps(results[a], results[b])[finite]
    differ = d != 0
    report[f"{a} vs {b}"] = {"differ": int(differ.sum()), "max_ulps": int(d.max()),
                             "first_x": x[finite][differ][:5].tolist()}
for name, y in results.items():
    d = ulps(y, exact.float())[finite]
    err = ((y.double() - exact).abs() / torch.finfo(torch.float32).eps)[finite]
    report[f"{name} vs float64"] = {"max_ulps_vs_rounded": int(d.max()),
                                   "mean_ulps": float(d.double().mean())}
report["specials"] = {name: y[-6:].tolist() for name, y in results.items()}
print(json.dumps(report, indent=1))
