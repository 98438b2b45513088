"""`python -m ember bench`: every workload under every variant, then a table and a report.

Parses the command line, runs the trials (harness.run_trials) with progress on the terminal,
and hands the numbers to report.py. A failing variant or wrong answer is reported in its row
and in the exit status; the run always goes on to the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from ember.bench import machine, report, roofline, workloads, zoo
from ember.bench.harness import TimingOptions, Trial, run_trials
from ember.bench.variants import VARIANTS, variant_rules

SEED_NAMES = ", ".join(w.name for w in workloads.WORKLOADS)
MODEL_NAMES = ", ".join(m.name for m in zoo.MODELS)
# the zoo compares what users choose between: eager, torch.compile(model), ember.compile(model)
MODEL_VARIANTS = ("eager", "inductor", "ember")
TIMING = {
    "full": TimingOptions(warmup=2, repeat=15, min_time=1.0, max_time=15.0),
    "quick": TimingOptions(warmup=1, repeat=5, min_time=0.2, max_time=3.0),
    # (the CPU zoo's --quick runs: 3 samples in 20 ms put ConvNeXt's 8 ms training step
    # 1.02-1.23x eager's time from run to run, IQR 19%, where 70 calls in one process put it
    # at 0.97x)
    "tiny": TimingOptions(warmup=2, repeat=7, min_time=0.3, max_time=1.5),
}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ember bench",
        description="Time the seed workloads (or your own) eagerly, under torch.compile's "
                    "Inductor and under ember: first call on cold caches, steady state, "
                    "break-even; check answers against eager; write a report.")
    parser.add_argument("targets", nargs="*", metavar="WORKLOAD",
                        help="workloads to run besides --only: a seed name (S1, softmax, ...) "
                             "or your code as file.py:builder, where builder() returns "
                             "(fn or module, args)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller shapes (about 1/16 of the elements; with --models the "
                             "tiny configs on the CPU, the quick ones on CUDA), fewer repeats, "
                             "one process per variant")
    parser.add_argument("--size", choices=workloads.SIZES,
                        help="shapes to run (default: full, the seed shapes; with --models "
                             "quick on the CPU, full on CUDA)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help=f"run only these workloads ({SEED_NAMES}; with --models a model "
                             f"({MODEL_NAMES}) or one of its workloads, e.g. gpt2-decode)")
    parser.add_argument("--models", action="store_true",
                        help="the model zoo instead of the seeds: transformers and timm models "
                             "from configs with random weights (ember/bench/zoo.py), each "
                             "compiled as a model, with ember.explain's graphs and breaks")
    parser.add_argument("--modes", default=",".join(zoo.MODES),
                        help=f"with --models: comma-separated subset of {','.join(zoo.MODES)} "
                             "(inference, an AdamW training step, greedy decoding with a KV "
                             "cache)")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated subset of {','.join(variant_rules)} "
                             f"(default {','.join(VARIANTS)}; with --models "
                             f"{','.join(MODEL_VARIANTS)})")
    parser.add_argument("--out", type=Path, default=Path("ember-bench"),
                        help="folder for report.md, results.json and logs/ (each measuring "
                             "process's stderr) (default ./ember-bench)")
    parser.add_argument("--process", choices=("trial", "variant"), default=None,
                        help="a fresh process per workload and variant (every first call cold; "
                             "default for full size) or one per variant (faster; default for "
                             "--quick and tiny)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="also time each compiled first call again in a fresh process "
                             "with the caches the cold run filled")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the GPU benchmark (python -m ember.bench.gpu) with the same "
                             "--only/--quick/--out, see its --help; with --models the zoo on "
                             "CUDA at ANCHORS.md's sizes")
    parser.add_argument("--dynamic", action="store_true",
                        help="the dynamic-shape workloads instead (issue 18): a transformer "
                             "block over 50 sequence lengths and greedy decoding with a KV "
                             "cache, eager vs ember vs torch.compile (ember.bench."
                             "dynamic_sweep); with --device cuda, static vs dynamic kernels "
                             "and the sweep on the GPU (ember.bench.dynamic_triton)")
    parser.add_argument("--no-roofline", action="store_true",
                        help="skip measuring the bandwidth and compute ceilings (no regimes)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip comparing compiled outputs with eager")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS for the measuring processes (default: as set, or "
                             "all cores); 1 steadies timings on a machine busy with other work")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one workload may take under one variant (default 600)")
    return parser


def size_of(options: argparse.Namespace) -> str:
    """--size if given; else the seeds' full shapes (quick with --quick), the zoo's CPU
    configs on the CPU (tiny with --quick) and ANCHORS.md's on CUDA (quick with --quick)."""
    if options.size:
        return options.size
    if options.models:
        ladder = ("full", "quick") if options.device == "cuda" else ("quick", "tiny")
        return ladder[1] if options.quick else ladder[0]
    return "quick" if options.quick else "full"


def selected_models(options: argparse.Namespace) -> list[workloads.Workload]:
    """The zoo's workloads: every model's modes among --modes, or those --only names (a model
    name selects its modes, `gpt2-decode` one workload)."""
    modes = [m.strip() for m in options.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in zoo.MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}: choose from "
                         f"{', '.join(zoo.MODES)}")
    everything = zoo.workloads()
    names = [n.lower() for n in [*options.only, *options.targets]]
    known = {m.name for m in zoo.MODELS} | {w.name for w in everything}
    missing = [n for n in names if n not in known]
    if missing:
        raise ValueError(f"unknown model(s) {', '.join(missing)}: choose from {MODEL_NAMES} "
                         "(or one workload, e.g. gpt2-decode)")
    return [w for w in everything
            if w.name.rsplit("-", 1)[1] in modes
            and (not names or w.name in names or w.name.rsplit("-", 1)[0] in names)]


def selected(options: argparse.Namespace) -> list[workloads.Workload]:
    if options.models:
        return selected_models(options)
    names = [*options.only, *options.targets]
    if not names:
        return list(workloads.WORKLOADS)
    chosen = []
    for name in names:
        workload = workloads.resolve(name)
        if workload not in chosen:
            chosen.append(workload)
    return chosen


class Progress:
    """One line per step on the terminal, with the run's elapsed seconds; on a TTY the current
    step's line also counts up its own seconds while a compile is running."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.live = stream.isatty()
        self.start = time.monotonic()
        self.step_start = self.start
        self.variant = ""
        self.current = ""

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.start:6.1f}s]"

    def __call__(self, workload: str | None, text: str) -> None:
        if text:
            if self.live and self.current:
                self.stream.write("\r\033[K")
            where = "" if workload in (None, "-") else f" {workload}"
            self.current = f"{self.variant:<9}{where}: {text}"
            self.step_start = time.monotonic()
            # A finished workload's line stays; on a TTY the steps before it are overwritten.
            done = text.startswith("done:")
            self.stream.write(f"{self.stamp()} {self.current}"
                              + ("\n" if done or not self.live else ""))
            if done:
                self.current = ""
        elif self.live and self.current:
            waited = time.monotonic() - self.step_start
            self.stream.write(f"\r\033[K{self.stamp()} {self.current} ... {waited:.0f}s")
        self.stream.flush()

    def say(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def measure(chosen: list[workloads.Workload], variants: list[str], options: argparse.Namespace,
            progress: Progress, scratch: Path) -> dict[tuple[str, str], Trial]:
    """Every (workload, variant) Trial, in the order the process mode asks for."""
    timing = TIMING[options.size]
    names = [w.name for w in chosen]
    trials: dict[tuple[str, str], Trial] = {}

    def run(batch: list[str], variant: str) -> None:
        progress.variant = variant
        caches = scratch / variant
        device = options.device if options.models else None
        found = run_trials(batch, variant, size=options.size, timing=timing,
                           check=variant != "eager" and not options.no_check,
                           cache_root=caches, timeout=options.timeout, threads=options.threads,
                           device=device, on_progress=progress, logs=options.out / "logs")
        if options.warm_cache and variant != "eager":
            progress.variant = f"{variant} (warm cache)"
            warm = run_trials(batch, variant, size=options.size, cache_root=caches,
                              timeout=options.timeout, threads=options.threads,
                              device=device, on_progress=progress)
            for trial, again in zip(found, warm):
                trial.first_call_warm_cache_s = again.first_call_s
        for trial in found:
            trials[trial.workload, variant] = trial

    if options.process == "trial":
        for name in names:
            for variant in variants:
                run([name], variant)
    else:
        for variant in variants:
            run(names, variant)
    return trials


def _dynamic(options: argparse.Namespace) -> int:
    """--dynamic: the shape sweep and decoding (CPU) or the dynamic kernels (CUDA)."""
    if options.device == "cuda":
        from ember.bench import dynamic_triton

        options.out.mkdir(parents=True, exist_ok=True)
        dynamic_triton.main(["--device", "cuda", "--json", str(options.out / "dynamic.json")]
                            + (["--quick"] if options.quick else []))
        return 0
    from ember.bench import dynamic_sweep

    inductor = options.variants is None or "inductor" in options.variants.split(",")
    lengths = range(3, 13) if options.quick else range(3, 53)
    dynamic_sweep.sweep(lengths, inductor)
    dynamic_sweep.decode(8 if options.quick else 32, inductor)
    return 0


def main(argv: list[str] | None = None, stream: TextIO | None = None) -> int:
    options = parser().parse_args(argv)
    stream = stream or sys.stdout
    if options.dynamic:
        return _dynamic(options)
    options.size = size_of(options)
    if options.device == "cuda" and not options.models:
        from ember.bench import gpu

        forwarded = ["--out", str(options.out)]
        if options.only:
            forwarded += ["--only", ",".join(options.only)]
        if options.size != "full":
            forwarded.append("--quick")
        return gpu.main(forwarded)
    if options.variants is None:
        options.variants = ",".join(MODEL_VARIANTS if options.models else VARIANTS)
    variants = [v.strip() for v in options.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in variant_rules]
    if unknown or not variants:
        parser().error(f"unknown variant(s) {', '.join(unknown)}: choose from "
                       f"{', '.join(variant_rules)}")
    try:
        chosen = selected(options)
    except ValueError as error:
        parser().error(str(error))
    if options.process is None:
        options.process = "trial" if options.size == "full" else "variant"

    started = time.monotonic()
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    about = machine.describe()
    progress = Progress(stream)
    if not options.no_roofline and not options.models:  # (the CPU's ceilings, for the seeds)
        progress.say("measuring the machine's ceilings (copy bandwidth, matmul peak) ...")
        about["ceilings"] = roofline.measure_ceilings().to_json()
    what = "model workload(s)" if options.models else "workload(s)"
    on = f" on {options.device}" if options.models else ""
    progress.say(f"ember bench: {len(chosen)} {what} x {len(variants)} variant(s), size "
                 f"{options.size}{on}, one process per {options.process}; {about['cpu']}, "
                 f"{about['usable_cores']} cores, torch {about['torch']}, load "
                 f"{about['load_average_start']}")
    try:
        with tempfile.TemporaryDirectory(prefix="ember-bench-") as scratch:
            trials = measure(chosen, variants, options, progress, Path(scratch))
    except KeyboardInterrupt:
        progress.say("\ninterrupted: no report written")
        return 130
    about["load_average_end"] = machine.load_average()

    results = [report.WorkloadResult(w.name, w.title, w.what,
                                     {v: trials[w.name, v] for v in variants}) for w in chosen]
    settings = {"timing": dataclasses.asdict(TIMING[options.size]), "process": options.process,
                "check": not options.no_check, "warm_cache": options.warm_cache,
                "timeout_s": options.timeout, "threads": options.threads,
                "models": options.models, "device": options.device}
    command = "python -m ember bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = report.Run(date, command.strip(), options.size, variants, about, settings, results,
                     time.monotonic() - started)
    markdown, raw = report.write(run, options.out)
    progress.say("\n" + report.terminal(run))
    progress.say(f"\nreport: {markdown}\nraw numbers: {raw}")
    return 0 if run.ok else 1
