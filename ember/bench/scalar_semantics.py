"""How eager computes a half-precision tensor op with a Python scalar: the scalar rounded to
the tensor's dtype first ("rounded") or held in float32 beside the float32 compute
("wide"), per op and device. Ember's rules must do as eager does (ember/lower/builder.py,
`Builder.elementwise`); this prints what eager does on this machine and what ember gives.

    python3 -m ember.bench.scalar_semantics [--device cuda] [--ember]
"""
import argparse
import operator

import torch

OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "rsub": lambda a, s: s - a, "rdiv": lambda a, s: s / a, "pow": operator.pow,
    "rpow": lambda a, s: s ** a, "lt": operator.lt, "ge": operator.ge,
    "clamp_min": lambda a, s: torch.clamp(a, min=s),
    "where": lambda a, s: torch.where(a > 0, a, s),
    "fmod": torch.fmod, "remainder": torch.remainder,
    "add_alpha": lambda a, s: torch.add(a, a * 2, alpha=s),
    "lerp": lambda a, s: torch.lerp(a, a * 2, s),
    "addcmul": lambda a, s: torch.addcmul(a, a, a, value=s),
    "mul_0d": lambda a, s: a * torch.tensor(s),
    "rmul_0d": lambda a, s: torch.tensor(s) * a,
    "div_0d": lambda a, s: a / torch.tensor(s),
}


def differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements that differ (NaN matches NaN)."""
    same = (a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a == b
    return int((~same).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ember", action="store_true", help="also ember's differences")
    options = parser.parse_args()
    if options.ember:
        import ember
    scalar = 0.1
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(100000, generator=torch.Generator().manual_seed(0)).to(
            dtype=dtype, device=options.device) + 0.05
        narrow = float(torch.tensor(scalar).to(dtype))
        for name, op in OPS.items():
            expected = op(x, scalar)
            if expected.dtype is torch.bool:
                wide = op(x.float(), scalar)
                rounded = op(x.float(), narrow)
            else:
                wide = op(x.float(), scalar).to(dtype)
                rounded = op(x.float(), narrow).to(dtype)
            line = (f"{str(dtype):15s} {name:10s} differs from wide {differ(expected, wide):6d}"
                    f" from rounded {differ(expected, rounded):6d}")
            if options.ember:
                got = ember.compile(lambda v, op=op: op(v, scalar), dynamic=False)(x)
                line += f"  ember differs {differ(got, expected):6d}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
