"""transformers' decoder and encoder families beyond the model zoo's (tests/e2e/
test_zoo_models.py), as users build them: each forward one graph with eager's logits. Tiny
configs, random weights, nothing downloaded."""

import pytest
import torch
from helpers import DEVICE

import ember

transformers = pytest.importorskip("transformers")

# (minutes under Triton's interpreter: CI runs the C cases, a GPU run of the suite the Triton)
pytestmark = pytest.mark.slow_in_interpreter

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=256, max_position_embeddings=128)
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2)),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=128, word_embed_proj_dim=64)),
    "falcon": ("FalconConfig", "FalconForCausalLM", {}),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(n_layer=2, n_head=4)),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM",
                   dict(dim=64, hidden_dim=128, n_layers=2, n_heads=4)),
    "deberta_v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", {}),
    "albert": ("AlbertConfig", "AlbertForMaskedLM", dict(embedding_size=32)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_forward_is_one_graph_with_eagers_logits(family):
    config_class, model_class, options = FAMILIES[family]
    if not hasattr(transformers, model_class):
        pytest.skip(f"this transformers has no {model_class}")
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**SMALL, **options})
    model = getattr(transformers, model_class)(config).to(DEVICE).eval()
    ids = torch.randint(0, 256, (2, 16), device=DEVICE)

    def logits(ids):
        return model(input_ids=ids).logits

    with torch.no_grad():
        torch.testing.assert_close(ember.compile(logits)(ids), logits(ids), rtol=1e-4,
                                   atol=1e-4)
        explained = ember.explain(logits)(ids)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
