"""ember/bench/model_sweep.py on real transformers models that each once broke ember's capture
or answered otherwise than eager (Gemma's partial activation in sliced layers, DeBERTa-v2's
scripted helpers, Bloom's custom autograd.Function in training, OPT's LayerDrop): tiny random
models, one graph each, eager's answers and gradients."""

import pytest

pytest.importorskip("transformers")

from ember.bench import model_sweep  # noqa: E402


@pytest.mark.parametrize("name, mode", [("gemma", "infer"), ("deberta-v2", "infer"),
                                        ("bloom", "train"), ("opt", "train")])
def test_a_real_model_compiles_whole_and_answers_as_eager(name, mode):
    result = model_sweep.run_case(name, model_sweep.cases()[name], mode)
    assert result["status"] == "ok", result
    assert (result["graphs"], result["breaks"], result["islands"]) == (1, 0, []), result
    assert result["warnings"] == [], result
