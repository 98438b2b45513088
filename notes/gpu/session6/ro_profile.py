"""Session 6: the host functions S4's reduce-overhead call spends its time in (cProfile, per
call), after the guard-and-run fusion; and the steady time with a sync, twice."""
import cProfile
import pstats
import statistics
import time

import torch

import ember
from ember.bench.gpu import build

for name in ("S4", "S5"):
    fn, args = build(name, False)
    compiled = ember.compile(fn, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(30):
            compiled(*args)
        torch.cuda.synchronize()
        for attempt in range(2):
            samples = []
            for _ in range(300):
                start = time.perf_counter()
                compiled(*args)
                torch.cuda.synchronize()
                samples.append(time.perf_counter() - start)
            samples.sort()
            print(name, "full+sync us: median", round(statistics.median(samples) * 1e6, 1),
                  "p10", round(samples[30] * 1e6, 1))
        samples = []
        for _ in range(300):
            start = time.perf_counter()
            compiled(*args)
            samples.append(time.perf_counter() - start)
            torch.cuda.synchronize()
        print(name, "host part of a call us:", round(statistics.median(samples) * 1e6, 1))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200):
            compiled(*args)
            torch.cuda.synchronize()
        profiler.disable()
        stats = pstats.Stats(profiler)
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:14]
        for function, row in rows:
            print(f"  {row[2] / 200 * 1e6:7.1f} us  {row[1] // 200:4d} calls  "
                  f"{function[2]} {function[0].split('/')[-1]}:{function[1]}")
    ember.reset()
