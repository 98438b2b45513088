"""ember/tuning.py and mode="max-autotune": the choice (the default unless a candidate is
faster by MARGIN; never a candidate that disagrees), its record in the disk cache read back
by a second process without timing anything, what EMBER_LOGS=perf says, and the default mode
left untouched (its sources: tests/codegen/test_default_sources.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import captured_log

import ember
from ember import config, options, tuning
from ember.runtime import disk_cache, tune_c

ROOT = Path(__file__).resolve().parents[1]


def fake(seconds: dict[str, float], wrong: frozenset = frozenset()):
    """Candidates whose runs take no time, whose timings are `seconds`; those in `wrong`
    disagree with the default."""
    def prepare(label):
        if label in wrong:
            raise tuning.Disagrees("its result 0 differs from the default's")
        return lambda: None
    return {label: (lambda label=label: prepare(label)) for label in seconds}


@pytest.fixture
def timed(monkeypatch):
    """tuning.measure answers with the candidates' planned seconds."""
    planned: dict[str, float] = {}
    monkeypatch.setattr(tuning, "measure",
                        lambda runs, synchronize, samples=5, apart=frozenset(), timer=None:
                        {k: planned[k] for k in runs})
    return planned


def test_the_default_stays_unless_a_candidate_beats_it_by_the_margin():
    assert tuning.fastest({"default": 1.0, "serial": 0.97}) == "default"
    assert tuning.fastest({"default": 1.0, "serial": 0.9, "threads=2": 0.8}) == "threads=2"
    assert tuning.fastest({"default": 1.0, "serial": 1.5}) == "default"
    margins = {"threads=2": 0.25}
    assert tuning.fastest({"default": 1.0, "threads=2": 0.8, "column=64": 0.9},
                          margins) == "column=64"
    assert tuning.fastest({"default": 1.0, "threads=2": 0.7, "column=64": 0.9},
                          margins) == "threads=2"


def test_a_candidate_that_disagrees_is_never_chosen(tmp_path, timed):
    timed.update({"default": 1.0, "serial": 0.1, "threads=2": 0.5})
    before = dict(tuning.counts)
    with config.override(cache_dir=tmp_path), captured_log("perf") as records:
        choice = tuning.choose("graph0", "kernel0", "pointwise [4]", tuning.key("test", "a"),
                               fake(timed, frozenset({"serial"})))
    assert choice == "threads=2"
    assert tuning.counts["disagreed"] - before["disagreed"] == 1
    (message,) = [r.getMessage() for r in records]
    assert "dropped as wrong: serial" in message and "threads=2 wins (2.00x" in message


def test_the_choice_is_recorded_and_read_back_without_timing(tmp_path, timed):
    timed.update({"default": 1.0, "serial": 0.5})
    key = tuning.key("test", "b")
    with config.override(cache_dir=tmp_path):
        assert tuning.choose("graph0", "kernel0", "x", key, fake(timed)) == "serial"
        before = dict(tuning.counts)
        timed.update({"default": 0.1})  # (were it timed again, the default would win)
        with captured_log("perf") as records:
            assert tuning.choose("graph1", "kernel3", "x", key, fake(timed)) == "serial"
        record = disk_cache.entry_path(tuning.KIND, key, ".json")
    assert tuning.counts["timings"] == before["timings"]
    assert tuning.counts["recorded"] - before["recorded"] == 1
    assert "choice serial read from the disk cache (nothing timed)" in records[0].getMessage()
    assert json.loads(record.read_text())["choice"] == "serial"


def test_a_damaged_record_is_tuned_again(tmp_path, timed):
    timed.update({"default": 1.0, "serial": 0.5})
    key = tuning.key("test", "c")
    with config.override(cache_dir=tmp_path):
        tuning.choose("graph0", "kernel0", "x", key, fake(timed))
        record = disk_cache.entry_path(tuning.KIND, key, ".json")
        record.write_text(json.dumps({"choice": "default"}))  # (its digest no longer fits)
        before = dict(tuning.counts)
        assert tuning.choose("graph0", "kernel0", "x", key, fake(timed)) == "serial"
    assert tuning.counts["tuned"] - before["tuned"] == 1


# (a pointwise kernel's candidates are thread counts: on one core — `taskset -c 0`,
# OMP_NUM_THREADS=1 — there is nothing to try, and these tests' counts would be 0)
needs_two_cores = pytest.mark.skipif(tune_c.cores() < 2,
                                     reason="C tuning tries thread counts: one core here")


@needs_two_cores
def test_modes_turn_tuning_on_and_the_default_mode_tunes_nothing(tmp_path):
    assert options.list_mode_options("max-autotune")["max_autotune"] is True
    assert options.list_mode_options("max-autotune-no-cudagraphs")["max_autotune"] is True
    x = torch.randn(300, 400, device="cpu")  # (the C backend's, under any test device)
    before = dict(tuning.counts)
    with config.override(cache_dir=tmp_path, backend="c"):
        torch.testing.assert_close(ember.compile(lambda x: x.tanh() + 1)(x), x.tanh() + 1)
        assert tuning.counts == before  # the default mode
        compiled = ember.compile(lambda x: x.tanh() * 3, mode="max-autotune-no-cudagraphs")
        torch.testing.assert_close(compiled(x), x.tanh() * 3)
        assert tuning.counts["tuned"] - before["tuned"] == 1
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: x.tanh() * 5, backend="ember", mode="max-autotune")
        torch.testing.assert_close(compiled(x), x.tanh() * 5)
        assert tuning.counts["tuned"] - before["tuned"] == 2
        compiled = ember.compile(lambda x: x.tanh() * 7, options={"max_autotune": True})
        torch.testing.assert_close(compiled(x), x.tanh() * 7)
        assert tuning.counts["tuned"] - before["tuned"] == 3


SCRIPT = textwrap.dedent("""
    import json, sys, torch, ember
    import torch.nn.functional as F
    from ember import tuning
    torch.manual_seed(0)
    x, w = torch.randn(256, 512), torch.randn(512)
    fn = ember.compile(lambda x, w: F.softmax(x * w, -1) + x.sum(0), mode="max-autotune")
    torch.testing.assert_close(fn(x, w), F.softmax(x * w, -1) + x.sum(0))
    print(json.dumps({"counts": tuning.counts,
                      "choices": {o.kernel: o.choice for o in tuning.history}}))
""")


def run(cache: Path, warm: bool) -> tuple[dict, str]:
    environment = dict(os.environ, EMBER_CACHE_DIR=str(cache), EMBER_LOGS="perf",
                       EMBER_BACKEND="c", EMBER_WARM_START="1" if warm else "0",
                       PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@needs_two_cores
@pytest.mark.parametrize("warm", [False, True])
def test_a_second_process_reads_the_choices_instead_of_timing(tmp_path, warm):
    first, said = run(tmp_path, warm)
    kernels = first["counts"]["tuned"]
    assert kernels == 2 and first["counts"]["timings"] >= 2 * kernels
    assert first["counts"]["recorded"] == 0
    assert said.count("max-autotune tried default") == kernels
    assert said.count(" wins (") + said.count("the default stays") == kernels
    second, said = run(tmp_path, warm)
    assert second["counts"]["tuned"] == 0 and second["counts"]["timings"] == 0
    if warm:  # the whole graph comes back from the warm-start entry: nothing to read
        assert second["counts"]["recorded"] == 0 and "warm start" in said
    else:
        assert second["counts"]["recorded"] == kernels
        assert second["choices"] == first["choices"]
        assert said.count("read from the disk cache (nothing timed)") == kernels


def test_a_timer_replaces_the_wall_clock_and_samples_each_candidate_in_turn():
    calls = []

    def timer(run):
        calls.append(run)
        return {fast: 1e-6, slow: 3e-6}[run]

    def fast():
        pass

    def slow():
        pass

    seconds = tuning.measure({"default": slow, "wide": fast}, lambda: None, samples=3,
                             timer=timer)
    assert seconds == {"default": 3e-6, "wide": 1e-6}
    assert calls == [slow, fast] * 3
