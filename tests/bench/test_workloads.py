"""The workloads: seed shapes as ANCHORS.md gives them, quick about 1/16 of full, seeded and
repeatable instances, lookup by name, user builders from a file, and the check's comparison."""

import textwrap

import pytest
import torch

from ember.bench import workloads
from ember.bench.trial import compare


def elements(workload, size):
    """Tensor elements of inputs and parameters, built on the meta device (no memory)."""
    with torch.device("meta"):
        fn, args = workload.build(**workload.sizes[size])
    total = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
    if isinstance(fn, torch.nn.Module):
        total += sum(p.numel() for p in fn.parameters())
    return total


def test_seed_shapes_are_those_of_the_anchors():
    shapes = {}
    for workload in workloads.WORKLOADS:
        with torch.device("meta"):
            fn, args = workload.build(**workload.sizes["full"])
        shapes[workload.name] = workloads.describe(fn, args)
    assert shapes == {
        "S1": "x 4000x4000 float32",
        "S2": "x 4096x4096 float32",
        "softmax": "x 4096x4096 float32",
        "layer_norm": "x 4096x4096 float32, weight 4096 float32, bias 4096 float32",
        "S3": "x 512x1024 float32",
        "S4": "Sequential 3.9M params; input 64x256 float32",
        "S5": "Sequential 25.2M params; input 16x1024 float32",
        "S6": "x 4000x4000 float32",
        "S6-where": "x 4000x4000 float32",
        "mlp-print": "PrintingMLP 8.4M params; x 64x1024 float32",
        "S3-forward": "Sequential 4.2M params; input 512x1024 float32",
        "overhead": "x 8 float32",
    }


@pytest.mark.parametrize("workload", [w for w in (*workloads.WORKLOADS,
                                                   *workloads.MODULE_WORKLOADS)
                                      if w.name not in ("overhead", "S4")],  # small already
                         ids=lambda w: w.name)
def test_quick_is_about_a_sixteenth_of_full(workload):
    assert elements(workload, "full") / elements(workload, "quick") == pytest.approx(16, rel=0.1)


@pytest.mark.parametrize("workload", (*workloads.WORKLOADS, *workloads.MODULE_WORKLOADS),
                         ids=lambda w: w.name)
def test_instances_are_repeatable_and_run(workload):
    fn, args = workload.instantiate("tiny")
    again, same_args = workload.instantiate("tiny")
    for a, b in zip(args, same_args):
        assert a is not b
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.set_grad_enabled(workload.grad):
        torch.testing.assert_close(fn(*args), again(*same_args), rtol=0, atol=0)


def test_resolve_by_name_or_title_in_any_case():
    assert workloads.resolve("s1").title == "gelu_ish"
    assert workloads.resolve("GELU_CHAIN20").name == "S2"
    assert workloads.resolve("Module-Train").title == "small_model_train"
    with pytest.raises(ValueError, match="unknown workload 'S9'"):
        workloads.resolve("S9")


def test_resolve_user_builders_from_a_file(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text(textwrap.dedent("""
        import torch

        def double(x):
            return x * 2

        def plain():
            return double, (torch.ones(3),)

        def sized(size):
            return double, (torch.ones(8 if size == "full" else 2),)
    """))
    plain = workloads.resolve(f"{source}:plain")
    fn, args = plain.instantiate("quick")
    assert plain.name == plain.title == f"{source}:plain"
    torch.testing.assert_close(fn(*args), torch.full((3,), 2.0))
    sized = workloads.resolve(f"{source}:sized")
    assert sized.instantiate("full")[1][0].shape == (8,)
    assert sized.instantiate("tiny")[1][0].shape == (2,)
    with pytest.raises(ValueError, match="no function 'missing'"):
        workloads.resolve(f"{source}:missing")
    with pytest.raises(ValueError, match="no such file"):
        workloads.resolve(f"{tmp_path}/absent.py:plain")


def test_compare_reports_the_worst_error_and_the_first_mismatch():
    want = [torch.zeros(4), (torch.ones(2), 3)]
    same = compare([torch.zeros(4), (torch.ones(2) + 1e-7, 3)], want, dict(rtol=1e-5, atol=1e-5))
    assert same["ok"] and same["max_abs_error"] == pytest.approx(1e-7, rel=0.2)
    wrong = compare([torch.zeros(4) + 0.5, (torch.ones(2), 3)], want, {})
    assert not wrong["ok"] and wrong["message"].startswith("output 0: Tensor-likes are not close")
    assert wrong["max_abs_error"] == 0.5
    assert not compare([torch.zeros(4), (torch.ones(2), 4)], want, {})["ok"]
    assert compare([torch.zeros(4)], want, {})["message"] == "1 outputs, eager gives 3"
