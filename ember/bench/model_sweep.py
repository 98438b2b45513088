"""Many real architectures, tiny and random, under ember.compile: does each compile whole and
answer as eager does? Beyond the zoo's eleven models (ember/bench/zoo.py), this is how ember
meets models nobody wrote a test for.

    python3 -m ember.bench.model_sweep [--only mistral swin] [--modes infer,train]
        [--json out.json]

For each model and mode: graphs, graph breaks and eager islands (ember.explain, with the
first reasons), whether ember warned on its fallbacks channel, and the largest difference
from eager (logits in inference; the loss and every parameter's gradient after one backward
in training). On the CPU, float32, one call each: a correctness and coverage sweep, not a
benchmark.
"""

from __future__ import annotations

import argparse
import json
import logging
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

SEED = 0
BATCH, LENGTH, IMAGE = 2, 12, 64
# (vision: batch norm in training over a batch of 2 at 1x1 spatial size normalizes two
# values, where float rounding alone sends eager's and any compiler's answers apart)
IMAGE_BATCH = 4

# transformers architectures: (model type, class, config overrides), tiny sizes. The common
# sizes fit most configs; each override names what that config calls them.
_DECODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                max_position_embeddings=64)
_ENCODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, vocab_size=256, max_position_embeddings=64)
TRANSFORMERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("mistral", "MistralForCausalLM", _DECODER),
    ("gemma", "GemmaForCausalLM", dict(_DECODER, head_dim=16)),
    ("gemma2", "Gemma2ForCausalLM", dict(_DECODER, head_dim=16)),
    ("phi", "PhiForCausalLM", _DECODER),
    ("phi3", "Phi3ForCausalLM", dict(_DECODER, pad_token_id=0)),
    ("qwen3", "Qwen3ForCausalLM", dict(_DECODER, head_dim=16)),
    ("olmo", "OlmoForCausalLM", _DECODER),
    ("stablelm", "StableLmForCausalLM", _DECODER),
    ("starcoder2", "Starcoder2ForCausalLM", _DECODER),
    ("gpt_neox", "GPTNeoXForCausalLM", _ENCODER),
    ("gptj", "GPTJForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                     n_positions=64, rotary_dim=8)),
    ("opt", "OPTForCausalLM", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   ffn_dim=128, vocab_size=256, max_position_embeddings=64,
                                   word_embed_proj_dim=64)),
    ("bloom", "BloomForCausalLM", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=256)),
    ("falcon", "FalconForCausalLM", dict(hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, vocab_size=256)),
    ("mixtral", "MixtralForCausalLM", dict(_DECODER, num_local_experts=4,
                                           num_experts_per_tok=2)),
    ("roberta", "RobertaForMaskedLM", _ENCODER),
    ("distilbert", "DistilBertForMaskedLM", dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                                 vocab_size=256, max_position_embeddings=64)),
    ("albert", "AlbertForMaskedLM", dict(_ENCODER, embedding_size=32)),
    ("electra", "ElectraForMaskedLM", dict(_ENCODER, embedding_size=64)),
    ("deberta-v2", "DebertaV2ForMaskedLM", _ENCODER),
    ("mpnet", "MPNetForMaskedLM", _ENCODER),
    ("xlm-roberta", "XLMRobertaForMaskedLM", _ENCODER),
    ("modernbert", "ModernBertForMaskedLM", dict(_ENCODER, global_attn_every_n_layers=2,
                                                 local_attention=8, pad_token_id=0,
                                                 bos_token_id=1, eos_token_id=2,
                                                 cls_token_id=1, sep_token_id=2)),
    ("mbart", "MBartForConditionalGeneration", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
        max_position_embeddings=64)),
    ("pegasus", "PegasusForConditionalGeneration", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
        max_position_embeddings=64)),
)
# timm architectures, small variants, random weights
TIMM: tuple[tuple[str, dict[str, Any]], ...] = (
    ("resnet18", {}), ("resnext26ts", {}), ("regnetx_002", {}), ("densenet121", {}),
    ("mobilenetv2_050", {}), ("efficientnet_b0", {}), ("ghostnet_050", {}),
    ("convnextv2_atto", {}), ("deit_tiny_patch16_224", dict(img_size=IMAGE)),
    ("swin_tiny_patch4_window7_224", dict(img_size=56)), ("levit_128s", dict(img_size=IMAGE)),
    ("mixer_s32_224", dict(img_size=IMAGE)), ("poolformer_s12", {}),
    ("cait_xxs24_224", dict(img_size=IMAGE, depth=2)), ("coat_lite_tiny", dict(img_size=IMAGE)),
    ("maxvit_nano_rw_256", dict(img_size=64)), ("hrnet_w18_small", {}),
    ("mobilevit_xxs", dict(img_size=64)), ("repvgg_a0", {}), ("dla34", {}),
)


def _seq2seq(model_class: str) -> bool:
    return model_class.endswith("ForConditionalGeneration")


def transformers_case(model_type: str, model_class: str, overrides: dict[str, Any]):
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **overrides)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout",
                 "attention_dropout", "activation_dropout", "resid_pdrop", "embd_pdrop",
                 "attn_pdrop", "hidden_dropout", "embedding_dropout", "classifier_dropout"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    if hasattr(config, "layerdrop"):
        config.layerdrop = 0.0
    if hasattr(config, "encoder_layerdrop"):
        config.encoder_layerdrop = config.decoder_layerdrop = 0.0
    torch.manual_seed(SEED)
    model = getattr(transformers, model_class)(config)
    generator = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(3, 256, (BATCH, LENGTH), generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if _seq2seq(model_class):
        batch["decoder_input_ids"] = torch.randint(3, 256, (BATCH, LENGTH // 2),
                                                   generator=generator)
    labels = batch.get("decoder_input_ids", ids)

    def forward(m, b):
        return m(**b).logits

    def loss(m, b):
        return m(**b, labels=labels).loss

    return model, batch, forward, loss


def timm_case(architecture: str, overrides: dict[str, Any]):
    import timm

    torch.manual_seed(SEED)
    try:  # (no dropout: a training step draws no random numbers, eager's and ember's agree)
        model = timm.create_model(architecture, pretrained=False, num_classes=10,
                                  drop_rate=0.0, drop_path_rate=0.0, **overrides)
    except TypeError:
        model = timm.create_model(architecture, pretrained=False, num_classes=10,
                                  drop_rate=0.0, **overrides)
    size = overrides.get("img_size", IMAGE if "img_size" not in overrides else None) or IMAGE
    generator = torch.Generator().manual_seed(SEED + 1)
    images = torch.randn(IMAGE_BATCH, 3, size, size, generator=generator)
    target = torch.randint(0, 10, (IMAGE_BATCH,), generator=generator)

    def forward(m, b):
        return m(b["x"])

    def loss(m, b):
        return F.cross_entropy(m(b["x"]), target)

    return model, {"x": images}, forward, loss


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_case(name: str, make: Callable[[], tuple], mode: str) -> dict[str, Any]:
    """One model in one mode: what explain says, the fallback warnings, eager's difference."""
    import ember

    found: dict[str, Any] = {"model": name, "mode": mode}
    try:
        model, batch, forward, loss = make()
    except Exception as error:  # noqa: BLE001 (a config this transformers does not take)
        found["status"] = f"not built: {type(error).__name__}: {str(error)[:120]}"
        return found
    model.train(mode == "train")
    run = forward if mode == "infer" else loss
    warnings = _Warnings()
    logging.getLogger("ember").addHandler(warnings)
    try:
        with torch.set_grad_enabled(mode == "train"):
            arguments, keywords = ((batch["x"],), {}) if "x" in batch else ((), batch)
            explained = ember.explain(model)(*arguments, **keywords)
            found.update(graphs=explained.graph_count, breaks=explained.graph_break_count,
                         reasons=[str(getattr(r, "reason", r))[:160]
                                  for r in explained.break_reasons[:3]],
                         islands=[str(i)[:160] for i in
                                  getattr(explained, "eager_islands", [])[:3]])
            compiled = ember.compile(model)
            expected = run(model, batch)
            if mode == "train":
                expected.backward()
                want = {n: p.grad.clone() for n, p in model.named_parameters()
                        if p.grad is not None}
                model.zero_grad(set_to_none=True)
            got = run(compiled, batch)
            difference = (got.detach() - expected.detach()).abs().max().item()
            if mode == "train":
                got.backward()
                for n, p in model.named_parameters():
                    if n in want:
                        grad = p.grad if p.grad is not None else torch.zeros_like(want[n])
                        scale = max(1.0, want[n].abs().max().item())
                        difference = max(difference,
                                         (grad - want[n]).abs().max().item() / scale)
            found["max_difference"] = difference
            found["status"] = "ok" if difference <= 1e-3 else "DIFFERENT"
    except Exception as error:  # noqa: BLE001 (a crash is a finding: say it, go on)
        found["status"] = f"CRASH: {type(error).__name__}: {str(error)[:200]}"
        found["trace"] = traceback.format_exc()[-1500:]
        try:
            with torch.set_grad_enabled(mode == "train"):
                run(model, batch)
        except Exception as eager_error:  # noqa: BLE001 (the sweep's config, not ember)
            found["status"] = f"eager raises too: {str(eager_error)[:100]}"
    finally:
        logging.getLogger("ember").removeHandler(warnings)
    found["warnings"] = [m[:200] for m in warnings.messages[:3]]
    return found


def cases() -> dict[str, Callable[[], tuple]]:
    found: dict[str, Callable[[], tuple]] = {}
    for model_type, model_class, overrides in TRANSFORMERS:
        found[model_type] = (lambda t=model_type, c=model_class, o=overrides:
                             transformers_case(t, c, o))
    for architecture, overrides in TIMM:
        found[architecture] = lambda a=architecture, o=overrides: timm_case(a, o)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--json", default=None, help="write every result here")
    options = parser.parse_args()
    results = []
    for name, make in cases().items():
        if options.only and name not in options.only:
            continue
        for mode in options.modes.split(","):
            result = run_case(name, make, mode)
            results.append(result)
            print(f"{name:32} {mode:5} {result.get('status', '?')[:70]:70} "
                  f"graphs {result.get('graphs', '-')} breaks {result.get('breaks', '-')} "
                  f"islands {len(result.get('islands', []))} "
                  f"warnings {len(result.get('warnings', []))}", flush=True)
            for line in result.get("reasons", []) + result.get("islands", []) + \
                    result.get("warnings", []):
                print(f"    {line}")
    if options.json:
        with open(options.json, "w") as file:
            json.dump(results, file, indent=1)
    runs = [r for r in results if not str(r.get("status", "")).startswith(("eager raises",
                                                                          "not built"))]
    ok = sum(r.get("status") == "ok" for r in runs)
    whole = sum(r.get("graphs") == 1 and not r.get("islands") for r in runs)
    print(f"{ok}/{len(runs)} match eager; {whole}/{len(runs)} one graph without islands "
          f"({len(results) - len(runs)} runs left out: the model or eager fails as configured)")


if __name__ == "__main__":
    main()
