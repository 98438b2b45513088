"""ember/runtime/tune_triton.py and ember/codegen/triton_candidates.py under Triton's
interpreter (tests/conftest.py), or compiled under EMBER_TEST_DEVICE=cuda: every candidate
tile of every kind of kernel — pointwise, persistent, looped, split and column reductions, a
matmul with its epilogue — built into the graph gives eager's answer. Timings are mocked
(the interpreter's mean nothing)."""

import os

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, check, make
from tuning_helpers import tuned, winning

from ember import config, tuning
from ember.codegen import triton_tiling
from ember.codegen.triton_candidates import label

pytest.importorskip("triton")
# (on a GPU, EMBER_TEST_DEVICE=cuda: the candidates compiled, each checked the same way)
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and DEVICE != "cuda",
                                reason="these tests run kernels through Triton's interpreter "
                                       "or on a GPU")


@pytest.fixture(autouse=True)
def _triton():
    with config.override(backend="triton"):
        yield


# name -> (fn, args, heuristics' changes that make the kernel of that kind at a small size)
CASES = {
    "pointwise": (lambda x: F.gelu(x * 1.01 + 0.5), (make(64, 100),), {}),
    "persistent": (lambda x: F.softmax(x, -1), (make(4, 200),), {}),
    "looped": (lambda x: x.sum(1) + x.amax(1), (make(6, 300),),
               dict(persistent_max=64, looped_rblock=128, split_min_row=1 << 30)),
    "split": (lambda x: x.sum(1), (make(4, 3000),), dict(persistent_max=64, looped_rblock=256,
                                                       split_min_row=1024)),
    "column": (lambda x: x.sum(0) * 2, (make(300, 48),), {}),
    "column_persistent": (lambda x: x.sum(0), (make(20, 64),), {}),
    "matmul_epilogue": (lambda x, w, b: torch.tanh(F.linear(x, w, b)),
                        (make(40, 32), make(24, 32, seed=1), make(24, seed=2)), {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_candidate_gives_eagers_answer(name, tmp_path, monkeypatch):
    fn, args, changes = CASES[name]
    monkeypatch.setattr(triton_tiling, "HEURISTICS",
                        triton_tiling.Heuristics(**changes))
    tried: dict[str, set[str]] = {}
    chosen: dict[str, set[str]] = {}
    for index in range(6):
        with winning(index, monkeypatch), tuned(tmp_path / f"cache{index}") as outcomes:
            graph = check(fn, *args, rtol=1e-4, atol=1e-4)
        for outcome in outcomes:
            tried.setdefault(outcome.kernel, set()).update(outcome.seconds)
            chosen.setdefault(outcome.kernel, set()).add(outcome.choice)
            text = graph.kernel_texts[outcome.kernel]
            for part in outcome.choice.split():  # (the tile chosen is the tile written)
                assert shows(part, text), (part, text[:300])
    assert tried, "no kernel was tuned"
    assert chosen == tried
    for labels in tried.values():
        assert tuning.DEFAULT in labels and 2 <= len(labels) <= 6
    if name == "matmul_epilogue":
        assert any("block_m" in choice for labels in chosen.values() for choice in labels)


def shows(part: str, text: str) -> bool:
    if part == "default":
        return True
    field, value = part.split("=")
    constant = {"xblock": "XBLOCK", "rblock": "RBLOCK", "block_m": "BLOCK_M",
                "block_n": "BLOCK_N", "block_k": "BLOCK_K"}.get(field)
    if constant:
        return f"{constant}: tl.constexpr = {value}" in text
    return f"num_{field}={value}" in text


def test_labels_name_what_differs_from_the_default():
    default = triton_tiling.Tiling(1024, num_warps=4)
    assert label(triton_tiling.Tiling(2048, num_warps=8), default) == "xblock=2048 warps=8"
    assert label(triton_tiling.Tiling(1024, num_warps=4, num_stages=2), default) == "stages=2"


@pytest.mark.skipif(DEVICE != "cuda", reason="times kernels on a GPU")
def test_the_gpu_timer_runs_every_queued_run_and_answers_seconds_per_run():
    from ember.runtime.tune_triton import GpuTimer

    counter = torch.zeros((), device="cuda")
    timer = GpuTimer(torch.cuda.current_device())
    def run():
        counter.add_(1)

    seconds = [timer(run) for _ in range(3)]
    repeats, _ = next(iter(timer.plans.values()))
    assert counter.item() == 10 + 10 + 3 * repeats  # the plan's two rounds of 10, then 3 samples
    assert all(0 < s < 1e-3 for s in seconds)
