"""The model zoo in the bench: the models and sizes (full ones as ANCHORS.md gives them, built on
the meta device), `--models` selection and sizes, the capture table of the report, and one
`python -m ember bench --models` run end to end on a tiny timm model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ember.bench import cli, report, zoo
from ember.bench.harness import Timing, Trial

ROOT = Path(__file__).resolve().parents[2]


def test_every_model_has_inference_and_training_and_the_decoders_decode():
    names = [w.name for w in zoo.workloads()]
    assert len(zoo.MODELS) == 11 and len(names) == len(set(names)) == 2 * 11 + 3
    assert [m.name for m in zoo.MODELS if m.kind == "decoder"] == ["gpt2", "llama", "qwen2"]
    assert {"gpt2-decode", "llama-decode", "qwen2-decode", "bert-train", "vit-infer"} <= set(names)
    llama = zoo.find("llama").configs["full"]
    assert llama["num_key_value_heads"] < llama["num_attention_heads"]  # GQA


def parameters_at_full_size(name):
    spec = zoo.find(name)
    with torch.device("meta"):
        model = spec.make(dict(spec.configs["full"]))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, millions", [
    ("gpt2", 124.4), ("resnet50", 25.6), ("vit", 86.6), ("llama", 155.7)])
def test_full_sizes_are_the_real_models(name, millions):
    assert parameters_at_full_size(name) / 1e6 == pytest.approx(millions, abs=0.1)


def test_full_shapes_are_those_of_the_anchors():
    shapes = {m.name: m.shapes["full"] for m in zoo.MODELS}
    assert (shapes["gpt2"].batch, shapes["gpt2"].length) == (8, 256)
    assert (shapes["llama"].batch, shapes["llama"].length) == (4, 512)
    assert (shapes["resnet50"].batch, shapes["resnet50"].image) == (32, 224)
    assert zoo.find("resnet50").channels_last
    assert zoo.placement("full", "infer") == ("cuda", torch.bfloat16)
    assert zoo.placement("full", "train") == ("cuda", torch.float32)
    assert zoo.placement("quick", "infer") == ("cpu", torch.float32)


def test_tiny_instances_are_seeded_and_run_eagerly():
    spec = zoo.find("vit")
    (step, args), (again, same) = (zoo.instantiate(spec, "infer"), zoo.instantiate(spec, "infer"))
    with torch.no_grad():
        torch.testing.assert_close(step(*args), again(*same), rtol=0, atol=0)
    assert not step.model.training and step.calls()[0][0] == "forward"
    train, batch = zoo.instantiate(spec, "train")
    assert train.model.training and float(train(*batch)) > 0


def options(*argv):
    parsed = cli.parser().parse_args(list(argv))
    parsed.size = cli.size_of(parsed)
    return parsed


def test_models_sizes_and_selection():
    assert options("--models").size == "quick"
    assert options("--models", "--quick").size == "tiny"
    assert options("--models", "--device", "cuda").size == "full"
    assert options("--models", "--device", "cuda", "--quick").size == "quick"
    assert options("--quick").size == "quick" and options().size == "full"
    chosen = cli.selected(options("--models", "--only", "gpt2", "vit-train"))
    assert [w.name for w in chosen] == ["gpt2-infer", "gpt2-train", "gpt2-decode", "vit-train"]
    chosen = cli.selected(options("--models", "--modes", "decode"))
    assert [w.name for w in chosen] == ["gpt2-decode", "llama-decode", "qwen2-decode"]
    assert all(w.compile_model for w in chosen)
    with pytest.raises(ValueError, match="unknown model"):
        cli.selected(options("--models", "--only", "gpt3"))
    with pytest.raises(ValueError, match="unknown mode"):
        cli.selected(options("--models", "--modes", "serve"))


def test_the_report_shows_each_calls_capture_and_the_reasons():
    ok = dict(ok=True, message="matches eager", max_abs_error=2e-7)
    calls = [dict(call="prompt", graphs=0, breaks=1, islands=[], ops=0, capture_s=0.1,
                  break_reasons=["transformers/utils/generic.py:1068 in forward: try/except"]),
             dict(call="a token with the cache", graphs=2, breaks=1, islands=["conv: why"],
                  ops=9, capture_s=0.1, break_reasons=["model.py:3 in f: a print"])]
    trials = {
        "eager": Trial("gpt2-decode", "eager", "quick", steady=Timing([0.5]),
                       tokens_per_call=32),
        "ember": Trial("gpt2-decode", "ember", "quick", steady=Timing([0.25]), graphs=3,
                       kernels=7, check=ok, capture=calls, tokens_per_call=32,
                       fallbacks=["1 of 3 graphs ran eagerly"]),
    }
    result = report.WorkloadResult("gpt2-decode", "GPT-2 decode", "GPT-2, decoding", trials)
    run = report.Run("2026-12-01T10:00:00+00:00", "python -m ember bench --models", "quick",
                     ["eager", "ember"], {"usable_cores": 2}, {"timing": {}}, [result], 1.0)
    headers, rows = report.capture_table(run)
    assert rows == [["gpt2-decode GPT-2 decode", "0 / 2", "1 / 1", "0 / 1", "3 (1 eager)",
                     "2.0e-07", "ok", "transformers/utils/generic.py:1068 in forward: "
                     "try/except"]]
    text = report.markdown(run)
    assert "## Capture" in text and "- model.py:3 in f: a print" in text and "- conv: why" in text
    assert "gpt2-decode GPT-2 decode: eager 64 tokens/s, ember 128 tokens/s" in text
    assert "eager islands" in report.terminal(run)


def test_bench_models_end_to_end(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "ember", "bench", "--models", "--quick", "--only", "vit",
         "--modes", "infer", "--variants", "ember", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["size"] == "tiny" and data["settings"]["models"]
    (workload,) = data["workloads"]
    assert workload["name"] == "vit-infer"
    ember = workload["trials"]["ember"]
    assert ember["error"] is None and ember["check"]["ok"], ember
    assert ember["description"].startswith("VisionTransformer")
    assert [(c["call"], c["graphs"], c["breaks"], c["islands"]) for c in ember["capture"]] == [
        ("forward", 1, 0, [])]
    assert ember["graphs"] == 1 and ember["fallbacks"] == []
    # (its first calls run eagerly while the C library builds: when calls run compiled is
    # said apart, after the first call and the second)
    assert ember["compiled_after_s"] >= ember["first_call_s"] + ember["second_call_s"]
    assert "## Capture" in (tmp_path / "report.md").read_text()


def test_the_benchs_counting_backend_keeps_automatic_dynamic():
    # (wrapped to count compiles, ember's backend was no longer recognized as ember's own:
    # the bench's decoding loops compiled per cache length to the recompile limit, then ran
    # eagerly — unlike any user's; compiled as users compile, the loop captures twice)
    import torch

    import ember
    from ember.bench import zoo
    from ember.bench.variants import Compiles, recording_backend

    step, args = zoo.instantiate(zoo.find("gpt2"), "decode", "tiny", "cpu")
    eager_tokens = step(*args)
    step, args = zoo.instantiate(zoo.find("gpt2"), "decode", "tiny", "cpu")
    compiles = Compiles()
    compiled = step.model_slot[0] = ember.compile(step.model,
                                                  backend=recording_backend(compiles))
    with torch.no_grad():
        assert torch.equal(step(*args), eager_tokens)
    assert len(compiled._compiled_forward.records) == 2  # (the prompt; every cache length)
    assert compiles.eager_graphs == 0


def test_a_failed_check_is_judged_by_float64():
    # an answer off eager's past the tolerance passes where it is as close to float64's
    # answer as eager's is (rounding, in an ill-conditioned model); farther, it fails
    from types import SimpleNamespace

    from ember.bench.trial import compare, float64_judge

    def instantiate(size, device):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 8).to(torch.bfloat16)

        def step(x):
            return model(x)

        step.model = model
        return step, (torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
                      .to(torch.bfloat16),)

    workload = SimpleNamespace(instantiate=instantiate, grad=False,
                               tolerance_at=lambda size, device: {"atol": 1e-6, "rtol": 0.0})
    options = SimpleNamespace(size="tiny", device=None)
    step, args = instantiate("tiny", None)
    expected = [step(*args).detach()]
    exact = step.model.double()(args[0].double()).detach()
    eager_error = float((expected[0].double() - exact).abs().max())
    assert eager_error > 1e-4  # (bf16's rounding)
    for shift, passes in ((eager_error / 2, True), (4 * eager_error, False)):
        outputs = [expected[0] + shift]  # (rounding of another order; an error)
        check = compare(outputs, expected, {"atol": 1e-6, "rtol": 0.0})
        assert not check["ok"]
        float64_judge(check, workload, options, outputs, expected)
        assert check["ok"] is passes, check
        assert check["eager_error_vs_float64"] == pytest.approx(eager_error)


def test_the_benchs_counting_backend_counts_a_graph_compiled_around_islands(monkeypatch):
    # (a graph with eager islands is compiled: its regions' kernels count, as in BART's
    # training on CUDA, which the bench reported as "0 kernels ... fell back to eager")
    import torch

    import ember
    from ember.bench.variants import Compiles, recording_backend
    from ember.lower import Unsupported
    from ember.lower.registry import aten, lowerings

    def refused(*args, **kwargs):
        raise Unsupported("refused by the test")

    monkeypatch.setitem(lowerings, aten.exp.default, refused)

    def fn(x):
        return (torch.tanh(x) * 2).mean(0).exp() + 1

    compiles = Compiles()
    x = torch.randn(4, 8)
    torch.testing.assert_close(ember.compile(fn, backend=recording_backend(compiles))(x), fn(x))
    assert (compiles.graphs, compiles.eager_graphs) == (1, 0)
    (partitioned,) = compiles.compiled
    assert (partitioned.region_count, partitioned.island_count) == (2, 1)
    assert compiles.kernels == partitioned.kernel_count == \
        sum(region.kernel_count for region in partitioned.regions.values()) >= 2
