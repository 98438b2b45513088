"""Where a zoo model's time goes: on CUDA the top kernels by device time under torch.profiler
(ten calls after warm-up) for eager, ember and torch.compile, with the launches per call and
the host's time per call beside the device's (a launch-bound graph shows host > device); on
the CPU (--device cpu) the top operations by their own CPU time, ember's kernels and library
calls labelled by name (EMBER_PROFILE=1: `ember kernel3: mul, add [4, 256]`).

    python3 -m ember.bench.zoo_profile resnet50 qwen2 [--variants eager,ember,tc] [--rows 14]
        [--host] [--mode train] [--device cpu --size tiny]

--mode train profiles the zoo's training step (forward, backward and AdamW) instead; --mode
decode its greedy decoding (the prompt, then a token a call with the KV cache).
--stacks aten::copy_ adds the Python stacks that called that op (the profiler's with_stack).

--kernels prints, on CUDA, only the device's kernels in narrow rows and their totals by kind
(matmul, attention, convolution, generated, copy, ...), per call, then ember's labels (a
kernel's ops and shape) by the device time under them.

--host adds the host's side: the hottest Python functions of ten calls under cProfile.

--phases (training, CUDA) times the step's phases instead: zero_grad, forward and loss,
backward, optimizer step, each as the host spends it (no sync) and as the device runs it
(CUDA events). A phase whose device time is near its host time kept the device waiting.
"""
import argparse
import cProfile
import pstats
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import ember
from ember import config
from ember.bench import zoo
from ember.bench.harness import wait_for_ember

CALLS = 10


def _compiled(variant: str, model):
    if variant == "ember":
        return ember.compile(model)
    if variant == "tc":
        return torch.compile(model)
    return model


def profile_model(name: str, variants: list[str], rows: int, host: bool,
                  mode: str = "infer", stacks: str = "", device: str = "cuda",
                  size: str = "full", compact: bool = False) -> None:
    spec = zoo.find(name)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CUDA, ProfilerActivity.CPU] if cuda else [ProfilerActivity.CPU]
    for variant in variants:
        with torch.set_grad_enabled(mode == "train"):
            # timed unlabelled (a profiler label costs ~5 us a call even with no profiler
            # running), then profiled with ember's kernels labelled by name
            with config.override(profile=False):
                step, args = zoo.instantiate(spec, mode, size, device)
                step.model_slot[0] = _compiled(variant, step.model)
                for _ in range(3):
                    step(*args)
                sync()
                started = time.perf_counter()
                for _ in range(CALLS):
                    step(*args)
                sync()
                per_call_ms = (time.perf_counter() - started) * 1e3 / CALLS
            step, args = zoo.instantiate(spec, mode, size, device)
            step.model_slot[0] = _compiled(variant, step.model)
            for _ in range(3):
                step(*args)
            sync()
            with profile(activities=activities, with_stack=bool(stacks)) as prof:
                for _ in range(CALLS):
                    step(*args)
                sync()
        events = prof.key_averages()
        if cuda:
            # (ember's labels are annotations on the device's timeline too: not kernels)
            kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                       and not e.key.startswith("ember ")]
            device_us = sum(e.device_time_total for e in kernels) / CALLS
            launches = sum(e.count for e in kernels) / CALLS
            print(f"== {name} {variant}: {per_call_ms:.3f} ms per call, "
                  f"device busy {device_us / 1e3:.3f} ms, {launches:.0f} kernels per call")
            if compact:
                _print_kernels(kernels, rows)
                labels = [e for e in events if e.key.startswith("ember ")
                          and e.device_time_total > 0]
                for event in sorted(labels, key=lambda e: -e.device_time_total)[:rows]:
                    print(f"   {event.device_time_total / CALLS:9.1f} us "
                          f"{event.count / CALLS:5.0f}x  {event.key[:110]}")
        else:
            labelled = [e for e in events if e.key.startswith("ember ")]
            print(f"== {name} {variant}: {per_call_ms:.3f} ms per call, "
                  f"{sum(e.count for e in labelled) / CALLS:.0f} ember kernels and library "
                  f"calls per call, {sum(e.cpu_time_total for e in labelled) / CALLS / 1e3:.3f}"
                  f" ms in them under the profiler (labels included)")
        if not (cuda and compact):
            print(events.table(sort_by="device_time_total" if cuda else "self_cpu_time_total",
                               row_limit=rows, max_name_column_width=80))
        if stacks:
            callers = [e for e in prof.key_averages(group_by_stack_n=8) if e.key == stacks]
            for event in sorted(callers, key=lambda e: -e.count)[:6]:
                print(f"-- {stacks}: {event.count / CALLS:.0f} per call from")
                print("\n".join(f"     {frame}" for frame in event.stack))
        if host:
            profiler = cProfile.Profile()
            with torch.set_grad_enabled(mode == "train"):
                profiler.enable()
                for _ in range(CALLS):
                    step(*args)
                profiler.disable()
                sync()
            print(f"== {name} {variant}: host, {CALLS} calls")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(rows)


def time_phases(name: str, variants: list[str], size: str = "full") -> None:
    """The training step's phases on the host and on the device, ms per call (median)."""
    spec = zoo.find(name)
    phases = ("zero_grad", "forward", "backward", "optimizer")
    for variant in variants:
        step, args = zoo.instantiate(spec, "train", size, "cuda")
        step.model_slot[0] = _compiled(variant, step.model)
        batch = dict(zip(step.batch_names, args))
        for _ in range(3):
            step(*args)
        wait_for_ember()
        torch.cuda.synchronize()
        host: list[list[float]] = []
        device: list[list[float]] = []
        for _ in range(CALLS):
            events = [torch.cuda.Event(enable_timing=True) for _ in range(len(phases) + 1)]
            marks = [time.perf_counter()]
            events[0].record()
            step.optimizer.zero_grad()
            events[1].record()
            marks.append(time.perf_counter())
            loss = zoo.loss_of(spec, step.model_slot[0], batch)
            events[2].record()
            marks.append(time.perf_counter())
            loss.backward()
            events[3].record()
            marks.append(time.perf_counter())
            step.optimizer.step()
            events[4].record()
            marks.append(time.perf_counter())
            torch.cuda.synchronize()
            host.append([(b - a) * 1e3 for a, b in zip(marks, marks[1:])])
            device.append([a.elapsed_time(b) for a, b in zip(events, events[1:])])
        print(f"== {name} {variant}: phases, ms per call (host without a sync / device)")
        for index, phase in enumerate(phases):
            print(f"   {phase:<10} host {statistics.median(h[index] for h in host):8.3f}"
                  f"   device {statistics.median(d[index] for d in device):8.3f}")
        print(f"   {'step':<10} host {statistics.median(sum(h) for h in host):8.3f}"
              f"   device {statistics.median(sum(d) for d in device):8.3f}")


_KINDS = (("matmul", ("gemm", "xmma", "cutlass::Kernel", "cublas", "splitk")),
          ("attention", ("fmha", "attention", "flash")),
          ("convolution", ("conv", "cudnn", "winograd", "implicit", "dgrad", "wgrad")),
          ("generated", ("triton_", "kernel")),
          ("copy", ("copy", "memcpy", "memset", "fill", "cat")),
          ("reduction", ("reduce", "norm", "softmax", "sum")))


def _kind(name: str) -> str:
    lowered = name.lower()
    for kind, marks in _KINDS:
        if any(mark.lower() in lowered for mark in marks):
            return kind
    return "other"


def _print_kernels(kernels: list, rows: int) -> None:
    """Device kernels only, in narrow rows (us and launches per call), then totals by kind."""
    totals: dict[str, list[float]] = {}
    for event in kernels:
        total = totals.setdefault(_kind(event.key), [0.0, 0.0])
        total[0] += event.device_time_total / CALLS
        total[1] += event.count / CALLS
    print("   by kind (us per call, launches): " + ", ".join(
        f"{kind} {us:.0f} ({count:.0f})"
        for kind, (us, count) in sorted(totals.items(), key=lambda item: -item[1][0])))
    for event in sorted(kernels, key=lambda e: -e.device_time_total)[:rows]:
        print(f"   {event.device_time_total / CALLS:9.1f} us {event.count / CALLS:5.0f}x  "
              f"{_kind(event.key):<11} {event.key[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--variants", default="eager,ember")
    parser.add_argument("--rows", type=int, default=14)
    parser.add_argument("--host", action="store_true")
    parser.add_argument("--mode", default="infer", choices=["infer", "train", "decode"])
    parser.add_argument("--stacks", default="", help="an op's name, e.g. aten::copy_")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--size", default="full", choices=["full", "quick", "tiny"])
    parser.add_argument("--kernels", action="store_true", help="device kernels only (CUDA)")
    parser.add_argument("--phases", action="store_true",
                        help="time the training step's phases, host and device (CUDA)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (CPU; 0: as set)")
    options = parser.parse_args()
    if options.threads:
        torch.set_num_threads(options.threads)
    if options.phases:
        for name in options.models:
            time_phases(name, options.variants.split(","), options.size)
        return
    with config.override(profile=True):  # (ember's kernels by name in the profile)
        for name in options.models:
            profile_model(name, options.variants.split(","), options.rows, options.host,
                          options.mode, options.stacks, options.device, options.size,
                          options.kernels)


if __name__ == "__main__":
    main()
