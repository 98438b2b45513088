"""The data-parallel benchmark (ember/bench/distributed.py) on 2 CPU ranks over gloo."""

import json

import pytest
import torch

from ember.bench import distributed


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_the_ddp_bench_times_each_variant_with_and_without_ddp(tmp_path, capsys):
    assert distributed.main(["--ranks", "2", "--steps", "3", "--size", "8x32",
                             "--variants", "eager,ember", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["variant"], r["ddp"]) for r in results] == [
        ("eager", True), ("eager", False), ("ember", True), ("ember", False)]
    assert all("error" not in r and r["median_ms"] > 0 for r in results)
    assert all(r["ranks_agree"] for r in results if r["ddp"])
    printed = capsys.readouterr().out
    assert "| ember |" in printed and "exposed by DDP" in printed
