"""Where S3's training step spends host time on a GPU, ember against torch.compile and eager.

    python -m ember.bench.host_profile ember|tc|eager

Builds S3 (4x Linear(1024) + gelu_ish, batch 512, SGD; as ember.bench.gpu does), compiles it,
makes 30 warm calls, then 50 calls under torch.profiler (CPU activity only) and prints the self
CPU time of the heaviest ops, then times 200 calls with a device sync each.
"""
import statistics
import sys
import time

import torch

from ember.bench.workloads import build_s3_step


def timed(step, x, calls=200):
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        step(x)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main(variant):
    torch.manual_seed(0)
    step, (x,) = build_s3_step(512, 1024)  # (as ember.bench.gpu builds S3)
    x = x.cuda()
    step.model_slot[0].cuda()
    # (the optimizer was built on CPU parameters moved in place: .cuda() on a module keeps them)
    if variant == "ember":
        import ember
        run = ember.compile(step)
    elif variant == "tc":
        step.model_slot[0] = torch.compile(step.model_slot[0])
        run = step
    else:
        run = step
    for _ in range(30):
        run(x)
    torch.cuda.synchronize()
    print(variant, "ms per step (sync each):", round(timed(run, x), 4))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            run(x)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main(sys.argv[1])
