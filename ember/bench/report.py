"""A benchmark run's numbers → derived figures (ratios, break-even), tables, report files.

Takes the Trials of every workload and variant; gives the terminal table, report.md and
results.json (raw samples included). Measures nothing and starts no process.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ember.bench.harness import Trial, break_even, format_ms, ratio
from ember.bench.plots import PLOTS, write_plots
from ember.bench.roofline import OVERHEAD, OVERHEAD_FLOOR_S, Ceilings, Regime, Work, regime
from ember.partition import ISLAND_SAYS

BASELINE, PEER, OURS = "eager", "inductor", "ember"
NAMES = {"eager": "eager", "inductor": "torch.compile (inductor)", "ember": "ember.compile",
         "dynamo+ember": "torch.compile(backend='ember')",
         "dynamo-eager": "torch.compile(backend='eager')",
         "ember-eager": "ember.compile(backend='eager')"}


@dataclasses.dataclass
class WorkloadResult:
    name: str
    title: str
    what: str
    trials: dict[str, Trial]

    @property
    def description(self) -> str:
        for trial in self.trials.values():
            if trial.description:
                return trial.description
        return ""

    def steady(self, variant: str) -> float | None:
        trial = self.trials.get(variant)
        if trial is None or trial.error is not None or trial.steady is None:
            return None
        return trial.steady.median

    def first_call(self, variant: str) -> float | None:
        trial = self.trials.get(variant)
        return None if trial is None or trial.error is not None else trial.first_call_s

    def compiled_after(self, variant: str) -> float | None:
        """The end of `variant`'s first compiled call, from its first call's start: ember's
        first calls may run eagerly while its kernels compile; other variants' first call
        runs compiled."""
        trial = self.trials.get(variant)
        if trial is None or trial.error is not None:
            return None
        later = trial.compiled_after_s
        return trial.first_call_s if later is None or trial.first_call_s is None else \
            max(later, trial.first_call_s)

    def break_even(self, variant: str) -> int | str | None:
        """Calls until `variant` beats eager (first call included): a count, "never", or None
        when a number is missing."""
        first, steady, eager = (self.first_call(variant), self.steady(variant),
                                self.steady(BASELINE))
        if first is None or steady is None or eager is None:
            return None
        calls = break_even(first, steady, eager)
        return "never" if calls is None else calls

    @property
    def work(self) -> Work | None:
        """Bytes and flops of one call, counted on the eager trial."""
        for trial in self.trials.values():
            if trial.work:
                return Work(int(trial.work["bytes"]), float(trial.work["flops"]))
        return None

    def regime(self, variant: str, ceilings: Ceilings | None) -> Regime | None:
        work, steady = self.work, self.steady(variant)
        if ceilings is None or work is None or steady is None:
            return None
        return regime(work, ceilings, steady)

    def status(self, variant: str) -> str:
        """"ok", "FAIL: <why>" (wrong answer), "error: <why>" (did not run), or "" (absent)."""
        trial = self.trials.get(variant)
        if trial is None:
            return ""
        if trial.error is not None:
            return f"error: {trial.error}"
        if trial.check is not None and not trial.check.get("ok"):
            return f"FAIL: {trial.check.get('message')}"
        return "ok"

    def summary(self) -> dict[str, Any]:
        return {
            "steady_s": {v: self.steady(v) for v in self.trials},
            "first_call_s": {v: self.first_call(v) for v in self.trials},
            "ember_over_eager": ratio(self.steady(OURS), self.steady(BASELINE)),
            "ember_over_inductor": ratio(self.steady(OURS), self.steady(PEER)),
            "inductor_over_eager": ratio(self.steady(PEER), self.steady(BASELINE)),
            "first_call_ember_over_inductor": ratio(self.first_call(OURS), self.first_call(PEER)),
            "compiled_after_s": {v: self.compiled_after(v) for v in self.trials},
            "compiled_after_ember_over_inductor": ratio(self.compiled_after(OURS),
                                                        self.first_call(PEER)),
            "break_even_calls": {v: self.break_even(v) for v in self.trials if v != BASELINE},
            "status": {v: self.status(v) for v in self.trials},
        }


@dataclasses.dataclass
class Run:
    date: str
    command: str
    size: str
    variants: list[str]
    machine: dict[str, Any]
    settings: dict[str, Any]
    results: list[WorkloadResult]
    elapsed_s: float | None = None
    plots: dict[str, bool] | None = None   # plot file name -> written

    @property
    def ok(self) -> bool:
        return all(r.status(v) in ("ok", "") for r in self.results for v in self.variants)

    def to_json(self) -> dict[str, Any]:
        return {
            "date": self.date, "command": self.command, "size": self.size,
            "variants": self.variants, "machine": self.machine, "settings": self.settings,
            "elapsed_s": self.elapsed_s, "plots": self.plots,
            "workloads": [{"name": r.name, "title": r.title, "what": r.what,
                           "description": r.description, "summary": r.summary(),
                           "trials": {v: t.to_json() for v, t in r.trials.items()},
                           "regimes": {v: found.to_json() for v in r.trials
                                       if (found := r.regime(v, ceilings_of(self)))}}
                          for r in self.results],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        results = [WorkloadResult(w["name"], w["title"], w["what"],
                                  {v: Trial.from_json(t) for v, t in w["trials"].items()})
                   for w in data["workloads"]]
        return cls(data["date"], data["command"], data["size"], data["variants"],
                   data["machine"], data["settings"], results, data.get("elapsed_s"),
                   data.get("plots"))


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else format_ms(seconds)


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


def ratio_text(value: float | None) -> str:
    """A ratio as the report prints it (fewer decimals as it grows)."""
    if value is None:
        return "—"
    if value < 0.1:
        return f"{value:.3f}x"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def _calls(value: int | str | None) -> str:
    return "—" if value is None else str(value)


def label_of(result: WorkloadResult) -> str:
    return result.name if result.name == result.title else f"{result.name} {result.title}"


def _warm_process(result: WorkloadResult, variant: str) -> bool:
    trial = result.trials.get(variant)
    return trial is not None and trial.process_order > 0


def _check_cell(result: WorkloadResult, variants: list[str]) -> str:
    problems = []
    for variant in variants:
        status = result.status(variant)
        if status.startswith("FAIL"):
            problems.append(f"{variant} FAIL")
        elif status.startswith("error"):
            problems.append(f"{variant} error")
    return ", ".join(problems) if problems else "ok"


def steady_table(run: Run) -> tuple[list[str], list[list[str]]]:
    """Steady state, one row per workload: median ms per variant, ember's ratios, the check."""
    variants, has = run.variants, set(run.variants).__contains__
    headers = ["workload"] + [f"{v} ms" for v in variants]
    ratios = [(OURS, BASELINE), (OURS, PEER), ("dynamo+ember", PEER)]
    ratios = [(a, b) for a, b in ratios if has(a) and has(b)]
    headers += [f"{a}/{b}" for a, b in ratios] + ["check"]
    rows = []
    for result in run.results:
        rows.append([label_of(result)] + [_ms(result.steady(v)) for v in variants]
                    + [ratio_text(ratio(result.steady(a), result.steady(b))) for a, b in ratios]
                    + [_check_cell(result, variants)])
    return headers, rows


def ceilings_of(run: Run) -> Ceilings | None:
    found = run.machine.get("ceilings")
    return Ceilings(**found) if found else None


def roofline_table(run: Run) -> tuple[list[str], list[list[str]]] | None:
    """Per workload: the work of a call, its intensity, and each variant's regime (the
    bound resource and the fraction of it the steady state attains)."""
    ceilings = ceilings_of(run)
    if ceilings is None or not any(r.work for r in run.results):
        return None
    headers = ["workload", "MB moved", "GFLOP", "flop/byte"] + \
        [f"{v} regime" for v in run.variants]
    rows = []
    for result in run.results:
        work = result.work
        row = [label_of(result)]
        row += ["—"] * 3 if work is None else [f"{work.bytes / 1e6:.1f}",
                                               f"{work.flops / 1e9:.2f}",
                                               f"{work.intensity:.1f}"]
        row += [str(result.regime(v, ceilings) or "—") for v in run.variants]
        rows.append(row)
    return headers, rows


def _roofline_lines(run: Run) -> list[str]:
    table = roofline_table(run)
    if table is None:
        return []
    ceilings = ceilings_of(run)
    return [f"Roofline: copy bandwidth {ceilings.bandwidth_gb_s:.1f} GB/s, float32 matmul "
            f"{ceilings.peak_gflop_s:.0f} GFLOP/s (ridge {ceilings.ridge:.1f} flop/byte), "
            f"measured at the start. Regime: the resource that bounds a call (bandwidth or "
            f"compute; GFLOP counts matmul-like work only), or overhead when the floor is "
            f"under {OVERHEAD_FLOOR_S * 1e6:.0f} µs and the time over {OVERHEAD:.0f}x it; the "
            f"percentage is floor / time.", markdown_table(*table), ""]


def first_call_table(run: Run) -> tuple[list[str], list[list[str]]]:
    """First call (cold) per compiled variant, ember's over Inductor's, and break-even counts."""
    compiled = [v for v in run.variants if v != BASELINE]
    has = set(run.variants).__contains__
    headers = ["workload"] + [f"{v} 1st s" for v in compiled]
    both = has(OURS) and has(PEER)
    if both:
        headers.append(f"{OURS}/{PEER}")
    later = has(OURS) and any(OURS in r.trials and r.trials[OURS].compiled_after_s is not None
                              for r in run.results)
    if later:
        headers.append(f"{OURS} compiled after s")
        if has(PEER):
            headers.append(f"compiled after/{PEER} 1st")
    if has(BASELINE):
        headers += [f"break-even {v}" for v in compiled]
    rows = []
    for result in run.results:
        row = [label_of(result)]
        row += [_s(result.first_call(v)) + ("*" if _warm_process(result, v) else "")
                for v in compiled]
        if both:
            row.append(ratio_text(ratio(result.first_call(OURS), result.first_call(PEER))))
        if later:
            row.append(_s(result.compiled_after(OURS)))
            if has(PEER):
                row.append(ratio_text(ratio(result.compiled_after(OURS),
                                            result.first_call(PEER))))
        if has(BASELINE):
            row += [_calls(result.break_even(v)) for v in compiled]
        rows.append(row)
    return headers, rows


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    align = ["---"] + ["---:"] * (len(headers) - 1)
    return "\n".join([line(headers), "|" + "|".join(align) + "|"] + [line(r) for r in rows])


def capture_table(run: Run) -> tuple[list[str], list[list[str]]] | None:
    """The zoo's capture figures, per workload: ember.explain's graphs, breaks and eager
    islands per call of the model (decoding: the prompt / a token with the cache), the graphs
    ember compiled over the whole run and those that ran eagerly, the check and the first
    break reason."""
    found = [(r, r.trials[OURS]) for r in run.results
             if OURS in r.trials and r.trials[OURS].capture is not None]
    if not found:
        return None
    headers = ["workload", "graphs", "breaks", "eager islands", "compiled in the run",
               "max abs diff", "check", "first reason"]
    rows = []
    for result, trial in found:
        check = trial.check or {}
        worst = check.get("max_abs_error")
        tail = ["—" if worst is None else f"{worst:.1e}", _check_cell(result, [OURS])]
        if isinstance(trial.capture, str):
            rows.append([label_of(result), "—", "—", "—", "—", *tail, trial.capture[:160]])
            continue
        calls = trial.capture
        reasons = _reasons(trial)
        eager = next((f for f in trial.fallbacks if "ran eagerly" in f), "")
        compiled = "—" if trial.graphs is None else str(trial.graphs)
        if eager:
            compiled += f" ({eager.split(' of ')[0]} eager)"
        rows.append([label_of(result)] + [" / ".join(str(c[key]) for c in calls)
                                        for key in ("graphs", "breaks")]
                    + [" / ".join(str(len(c["islands"])) for c in calls), compiled, *tail,
                       reasons[0][:160] if reasons else ""])
    return headers, rows


def _reasons(trial: Trial) -> list[str]:
    """Every distinct break and island reason of a zoo ember trial, then why graphs ran
    eagerly in the run (first lines), in order."""
    if not isinstance(trial.capture, list):
        return []
    found = [reason for call in trial.capture
             for reason in [*call["break_reasons"], *call["islands"]]]
    found += [message.splitlines()[0] for message in trial.fallbacks
              if "ran eagerly" not in message]
    return list(dict.fromkeys(found))


def decoding_lines(run: Run) -> list[str]:
    """Tokens per second of each decoding workload and variant (steady state)."""
    lines = []
    for result in run.results:
        rates = [(v, t.tokens_per_call / result.steady(v)) for v, t in result.trials.items()
                 if t.tokens_per_call and result.steady(v)]
        if rates:
            lines.append(f"{label_of(result)}: " + ", ".join(f"{v} {rate:.0f} tokens/s"
                                                           for v, rate in rates))
    return lines


def problems(run: Run) -> list[str]:
    """Every failed check, failed variant and fallback to eager, one line each."""
    lines = []
    for result in run.results:
        for variant, trial in result.trials.items():
            status = result.status(variant)
            if status not in ("ok", ""):
                kind, _, why = status.partition(": ")
                lines.append(f"{kind.upper()} {label_of(result)} {variant}: {why}")
            for message in trial.fallbacks:  # (first lines: a traceback's tail says less)
                if ISLAND_SAYS not in message:  # (islands: in the capture table)
                    lines.append(f"FALLBACK {label_of(result)} {variant}: "
                                 f"{message.splitlines()[0]}")
    return lines


def load_note(run: Run) -> str | None:
    cores = run.machine.get("usable_cores") or 1
    loads = [run.machine.get("load_average_start"), run.machine.get("load_average_end")]
    highest = max((x for x in loads if x is not None), default=None)
    if highest is not None and highest > 0.5 * cores:
        threads = run.settings.get("threads")
        advice = "" if threads == 1 else "; --threads 1 steadies them"
        return (f"load average reached {highest} on {cores} cores: other work was running, so "
                f"timings are noisy (compare ratios within this run only{advice})")
    return None


def terminal(run: Run) -> str:
    parts = ["steady state (median per call)", text_table(*steady_table(run))]
    if any(v != BASELINE for v in run.variants):
        parts += ["", "first call (capture + compile, cold caches, imports excluded); "
                  "break-even in calls vs eager", text_table(*first_call_table(run))]
    table = roofline_table(run)
    if table is not None:
        ceilings = ceilings_of(run)
        parts += ["", f"roofline: {ceilings.bandwidth_gb_s:.1f} GB/s copy, "
                  f"{ceilings.peak_gflop_s:.0f} GFLOP/s matmul; regime (attained fraction)",
                  text_table(*table)]
    table = capture_table(run)
    if table is not None:
        parts += ["", "ember.explain per call of the model (decoding: prompt / token)",
                  text_table(table[0][:-1], [row[:-1] for row in table[1]])]
        parts += [""] + decoding_lines(run)
    if any(_warm_process(r, v) for r in run.results for v in run.variants):
        parts.append("* first call in a process that had already compiled other workloads "
                     "(caches empty, process warm)")
    note = load_note(run)
    if note:
        parts.append(f"note: {note}")
    parts += [line for line in problems(run)]
    return "\n".join(parts)


def markdown(run: Run) -> str:
    machine = run.machine
    threads = sorted({t.threads for r in run.results for t in r.trials.values() if t.threads})
    cores = f"{machine.get('cores')} cores ({machine.get('usable_cores')} usable), measured " \
            f"with {', '.join(map(str, threads)) or machine.get('torch_threads')} torch threads"
    loads = f"{machine.get('load_average_start')} at start, {machine.get('load_average_end')} " \
            "at end (1-minute)"
    lines = [
        "# Ember benchmark",
        "",
        f"{run.date} · size `{run.size}` · `{run.command}`"
        + (f" · {run.elapsed_s:.0f} s" if run.elapsed_s is not None else ""),
        "",
        "## Machine",
        "",
        f"- CPU: {machine.get('cpu')}, {cores}",
        f"- memory: {machine.get('memory_gib')} GiB",
        f"- torch {machine.get('torch')}"
        + (f", CUDA {machine['cuda']}" if machine.get("cuda") else "")
        + f"; Python {machine.get('python')} on {machine.get('os')}",
        f"- C compiler: {machine.get('c_compiler')}",
        f"- ember commit {machine.get('ember_commit')}",
        f"- load average: {loads}",
        "",
    ]
    note = load_note(run)
    if note:
        lines += [f"> **Busy machine:** {note}.", ""]
    lines += [
        "## Results",
        "",
        "Steady state: median time per call, in ms. Ratios below 1 mean ember is faster.",
        "",
        markdown_table(*steady_table(run)),
        "",
    ]
    if any(v != BASELINE for v in run.variants):
        lines += [
            "First call (`1st`, s): capture and compile on cold caches in a fresh process, "
            "imports excluded. Ember's first calls may return at eager's pace while its "
            "kernels compile beside them (later calls run eagerly until they are in): "
            "`compiled after` is the end of its first compiled call, from the first call's "
            "start, against Inductor's first call. Break-even: calls until the compiled "
            "variant, first call included, has spent no more time than eager.",
            "",
            markdown_table(*first_call_table(run)),
            "",
        ]
    lines += _roofline_lines(run)
    lines += _capture_lines(run)
    plots = [name for name in PLOTS if (run.plots or {}).get(name)]
    if plots:
        lines += ["Plots: " + ", ".join(f"[{name}]({name})" for name in plots), ""]
        lines += [f"![{name}]({name})" for name in plots] + [""]
    if any(_warm_process(r, v) for r in run.results for v in run.variants):
        lines += ["\\* measured in a process that had already compiled the workloads above it "
                  "(its caches empty, the process warm): smaller than a cold first call.", ""]
    found = problems(run)
    if found:
        lines += ["## Problems", ""] + [f"- **{line}**" if line.startswith("FAIL") else
                                        f"- {line}" for line in found] + [""]
    lines += ["## Workloads", ""]
    for result in run.results:
        inputs = f" Inputs: {result.description}." if result.description else ""
        lines += [f"### {label_of(result)}", "", f"{result.what}.{inputs}", "",
                  markdown_table(*_detail_rows(result)), ""]
    lines += ["## How this was measured", ""] + [f"- {line}" for line in _method(run)] + [""]
    return "\n".join(lines)


def _capture_lines(run: Run) -> list[str]:
    table = capture_table(run)
    if table is None:
        return []
    lines = ["## Capture", "",
             "What `ember.explain` makes of each call the step makes of the model (decoding: "
             "the prompt / a token with the prompt's cache): graphs, graph breaks and eager "
             "islands; then the graphs ember compiled over the whole timed run (recompiles "
             "included) and how many of them ran eagerly, and the check against eager.", "",
             markdown_table(*table), ""]
    rates = decoding_lines(run)
    if rates:
        lines += ["Decoding, steady state:", ""] + [f"- {line}" for line in rates] + [""]
    for result in run.results:
        trial = result.trials.get(OURS)
        reasons = _reasons(trial) if trial is not None else []
        if reasons:
            lines += [f"{label_of(result)}, break and island reasons:", ""]
            lines += [f"- {reason}" for reason in reasons] + [""]
    return lines


def _detail_rows(result: WorkloadResult) -> tuple[list[str], list[list[str]]]:
    headers = ["variant", "median ms", "IQR ms", "min ms", "calls", "first call s",
               "second call ms", "warm-cache first call s", "import torch / ember s", "kernels",
               "status"]
    rows = []
    for variant, trial in result.trials.items():
        steady = trial.steady if trial.error is None else None
        imports = "—" if trial.import_torch_s is None else \
            f"{trial.import_torch_s:.2f} / {trial.import_ember_s or 0:.2f}"
        rows.append([
            NAMES.get(variant, variant),
            _ms(steady.median if steady else None),
            f"{_ms(steady.q1)}–{_ms(steady.q3)}" if steady else "—",
            _ms(steady.minimum if steady else None),
            str(steady.calls) if steady else "—",
            _s(trial.first_call_s) + ("*" if trial.process_order > 0 else ""),
            _ms(trial.second_call_s),
            _s(trial.first_call_warm_cache_s),
            imports,
            "—" if trial.kernels is None else f"{trial.kernels} in {trial.graphs} graph(s)",
            result.status(variant),
        ])
    # Columns nobody measured (warm-cache first calls without --warm-cache, kernels of eager).
    kept = [i for i in range(len(headers)) if any(row[i] != "—" for row in rows)]
    return [headers[i] for i in kept], [[row[i] for i in kept] for row in rows]


def _method(run: Run) -> list[str]:
    timing = run.settings.get("timing", {})
    return [
        f"Steady state: {timing.get('warmup')} warm-up calls, then samples until at least "
        f"{timing.get('repeat')} samples and {timing.get('min_time')} s (at most "
        f"{timing.get('max_time')} s); calls faster than 0.2 ms are timed in batches. Each "
        "call ends with a device sync on CUDA. The table shows the median; IQR is the middle "
        "half of the samples.",
        "First call: a fresh Python process per "
        + ("workload and variant" if run.settings.get("process") == "trial" else
           "variant (workloads in turn)")
        + ", with empty ember, Inductor and Triton caches for every workload. `import torch`, "
        "`import torch._dynamo` and `import ember` are timed apart and not included; "
        "Inductor's own lazy imports during its first compile are, as a user sees them.",
        "Ratios below 1 mean ember is faster (steady state) or compiles faster (first call).",
        "Break-even n is the smallest n with first + (n−1)·steady ≤ n·eager; `never` when the "
        "compiled steady state is not faster than eager.",
        "Correctness: the first two outputs of each compiled variant against eager's on the "
        "same (seeded) inputs, with torch.testing.assert_close at the workload's tolerance.",
    ]


def write(run: Run, folder: Path) -> tuple[Path, Path]:
    """report.md, results.json and the plots in `folder` (created if needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    run.plots = write_plots(run, folder)
    report, raw = folder / "report.md", folder / "results.json"
    report.write_text(markdown(run))
    raw.write_text(json.dumps(run.to_json(), indent=1) + "\n")
    return report, raw
