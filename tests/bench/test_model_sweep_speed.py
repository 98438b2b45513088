"""ember/bench/model_sweep_speed.py: a model timed under eager and ember in interleaved
rounds, its record, and the summary's geometric mean and list of models slower than eager.
(The figures themselves are measured, never asserted: notes/ keeps them.)"""

import math

import torch

from ember.bench import model_sweep_speed


def _tiny_case():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    batch = {"x": torch.randn(3, 8), "target": torch.randint(0, 4, (3,))}
    return (model, batch, lambda m, b: m(b["x"]),
            lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]), b["target"]))


def _broken_case():
    raise TypeError("this config takes no such size")


def test_a_model_is_timed_in_both_modes_and_summed_up():
    results = [model_sweep_speed.time_case("tiny", _tiny_case, mode, rounds=2, calls=2)
               for mode in ("infer", "train")]
    for found in results:
        assert found["status"] in ("ok", "slower"), found
        assert found["eager_ms"] > 0 and found["ember_ms"] > 0 and found["first_call_s"] > 0
        assert math.isclose(found["ratio"], found["ember_ms"] / found["eager_ms"])
        assert found["status"] == ("slower" if found["ratio"] > model_sweep_speed.SLOWER
                                   else "ok")
    broken = model_sweep_speed.time_case("broken", _broken_case, "infer", 1, 1)
    assert broken["status"].startswith("not built: TypeError")
    lines = model_sweep_speed.summary(
        [*results, broken, {"model": "b", "mode": "infer", "ratio": 4.0, "status": "slower"}])
    geomean = math.sqrt(results[0]["ratio"] * 4.0)
    assert lines[0].startswith(f"infer: 2 models, geometric mean ember/eager {geomean:.2f}")
    assert lines[0].endswith("(b)") and lines[1].startswith("train: 1 models")
