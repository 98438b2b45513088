"""Data-parallel training step time: eager DDP vs torch.compile DDP vs ember DDP.

    python -m ember.bench.distributed [--ranks 2] [--steps 20] [--quick] [--out DIR]

S3's model (4x Linear with gelu_ish between, SGD) with one copy per rank, each rank on its own
batch: NCCL with one GPU per rank where there are as many GPUs, else gloo on the CPU. Each
variant trains in the same processes, one after another, on a fresh copy of the model:

- eager DDP: DDP(model);
- torch.compile DDP: torch.compile(DDP(model)) (Dynamo splits the graph at DDP's buckets);
- ember DDP: ember.compile(DDP(model)) (DDP's forward as it is, the model compiled);
- and each again without DDP (no gradient all-reduce), so that the step time DDP adds —
  communication the backward did not hide — can be read off: exposed = DDP - local.

ember's compiled backward is one autograd node: every gradient is ready when it ends, so DDP's
buckets are all-reduced after it, not during it (eager's and torch.compile's backward hand
buckets over layer by layer). The exposed time is where that shows.

Per variant: the first step (compile included) and the median step time (a barrier and, on
GPUs, a device sync after each step) on rank 0; parameters are checked equal across ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("eager", "torch.compile", "ember")


def _step_fn(model: Any, net: Any, optimizer: Any) -> Any:
    def step(x: Any) -> Any:
        optimizer.zero_grad()
        loss = net(x).sum()
        loss.backward()
        optimizer.step()
        return loss

    return step


def _build(variant: str, distributed: bool, batch: int, width: int, device: Any) -> Any:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ember
    from ember.bench.workloads import build_s3_forward

    torch.manual_seed(0)
    model, _ = build_s3_forward(batch, width)
    model = model.to(device)
    net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if distributed else model
    if variant == "torch.compile":
        net = torch.compile(net)
    elif variant == "ember":
        net = ember.compile(net)
    # (a small rate: the .sum() loss's gradients are large, and the step runs ~25 times)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    return model, _step_fn(model, net, optimizer)


def _time(step: Any, x: Any, steps: int, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    sync()
    start = time.perf_counter()
    step(x)
    sync()
    first = time.perf_counter() - start
    for _ in range(2):
        step(x)
    sync()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step(x)
        sync()
        samples.append(time.perf_counter() - start)
    return dict(first_s=first, median_ms=statistics.median(samples) * 1e3,
                p10_ms=sorted(samples)[len(samples) // 10] * 1e3,
                p90_ms=sorted(samples)[-1 - len(samples) // 10] * 1e3)


def rank_main(rank: int, world: int, init: str, out: str, options: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    nccl = options["backend"] == "nccl"
    device = torch.device("cuda", rank) if nccl else torch.device("cpu")
    if nccl:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(options["backend"], init_method=init, rank=rank, world_size=world)
    try:
        results = []
        generator = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(options["batch"], options["width"], generator=generator).to(device)
        for variant in options["variants"]:
            for distributed in (True, False):
                try:
                    model, step = _build(variant, distributed, options["batch"],
                                         options["width"], device)
                    timing = _time(step, x, options["steps"], device)
                    same = True
                    if distributed:  # every rank must end with rank 0's parameters
                        for param in model.parameters():
                            copy = param.detach().clone()
                            dist.broadcast(copy, 0)
                            same = same and torch.equal(copy, param.detach())
                        agree = torch.tensor([float(same)], device=device)
                        dist.all_reduce(agree, op=dist.ReduceOp.MIN)
                        same = bool(agree.item())
                    results.append(dict(variant=variant, ddp=distributed, ranks_agree=same,
                                        **timing))
                except Exception as error:  # noqa: BLE001 (a variant that fails is reported)
                    results.append(dict(variant=variant, ddp=distributed,
                                        error=f"{type(error).__name__}: {error}"[:200]))
        if rank == 0:
            Path(out, "results.json").write_text(json.dumps(results, indent=1))
    finally:
        dist.destroy_process_group()


def report(results: list[dict], machine: str) -> str:
    by = {(r["variant"], r["ddp"]): r for r in results if "error" not in r}
    rows = ["| variant | DDP step ms (p10-p90) | local step ms | exposed by DDP ms | first step s "
            "| ranks agree |", "|---|---|---|---|---|---|"]
    for variant in dict.fromkeys(r["variant"] for r in results):
        ddp, local = by.get((variant, True)), by.get((variant, False))
        if ddp is None:
            error = next(r.get("error") for r in results if r["variant"] == variant and r["ddp"])
            rows.append(f"| {variant} | error: {error} | | | | |")
            continue
        local_ms = f"{local['median_ms']:.2f}" if local else ""
        exposed = f"{ddp['median_ms'] - local['median_ms']:.2f}" if local else ""
        rows.append(f"| {variant} | {ddp['median_ms']:.2f} ({ddp['p10_ms']:.2f}-"
                    f"{ddp['p90_ms']:.2f}) | {local_ms} | {exposed} | {ddp['first_s']:.2f} | "
                    f"{ddp['ranks_agree']} |")
    return f"# Data-parallel S3 step\n\n{machine}\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="batch 128, width 256 per rank")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--size", default="", help="BATCHxWIDTH per rank (else by --quick)")
    parser.add_argument("--out", default="ember-bench-distributed")
    args = parser.parse_args(argv)
    if not torch.distributed.is_available():
        print("this torch has no torch.distributed", file=sys.stderr)
        return 2
    nccl = torch.cuda.is_available() and torch.cuda.device_count() >= args.ranks
    quick = args.quick or not nccl  # (the CPU runs the quick size)
    batch, width = map(int, args.size.split("x")) if args.size else \
        ((128, 256) if quick else (512, 1024))
    options = dict(backend="nccl" if nccl else "gloo", steps=args.steps, batch=batch,
                   width=width, variants=args.variants.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ember-ddp-") as folder:
        init = f"file://{Path(folder) / 'init'}"
        mp.spawn(rank_main, args=(args.ranks, init, str(out), options), nprocs=args.ranks)
    results = json.loads((out / "results.json").read_text())
    where = (f"{args.ranks} x {torch.cuda.get_device_name()} (NCCL)" if nccl else
             f"{args.ranks} CPU ranks (gloo), {os.cpu_count()} cores")
    machine = (f"{where}; torch {torch.__version__}; batch {options['batch']} x width "
               f"{options['width']} per rank, {args.steps} timed steps")
    text = report(results, machine)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
