"""The harness's arithmetic on synthetic timings: break-even, ratios, quartiles, and benchmark's
sampling loop driven by a fake clock (so the counts and medians are exact)."""

import pytest
import torch

from ember.bench import harness
from ember.bench.harness import Timing, break_even, format_ms, ratio


@pytest.mark.parametrize("first, steady, eager, calls", [
    (10.0, 1.0, 2.0, 9),       # 10 + 8*1 = 18 = 9*2: pays off exactly at the 9th call
    (10.5, 1.0, 2.0, 10),      # 10.5 + 8 > 18, 10.5 + 9 = 19.5 <= 20
    (1.5, 1.0, 2.0, 1),        # the first call is already cheaper than an eager call
    (2.0, 1.0, 2.0, 1),        # equal counts as paid off
    (0.3, 0.1, 0.2, 2),        # binary fractions: 0.3 + 0.1 = 0.4 = 2*0.2 only up to rounding
    (100.0, 2.0, 2.0, None),   # same steady state: never
    (100.0, 3.0, 2.0, None),   # slower steady state: never
    (0.1, 3.0, 2.0, None),     # slower steady state: never, whatever the first call costs
])
def test_break_even(first, steady, eager, calls):
    assert break_even(first, steady, eager) == calls


def test_break_even_is_the_smallest_count_that_satisfies_the_inequality():
    for first in (0.37, 1.0, 12.6, 17.5, 1e3):
        for steady, eager in ((0.049, 0.49), (0.215, 1.215), (0.0001, 0.0003)):
            n = break_even(first, steady, eager)
            assert first + (n - 1) * steady <= n * eager
            assert n == 1 or first + (n - 2) * steady > (n - 1) * eager


def test_ratio_is_none_when_a_number_is_missing():
    assert ratio(1.0, 4.0) == 0.25
    assert ratio(None, 4.0) is None and ratio(1.0, None) is None and ratio(1.0, 0.0) is None


def test_timing_median_quartiles_and_spread():
    timing = Timing([5.0, 1.0, 3.0, 2.0, 4.0], number=10)
    assert timing.median == 3.0
    assert (timing.q1, timing.q3) == (2.0, 4.0)
    assert (timing.minimum, timing.maximum) == (1.0, 5.0)
    assert timing.spread == pytest.approx(2.0 / 3.0)
    assert timing.calls == 50
    even = Timing([1.0, 2.0, 3.0, 10.0])
    assert even.median == 2.5
    assert (even.q1, even.q3) == (1.75, 4.75)   # linear interpolation, as numpy's default
    assert Timing([7.0]).q1 == Timing([7.0]).q3 == 7.0


def test_timing_survives_json():
    timing = Timing([0.25, 0.5, 0.125], number=3)
    again = Timing.from_json(timing.to_json())
    assert again == timing
    assert timing.to_json()["median_s"] == 0.25


def test_format_ms_keeps_three_significant_digits_without_exponents():
    assert [format_ms(s) for s in (0.49, 0.0123, 0.00152, 0.00015, 1.215)] == \
        ["490", "12.3", "1.52", "0.15", "1215"]


class FakeClock:
    """perf_counter that only moves when the benchmarked function runs."""

    def __init__(self, cost: float):
        self.now = 0.0
        self.cost = cost
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.calls += 1
        self.now += self.cost


def test_benchmark_counts_warmup_and_samples(monkeypatch, capsys):
    clock = FakeClock(cost=1e-3)
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    timing = harness.benchmark(clock.work, desc="compiled", warmup=3, repeat=5, min_time=0.01,
                               warmup_time=0.0)
    assert timing.number == 1
    assert len(timing.samples) == 10            # min_time (10 ms) outlasts repeat (5)
    assert clock.calls == 3 + 10
    assert timing.median == pytest.approx(1e-3)
    assert capsys.readouterr().out == "compiled: 1.00 ms/call\n"


def test_benchmark_batches_calls_faster_than_the_sample_target(monkeypatch):
    clock = FakeClock(cost=1e-5)
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    timing = harness.benchmark(clock.work, warmup=1, repeat=4, min_time=0.0, warmup_time=0.0)
    assert timing.number == 20                  # 20 x 10 us reaches the 0.2 ms target
    assert len(timing.samples) == 4
    assert clock.calls == 1 + 4 * 20
    assert timing.median == pytest.approx(1e-5)


def test_benchmark_warms_up_for_its_time_as_well_as_its_count(monkeypatch):
    # (the first calls that fill fresh memory stay out of the samples)
    clock = FakeClock(cost=1e-3)
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    timing = harness.benchmark(clock.work, warmup=2, repeat=3, min_time=0.0,
                               warmup_time=0.0095)
    assert clock.calls - timing.calls == 10  # (2 would do by count; 9.5 ms takes 10)


def test_benchmark_stops_at_max_time(monkeypatch):
    clock = FakeClock(cost=1.0)
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    timing = harness.benchmark(clock.work, warmup=1, repeat=100, min_time=0.0, max_time=5.0)
    assert len(timing.samples) == 5


def test_benchmark_passes_arguments_and_never_syncs_a_cpu_device(monkeypatch):
    def forbidden():
        raise AssertionError("torch.cuda.synchronize called for CPU tensors")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    seen = []
    timing = harness.benchmark(lambda x, y: seen.append(x + y), torch.ones(2), torch.ones(2),
                               warmup=1, repeat=2, min_time=0.0, warmup_time=0.0)
    assert timing.calls == len(seen) - 1
    torch.testing.assert_close(seen[0], torch.full((2,), 2.0))


def test_device_sync_looks_inside_modules_and_containers(monkeypatch):
    class Fake:
        device = torch.device("cuda")

    monkeypatch.setattr(harness, "tensors_in", lambda values: [torch.ones(1), Fake()])
    assert harness.device_sync(torch.ones(1)) is torch.cuda.synchronize
    monkeypatch.undo()
    model = torch.nn.Linear(2, 2)
    found = harness.tensors_in([model, {"x": torch.ones(3)}, (torch.zeros(1),)])
    assert len(found) == 4                      # weight, bias, x, the zeros


def test_the_trial_settles_mkl_s_vector_math_on_one_thread(monkeypatch):
    # (a first call split over threads raced in MKL's set-up: trial.settle_vector_math)
    from ember.bench import trial

    called = []
    for name in trial.MKL_VECTOR_MATH:
        function = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda x, f=function, n=name: called.append(
            (n, x.dtype, x.numel())) or f(x))
    trial.settle_vector_math()
    assert sorted({n for n, _, _ in called}) == sorted(trial.MKL_VECTOR_MATH)
    assert {d for _, d, _ in called} == {torch.float32, torch.float64}
    assert all(numel < 2048 for _, _, numel in called)  # (below torch's parallel grain)


def test_a_steady_state_starts_after_ember_s_keeps(tmp_path):
    # (a keep on its thread takes the GIL from the timed calls: benchmark waits for it)
    import threading

    from ember import config
    from ember.runtime import warm_cache

    started, release = threading.Event(), threading.Event()

    def slow_keep():
        started.set()
        release.wait(5)

    finished = []
    with config.override(cache_dir=tmp_path):
        future = warm_cache._keeping.submit(slow_keep)
        started.wait(5)
        threading.Timer(0.05, release.set).start()
        harness.benchmark(lambda: finished.append(future.done()), warmup=1, repeat=1,
                          min_time=0.0)
    assert finished and all(finished)  # (every timed call came after the keep)
