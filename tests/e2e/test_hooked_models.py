"""transformers 5 collects hidden states (and attentions) through forward hooks it installs on
the first call that asks for them (under a threading lock): that call and the later ones
compile whole, one graph each, with eager's outputs — hooks, lock and all. (Default
attention: with attn_implementation="eager" transformers' attention lookup catches a
KeyError, which still breaks the graph.)"""

from __future__ import annotations

import copy

import pytest
import torch

import ember

transformers = pytest.importorskip("transformers")


def segformer():
    config = transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=32, num_labels=5, drop_path_rate=0.0, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.SegformerForSemanticSegmentation(config).eval(), \
        (torch.randn(1, 3, 32, 32),), {}


def bert():
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertModel(config).eval(), (torch.randint(0, 64, (2, 8)),), \
        dict(output_hidden_states=True)


def gpt2():
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval(), (torch.randint(0, 64, (2, 8)),), \
        dict(output_hidden_states=True, use_cache=False)


def close(actual, expected, path="output"):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), path
        for index, (a, e) in enumerate(zip(actual, expected)):
            close(a, e, f"{path}[{index}]")
    elif isinstance(expected, dict):
        assert list(actual.keys()) == list(expected.keys()), path
        for key in expected:
            close(actual[key], expected[key], f"{path}.{key}")
    else:
        assert actual == expected, path


def hooks(model) -> list[int]:
    return [len(module._forward_hooks) for module in model.modules()]


@pytest.mark.slow_in_interpreter
@pytest.mark.parametrize("build", [segformer, bert, gpt2])
def test_hidden_states_compile_whole(build):
    model, args, kwargs = build()
    reference = copy.deepcopy(model)
    # the first call installs the hooks (a side effect, replayed) and runs them in its graph
    report = ember.explain(copy.deepcopy(model))(*args, **kwargs)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    compiled = ember.compile(model)
    with torch.no_grad():
        for _ in range(2):
            close(compiled(*args, **kwargs), reference(*args, **kwargs))
            assert hooks(model) == hooks(reference) and sum(hooks(model)) > 0
            # the hooks are installed for good: the next call, compiled again, has them
            report = ember.explain(model)(*args, **kwargs)
            assert (report.graph_count, report.graph_break_count) == (1, 0), \
                report.break_reasons
    # (the first call's version, and the one with the hooks installed)
    assert len(compiled._compiled_forward.entries) == 2
