"""ember/bench/dynamic_triton.py's CPU path: its table on tiny sizes, with Triton's interpreter
running the kernels (the GPU run is the lead's: see notes/2026-12-dynamic-shapes-triton.md)."""

import os

import pytest

from ember.bench import dynamic_triton

pytest.importorskip("triton")


# slow: ~9 minutes since the row-length cases are symbolic too (symbolic strides): the
# interpreter runs their looped and split reductions program by program (see
# notes/closing-2026-12-02-night-strides-convnets-training.md)
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="runs the Triton kernels through the interpreter")
def test_the_bench_checks_and_times_static_and_dynamic_kernels(capsys):
    report = dynamic_triton.main(["--device", "cpu", "--backend", "triton", "--quick",
                                  "--lengths", "16", "--variants", "eager,ember,nonsense"])
    steady = {(row["workload"], row["symbolic"]): row for row in report["steady"]}
    assert len(steady) == 4
    for name in ("softmax", "S1 gelu_ish"):
        row = steady[(name, "dim 0")]
        assert row["form"] == "symbolic" and not row["error"], row
        assert row["static_us"] > 0 and row["dynamic_us"] > 0
        # a symbolic row length inside a 2-d tensor: its rows' stride is a symbol too
        assert steady[(name, "dim 1")]["form"] == "symbolic", steady[(name, "dim 1")]
    sweep = {r["variant"]: r for r in report["sweep"]}
    assert sweep["ember"]["captures"] == 2 and sweep["ember"]["form"] == "symbolic"
    assert sweep["eager"]["total_s"] > 0
    # a variant that fails is a row of the table, not the end of the run
    assert sweep["nonsense"]["error"].startswith("ValueError") and \
        "total_s" not in sweep["nonsense"]
    printed = capsys.readouterr().out
    assert "static us" in printed and "shape sweep: 4 sequence lengths" in printed
