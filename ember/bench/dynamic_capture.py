"""What symbolic sizes cost in capture (issue 18, stage 1): a toy transformer block of N
layers captured static (dynamic=False), with only the batch dim symbolic (mark_dynamic: what
automatic dynamic makes of a changing batch) and with every dim symbolic (dynamic=True),
backend="eager" so only capture is timed; then the per-call cost of each entry's guards on a
tiny function. With --kernels (stage 2): the steady state of S1 (gelu_ish) and a row softmax
compiled by ember's C backend per shape (dynamic=False) against once for every batch size
(the batch marked dynamic), static and dynamic measured in alternation, as ratios. With
--lowering: the lowering alone (FX graph -> IR) of the toy block, static against on the
capture's symbolic fakes (batch dim symbolic).

    python3 -m ember.bench.dynamic_capture [--layers 12] [--repeat 5] [--kernels] [--lowering]

Each capture runs in a fresh ember.compile (median of --repeat); the first symbolic capture
of the process also pays for importing sympy and torch's symbolic-shape modules, said apart.
"""
import argparse
import statistics
import time

import torch

import ember
from ember.bench.harness import benchmark
from ember.bench.workloads import gelu_ish, softmax_last


def block(layers: int):
    def forward(x, weights):
        b, t, c = x.shape
        h = 4
        for w in weights[:layers]:
            q = (x @ w).view(b, t, h, c // h).transpose(1, 2)
            scores = (q @ q.transpose(-1, -2)) / (c // h) ** 0.5
            x = x + torch.softmax(scores, -1).matmul(q).transpose(1, 2).reshape(b, t, c)
            x = torch.nn.functional.layer_norm(x, (c,))
            x = x + torch.nn.functional.gelu(x * 2)
        return x
    return forward


def capture_seconds(function, dynamic: bool | None, inputs: tuple, repeat: int,
                    batch_only: bool = False) -> float:
    times = []
    for _ in range(repeat):
        compiled = ember.compile(function, backend="eager", dynamic=dynamic)
        if batch_only:
            ember.mark_dynamic(inputs[0], 0)
        started = time.perf_counter()
        compiled(*inputs)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def call_microseconds(dynamic: bool, calls: int = 20000) -> float:
    compiled = ember.compile(lambda x: x + 1, backend="eager", dynamic=dynamic)
    x = torch.randn(8, 4)
    compiled(x)
    started = time.perf_counter()
    for _ in range(calls):
        compiled(x)
    return (time.perf_counter() - started) / calls * 1e6


KERNEL_SHAPES = [(8, 768), (256, 1024), (2048, 1024)]


def steady_state(function, shape: tuple[int, int], rounds: int) -> tuple[float, float]:
    """(static, dynamic) median seconds per call of `function` compiled by ember for `shape`:
    static (dynamic=False), and dynamic (dim 0 marked: one C build for every batch size,
    first compiled at another batch size so the kernel cannot have this one baked in)."""
    x = torch.randn(*shape)
    static = ember.compile(function, dynamic=False)
    dynamic = ember.compile(function)
    other = torch.randn(shape[0] + 3, shape[1])
    ember.mark_dynamic(other, 0)
    dynamic(other)
    static(x)
    dynamic(x)
    assert not dynamic.records[0].compiled.__class__.__name__ == "ShapeSpecialized"
    times: dict[str, list[float]] = {"static": [], "dynamic": []}
    for _ in range(rounds):
        for name, compiled in (("static", static), ("dynamic", dynamic)):
            times[name].append(benchmark(compiled, x, repeat=5, min_time=0.2).median)
    return statistics.median(times["static"]), statistics.median(times["dynamic"])


def kernels(rounds: int) -> None:
    for label, function in (("S1 gelu_ish", gelu_ish), ("softmax rows", softmax_last)):
        for shape in KERNEL_SHAPES:
            static, dynamic = steady_state(function, shape, rounds)
            print(f"{label} {list(shape)}: static {static * 1e6:.1f} us, dynamic "
                  f"{dynamic * 1e6:.1f} us ({dynamic / static:.2f}x)")


def lowering_ms(layers: int, repeat: int) -> tuple[float, float]:
    """(static, symbolic) median milliseconds of lowering the toy block's captured graph."""
    from ember.lower import trace

    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    keep.serves_any_shape = True
    weights = [torch.randn(32, 32) for _ in range(layers)]
    for dynamic in (False, None):
        x = torch.randn(4, 16, 32)
        if dynamic is None:
            ember.mark_dynamic(x, 0)
        ember.compile(block(layers), backend=keep, dynamic=dynamic)(x, weights)
    (static_gm, static_inputs), (symbolic_gm, symbolic_inputs) = graphs
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.no_grad():
        trace(symbolic_gm, symbolic_inputs, symbolic=True)  # (first use: imports, caches)
        for _ in range(repeat):
            for symbolic, gm, inputs in ((False, static_gm, static_inputs),
                                         (True, symbolic_gm, symbolic_inputs)):
                started = time.perf_counter()
                trace(gm, inputs, symbolic=symbolic)
                times[symbolic].append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kernels", action="store_true",
                        help="steady state of S1 and softmax, static against dynamic (C)")
    parser.add_argument("--lowering", action="store_true",
                        help="lowering of the toy block, static against symbolic")
    options = parser.parse_args()
    if options.kernels:
        kernels(options.repeat)
    if options.lowering:
        static, symbolic = lowering_ms(options.layers, options.repeat)
        print(f"lowering of {options.layers} layers: static {static:.1f} ms, symbolic "
              f"{symbolic:.1f} ms ({symbolic / static:.1f}x)")
    if options.kernels or options.lowering:
        return
    function = block(options.layers)
    inputs = (torch.randn(4, 16, 32), [torch.randn(32, 32) for _ in range(options.layers)])
    started = time.perf_counter()
    ember.compile(block(1), backend="eager", dynamic=True)(torch.randn(2, 4, 8),
                                                             [torch.randn(8, 8)])
    first = time.perf_counter() - started
    static = capture_seconds(function, False, inputs, options.repeat)
    batch = capture_seconds(function, None, inputs, options.repeat, batch_only=True)
    symbolic = capture_seconds(function, True, inputs, options.repeat)
    print(f"first symbolic capture of the process (imports): {first * 1e3:.0f} ms")
    print(f"capture of {options.layers} layers: static {static * 1e3:.1f} ms, batch dim "
          f"symbolic {batch * 1e3:.1f} ms ({batch / static:.1f}x), every dim symbolic "
          f"{symbolic * 1e3:.1f} ms ({symbolic / static:.1f}x)")
    print(f"a compiled call of x + 1 (guards, backend eager): static "
          f"{call_microseconds(False):.1f} us, symbolic {call_microseconds(True):.1f} us")


if __name__ == "__main__":
    main()
