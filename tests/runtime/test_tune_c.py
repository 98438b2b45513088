"""ember/runtime/tune_c.py: every candidate configuration of a C kernel (thread counts, column
widths), built into the graph, gives eager's answer; the candidates are the ones described;
the choice is what the timings say."""

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, check, make
from tuning_helpers import tuned, winning

from ember import config, tuning
from ember.codegen.c import CTuning, write_kernel
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.runtime import tune_c
from ember.schedule.fuse import schedule

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="C kernels run on the CPU")


@pytest.fixture(autouse=True)
def _four_cores(monkeypatch):
    """Candidates as on a 4-core machine (serial, 2 threads, 4), whatever this one has."""
    monkeypatch.setattr(tune_c, "cores", lambda: 4)
    with config.override(backend="c"):
        yield


CASES = {
    "pointwise_parallel": (lambda x: torch.tanh(x) * 2 + 1, (make(300, 400),)),
    "pointwise_small": (lambda x: x.exp() - 1, (make(8, 8),)),
    "softmax_rows": (lambda x: F.softmax(x, -1), (make(200, 300),)),
    "sum_columns": (lambda x: x.sum(0) * 2, (make(300, 200),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (500,), w, b),
                   (make(80, 500), make(500, seed=1), make(500, seed=2))),
    "centred": (lambda x: (x - x.mean()).abs(), (make(300, 300),)),
    "embedding": (lambda w, i: F.embedding(i, w) * 2,
                  (make(50, 64), torch.randint(0, 50, (40, 30)))),
    "in_place": (lambda x: x.add_(1).mul(2), (make(300, 300),)),
    "integer": (lambda x: (x * 3) // 2 + x % 5, (torch.randint(-100, 100, (400, 400)),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_candidate_gives_eagers_answer(name, tmp_path, monkeypatch):
    fn, args = CASES[name]
    tried: dict[str, set[str]] = {}
    chosen: dict[str, set[str]] = {}
    for index in range(6):
        with winning(index, monkeypatch), tuned(tmp_path / f"cache{index}") as outcomes:
            graph = check(fn, *args)
        for outcome in outcomes:
            assert shows(outcome.choice, graph.kernel_texts[outcome.kernel]), outcome
            tried.setdefault(outcome.kernel, set()).update(outcome.seconds)
            chosen.setdefault(outcome.kernel, set()).add(outcome.choice)
    assert tried, "no kernel was tuned"
    assert chosen == tried  # (each candidate was built into the graph once)
    for labels in tried.values():
        assert tuning.DEFAULT in labels and 2 <= len(labels) <= 5


def shows(choice: str, text: str) -> bool:
    """Does a kernel's C text carry its configuration?"""
    if choice == "serial":
        return "omp parallel" not in text
    if choice.startswith("threads="):
        return f"num_threads({choice.split('=')[1]})" in text
    if choice.startswith("column="):
        return f"[{choice.split('=')[1]}]" in text
    return "num_threads" not in text


def plan_of(fn, *args):
    with torch.no_grad():
        return schedule(run_passes(trace(torch.fx.symbolic_trace(fn), list(args)).graph))


def test_thread_candidates_set_the_parallel_pragmas():
    big = plan_of(lambda x: torch.tanh(x) * 2, make(300, 400))
    (kernel,) = big.kernels
    assert list(tune_c.candidates(kernel, big)) == ["default", "serial", "threads=2"]
    assert "omp parallel" in write_kernel(kernel, big).text
    assert "omp parallel" not in write_kernel(kernel, big, CTuning(threads=1)).text
    assert write_kernel(kernel, big, CTuning(threads=2)).text.count("num_threads(2)") == 1
    small = plan_of(lambda x: x.exp(), make(8, 8))
    (kernel,) = small.kernels
    assert list(tune_c.candidates(kernel, small)) == ["default", "threads=2", "threads=4"]
    assert "omp parallel" not in write_kernel(kernel, small).text
    assert write_kernel(kernel, small, CTuning(threads=4)).text.count("num_threads(4)") == 1


def test_a_kernel_made_parallel_by_its_costly_calls_is_offered_fewer_threads():
    """64x256 tanh: under the threshold by its elements, over it by its tanh calls' weight
    (the second writing's decision, which the candidates follow)."""
    plan = plan_of(lambda x, b: torch.tanh(x + b), make(64, 256), make(256))
    (kernel,) = plan.kernels
    assert "omp parallel" in write_kernel(kernel, plan).text
    assert list(tune_c.candidates(kernel, plan)) == ["default", "serial", "threads=2"]


def test_column_candidates_change_the_block_width():
    plan = plan_of(lambda x: x.sum(0), make(300, 2000))
    (kernel,) = plan.kernels
    assert list(tune_c.candidates(kernel, plan)) == ["default", "serial", "threads=2",
                                                     "column=64", "column=1024"]
    assert "[256]" in write_kernel(kernel, plan).text
    assert "[64]" in write_kernel(kernel, plan, CTuning(column=64)).text
    assert "[1024]" in write_kernel(kernel, plan, CTuning(column=1024)).text


def test_the_default_config_writes_the_default_source():
    plan = plan_of(lambda x: F.softmax(x, -1) + x.sum(0), make(300, 400))
    from ember.codegen.c import write_source

    assert write_source(plan, {})[0] == write_source(plan)[0]
    assert write_source(plan, {k.name: CTuning() for k in plan.kernels})[0] == \
        write_source(plan)[0]


def test_a_real_timing_keeps_a_candidate_only_when_it_is_faster(tmp_path):
    """No timer patched: the timings are real (noisy here); whichever wins, the graph gives
    eager's answer and every candidate was timed."""
    fn, args = CASES["softmax_rows"]
    before = dict(tuning.counts)
    with tuned(tmp_path) as outcomes:
        check(fn, *args)
    (outcome,) = outcomes
    assert set(outcome.seconds) == {"default", "serial", "threads=2"}
    assert all(seconds > 0 for seconds in outcome.seconds.values())
    assert outcome.choice == tuning.fastest(outcome.seconds)  # (its default is parallel:
    # no candidate adds a parallel region, so every margin is tuning.MARGIN)
    assert tuning.counts["timings"] - before["timings"] == 3


def test_a_failure_to_tune_leaves_the_graph_compiled_as_the_heuristics_build_it(
        tmp_path, monkeypatch):
    from helpers import captured_log

    from ember.runtime.build import BuildError

    def broken(work, renamed):
        raise BuildError("cc failed on the candidates")

    monkeypatch.setattr(tune_c, "_library", broken)
    fn, args = CASES["softmax_rows"]
    with tuned(tmp_path) as outcomes, captured_log("perf") as records:
        graph = check(fn, *args)
    assert outcomes == []
    assert "omp parallel" in graph.kernel_texts["kernel0"]  # (the heuristics' choice)
    assert any("could not tune its kernels (BuildError: cc failed" in r.getMessage()
               for r in records)
