"""The report on a synthetic run: derived ratios and break-even, both tables, the problems list,
and report.md / results.json written with exactly the numbers they were given."""

import json

from ember.bench import report
from ember.bench.harness import Timing, Trial


def trial(workload, variant, first, steady, **extra):
    return Trial(workload, variant, "full", description="x 4000x4000 float32",
                 first_call_s=first, steady=Timing([steady * 0.9, steady, steady * 1.2]),
                 **extra)


def synthetic_run(load=0.1):
    ok = dict(ok=True, message="matches eager", max_abs_error=1e-7)
    s1 = report.WorkloadResult("S1", "gelu_ish", "0.5*x*(...)", {
        "eager": trial("S1", "eager", 0.5, 0.490),
        "inductor": trial("S1", "inductor", 17.5, 0.049, check=ok),
        "ember": trial("S1", "ember", 0.25, 0.0245, check=ok, kernels=1, graphs=1),
    })
    s5 = report.WorkloadResult("S5", "mlp3_b16_fwd", "mlp", {
        "eager": trial("S5", "eager", 0.1, 0.064),
        "inductor": trial("S5", "inductor", 7.6, 0.064, check=ok, process_order=1),
        "ember": trial("S5", "ember", 0.3, 0.070, process_order=1, kernels=3, graphs=1,
                       check=dict(ok=False, message="output 0: Tensor-likes are not close!",
                                  max_abs_error=0.5),
                       fallbacks=["graph0 runs eagerly: no C compiler"]),
    })
    broken = report.WorkloadResult("user.py:f", "user.py:f", "f() from user.py", {
        "eager": Trial("user.py:f", "eager", "full", error="build failed: ValueError: nope"),
        "inductor": Trial("user.py:f", "inductor", "full", error="build failed: ValueError"),
        "ember": Trial("user.py:f", "ember", "full", error="build failed: ValueError: nope"),
    })
    machine = {"cpu": "AMD EPYC", "cores": 2, "usable_cores": 2, "torch_threads": 2,
               "torch": "2.13.0+cpu", "python": "3.11.7", "os": "Linux", "memory_gib": 23.5,
               "c_compiler": "gcc 12.2.0", "ember_commit": "abc1234",
               "load_average_start": load, "load_average_end": load}
    settings = {"timing": {"warmup": 2, "repeat": 15, "min_time": 1.0, "max_time": 15.0},
                "process": "trial"}
    return report.Run("2026-11-29T10:00:00+00:00", "python -m ember bench", "full",
                      ["eager", "inductor", "ember"], machine, settings, [s1, s5, broken], 42.0)


def test_summary_derives_ratios_and_break_even():
    s1, s5, broken = synthetic_run().results
    summary = s1.summary()
    assert summary["ember_over_eager"] == 0.0245 / 0.490
    assert summary["ember_over_inductor"] == 0.5
    assert summary["first_call_ember_over_inductor"] == 0.25 / 17.5
    # ember: 0.25 + (n-1)*0.0245 <= n*0.49  ->  n = 1 (first call cheaper than an eager call)
    # inductor: 17.5 + (n-1)*0.049 <= n*0.49  ->  n >= 39.57  ->  40
    assert summary["break_even_calls"] == {"inductor": 40, "ember": 1}
    assert s5.break_even("inductor") == "never"          # same steady state as eager
    assert s5.break_even("ember") == "never"             # slower than eager
    assert s5.status("ember").startswith("FAIL: output 0")
    assert broken.break_even("ember") is None and broken.status("ember").startswith("error")


def test_terminal_tables_and_problems():
    text = report.terminal(synthetic_run())
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("S1 gelu_ish") and "ms" not in line)
    assert row.split() == ["S1", "gelu_ish", "490", "49.0", "24.5", "0.050x", "0.50x", "ok"]
    first = [line for line in lines if line.startswith("S1 gelu_ish")][1]
    assert first.split() == ["S1", "gelu_ish", "17.5", "0.25", "0.014x", "40", "1"]
    s5_first = [line for line in lines if line.startswith("S5")][1]
    assert s5_first.split() == ["S5", "mlp3_b16_fwd", "7.60*", "0.30*", "0.039x", "never",
                                "never"]
    assert "S5 mlp3_b16_fwd      64.0         64.0      70.0" in text
    assert "ember FAIL" in text and "inductor error, ember error" in text
    assert "FAIL S5 mlp3_b16_fwd ember: output 0: Tensor-likes are not close!" in lines
    assert "FALLBACK S5 mlp3_b16_fwd ember: graph0 runs eagerly: no C compiler" in lines
    assert "ERROR user.py:f eager: build failed: ValueError: nope" in lines
    assert not any(line.startswith("note: load") for line in lines)
    assert "note: load average reached 1.9 on 2 cores" in report.terminal(synthetic_run(1.9))


def test_tables_leave_out_columns_of_variants_not_run():
    run = synthetic_run()
    run.variants = ["eager", "ember"]
    for result in run.results:
        del result.trials["inductor"]
    headers, rows = report.steady_table(run)
    assert headers == ["workload", "eager ms", "ember ms", "ember/eager", "check"]
    headers, rows = report.first_call_table(run)
    assert headers == ["workload", "ember 1st s", "break-even ember"]
    assert rows[0] == ["S1 gelu_ish", "0.25", "1"]


def test_written_files_hold_the_numbers(tmp_path):
    run = synthetic_run()
    markdown_path, json_path = report.write(run, tmp_path / "out")
    markdown = markdown_path.read_text()
    assert "| S1 gelu_ish | 490 | 49.0 | 24.5 | 0.050x | 0.50x | ok |" in markdown
    assert "| S1 gelu_ish | 17.5 | 0.25 | 0.014x | 40 | 1 |" in markdown
    assert "- CPU: AMD EPYC, 2 cores (2 usable)" in markdown
    assert "2026-11-29T10:00:00+00:00" in markdown and "torch 2.13.0+cpu" in markdown
    assert "- **FAIL S5 mlp3_b16_fwd ember: output 0" in markdown
    assert "| ember.compile | 24.5 | 23.3–27.0 | 22.1 | 3 | 0.25 |" in markdown  # detail: IQR, min
    data = json.loads(json_path.read_text())
    s1 = data["workloads"][0]
    assert s1["trials"]["ember"]["steady"]["samples_s"] == [0.0245 * 0.9, 0.0245, 0.0245 * 1.2]
    assert s1["summary"]["break_even_calls"] == {"inductor": 40, "ember": 1}
    assert data["machine"]["cpu"] == "AMD EPYC" and data["elapsed_s"] == 42.0
    again = report.Run.from_json(data)
    assert again.results[0].trials["inductor"] == run.results[0].trials["inductor"]
    assert report.markdown(again) == markdown
    assert not again.ok and not run.ok
