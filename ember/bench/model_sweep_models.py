"""The model sweep's models (ember/bench/model_sweep.py runs them): tiny random-weight
architectures from transformers and timm, built from configs in code (no downloads), with a
batch and a loss for each. The tables are ember/bench/model_sweep_tables.py; here, how a
table entry becomes (model, batch, forward, loss). Nothing here compiles or judges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ember.bench.model_sweep_tables import (
    BATCH,
    IMAGE,
    IMAGE_BATCH,
    INPUTS,
    LENGTH,
    OUTPUTS,
    SEED,
    TIMM,
    TRANSFORMERS,
)


def _seq2seq(model_class: str) -> bool:
    return model_class.endswith(("ForConditionalGeneration", "MTModel"))


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
    output = OUTPUTS.get(kind, "logits")

    def forward(m, b):
        return getattr(m(**b), output)

    def loss(m, b):
        # (the labels go where the batch went: model_sweep --device moves the batch)
        device = next(v.device for v in b.values() if isinstance(v, torch.Tensor))
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in labels.items()}
        if kind == "detection":  # (transformers' matching loss needs scipy: the heads' own)
            answer = m(**b)
            return (F.cross_entropy(answer.logits.flatten(0, 1), moved["classes"]) +
                    F.l1_loss(answer.pred_boxes, moved["boxes"]))
        return m(**b, **moved).loss

    return model, batch, forward, loss


def _inputs(kind: str, config: Any, seq2seq: bool, generator: torch.Generator
            ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A transformers model's batch for its kind of input, and what its loss takes."""
    def tokens(length: int, high: int = 256) -> torch.Tensor:
        return torch.randint(3, high, (BATCH, length), generator=generator)

    if kind == "detection":  # (YOLOS's detection tokens, DETR's object queries)
        height, width = getattr(config, "image_size", (IMAGE, IMAGE))
        batch = {"pixel_values": torch.randn(BATCH, 3, height, width, generator=generator)}
        queries = getattr(config, "num_detection_tokens", None) or config.num_queries
        return batch, {"classes": torch.randint(0, config.num_labels + 1, (BATCH * queries,),
                                                generator=generator),
                       "boxes": torch.rand(BATCH, queries, 4, generator=generator)}
    if kind == "masked image":  # (the model masks patches itself and answers its loss)
        size = config.image_size
        return {"pixel_values": torch.randn(BATCH, 3, size, size, generator=generator)}, {}
    if kind == "time series":
        shape = (BATCH, config.context_length, config.num_input_channels)
        future = (BATCH, config.prediction_length, config.num_input_channels)
        return ({"past_values": torch.randn(*shape, generator=generator)},
                {"future_values": torch.randn(*future, generator=generator)})
    if kind == "filter banks":  # (stacked frames, as Speech2Text's feature extractor gives)
        features = torch.randn(BATCH, 4 * LENGTH, config.input_feat_per_channel *
                               config.input_channels, generator=generator)
        target = tokens(LENGTH // 2)
        return {"input_features": features, "decoder_input_ids": target}, {"labels": target}
    if kind in ("image", "segmentation"):
        size = getattr(config, "image_size", 32)
        batch = {"pixel_values": torch.randn(BATCH, 3, size, size, generator=generator)}
        high = config.num_labels
        shape = (BATCH, size, size) if kind == "segmentation" else (BATCH,)
        return batch, {"labels": torch.randint(0, high, shape, generator=generator)}
    if kind == "waveform":  # (the CTC loss wants labels shorter than the 19 frames)
        return ({"input_values": torch.randn(BATCH, 400, generator=generator)},
                {"labels": tokens(6, config.vocab_size)})
    if kind == "spectrogram":  # (frames by mel bins, as the AST feature extractor gives)
        return ({"input_values": torch.randn(BATCH, config.max_length, config.num_mel_bins,
                                             generator=generator)},
                {"labels": torch.randint(0, config.num_labels, (BATCH,), generator=generator)})
    if kind == "waveform and tokens":  # (Moonshine: raw audio in, text out)
        target = tokens(LENGTH // 2)
        return ({"input_values": torch.randn(BATCH, 1600, generator=generator),
                 "decoder_input_ids": target}, {"labels": target})
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
        return F.cross_entropy(m(b["x"]), b["target"])

    return model, {"x": images, "target": target}, forward, loss


def cases() -> dict[str, Callable[[], tuple]]:
    found: dict[str, Callable[[], tuple]] = {}
    for model_type, model_class, overrides in TRANSFORMERS:
        found[model_type] = (lambda t=model_type, c=model_class, o=overrides:
                             transformers_case(t, c, o))
    for architecture, overrides in TIMM:
        found[architecture] = lambda a=architecture, o=overrides: timm_case(a, o)
    return found
