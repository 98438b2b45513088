"""ember/bench/model_sweep.py on real transformers models that each once broke ember's capture
or answered otherwise than eager (Gemma's partial activation in sliced layers, DeBERTa-v2's
scripted helpers, Bloom's custom autograd.Function in training, OPT's LayerDrop, GPT-BigCode's
multi-query key expanded over the heads, Wav2Vec2's constant-result probe, Funnel's arange
over position tensors made of constants, Wav2Vec2's first hidden state set to require grad in
training, LayoutLM's attention function read with Mapping.get over a KeyError,
RecurrentGemma's cache methods bound with function.__get__, PatchTST's batch norm over a
transposed view in training): tiny random models, one graph each, eager's answers and
gradients. And greedy
decoding with a KV cache (Mistral's and Gemma-2's sliding-window cache layers keep their length
as a Python int): eager's tokens, the prompt's capture and one for every later step."""

import pytest

pytest.importorskip("transformers")

from ember.bench import model_sweep  # noqa: E402


@pytest.mark.parametrize("name, mode", [("gemma", "infer"), ("deberta-v2", "infer"),
                                        ("bloom", "train"), ("opt", "train"),
                                        ("gpt_bigcode", "infer"), ("wav2vec2", "infer"),
                                        ("funnel", "infer"), ("funnel", "train"),
                                        ("wav2vec2", "train"), ("layoutlm", "infer"),
                                        ("recurrent_gemma", "infer"), ("mamba", "infer"),
                                        ("patchtst", "train")])
def test_a_real_model_compiles_whole_and_answers_as_eager(name, mode):
    result = model_sweep.run_case(name, model_sweep.cases()[name], mode)
    assert result["status"] == "ok", result
    assert (result["graphs"], result["breaks"], result["islands"]) == (1, 0, []), result
    assert result["warnings"] == [], result


@pytest.mark.parametrize("name, mode", [("mistral", "decode"), ("gemma2", "generate")])
def test_greedy_decoding_gives_eagers_tokens_in_two_captures(name, mode):
    # by hand with ember.compile(model), and model.generate with the forward compiled: two
    # runs of 8 tokens each, the prompt's capture and one with the cache's length a symbol
    result = model_sweep.run_case(name, model_sweep.cases()[name], mode)
    assert result["status"] == "ok", result
    assert (result["compiles"], result["eager_graphs"], result["max_difference"]) == (2, 0, 0), \
        result
    assert (result["graphs"], result["breaks"], result["islands"]) == (1, 0, []), result
    assert result["warnings"] == [], result
