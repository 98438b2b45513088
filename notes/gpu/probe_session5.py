"""Session 5's H200 probe: where S2's kernel time goes and where each first call's time goes.

    python3 notes/gpu/probe_session5.py all OUT_DIR

- s2: S2's fused kernel (20x gelu(x*1.01+0.01)) rendered as ember renders it, in variants
  (erf through tl.math or libdevice, gelu as eager writes it or as one fma, tiles, ptxas -O
  levels): Triton's compile time by stage, registers, PTX instruction counts, kernel time.
- inductor: Inductor's S2 kernel source and its PTX counts.
- firstcall NAME: one workload's first ember call on cold caches (a fresh process), with
  Triton's compile stages timed and EMBER_LOGS=perf's stage log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STAGES = ("make_ttir", "make_ttgir", "make_llir", "make_ptx", "make_cubin")


def time_stages() -> dict[str, float]:
    """Wrap the NVIDIA backend's compile stages with timers (summed over threads)."""
    from triton.backends.nvidia import compiler

    totals: dict[str, float] = {}
    lock = threading.Lock()
    cls = compiler.CUDABackend
    for name in STAGES:
        raw = cls.__dict__[name]
        static = isinstance(raw, staticmethod)
        fn = raw.__func__ if static else raw

        def timed(*args, _fn=fn, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                with lock:
                    totals[_name] = totals.get(_name, 0.0) + time.perf_counter() - start

        setattr(cls, name, staticmethod(timed) if static else timed)
    return totals


def ptx_counts(ptx: str) -> dict[str, int]:
    body = [line.strip() for line in ptx.splitlines()]
    instructions = [l for l in body if l and not l.startswith(("//", ".", "{", "}", "$"))
                    and l.endswith(";")]
    count = lambda prefix: sum(1 for l in instructions if l.startswith(prefix))  # noqa: E731
    return dict(total=len(instructions), fma=count("fma"), mul=count("mul.f32") + count("mul.rn"),
                add=count("add.f32") + count("add.rn"), ex2=count("ex2"), setp=count("setp"),
                selp=count("selp"), bra=count("bra"), ld=count("ld.global"),
                st=count("st.global"))


def s2_source(name: str, block: int, erf: str, form: str) -> str:
    lines = ["import triton", "import triton.language as tl",
             "from triton.language.extra import libdevice", "", "",
             "@triton.jit", f"def {name}(p_in0, p_out0):",
             f"    XBLOCK: tl.constexpr = {block}",
             "    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)",
             "    v = tl.load(p_in0 + x)"]
    call = "tl.math.erf" if erf == "math" else "libdevice.erf"
    for _ in range(20):
        lines.append("    v = (v * 1.01) + 0.01")
        if form == "plain":  # as eager and Inductor write erf-gelu
            lines.append(f"    v = (v * 0.5) * ({call}(v * 0.70710677) + 1.0)")
        else:  # 0.5v + 0.5v*erf: one fma instead of an add and a multiply
            lines.append("    h = v * 0.5")
            lines.append(f"    v = h * {call}(v * 0.70710677) + h")
    lines.append("    tl.store(p_out0 + x, v)")
    return "\n".join(lines) + "\n"


def load(text: str, name: str, folder: Path):
    import importlib.util

    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def kernel_ms(run, iterations: int = 50) -> float:
    import torch

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iterations)
    return sorted(times)[len(times) // 2]


def probe_s2(out: Path) -> list[dict]:
    import torch
    import torch.nn.functional as F
    import triton
    from triton.compiler import ASTSource

    stages = time_stages()
    folder = Path(tempfile.mkdtemp())
    x = torch.randn(4096, 4096, device="cuda")
    expected = x
    for _ in range(20):
        expected = F.gelu(expected * 1.01 + 0.01)
    target = triton.runtime.driver.active.get_current_target()
    variants = [  # (run 1's list: tests in notes/gpu/session5/probe-run1.txt)
        ("math", "plain", 1024, 8, None), ("math", "fma", 1024, 8, None),
        ("math", "fma", 512, 4, None), ("math", "fma", 2048, 16, None),
        ("math", "plain", 2048, 16, None),
    ]
    results = []
    for i, (erf, form, block, warps, ptx_options) in enumerate(variants):
        name = f"s2_{i}"
        fn = load(s2_source(name, block, erf, form), name, folder)
        signature = {"p_in0": "*fp32", "p_out0": "*fp32"}
        attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
        options = {"num_warps": warps, "num_stages": 1}
        if ptx_options:
            options["ptx_options"] = ptx_options
        stages.clear()
        start = time.perf_counter()
        compiled = triton.compile(ASTSource(fn, signature, {}, attrs), target=target,
                                  options=options)
        compile_s = time.perf_counter() - start
        y = torch.empty_like(x)
        grid = (x.numel() // block, 1, 1)
        compiled[grid](x, y)
        torch.cuda.synchronize()
        error = float((y - expected).abs().max())
        ms = kernel_ms(lambda: compiled[grid](x, y))
        row = dict(erf=erf, form=form, block=block, warps=warps, ptx_options=ptx_options,
                   compile_s=round(compile_s, 3),
                   stages={k: round(v, 3) for k, v in stages.items()},
                   n_regs=compiled.n_regs, n_spills=compiled.n_spills,
                   ptx=ptx_counts(compiled.asm["ptx"]), kernel_ms=round(ms, 4),
                   max_abs_error=error)
        print(json.dumps(row), flush=True)
        results.append(row)
        (out / f"s2_{i}.ptx").write_text(compiled.asm["ptx"])
    (out / "s2_variants.json").write_text(json.dumps(results, indent=1))
    return results


def probe_inductor(out: Path) -> None:
    import torch
    from torch._inductor.utils import run_and_get_code

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from ember.bench.workloads import gelu_chain20

    x = torch.randn(4096, 4096, device="cuda")
    compiled = torch.compile(gelu_chain20)
    _, codes = run_and_get_code(compiled, x)
    (out / "inductor_s2.py").write_text("\n\n".join(codes))
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    for ptx in cache.rglob("*.ptx"):
        text = ptx.read_text()
        if "ex2" in text or "erf" in ptx.name:
            counts = ptx_counts(text)
            print(json.dumps(dict(inductor_ptx=ptx.name, **counts)), flush=True)
            (out / f"inductor_{ptx.name}").write_text(text)
    for meta in cache.rglob("*.json"):
        if "__grp__" in meta.name:
            continue
        try:
            data = json.loads(meta.read_text())
        except ValueError:
            continue
        if "num_warps" in data:
            print(json.dumps(dict(inductor_kernel=data.get("name"), num_warps=data["num_warps"],
                                  num_stages=data.get("num_stages"))), flush=True)
    ms = kernel_ms(lambda: compiled(x), 20)
    print(json.dumps(dict(inductor_call_ms_back_to_back=round(ms, 4))), flush=True)


def probe_first_call(name: str) -> None:
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    started = time.perf_counter()
    import torch

    torch_s = time.perf_counter() - started
    torch.zeros(1, device="cuda")
    start = time.perf_counter()
    import triton

    triton_import_s = time.perf_counter() - start
    start = time.perf_counter()
    driver = triton.runtime.driver.active
    driver.get_current_target()
    driver.utils  # noqa: B018
    driver_s = time.perf_counter() - start
    stages = time_stages()
    import ember
    from ember.bench.gpu import build

    fn, args = build(name, False)
    with torch.no_grad():
        fn(*args)
        torch.cuda.synchronize()
        compiled = ember.compile(fn)
        start = time.perf_counter()
        compiled(*args)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
    print(json.dumps(dict(workload=name, torch_import_s=round(torch_s, 3),
                          triton_import_s=round(triton_import_s, 3),
                          triton_driver_s=round(driver_s, 3), first_call_s=round(first_s, 3),
                          triton_stages={k: round(v, 3) for k, v in stages.items()})),
          flush=True)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "firstcall":
        probe_first_call(sys.argv[3])
        return
    if mode == "s2":
        probe_s2(out)
        return
    if mode == "inductor":
        probe_inductor(out)
        return
    assert mode == "all"
    log = out / "probe.txt"
    with log.open("w") as sink:
        for argv, env in [(["s2"], {}), (["inductor"], {})] + \
                [(["firstcall", w], {"EMBER_LOGS": "perf"})
                 for w in ("S1", "S2", "S5", "layer_norm", "softmax")]:
            caches = Path(tempfile.mkdtemp())
            environment = dict(os.environ, TRITON_CACHE_DIR=str(caches / "triton"),
                               TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                               EMBER_CACHE_DIR=str(caches / "ember"), **env)
            environment.pop("TRITON_INTERPRET", None)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, argv[0], str(out), *argv[1:]],
                                  env=environment, capture_output=True, text=True, timeout=240)
            sink.write(f"## {' '.join(argv)} (rc {done.returncode}, "
                       f"{time.perf_counter() - started:.1f} s)\n{done.stdout}\n")
            sink.write("stderr:\n" + "\n".join(done.stderr.splitlines()[-40:]) + "\n\n")
            sink.flush()


if __name__ == "__main__":
    main()
