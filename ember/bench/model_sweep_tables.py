"""The model sweep's architectures (ember/bench/model_sweep.py runs them, built by
ember/bench/model_sweep_models.py): tiny transformers and timm configurations, as tables — what
each model type is built from, what it takes and answers — and the common sizes.
"""

from __future__ import annotations

from typing import Any

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
# (BART-style encoder-decoders' and wav2vec2-style speech models' sizes)
_BART = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
             vocab_size=256, max_position_embeddings=64)
_SPEECH = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, vocab_size=32, conv_dim=(32, 32, 32),
               conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
               num_conv_pos_embedding_groups=4, pad_token_id=0)
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
    ("mbart", "MBartForConditionalGeneration", _BART),
    ("pegasus", "PegasusForConditionalGeneration", _BART),
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
        _BART, num_mel_bins=16, max_source_positions=32, max_target_positions=64,
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
    # added 2026-12 (newer patterns): Gemma 3's sliding and global layers with QK norms,
    # MoE routing with top-k over expert groups (DeepSeek-V3, with its low-rank attention),
    # Qwen3-MoE, GraniteMoE's parallel experts, Llama 4's chunked attention and sigmoid
    # router, GLM-4's partial interleaved rotary, Jamba's Mamba layers beside attention,
    # ViTMAE's random masking (argsort of noise drawn in forward), DETR's sine positions,
    # frozen batch norms and object queries, PatchTST's patching and scaling of a time
    # series, Speech2Text's convolutional subsampling, Data2Vec-Vision's relative position
    # bias, Perceiver's cross attention onto latents
    ("gemma3_text", "Gemma3ForCausalLM", dict(
        _DECODER, head_dim=16, sliding_window=4, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"])),
    ("deepseek_v3", "DeepseekV3ForCausalLM", dict(
        _DECODER, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8,
        n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
        n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, head_dim=8)),
    ("qwen3_moe", "Qwen3MoeForCausalLM", dict(_DECODER, head_dim=16, num_experts=4,
                                              num_experts_per_tok=2, moe_intermediate_size=32)),
    ("granitemoe", "GraniteMoeForCausalLM", dict(_DECODER, num_local_experts=4,
                                                 num_experts_per_tok=2,
                                                 embedding_multiplier=2.0,
                                                 residual_multiplier=0.5)),
    ("llama4_text", "Llama4ForCausalLM", dict(
        _DECODER, head_dim=16, intermediate_size_mlp=128, num_local_experts=4,
        num_experts_per_tok=1, attention_chunk_size=4, no_rope_layers=[1, 0],
        layer_types=["chunked_attention", "full_attention"], moe_layers=[0, 1])),
    ("glm4", "Glm4ForCausalLM", dict(_DECODER, head_dim=16, pad_token_id=0)),
    ("jamba", "JambaForCausalLM", dict(
        _DECODER, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
        expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8,
        mamba_dt_rank=8, use_mamba_kernels=False)),
    ("vit_mae", "ViTMAEForPreTraining", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=1,
        decoder_num_attention_heads=4, decoder_intermediate_size=64)),
    ("detr", "DetrForObjectDetection", dict(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone=None,
        backbone_config=dict(model_type="resnet", embedding_size=16, hidden_sizes=[16, 32],
                             depths=[1, 1], layer_type="basic", out_features=["stage2"]),
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5,
        num_labels=4)),
    ("patchtst", "PatchTSTForPrediction", dict(
        num_input_channels=3, context_length=32, patch_length=8, patch_stride=8,
        prediction_length=8, d_model=32, num_attention_heads=4, ffn_dim=64,
        num_hidden_layers=2)),
    ("speech_to_text", "Speech2TextForConditionalGeneration", dict(
        _BART, conv_channels=32, input_feat_per_channel=16, max_source_positions=64,
        max_target_positions=64, decoder_start_token_id=1, pad_token_id=0)),
    ("data2vec-vision", "Data2VecVisionForImageClassification", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=10, use_relative_position_bias=True)),
    ("perceiver", "PerceiverForMaskedLM", dict(
        num_latents=16, d_latents=64, d_model=32, num_blocks=1, num_self_attends_per_block=2,
        num_self_attention_heads=4, num_cross_attention_heads=4, max_position_embeddings=LENGTH,
        vocab_size=262)),
    # added 2026-12-07 (current decoder families, as held-out models may be): OLMo 2 and 3's
    # QK norms, SmolLM3's layers without rotary, Cohere 2's sliding layers, EXAONE 4, Arcee's
    # ReLU^2 MLP, Helium, gpt-oss's sinks and MoE, LFM2's short convolutions, Hunyuan,
    # ERNIE 4.5, Seed-OSS, GLM-4-MoE, Apertus's xIELU, the Mamba-2 hybrids (GraniteMoeHybrid,
    # Bamba, Falcon-H1) and Mamba-2 itself, PhiMoE, BitNet's quantized linears, MPT's ALiBi,
    # GPT-Neo's local layers, BioGPT, CTRL, VaultGemma, nanochat; JetMoE (its experts'
    # .tolist() breaks the graph, as under torch.compile)
    ("olmo2", "Olmo2ForCausalLM", _DECODER),
    ("olmo3", "Olmo3ForCausalLM", _DECODER),
    ("smollm3", "SmolLM3ForCausalLM", dict(_DECODER, pad_token_id=0, bos_token_id=1,
                                           eos_token_id=2)),
    ("cohere2", "Cohere2ForCausalLM", _DECODER),
    ("exaone4", "Exaone4ForCausalLM", _DECODER),
    ("arcee", "ArceeForCausalLM", _DECODER),
    ("helium", "HeliumForCausalLM", dict(_DECODER, head_dim=16)),
    ("gpt_oss", "GptOssForCausalLM", dict(_DECODER, num_local_experts=4, num_experts_per_tok=2,
                                          head_dim=16)),
    ("lfm2", "Lfm2ForCausalLM", _DECODER),
    ("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", dict(_DECODER, head_dim=16)),
    ("ernie4_5", "Ernie4_5ForCausalLM", dict(_DECODER, head_dim=16)),
    ("seed_oss", "SeedOssForCausalLM", dict(_DECODER, head_dim=16)),
    ("glm4_moe", "Glm4MoeForCausalLM", dict(_DECODER, n_routed_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=32, first_k_dense_replace=1,
                                            head_dim=16)),
    ("apertus", "ApertusForCausalLM", _DECODER),
    ("granitemoehybrid", "GraniteMoeHybridForCausalLM", dict(
        _DECODER, layer_types=["mamba", "attention"], mamba_d_head=16, mamba_n_heads=8,
        mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2)),
    ("bamba", "BambaForCausalLM", dict(_DECODER, attn_layer_indices=[1], mamba_d_head=16,
                                       mamba_n_heads=8, mamba_chunk_size=16)),
    ("falcon_h1", "FalconH1ForCausalLM", dict(_DECODER, mamba_d_head=16, mamba_n_heads=8,
                                              mamba_chunk_size=16, mamba_d_ssm=128)),
    ("mamba2", "Mamba2ForCausalLM", dict(hidden_size=64, num_hidden_layers=2, vocab_size=256,
                                         num_heads=4, head_dim=32, state_size=16,
                                         n_groups=1)),
    ("phimoe", "PhimoeForCausalLM", dict(_DECODER, num_local_experts=4,
                                         num_experts_per_tok=2)),
    ("bitnet", "BitNetForCausalLM", _DECODER),
    ("mpt", "MptForCausalLM", dict(d_model=64, n_layers=2, n_heads=4, vocab_size=256,
                                   max_seq_len=64)),
    ("gpt_neo", "GPTNeoForCausalLM", dict(hidden_size=64, num_layers=2, num_heads=4,
                                          vocab_size=256, max_position_embeddings=64,
                                          attention_types=[[["global", "local"], 1]],
                                          window_size=8)),
    ("biogpt", "BioGptForCausalLM", _DECODER),
    ("ctrl", "CTRLLMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                     n_positions=64, dff=128)),
    ("vaultgemma", "VaultGemmaForCausalLM", dict(_DECODER, head_dim=16)),
    ("nanochat", "NanoChatForCausalLM", _DECODER),
    ("jetmoe", "JetMoeForCausalLM", _DECODER),
    # added 2026-12-07 (architectures not yet swept): T5 relatives (UMT5's per-layer relative
    # bias, LongT5's transient-global attention, Switch Transformers' capacity-limited expert
    # routing), BART relatives (Marian, M2M-100's padded sinusoidal positions, LED's windowed
    # encoder, Blenderbot, PLBart, BigBird-Pegasus's block-sparse attention), encoders with
    # their own attention (BigBird, ConvBERT's span convolutions, SqueezeBERT's grouped 1x1
    # convolutions, RoFormer's rotary values, ESM's rotary and token dropout rescaling, LUKE's
    # entity-aware attention, Nystromformer's landmarks and iterative pseudo-inverse, YOSO's
    # expectation of LSH collisions, RemBERT's decoupled embeddings, Megatron-BERT's
    # pre-norm, X-MOD's per-language adapters), speech models (WavLM's gated relative
    # position bias, SEW's squeeze and upsample, UniSpeech-SAT, the Audio Spectrogram
    # Transformer's overlapping patches, Moonshine's raw-waveform encoder with partial rotary),
    # decoders (Zamba's shared attention beside Mamba layers, DBRX's clipped QKV and MoE,
    # GPT-NeoX-Japanese's biased residual, TrOCR's decoder alone)
    ("umt5", "UMT5ForConditionalGeneration", dict(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        vocab_size=256, decoder_start_token_id=0, pad_token_id=0)),
    ("longt5", "LongT5ForConditionalGeneration", dict(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        vocab_size=256, decoder_start_token_id=0, pad_token_id=0,
        encoder_attention_type="transient-global", local_radius=2, global_block_size=4)),
    ("switch_transformers", "SwitchTransformersForConditionalGeneration", dict(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        vocab_size=256, decoder_start_token_id=0, pad_token_id=0, num_experts=4,
        expert_capacity=8, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
        router_jitter_noise=0.0)),
    ("marian", "MarianMTModel", dict(_BART, pad_token_id=0, decoder_start_token_id=0)),
    ("m2m_100", "M2M100ForConditionalGeneration", _BART),
    ("led", "LEDForConditionalGeneration", dict(
        _BART, attention_window=4, max_encoder_position_embeddings=64,
        max_decoder_position_embeddings=64)),
    ("blenderbot", "BlenderbotForConditionalGeneration", _BART),
    ("plbart", "PLBartForConditionalGeneration", _BART),
    ("bigbird_pegasus", "BigBirdPegasusForConditionalGeneration", dict(
        _BART, attention_type="block_sparse", block_size=1, num_random_blocks=2)),
    ("big_bird", "BigBirdForMaskedLM", dict(_ENCODER, attention_type="block_sparse",
                                            block_size=1, num_random_blocks=2)),
    ("convbert", "ConvBertForMaskedLM", dict(_ENCODER, embedding_size=64, conv_kernel_size=3)),
    ("squeezebert", "SqueezeBertForMaskedLM", dict(_ENCODER, embedding_size=64)),
    ("roformer", "RoFormerForMaskedLM", dict(_ENCODER, embedding_size=64, rotary_value=True)),
    ("esm", "EsmForMaskedLM", dict(_ENCODER, pad_token_id=1, mask_token_id=2,
                                   position_embedding_type="rotary", token_dropout=True,
                                   emb_layer_norm_before=False)),
    ("luke", "LukeForMaskedLM", dict(_ENCODER, entity_vocab_size=16, entity_emb_size=32)),
    ("nystromformer", "NystromformerForMaskedLM", dict(_ENCODER, num_landmarks=4,
                                                       segment_means_seq_len=LENGTH,
                                                       conv_kernel_size=3)),
    ("yoso", "YosoForMaskedLM", dict(_ENCODER, use_expectation=True, hash_code_len=4,
                                     num_hash=8, conv_window=3)),
    ("rembert", "RemBertForMaskedLM", dict(_ENCODER, input_embedding_size=32,
                                           output_embedding_size=32, bos_token_id=1,
                                           eos_token_id=2)),
    ("megatron-bert", "MegatronBertForMaskedLM", _ENCODER),
    ("xmod", "XmodForMaskedLM", dict(_ENCODER, languages=["en_XX", "de_DE"],
                                     default_language="en_XX")),
    ("wavlm", "WavLMForCTC", dict(_SPEECH, num_buckets=32, max_bucket_distance=64)),
    ("sew", "SEWForCTC", dict(_SPEECH, squeeze_factor=2)),
    ("unispeech-sat", "UniSpeechSatForCTC", _SPEECH),
    ("audio-spectrogram-transformer", "ASTForAudioClassification", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        patch_size=8, frequency_stride=4, time_stride=4, max_length=32, num_mel_bins=16,
        num_labels=10)),
    ("moonshine", "MoonshineForConditionalGeneration", dict(
        hidden_size=64, intermediate_size=128, encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2, encoder_num_attention_heads=4,
        decoder_num_attention_heads=4, encoder_num_key_value_heads=4,
        decoder_num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
        pad_token_id=0)),
    ("zamba", "ZambaForCausalLM", dict(_DECODER, num_hidden_layers=5, attn_layer_period=2,
                                       attn_layer_offset=0, n_mamba_heads=2,
                                       mamba_d_state=8, mamba_dt_rank=8,
                                       use_mamba_kernels=False)),
    ("dbrx", "DbrxForCausalLM", dict(
        d_model=64, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=256,
        attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
        ffn_config=dict(hidden_size=64, ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2))),
    ("gpt_neox_japanese", "GPTNeoXJapaneseForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=2,
        vocab_size=256, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)),
    ("trocr", "TrOCRForCausalLM", dict(d_model=64, decoder_layers=2, decoder_attention_heads=4,
                                       decoder_ffn_dim=128, vocab_size=256,
                                       max_position_embeddings=64)),
)
# what the transformers models other than text models take (the rest: input_ids)
INPUTS = {"whisper": "audio features", "clip": "text and image", "vit": "image",
          "swin": "image", "convnext": "image", "segformer": "segmentation",
          "wav2vec2": "waveform", "layoutlm": "text and boxes", "yolos": "detection",
          "dinov2": "image", "hubert": "waveform", "siglip": "text and image",
          "vit_mae": "masked image", "detr": "detection", "patchtst": "time series",
          "speech_to_text": "filter banks", "data2vec-vision": "image",
          "wavlm": "waveform", "sew": "waveform", "unispeech-sat": "waveform",
          "audio-spectrogram-transformer": "spectrogram", "moonshine": "waveform and tokens"}
# what a model answers, by kind of input, where it is not `logits`
OUTPUTS = {"text and image": "logits_per_image", "time series": "prediction_outputs"}
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
    # added 2026-12 (newer patterns): universal inverted bottlenecks (MobileNetV4), light
    # aggregation with learnable affine (HGNetV2), reparameterized ViT-style convnets
    # (RepViT), partial convolutions over a channel slice (FasterNet), dual spatial and
    # channel attention (DaViT), locally-grouped and global sub-sampled attention (Twins),
    # pooling attention with relative positions (MViTv2), mask-unit attention with unrolled
    # tokens (Hiera), gated positional self-attention (ConViT)
    ("mobilenetv4_conv_small", {}), ("hgnetv2_b0", {}), ("repvit_m0_9", {}),
    ("fasternet_t0", {}), ("davit_tiny", dict(depths=(1, 1, 1, 1))),
    ("twins_svt_small", dict(depths=(1, 1, 1, 1))), ("mvitv2_tiny", dict(img_size=IMAGE)),
    ("hiera_tiny_224", dict(img_size=IMAGE)), ("convit_tiny", dict(img_size=IMAGE)),
    # added 2026-12-07 (architectures not yet swept): NAS-found inverted residuals (MnasNet,
    # ReXNet's partial residual adds), gated depthwise blocks without SSM (MambaOut),
    # element-wise star products (StarNet), dense concatenation (RDNet), focal modulation
    # (FocalNet), MBConv beside relative attention (CoAtNet), Visformer's conv-attention
    # stages, affine-only MLP blocks (ResMLP), Inception depthwise token mixers
    # (InceptionNeXt), decoupled fully connected attention (GhostNetV2), lambda layers
    # (LambdaNet), pixel-in-patch transformers (TNT)
    ("mnasnet_050", {}), ("rexnet_100", {}), ("mambaout_femto", {}), ("starnet_s1", {}),
    ("rdnet_tiny", {}), ("focalnet_tiny_srf", {}),
    ("coatnet_nano_rw_224", dict(img_size=IMAGE)), ("visformer_tiny", dict(img_size=IMAGE)),
    ("resmlp_12_224", dict(img_size=IMAGE)), ("inception_next_tiny", {}),
    ("ghostnetv2_100", {}), ("lambda_resnet26t", dict(img_size=IMAGE)),
    ("tnt_s_patch16_224", dict(img_size=IMAGE, depth=2)),
)

