"""Many real architectures, tiny and random, under ember.compile: does each compile whole and
answer as eager does? Beyond the zoo's eleven models (ember/bench/zoo.py), this is how ember
meets models nobody wrote a test for.

    python3 -m ember.bench.model_sweep [--only mistral swin]
        [--modes infer,train,decode,generate] [--json out.json]

For each model and mode: graphs, graph breaks and eager islands (ember.explain, with the
first reasons), whether ember warned on its fallbacks channel, and the largest difference
from eager (logits in inference; the loss and every parameter's gradient after one backward
in training; relative where the answer passes 1; where that passes 1e-3, float64 judges).
On the CPU, float32, one call each: a correctness and coverage sweep, not a benchmark.

The causal LMs also decode greedily with a KV cache, twice over, as users write it with
transformers 5: `decode` compiles the model (`ember.compile(model)`) and runs the loop by
hand (the prompt with an empty DynamicCache, then one token a call with `past_key_values`);
`generate` compiles the model's forward (`model.forward = ember.compile(model.forward)`) and
calls `model.generate(do_sample=False)`. Checked: eager's tokens, how many captures the two
runs made (the prompt's and one for every cache length after it: two; at most
DECODE_COMPILES), and graphs, breaks and islands of the prompt's call and a cached token's.
"""

from __future__ import annotations

import argparse
import copy
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
# decoding: tokens chosen per run, and the captures two runs may make in all (the prompt's,
# and the cached step's once the cache's length is a symbol; one more where a first cached
# step is captured statically before its length changes)
NEW_TOKENS = 8
DECODE_COMPILES = 3

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
    # added 2026-12 (issue 17's held-out models): more decoders (biased QKV, Llama 3's rope
    # scaling, multi-query attention, CodeGen's fused QKV and rotary, XGLM's sinusoidal
    # positions), encoder-decoders (T5 v1.1's gated GELU, Whisper's audio features), encoders
    # with their own Python (Longformer's windowed attention and padding, Funnel's pooling),
    # a vision+text model (CLIP), transformers' vision models (ViT, Swin, ConvNeXt,
    # SegFormer) and a speech model with a convolutional feature extractor (Wav2Vec2)
    ("qwen2", "Qwen2ForCausalLM", _DECODER),
    ("llama", "LlamaForCausalLM", dict(_DECODER, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=16))),
    ("gpt_bigcode", "GPTBigCodeForCausalLM", dict(n_embd=64, n_layer=2, n_head=4,
                                                  vocab_size=256, n_positions=64,
                                                  multi_query=True, bos_token_id=1,
                                                  eos_token_id=2)),
    ("codegen", "CodeGenForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                           n_positions=64, n_ctx=64, rotary_dim=8,
                                           bos_token_id=1, eos_token_id=2)),
    ("xglm", "XGLMForCausalLM", dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=128,
                                     vocab_size=256, max_position_embeddings=64)),
    ("mt5", "MT5ForConditionalGeneration", dict(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        vocab_size=256, decoder_start_token_id=0, pad_token_id=0)),
    ("whisper", "WhisperForConditionalGeneration", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
        num_mel_bins=16, max_source_positions=32, max_target_positions=64,
        decoder_start_token_id=1, pad_token_id=0)),
    ("longformer", "LongformerForMaskedLM", dict(_ENCODER, attention_window=4,
                                                 max_position_embeddings=80, pad_token_id=1)),
    ("funnel", "FunnelForMaskedLM", dict(d_model=64, n_head=4, d_head=16, d_inner=128,
                                         block_sizes=[1, 1], vocab_size=256)),
    ("clip", "CLIPModel", dict(
        text_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, vocab_size=256, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0),
        vision_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, image_size=32, patch_size=8),
        projection_dim=32)),
    ("vit", "ViTForImageClassification", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=10)),
    ("swin", "SwinForImageClassification", dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                                                image_size=32, patch_size=2, window_size=4,
                                                num_labels=10)),
    ("convnext", "ConvNextForImageClassification", dict(num_stages=2, hidden_sizes=[16, 32],
                                                        image_size=32,
                                                        depths=[1, 1], num_labels=10)),
    ("segformer", "SegformerForSemanticSegmentation", dict(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=32, num_labels=5)),
    ("wav2vec2", "Wav2Vec2ForCTC", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=32, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, pad_token_id=0)),
    # added 2026-12 (more Python and op patterns): XLNet's relative attention (einsum, the
    # relative shift), Reformer's LSH and chunked local attention with reversible layers (a
    # custom autograd.Function, torch.manual_seed inside forward), state-space scans in
    # Python loops (Mamba, Falcon-Mamba), RWKV's time mixing, RecurrentGemma's linear
    # recurrence beside local attention, BERT as a causal decoder, LayoutLM's box embeddings,
    # detection heads (YOLOS), DINOv2's interpolated positions, HuBERT, SigLIP's sigmoid
    # loss, GPT-2's Conv1D, decoders with their own norms and scalings (Persimmon, Cohere,
    # Granite, Nemotron) and MoE routing (OLMoE, Qwen2-MoE with a shared expert)
    ("xlnet", "XLNetLMHeadModel", dict(d_model=64, n_layer=2, n_head=4, d_inner=128,
                                       vocab_size=256)),
    ("reformer", "ReformerModelWithLMHead", dict(
        hidden_size=64, num_attention_heads=2, attention_head_size=16, feed_forward_size=128,
        vocab_size=256, attn_layers=["local", "lsh"], axial_pos_shape=[3, 4],
        axial_pos_embds_dim=[32, 32], max_position_embeddings=LENGTH,
        local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, hash_seed=SEED,
        is_decoder=True)),
    ("mamba", "MambaForCausalLM", dict(hidden_size=64, num_hidden_layers=2, vocab_size=256,
                                       state_size=8, expand=2, conv_kernel=4)),
    ("falcon_mamba", "FalconMambaForCausalLM", dict(hidden_size=64, num_hidden_layers=2,
                                                    vocab_size=256, state_size=8, expand=2,
                                                    conv_kernel=4)),
    ("rwkv", "RwkvForCausalLM", dict(hidden_size=64, num_hidden_layers=2, vocab_size=256,
                                     attention_hidden_size=64, intermediate_size=128,
                                     context_length=64)),
    ("recurrent_gemma", "RecurrentGemmaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=128, vocab_size=256, lru_width=64, attention_window_size=16,
        head_dim=16)),
    ("bert-generation", "BertGenerationDecoder", dict(_ENCODER, is_decoder=True)),
    ("layoutlm", "LayoutLMForMaskedLM", dict(_ENCODER, max_2d_position_embeddings=128)),
    ("yolos", "YolosForObjectDetection", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=[32, 32], patch_size=8, num_detection_tokens=5, num_labels=4)),
    ("dinov2", "Dinov2ForImageClassification", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=32,
        patch_size=8, num_labels=10)),
    ("hubert", "HubertForCTC", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=32, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, pad_token_id=0)),
    ("siglip", "SiglipModel", dict(
        text_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, vocab_size=256, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0),
        vision_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, image_size=32, patch_size=8))),
    ("gpt2", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                     n_positions=64, bos_token_id=1, eos_token_id=2)),
    ("persimmon", "PersimmonForCausalLM", _ENCODER),
    ("cohere", "CohereForCausalLM", dict(_DECODER, eos_token_id=2)),
    ("granite", "GraniteForCausalLM", dict(_DECODER, embedding_multiplier=2.0,
                                           residual_multiplier=0.5, logits_scaling=4.0,
                                           attention_multiplier=0.25)),
    ("nemotron", "NemotronForCausalLM", _DECODER),
    ("olmoe", "OlmoeForCausalLM", dict(_DECODER, num_experts=4, num_experts_per_tok=2,
                                       eos_token_id=2)),
    ("qwen2_moe", "Qwen2MoeForCausalLM", dict(_DECODER, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=32,
                                              shared_expert_intermediate_size=64)),
)
# what the transformers models other than text models take (the rest: input_ids)
INPUTS = {"whisper": "audio features", "clip": "text and image", "vit": "image",
          "swin": "image", "convnext": "image", "segformer": "segmentation",
          "wav2vec2": "waveform", "layoutlm": "text and boxes", "yolos": "detection",
          "dinov2": "image", "hubert": "waveform", "siglip": "text and image"}
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
    # added 2026-12: relative position bias (BEiT), rotary embeddings and SwiGLU (EVA-02,
    # ViT-RoPE), squeeze-excite RegNet, split attention (ResNeSt), Inception's branches,
    # separable convolutions (Xception), weight standardization (NF-RegNet), cross-stage
    # partial networks, space-to-depth and anti-aliasing (TResNet), one-shot aggregation
    # (VoVNet), linear attention (EfficientViT), reparameterized blocks (FastViT), LSTMs
    # over rows and columns (Sequencer), spatial-reduction attention (PVT v2)
    ("beit_base_patch16_224", dict(img_size=IMAGE, depth=2, embed_dim=64, num_heads=4)),
    ("eva02_base_patch14_224", dict(img_size=56, depth=2, embed_dim=64, num_heads=4)),
    ("vit_small_patch16_rope_224", dict(img_size=IMAGE, depth=2)),
    ("regnety_002", {}), ("resnest14d", {}), ("inception_v3", dict(input_size=96)),
    ("xception41", {}), ("nf_regnet_b0", {}), ("cs3darknet_s", {}), ("tresnet_m", {}),
    ("ese_vovnet19b_dw", {}), ("efficientvit_b0", {}), ("fastvit_t8", {}),
    ("sequencer2d_s", dict(layers=[1, 1, 1, 1])), ("pvt_v2_b0", {}),
    # added 2026-12 (more patterns): windowed attention with padding (TinyViT), global
    # context attention (GCViT), split depthwise and transposed attention (EdgeNeXt), hard
    # swish nets (LCNet), two-branch cross attention (CrossViT), outlook attention through
    # unfold and fold (VOLO), cross-covariance attention (XCiT), pooling-based ViT (PiT),
    # gated MLPs (gMLP), attention biases indexed by offsets (EfficientFormerV2)
    ("tiny_vit_5m_224", dict(input_size=IMAGE)), ("gcvit_xxtiny", dict(img_size=IMAGE)),
    ("edgenext_xx_small", {}), ("lcnet_050", {}), ("crossvit_tiny_240", dict(img_size=120)),
    ("volo_d1_224", dict(img_size=IMAGE)), ("xcit_nano_12_p16_224", dict(img_size=IMAGE,
                                                                         depth=2)),
    ("pit_ti_224", dict(img_size=IMAGE)), ("gmlp_ti16_224", dict(img_size=IMAGE)),
    ("efficientformerv2_s0", dict(img_size=IMAGE)),
)


def _seq2seq(model_class: str) -> bool:
    return model_class.endswith("ForConditionalGeneration")


def decoders() -> set[str]:
    """The cases that decode (causal LMs whose forward takes a KV cache as
    `past_key_values`): they have the decode and generate modes."""
    import inspect

    import transformers

    return {model_type for model_type, model_class, _ in TRANSFORMERS
            if model_class.endswith(("ForCausalLM", "LMHeadModel")) and "past_key_values" in
            inspect.signature(getattr(transformers, model_class).forward).parameters}


# config entries that draw random numbers in training (dropout, stochastic depth, LayerDrop,
# SpecAugment's masks), set to 0 so that a training step draws none and eager's and ember's
# steps agree: a float entry named with one of these pieces, or one of the names
_RANDOM_PIECES = ("dropout", "drop_path", "pdrop", "layerdrop")
_RANDOM_NAMES = ("mask_time_prob", "mask_feature_prob", "dropout_rate")


def _without_randomness(config: Any) -> None:
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and (name in _RANDOM_NAMES or
                                         any(piece in name for piece in _RANDOM_PIECES)):
            setattr(config, name, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # (a sub-config)
            _without_randomness(value)


def transformers_case(model_type: str, model_class: str, overrides: dict[str, Any]):
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **overrides)
    _without_randomness(config)
    torch.manual_seed(SEED)
    model = getattr(transformers, model_class)(config)
    generator = torch.Generator().manual_seed(SEED + 1)
    batch, labels = _inputs(INPUTS.get(model_type, "text"), config, _seq2seq(model_class),
                            generator)
    kind = INPUTS.get(model_type, "text")
    output = "logits_per_image" if kind == "text and image" else "logits"

    def forward(m, b):
        return getattr(m(**b), output)

    def loss(m, b):
        if kind == "detection":  # (transformers' matching loss needs scipy: the heads' own)
            answer = m(**b)
            return (F.cross_entropy(answer.logits.flatten(0, 1), labels["classes"]) +
                    F.l1_loss(answer.pred_boxes, labels["boxes"]))
        return m(**b, **labels).loss

    return model, batch, forward, loss


def _inputs(kind: str, config: Any, seq2seq: bool, generator: torch.Generator
            ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A transformers model's batch for its kind of input, and what its loss takes."""
    def tokens(length: int, high: int = 256) -> torch.Tensor:
        return torch.randint(3, high, (BATCH, length), generator=generator)

    if kind == "detection":
        height, width = config.image_size
        batch = {"pixel_values": torch.randn(BATCH, 3, height, width, generator=generator)}
        queries = BATCH * config.num_detection_tokens
        return batch, {"classes": torch.randint(0, config.num_labels + 1, (queries,),
                                                generator=generator),
                       "boxes": torch.rand(BATCH, config.num_detection_tokens, 4,
                                           generator=generator)}
    if kind in ("image", "segmentation"):
        size = getattr(config, "image_size", 32)
        batch = {"pixel_values": torch.randn(BATCH, 3, size, size, generator=generator)}
        high = config.num_labels
        shape = (BATCH, size, size) if kind == "segmentation" else (BATCH,)
        return batch, {"labels": torch.randint(0, high, shape, generator=generator)}
    if kind == "waveform":  # (the CTC loss wants labels shorter than the 19 frames)
        return ({"input_values": torch.randn(BATCH, 400, generator=generator)},
                {"labels": tokens(6, config.vocab_size)})
    if kind == "audio features":
        features = torch.randn(BATCH, config.num_mel_bins, 2 * config.max_source_positions,
                               generator=generator)
        target = tokens(LENGTH // 2)
        return {"input_features": features, "decoder_input_ids": target}, {"labels": target}
    ids = tokens(LENGTH)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if kind == "text and image":
        size = config.vision_config.image_size
        batch["pixel_values"] = torch.randn(BATCH, 3, size, size, generator=generator)
        return batch, {"return_loss": True}
    if kind == "text and boxes":  # (corners in order: x0 <= x1, y0 <= y1)
        corners = torch.randint(0, config.max_2d_position_embeddings, (BATCH, LENGTH, 2, 2),
                                generator=generator).sort(dim=2).values
        batch["bbox"] = corners.flatten(2)  # (x0, y0, x1, y1)
    if seq2seq:
        batch["decoder_input_ids"] = tokens(LENGTH // 2)
    return batch, {"labels": batch.get("decoder_input_ids", ids)}


def timm_case(architecture: str, overrides: dict[str, Any]):
    import timm

    overrides = dict(overrides)
    size = overrides.pop("input_size", overrides.get("img_size", IMAGE))
    torch.manual_seed(SEED)
    try:  # (no dropout: a training step draws no random numbers, eager's and ember's agree)
        model = timm.create_model(architecture, pretrained=False, num_classes=10,
                                  drop_rate=0.0, drop_path_rate=0.0, **overrides)
    except TypeError:
        model = timm.create_model(architecture, pretrained=False, num_classes=10,
                                  drop_rate=0.0, **overrides)
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


TOLERANCE = 1e-3


def _answer(model: Any, batch: dict[str, Any], run: Callable, mode: str
            ) -> dict[str, torch.Tensor]:
    """What a call answers: the output and, in training, every parameter's gradient."""
    output = run(model, batch)
    answer = {"output": output.detach()}
    if mode == "train":
        output.backward()
        parameters = getattr(model, "_orig_mod", model)
        answer.update((n, p.grad.clone()) for n, p in parameters.named_parameters()
                      if p.grad is not None)
        parameters.zero_grad(set_to_none=True)
    return answer


def _difference(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """The largest difference, relative to each tensor's size where that passes 1 (a random
    model's logits reach 1e9 through Inception's eval-mode batch norms, where float32
    rounding alone differs in the thousands); a gradient eager has and ember lacks counts
    as zeros."""
    difference = 0.0
    for name, want in expected.items():
        have = got.get(name, torch.zeros_like(want)).to(want.dtype)
        scale = max(1.0, want.abs().max().item())
        difference = max(difference, (have - want).abs().max().item() / scale)
    return difference


def _double(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in batch.items()}


def run_case(name: str, make: Callable[[], tuple], mode: str) -> dict[str, Any]:
    """One model in one mode: what explain says, the fallback warnings, eager's difference."""
    import ember

    found: dict[str, Any] = {"model": name, "mode": mode}
    try:
        model, batch, forward, loss = make()
    except Exception as error:  # noqa: BLE001 (a config this transformers does not take)
        found["status"] = f"not built: {type(error).__name__}: {str(error)[:120]}"
        return found
    if mode in ("decode", "generate"):
        return run_decoding(found, model, batch)
    model.train(mode == "train")
    run = forward if mode == "infer" else loss
    # (before any call: a float64 judge, below; RecurrentGemma keeps its recurrent states,
    # non-leaf tensors in training, on its modules, which deepcopy refuses)
    reference = copy.deepcopy(model)
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
            expected = _answer(model, batch, run, mode)
            got = _answer(ember.compile(model), batch, run, mode)
            difference = _difference(got, expected)
            found["max_difference"] = difference
            found["status"] = "ok" if difference <= TOLERANCE else "DIFFERENT"
            if difference > TOLERANCE:
                # where they differ, float64 judges: a random model's training step can be
                # ill-conditioned enough (Xception's batch norms over 2x2 maps) that float32
                # rounding alone moves a gradient by 2%; ember is right where it is no
                # farther from float64's answer than eager is (twice, plus the tolerance)
                exact = _answer(reference.double(), _double(batch), run, mode)
                eager_error, ember_error = (_difference(a, exact) for a in (expected, got))
                found.update(eager_error=eager_error, ember_error=ember_error)
                if ember_error <= 2 * eager_error + TOLERANCE:
                    found["status"] = "ok (float64: eager's error as large)"
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


def greedy(model: Callable[..., Any], batch: dict[str, torch.Tensor],
           new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    """Greedy decoding with a KV cache by hand, as users write the loop with transformers 5:
    the prompt with an empty DynamicCache (its layers as the config asks: sliding-window
    layers keep a Python int of their length), then the chosen token a call."""
    import transformers

    mask = batch["attention_mask"]
    cache = transformers.DynamicCache(config=model.config)
    output = model(input_ids=batch["input_ids"], attention_mask=mask, past_key_values=cache,
                   use_cache=True)
    chosen = [output.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        mask = torch.cat([mask, torch.ones_like(chosen[-1])], dim=1)
        output = model(input_ids=chosen[-1], attention_mask=mask,
                       past_key_values=output.past_key_values, use_cache=True)
        chosen.append(output.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(chosen, dim=1)


def generated(model: torch.nn.Module, batch: dict[str, torch.Tensor],
              new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    return model.generate(batch["input_ids"], attention_mask=batch["attention_mask"],
                          do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def captures(compiled: Any) -> dict[str, int]:
    """How many captures a compiled function (or module) made, its resume functions' and the
    functions it compiled apart included, and how many of their graphs run eagerly."""
    from ember.backends import EagerGraph

    function = getattr(compiled, "_compiled_forward", compiled)
    found = {"captures": len(function.records),
             "eager": sum(isinstance(r.compiled, EagerGraph) for r in function.records)}
    inner = [r.compiled for r in function.resumes.values() if r.compiled is not None]
    for part in [*inner, *function.callees.values()]:
        for key, count in captures(part).items():
            found[key] += count
    return found


def run_decoding(found: dict[str, Any], model: torch.nn.Module,
                 batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Greedy decoding (found["mode"]: decode by hand or generate), eager and compiled, twice
    each: the tokens, the captures, and what explain makes of the prompt's and a cached
    token's call."""
    import transformers

    import ember

    mode = found["mode"]
    model.eval()
    batch = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    warnings = _Warnings()
    logging.getLogger("ember").addHandler(warnings)
    try:
        with torch.no_grad():
            prompt = dict(batch, use_cache=True,
                          past_key_values=transformers.DynamicCache(config=model.config))
            cache = model(**prompt).past_key_values
            token = batch["input_ids"][:, -1:]
            step = dict(input_ids=token, past_key_values=cache, use_cache=True,
                        attention_mask=torch.cat([batch["attention_mask"],
                                                  torch.ones_like(token)], dim=1))
            prompt["past_key_values"] = transformers.DynamicCache(config=model.config)
            calls = [ember.explain(model)(**keywords) for keywords in (prompt, step)]
            found.update(graphs=max(c.graph_count for c in calls),
                         breaks=sum(c.graph_break_count for c in calls),
                         reasons=[str(getattr(r, "reason", r))[:160]
                                  for c in calls for r in c.break_reasons][:3],
                         islands=[str(i)[:160] for c in calls
                                  for i in getattr(c, "eager_islands", [])][:3])
            if mode == "decode":
                expected = greedy(model, batch)
                compiled = ember.compile(model)
                runs = [greedy(compiled, batch) for _ in range(2)]
            else:
                expected = generated(model, batch)
                compiled = ember.compile(model.forward)
                model.forward = compiled
                try:
                    runs = [generated(model, batch) for _ in range(2)]
                finally:
                    del model.forward
        counted = captures(compiled)
        found.update(compiles=counted["captures"], eager_graphs=counted["eager"],
                     tokens=int(expected.numel()),
                     max_difference=max(int((run != expected).sum()) for run in runs))
        if found["max_difference"]:
            found["status"] = "DIFFERENT"
        elif warnings.messages:
            found["status"] = "FALLBACK: " + warnings.messages[0][:100]
        elif counted["captures"] > DECODE_COMPILES:
            found["status"] = f"RECOMPILES: {counted['captures']} captures"
        else:
            found["status"] = "ok"
    except Exception as error:  # noqa: BLE001 (a crash is a finding: say it, go on)
        found["status"] = f"CRASH: {type(error).__name__}: {str(error)[:200]}"
        found["trace"] = traceback.format_exc()[-1500:]
        try:  # (RecurrentGemma answers no cache: the loop fails in eager too)
            with torch.no_grad():
                greedy(model, batch)
        except Exception as eager_error:  # noqa: BLE001 (the sweep's loop, not ember)
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


def summary(result: dict[str, Any]) -> str:
    """One line per model and mode (and, decoding, the captures the two runs made)."""
    difference = result.get("max_difference")
    line = (f"{result['model']:24} {result['mode']:8} {result.get('status', '?')[:60]:60} "
            f"graphs {result.get('graphs', '-')} breaks {result.get('breaks', '-')} "
            f"islands {len(result.get('islands', []))} "
            f"warnings {len(result.get('warnings', []))} "
            f"diff {'-' if difference is None else format(difference, '.2g')}")
    if "compiles" in result:
        line += f" compiles {result['compiles']} (eager {result['eager_graphs']})"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--json", default=None, help="write every result here")
    options = parser.parse_args()
    results = []
    decoding = decoders()
    for name, make in cases().items():
        if options.only and name not in options.only:
            continue
        for mode in options.modes.split(","):
            if mode in ("decode", "generate") and name not in decoding:
                continue
            result = run_case(name, make, mode)
            results.append(result)
            print(summary(result), flush=True)
            for line in result.get("reasons", []) + result.get("islands", []) + \
                    result.get("warnings", []):
                print(f"    {line}")
    if options.json:
        with open(options.json, "w") as file:
            json.dump(results, file, indent=1)
    runs = [r for r in results if not str(r.get("status", "")).startswith(("eager raises",
                                                                          "not built"))]
    ok = sum(str(r.get("status")).startswith("ok") for r in runs)
    whole = sum(r.get("graphs") == 1 and not r.get("islands") for r in runs)
    print(f"{ok}/{len(runs)} match eager; {whole}/{len(runs)} one graph without islands "
          f"({len(results) - len(runs)} runs left out: the model or eager fails as configured)")


if __name__ == "__main__":
    main()
