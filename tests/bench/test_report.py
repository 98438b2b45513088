"""The report on a synthetic run: derived ratios and break-even, both tables, the problems list,
and report.md / results.json written with exactly the numbers they were given."""

import json

import pytest

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
        "ember": trial("S1", "ember", 0.25, 0.0245, check=ok, kernels=1, graphs=1,
                       compiled_after_s=1.75),  # (its first call ran eagerly, kernels beside)
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
    assert summary["compiled_after_ember_over_inductor"] == 1.75 / 17.5
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
    assert first.split() == ["S1", "gelu_ish", "17.5", "0.25", "0.014x", "1.75", "0.10x",
                             "40", "1"]
    s5_first = [line for line in lines if line.startswith("S5")][1]  # (its first call compiled)
    assert s5_first.split() == ["S5", "mlp3_b16_fwd", "7.60*", "0.30*", "0.039x", "0.30",
                                "0.039x", "never", "never"]
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
    assert headers == ["workload", "ember 1st s", "ember compiled after s", "break-even ember"]
    assert rows[0] == ["S1 gelu_ish", "0.25", "1.75", "1"]


def test_written_files_hold_the_numbers(tmp_path):
    run = synthetic_run()
    markdown_path, json_path = report.write(run, tmp_path / "out")
    markdown = markdown_path.read_text()
    assert "| S1 gelu_ish | 490 | 49.0 | 24.5 | 0.050x | 0.50x | ok |" in markdown
    assert "| S1 gelu_ish | 17.5 | 0.25 | 0.014x | 1.75 | 0.10x | 40 | 1 |" in markdown
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
    for name in report.PLOTS:  # the figures, as PNG files, linked from the report
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name}]({name})" in markdown


def test_regimes_from_the_roofline():
    from ember.bench.roofline import Ceilings, Work, regime

    ceilings = Ceilings(bandwidth_gb_s=20.0, peak_gflop_s=100.0)  # ridge: 5 flop/byte
    copy_like = Work(bytes=200_000_000, flops=0.0)                 # floor 10 ms of memory
    assert ceilings.ridge == 5.0
    found = regime(copy_like, ceilings, 0.0125)
    assert found.name == "bandwidth" and found.attained == pytest.approx(0.8)
    assert str(regime(copy_like, ceilings, 0.05)) == "bandwidth (20%)"  # slow, not overhead
    matmul = Work(bytes=10_000_000, flops=2e9)                        # 20 ms compute, 0.5 memory
    found = regime(matmul, ceilings, 0.025)
    assert found.name == "compute" and found.floor_s == pytest.approx(0.02)
    assert found.attained == pytest.approx(0.8)
    tiny = Work(bytes=32, flops=0.0)
    assert regime(tiny, ceilings, 3e-6).name == "overhead" and str(
        regime(copy_like, ceilings, 0.01)) == "bandwidth (100%)"
    # faster than DRAM's copy bandwidth: the data stayed in the caches (not "183%")
    found = regime(copy_like, ceilings, 0.0055)
    assert str(found) == "cache-resident" and found.to_json()["attained"] is None


def test_results_json_carries_each_variants_regime(tmp_path):
    run = synthetic_run()
    run.machine["ceilings"] = {"bandwidth_gb_s": 25.0, "peak_gflop_s": 100.0, "device": "cpu"}
    run.results[0].trials["eager"].work = {"bytes": 128_000_000, "flops": 0.0}
    regimes = run.to_json()["workloads"][0]["regimes"]
    assert set(regimes) == {"eager", "inductor", "ember"}
    assert regimes["ember"]["regime"] == "bandwidth"
    assert regimes["ember"]["attained"] == pytest.approx(5.12 / 24.5, rel=1e-3)
    assert run.to_json()["workloads"][1]["regimes"] == {}


def test_the_report_shows_each_variants_regime():
    run = synthetic_run()
    run.machine["ceilings"] = {"bandwidth_gb_s": 25.0, "peak_gflop_s": 100.0, "device": "cpu"}
    run.results[0].trials["eager"].work = {"bytes": 128_000_000, "flops": 0.0}
    headers, rows = report.roofline_table(run)
    assert headers == ["workload", "MB moved", "GFLOP", "flop/byte", "eager regime",
                       "inductor regime", "ember regime"]
    # 128 MB at 25 GB/s: a 5.12 ms floor; eager 490 ms, ember 24.5 ms: 5.12/24.5
    assert rows[0] == ["S1 gelu_ish", "128.0", "0.00", "0.0", "bandwidth (1%)",
                       "bandwidth (10%)", "bandwidth (21%)"]
    assert rows[1][1:4] == ["—", "—", "—"]
    assert "Roofline: copy bandwidth 25.0 GB/s" in report.markdown(run)
    assert "roofline: 25.0 GB/s copy" in report.terminal(run)


def test_work_is_counted_on_one_eager_call():
    import torch

    from ember.bench.roofline import count_work

    model = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    with torch.no_grad():
        work = count_work(model, (x,))
    assert work.flops == 2 * 16 * 8 * 4
    assert work.bytes == 4 * (16 * 8 + 8 * 4 + 4 + 16 * 4)  # x, weight, bias read; y written


def test_eager_islands_are_no_fallbacks():
    # (a graph compiled around its islands: the islands are in the capture table, not among
    # the problems, and the summary line does not say the graph fell back)
    island = "BART.forward (generic.py:939): rand runs as an eager island: makes a tensor on cpu"
    run = synthetic_run()
    for result in run.results:
        if "ember" in result.trials and result.name == "S1":
            result.trials["ember"].fallbacks = [island, island]
            summary = result.trials["ember"].summary()
    assert "fell back" not in summary and f"2 eager islands: {island}" in summary
    assert not any("FALLBACK S1" in line for line in report.problems(run))
