"""`python -m ember bench` end to end on tiny shapes (eager and ember only, to stay fast): the
files it writes and what they say; a crashing or hanging workload; no C compiler."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ember.bench.harness import run_trials
from ember.bench.report import ratio_text

ROOT = Path(__file__).resolve().parents[2]


def bench(*arguments, env=None):
    return subprocess.run([sys.executable, "-m", "ember", "bench", *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_bench_writes_report_and_raw_numbers(tmp_path):
    done = bench("--size", "tiny", "--only", "S1", "softmax", "--variants", "eager,ember",
                 "--warm-cache", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["size"] == "tiny" and data["variants"] == ["eager", "ember"]
    assert [w["name"] for w in data["workloads"]] == ["S1", "softmax"]
    s1, softmax = data["workloads"]
    assert s1["description"] == "x 64x64 float32"
    for workload in (s1, softmax):
        eager, ember = workload["trials"]["eager"], workload["trials"]["ember"]
        assert eager["error"] is None and ember["error"] is None
        assert ember["check"]["ok"] and ember["check"]["max_abs_error"] < 1e-4
        assert ember["graphs"] == 1 and ember["fallbacks"] == []
        assert 0 < ember["first_call_s"] < 60
        steady = ember["steady"]
        assert steady["calls"] == len(steady["samples_s"]) * steady["number"] >= 3
        assert steady["q1_s"] <= steady["median_s"] <= steady["q3_s"]
        summary = workload["summary"]
        assert summary["ember_over_eager"] == pytest.approx(
            steady["median_s"] / eager["steady"]["median_s"])
        assert summary["status"] == {"eager": "ok", "ember": "ok"}
    assert s1["trials"]["ember"]["kernels"] == 1
    assert s1["trials"]["ember"]["first_call_warm_cache_s"] > 0
    assert s1["trials"]["eager"]["first_call_warm_cache_s"] is None
    assert s1["trials"]["eager"]["import_torch_s"] > 0          # the first in its process
    assert softmax["trials"]["ember"]["process_order"] == 1     # tiny: one process per variant
    markdown = (tmp_path / "report.md").read_text()
    ratio = s1["summary"]["ember_over_eager"]
    assert f"| S1 gelu_ish | {ratio_cell(s1, 'eager')} | {ratio_cell(s1, 'ember')} |" in markdown
    assert ratio_text(ratio) in markdown
    assert f"- CPU: {data['machine']['cpu']}" in markdown
    assert data["date"] in markdown
    assert "steady state (median per call)" in done.stdout
    assert "ember     S1: done: first call" in done.stdout
    # the roofline: ceilings measured at the start, work counted on the eager trial
    ceilings = data["machine"]["ceilings"]
    assert ceilings["bandwidth_gb_s"] > 0 and ceilings["peak_gflop_s"] > 0
    assert s1["trials"]["eager"]["work"] == {"bytes": 2 * 64 * 64 * 4, "flops": 0.0}
    assert "| S1 gelu_ish | 0.0 | 0.00 | 0.0 |" in markdown  # 32 KB, no matmul flops
    for name in ("first_call_vs_steady.png", "steady_state.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def ratio_cell(workload, variant):
    from ember.bench.harness import format_ms

    return format_ms(workload["trials"][variant]["steady"]["median_s"])


@pytest.mark.slow
def test_a_crash_or_a_hang_costs_only_its_own_workload(tmp_path):
    user = tmp_path / "user.py"
    user.write_text(textwrap.dedent("""
        import os, time, torch

        def crash(x):
            os._exit(7)

        def crashing():
            return crash, (torch.ones(2),)

        def hanging():
            time.sleep(120)
    """))
    trials = run_trials([f"{user}:hanging", f"{user}:crashing", "S1"], "eager", size="tiny",
                        timeout=4)
    assert trials[0].error.startswith("the measuring process ran past the time limit")
    assert trials[1].error.startswith("the measuring process exited (7)")
    assert trials[2].error is None and trials[2].first_call_s > 0


def test_without_a_c_compiler_ember_runs_eagerly_and_says_so(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "EMBER_CC")}
    env["PATH"] = str(empty)
    done = bench("--size", "tiny", "--only", "S1", "--variants", "ember", "--out",
                 str(tmp_path), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    ember = json.loads((tmp_path / "results.json").read_text())["workloads"][0]["trials"]["ember"]
    # (run eagerly: eager's bits; ember/bench/trial.settle_vector_math)
    assert ember["check"]["ok"] and ember["check"]["max_abs_error"] == 0.0
    assert ember["fallbacks"][0] == "1 of 1 graphs ran eagerly"
    assert "no C compiler found" in ember["fallbacks"][1]
    assert "FALLBACK S1 gelu_ish ember: 1 of 1 graphs ran eagerly" in done.stdout
    assert "C compiler: none found" in (tmp_path / "report.md").read_text()
    # the measuring process's stderr is kept beside the report (its fallbacks channel here)
    assert "no C compiler found" in (tmp_path / "logs" / "ember-1.txt").read_text()


def test_options():
    from ember.bench.cli import parser, size_of

    assert size_of(parser().parse_args([])) == "full"
    assert size_of(parser().parse_args(["--quick"])) == "quick"
    assert size_of(parser().parse_args(["--size", "tiny"])) == "tiny"
    options = parser().parse_args(["--only", "S1", "S2", "--variants", "eager,ember"])
    assert options.only == ["S1", "S2"] and options.variants == "eager,ember"


def test_help_lists_commands_and_switches(capsys):
    from ember.__main__ import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "bench" in out and "EMBER_CACHE_DIR" in out
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_the_gpu_benchmark_says_it_needs_a_gpu(capsys):
    import torch

    from ember.bench import cli

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert cli.main(["--device", "cuda", "--only", "S1"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_warm_start_table_gives_the_ratios_of_extra_times():
    from ember.bench.warm_start import table

    text = table({"S1": {"eager": 1.0, "ember-cold": 2.0, "ember-warm": 1.2,
                         "torch.compile-cold": 11.0, "torch.compile-warm": 5.0,
                         "warm hits": 1}})
    row = next(line for line in text.splitlines() if line.startswith("S1"))
    assert "0.100" in row and "0.200" in row and "0.050" in row  # (1/10, 0.2/1, 0.2/4)


def test_dynamic_runs_the_shape_sweep_and_decoding():
    run = bench("--dynamic", "--quick", "--variants", "eager,ember")
    assert run.returncode == 0, run.stderr[-2000:]
    ember_lines = [line for line in run.stdout.splitlines() if line.strip().startswith("ember")]
    assert len(ember_lines) == 2, run.stdout  # (the sweep's, the decoding's)
    sweep, decoding = ember_lines
    # the sweep's answers are checked against eager's as it runs (assert_close)
    assert int(sweep.rsplit("(", 1)[1].split()[0]) <= 2, sweep  # captures over ten lengths
    assert "eager's tokens: True" in decoding and \
        int(decoding.rsplit("(", 1)[1].split()[0]) <= 2, decoding
