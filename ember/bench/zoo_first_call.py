"""Where a zoo model's first call goes, on cold caches: the wall time and ember's compile
stages (EMBER_LOGS=perf,kernels); with --profile, the main thread's hottest functions under
cProfile (Triton's compiles run on other threads: their time shows only as waiting).

    python3 -m ember.bench.zoo_first_call vit [--device cuda] [--mode train] [--profile]
        [--variant ember|tc|eager]

--variant tc times torch.compile's first call instead (its caches pointed at empty folders
too), eager eager's: run each in a process of its own, after the machine has run the model
once (a first process pays for reading torch's GPU kernels from disk).

Run it in a fresh process: the caches (ember's and Triton's) are pointed at empty folders.
"""
import argparse
import contextlib
import cProfile
import os
import pstats
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--size", default="full", help="the zoo's config: full or tiny")
    parser.add_argument("--mode", default="infer", choices=["infer", "train", "decode"])
    parser.add_argument("--warm", action="store_true", help="keep the caches as they are")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--variant", default="ember", choices=["ember", "tc", "eager"])
    parser.add_argument("--trace", action="store_true",
                        help="the first call under torch.profiler: its ops by CPU time, every "
                             "thread (the autograd engine runs a CUDA backward on its own)")
    parser.add_argument("--dump", default="", help="with --profile: write the stats to this file")
    parser.add_argument("--calls", type=int, default=1,
                        help="time this many calls (the second: what a first call left)")
    parser.add_argument("--switch-interval", type=float, default=0.0,
                        help="sys.setswitchinterval for the calls (seconds; 0: Python's own)")
    parser.add_argument("--setup", default="",
                        help="Python run before the timed calls (e.g. 'import triton': what a "
                             "first call costs without that import beside it)")
    options = parser.parse_args()
    if not options.warm:
        cold = tempfile.mkdtemp(prefix="ember-first-call-")
        os.environ["EMBER_CACHE_DIR"] = os.path.join(cold, "ember")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cold, "triton")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cold, "inductor")
    os.environ.setdefault("EMBER_LOGS", "perf,kernels")

    import torch

    import ember
    from ember import config
    from ember.bench import zoo

    config.reload()  # (ember was imported with this module's package: read the folders again)

    spec = zoo.find(options.model)
    step, args = zoo.instantiate(spec, options.mode, options.size, options.device)
    if options.variant == "ember":
        step.model_slot[0] = ember.compile(step.model)
    elif options.variant == "tc":
        step.model_slot[0] = torch.compile(step.model)
    if options.setup:
        exec(options.setup, {})  # noqa: S102 (the command line's own code)
    if options.switch_interval:
        import sys

        sys.setswitchinterval(options.switch_interval)
    profiler = cProfile.Profile()
    began = time.perf_counter()
    traced = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) \
        if options.trace else contextlib.nullcontext()
    start = time.perf_counter()
    with torch.set_grad_enabled(options.mode == "train"), traced:
        if options.profile:
            profiler.enable()
        step(*args)
        profiler.disable()
        if options.device == "cuda":
            torch.cuda.synchronize()
    print(f"== {options.model} {options.variant}: first call "
          f"{time.perf_counter() - start:.3f} s"
          + (" (under cProfile)" if options.profile else ""))
    for call in range(2, options.calls + 1):
        start = time.perf_counter()
        with torch.set_grad_enabled(options.mode == "train"):
            step(*args)
        if options.device == "cuda":
            torch.cuda.synchronize()
        print(f"== {options.model} {options.variant}: call {call} "
              f"{time.perf_counter() - start:.3f} s")
    if options.variant == "ember":  # (calls that came before its kernels were in ran eagerly)
        from ember.backends import wait_for_background_compiles

        wait_for_background_compiles()
        waited = time.perf_counter()
        with torch.set_grad_enabled(options.mode == "train"):
            step(*args)  # (the first compiled run: its library calls' first uses, checks)
        if options.device == "cuda":
            torch.cuda.synchronize()
        print(f"== {options.model} ember: first compiled call "
              f"{time.perf_counter() - waited:.3f} s; compiled after "
              f"{time.perf_counter() - began:.3f} s from the first call's start")
    if options.trace:
        print(traced.key_averages().table(sort_by="cpu_time_total", row_limit=options.rows,
                                          max_name_column_width=70))
    if options.profile:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(options.rows)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(options.rows)
        if options.dump:
            profiler.dump_stats(options.dump)


if __name__ == "__main__":
    main()
