"""Session 6: where S4's reduce-overhead call spends its time (run 2 measured 0.563 ms per call
against 0.424 in session 5's run 6, with the replay alone unchanged at 0.34 ms)."""
import json
import statistics
import time

import torch

import ember
from ember.bench.gpu import _graph_inputs, build


def median_us(fn, calls=300):
    for _ in range(20):
        fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return round(statistics.median(samples) * 1e6, 1), round(samples[calls // 10] * 1e6, 1)


def spin():
    stream = torch.cuda.current_stream()
    while not stream.query():
        pass


report = {}
for name in ("S4", "S5"):
    fn, args = build(name, False)
    compiled = ember.compile(fn, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            compiled(*args)
        torch.cuda.synchronize()
        target = compiled._compiled_forward
        entry, record = target.entries[0], target.records[-1]
        arguments = target.binder(fn, *args)
        tensors = _graph_inputs(entry, target, arguments)
        graphed = record.compiled
        replay = record.cuda_graph.graph.replay
        rows = {}
        for attempt in range(2):
            rows[f"full+sync #{attempt}"] = median_us(lambda: (compiled(*args), torch.cuda.synchronize()))
            rows[f"full+spin #{attempt}"] = median_us(lambda: (compiled(*args), spin()))
            rows[f"cudagraphed+sync #{attempt}"] = median_us(lambda: (graphed(*tensors), torch.cuda.synchronize()))
            rows[f"replay+sync #{attempt}"] = median_us(lambda: (replay(), torch.cuda.synchronize()))
            rows[f"replay+spin #{attempt}"] = median_us(lambda: (replay(), spin()))
            rows[f"full, no sync #{attempt}"] = median_us(lambda: compiled(*args))
            rows[f"guard #{attempt}"] = median_us(lambda: entry.guard(arguments))
            rows[f"sync alone #{attempt}"] = median_us(torch.cuda.synchronize)
        report[name] = rows
    ember.reset()
print(json.dumps(report, indent=1))
