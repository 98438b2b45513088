"""The benchmark report's figures (matplotlib, PNG): first calls beside steady states, and
steady states over eager's. report.write draws them beside report.md."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ember.bench.harness import ratio

if TYPE_CHECKING:
    from ember.bench.report import Run

PLOTS = ("first_call_vs_steady.png", "steady_state.png")


def write_plots(run: Run, folder: Path) -> dict[str, bool]:
    """PNG figures (matplotlib): per workload, the first call (ember's to the end of its first
    compiled call) beside the steady state of each variant (the seeds' cold-vs-warm figure);
    and every workload's steady state relative to eager. Without matplotlib, none (the report
    says so)."""
    from ember.bench.report import BASELINE, NAMES, label_of  # (report imports this module)

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {name: False for name in PLOTS}
    colors = {"eager": "tab:gray", "inductor": "tab:blue", "ember": "tab:red",
              "dynamo+ember": "tab:orange", "ember-model": "tab:pink"}
    results = [r for r in run.results if any(r.steady(v) for v in run.variants)]
    if not results:
        return {name: False for name in PLOTS}
    figure, axes = plt.subplots(len(results), 2, figsize=(10, 2.6 * len(results)),
                                squeeze=False)
    for row, result in zip(axes, results):
        variants = [v for v in run.variants if result.steady(v) is not None]
        # (ember's until its calls run compiled: its first call may return at eager's pace)
        first = [result.compiled_after(v) or 0.0 for v in variants]
        steady = [result.steady(v) * 1e3 for v in variants]
        shades = [colors.get(v, "tab:green") for v in variants]
        row[0].bar(variants, first, color=shades)
        row[0].set_ylabel("until compiled (s)")
        row[0].set_title(f"{label_of(result)}: first call, to the end of the first compiled "
                         f"call", fontsize=9)
        row[1].bar(variants, steady, color=shades)
        row[1].set_ylabel("ms per call")
        row[1].set_title(f"{label_of(result)}: steady state", fontsize=9)
        for axis in row:
            axis.grid(True, axis="y", alpha=0.3)
            axis.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    figure.savefig(folder / PLOTS[0], dpi=110)
    plt.close(figure)

    compiled = [v for v in run.variants if v != BASELINE]
    figure, axis = plt.subplots(figsize=(max(6, 1.3 * len(results)), 3.6))
    width = 0.8 / max(1, len(compiled))
    for k, variant in enumerate(compiled):
        values = [ratio(r.steady(BASELINE), r.steady(variant)) or 0.0 for r in results]
        axis.bar([i + k * width for i in range(len(results))], values, width,
                 label=NAMES.get(variant, variant), color=colors.get(variant, "tab:green"))
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([i + width * (len(compiled) - 1) / 2 for i in range(len(results))])
    axis.set_xticklabels([r.name for r in results], fontsize=8)
    axis.set_ylabel("speedup over eager (x)")
    axis.set_title("steady state per workload (higher is faster)", fontsize=10)
    axis.legend(fontsize=8)
    axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(folder / PLOTS[1], dpi=110)
    plt.close(figure)
    return {name: True for name in PLOTS}
