"""The model zoo: transformers and timm models as users compile them, for the bench and the tests.

Each model is built from a config with random weights (nothing is downloaded, `from_pretrained`
is never called) at one of three sizes, and run in one of three modes: inference, a training
step with AdamW, and greedy decoding with a KV cache (decoders). `instantiate` gives a step
function and its arguments; the step calls the model through `step.model_slot[0]`, so a
compiled variant compiles the model alone (`torch.compile(model)`, `ember.compile(model)`) and
the Python around it (loss, backward, optimizer, decoding loop) stays as users write it.
Builders make models and tensors only; they never compile or time anything.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# full: the real-model sizes of ../shared/ANCHORS.md, on CUDA (bf16 inference and decoding,
# fp32 training); quick: the CPU benchmark's sizes (a whole CPU run in minutes on 2 cores);
# tiny: the tests' sizes (and the CPU benchmark's --quick).
SIZES = ("full", "quick", "tiny")
MODES = ("infer", "train", "decode")
SEED = 0


@dataclasses.dataclass(frozen=True)
class Shape:
    """The inputs of one call: `batch` sequences of `length` tokens (`target` decoder tokens
    for encoder-decoders, `new_tokens` generated when decoding), or `batch` images of
    `image`² pixels."""

    batch: int
    length: int = 0
    target: int = 0
    new_tokens: int = 0
    image: int = 0


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model of the zoo. `make(config)` builds it from `configs[size]` (keyword arguments
    of its config class or of timm.create_model); `kind` decides its inputs and modes:
    decoder (causal LM: all three modes), encoder (masked LM), seq2seq (encoder-decoder LM)
    or vision (image classifier)."""

    name: str
    title: str
    library: str
    kind: str
    make: Callable[[dict[str, Any]], torch.nn.Module]
    configs: dict[str, dict[str, Any]]
    shapes: dict[str, Shape]
    channels_last: bool = False

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES if self.kind == "decoder" else ("infer", "train")

    @property
    def vocabulary(self) -> int:
        return self.configs["tiny"].get("vocab_size", 0)


def _transformers(class_name: str, config_name: str) -> Callable[[dict[str, Any]], Any]:
    def make(config: dict[str, Any]) -> torch.nn.Module:
        import transformers

        settings = getattr(transformers, config_name)(**config)
        return getattr(transformers, class_name)(settings)

    make.__name__ = f"make_{class_name}"
    return make


def _timm(architecture: str) -> Callable[[dict[str, Any]], torch.nn.Module]:
    """timm.create_model(architecture, **config); a config's `architecture` names a smaller
    member of the same family."""

    def make(config: dict[str, Any]) -> torch.nn.Module:
        import timm

        config = dict(config)
        # no dropout, no stochastic depth: compiled and eager runs draw no random numbers
        return timm.create_model(config.pop("architecture", architecture), pretrained=False,
                                 drop_rate=0.0, drop_path_rate=0.0, **config)

    make.__name__ = f"make_{architecture}"
    return make


def _sizes(full: dict[str, Any], quick: dict[str, Any], tiny: dict[str, Any],
           common: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    common = common or {}
    return {"full": {**common, **full}, "quick": {**common, **quick},
            "tiny": {**common, **tiny}}


# NOTE: every dropout is 0 so that a compiled training step and eager's draw no random numbers
# and can be compared value for value.
_GPT2_OFF = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_BERT_OFF = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_BART_OFF = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)

# Llama-style decoders (Llama, Qwen2): GQA, RoPE, RMSNorm, at the same sizes
_LLAMA_SIZES = _sizes(
    full=dict(num_hidden_layers=8, hidden_size=1024, intermediate_size=2816,
              num_attention_heads=16, num_key_value_heads=4, vocab_size=32000),
    quick=dict(num_hidden_layers=4, hidden_size=256, intermediate_size=688,
               num_attention_heads=8, num_key_value_heads=2, vocab_size=8192),
    tiny=dict(num_hidden_layers=2, hidden_size=64, intermediate_size=176,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
    common=dict(max_position_embeddings=2048))
_LLAMA_SHAPES = {"full": Shape(4, 512, new_tokens=64), "quick": Shape(2, 128, new_tokens=16),
                 "tiny": Shape(2, 16, new_tokens=4)}

MODELS: tuple[ZooModel, ...] = (
    ZooModel(
        "gpt2", "GPT-2", "transformers", "decoder",
        _transformers("GPT2LMHeadModel", "GPT2Config"),
        _sizes(full=dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
               quick=dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=512,
                          bos_token_id=8191, eos_token_id=8191),
               tiny=dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128,
                         bos_token_id=255, eos_token_id=255),
               common=_GPT2_OFF),
        {"full": Shape(8, 256, new_tokens=64), "quick": Shape(2, 128, new_tokens=16),
         "tiny": Shape(2, 16, new_tokens=4)}),
    ZooModel(
        "llama", "Llama-style (GQA, RoPE, RMSNorm)", "transformers", "decoder",
        _transformers("LlamaForCausalLM", "LlamaConfig"), _LLAMA_SIZES, _LLAMA_SHAPES),
    ZooModel(
        "qwen2", "Qwen2 (GQA, biased QKV)", "transformers", "decoder",
        _transformers("Qwen2ForCausalLM", "Qwen2Config"), _LLAMA_SIZES, _LLAMA_SHAPES),
    ZooModel(
        "bert", "BERT (masked LM)", "transformers", "encoder",
        _transformers("BertForMaskedLM", "BertConfig"),
        _sizes(full=dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                         intermediate_size=3072, vocab_size=30522),
               quick=dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                          intermediate_size=1024, vocab_size=8192),
               tiny=dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         intermediate_size=128, vocab_size=256),
               common=_BERT_OFF),
        {"full": Shape(8, 256), "quick": Shape(2, 128), "tiny": Shape(2, 16)}),
    ZooModel(
        "t5", "T5 (encoder-decoder)", "transformers", "seq2seq",
        _transformers("T5ForConditionalGeneration", "T5Config"),
        _sizes(full=dict(num_layers=6, num_decoder_layers=6, d_model=512, d_kv=64, d_ff=2048,
                         num_heads=8, vocab_size=32128),
               quick=dict(num_layers=2, num_decoder_layers=2, d_model=256, d_kv=32, d_ff=1024,
                          num_heads=8, vocab_size=8192),
               tiny=dict(num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, d_ff=128,
                         num_heads=4, vocab_size=256),
               common=dict(dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)),
        {"full": Shape(8, 256, target=64), "quick": Shape(2, 128, target=32),
         "tiny": Shape(2, 16, target=8)}),
    ZooModel(
        "bart", "BART (encoder-decoder)", "transformers", "seq2seq",
        _transformers("BartForConditionalGeneration", "BartConfig"),
        _sizes(full=dict(encoder_layers=6, decoder_layers=6, d_model=768,
                         encoder_attention_heads=12, decoder_attention_heads=12,
                         encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265),
               quick=dict(encoder_layers=2, decoder_layers=2, d_model=256,
                          encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=8192),
               tiny=dict(encoder_layers=2, decoder_layers=2, d_model=64,
                         encoder_attention_heads=4, decoder_attention_heads=4,
                         encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256),
               common=dict(_BART_OFF, max_position_embeddings=1024,
                           decoder_start_token_id=2)),
        {"full": Shape(8, 256, target=64), "quick": Shape(2, 128, target=32),
         "tiny": Shape(2, 16, target=8)}),
    ZooModel(
        "resnet50", "ResNet-50", "timm", "vision", _timm("resnet50"),
        # quick and tiny: ResNet-50's bottleneck blocks, fewer per stage
        _sizes(full={}, quick=dict(layers=(1, 1, 1, 1), num_classes=100),
               tiny=dict(layers=(1, 1, 1, 1), channels=(16, 32, 64, 128), stem_width=16,
                         num_classes=10)),
        {"full": Shape(32, image=224), "quick": Shape(4, image=64), "tiny": Shape(4, image=64)},
        channels_last=True),
    ZooModel(
        "vit", "ViT-B/16", "timm", "vision", _timm("vit_base_patch16_224"),
        _sizes(full={}, quick=dict(depth=4, embed_dim=256, num_heads=4, img_size=64,
                                   num_classes=100),
               tiny=dict(depth=2, embed_dim=64, num_heads=4, img_size=64, num_classes=10)),
        {"full": Shape(32, image=224), "quick": Shape(4, image=64), "tiny": Shape(4, image=64)}),
    ZooModel(
        "convnext", "ConvNeXt", "timm", "vision", _timm("convnext_tiny"),
        _sizes(full={}, quick=dict(depths=(1, 1, 3, 1), dims=(48, 96, 192, 384),
                                   num_classes=100),
               tiny=dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128), num_classes=10)),
        {"full": Shape(32, image=224), "quick": Shape(4, image=64), "tiny": Shape(4, image=64)}),
    ZooModel(
        "mobilenetv3", "MobileNetV3", "timm", "vision", _timm("mobilenetv3_large_100"),
        _sizes(full={}, quick=dict(num_classes=100),
               tiny=dict(architecture="mobilenetv3_small_050", num_classes=10)),
        {"full": Shape(32, image=224), "quick": Shape(4, image=64), "tiny": Shape(4, image=64)}),
    ZooModel(
        "efficientnet", "EfficientNet-B0", "timm", "vision", _timm("efficientnet_b0"),
        # tiny: TinyNet-E, an EfficientNet scaled down in width, depth and resolution
        _sizes(full={}, quick=dict(num_classes=100),
               tiny=dict(architecture="tinynet_e", num_classes=10)),
        {"full": Shape(32, image=224), "quick": Shape(4, image=64), "tiny": Shape(4, image=64)}),
)


def find(name: str) -> ZooModel:
    for model in MODELS:
        if model.name == name.lower():
            return model
    raise ValueError(f"no zoo model {name!r}: choose from {', '.join(m.name for m in MODELS)}")


def placement(size: str, mode: str, device: str | None = None) -> tuple[str, torch.dtype]:
    """Where and in what a model runs: the full size on CUDA, the smaller ones on the CPU
    (unless `device` says otherwise); on CUDA in bf16 except training (fp32, as ANCHORS.md
    measures it), on the CPU in fp32."""
    device = device or ("cuda" if size == "full" else "cpu")
    if device == "cuda" and mode != "train":
        return device, torch.bfloat16
    return device, torch.float32


def build(spec: ZooModel, size: str = "tiny", device: str = "cpu",
          dtype: torch.dtype = torch.float32, train: bool = False) -> torch.nn.Module:
    """The model with seeded random weights, on `device` in `dtype`, in train or eval mode."""
    torch.manual_seed(SEED)
    model = spec.make(dict(spec.configs[size]))
    model = model.to(device=device, dtype=dtype)
    if spec.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model.train(train)


def inputs(spec: ZooModel, size: str = "tiny", device: str = "cpu",
           dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The keyword arguments of one forward call (seeded): token ids and an attention mask
    (all ones, as a tokenizer gives for equal lengths) for text, images for vision; and the
    training target under `labels` (the step's loss, never passed to a vision model)."""
    shape = spec.shapes[size]
    generator = torch.Generator().manual_seed(SEED + 1)
    if spec.kind == "vision":
        images = torch.randn(shape.batch, 3, shape.image, shape.image, generator=generator,
                             device="cpu")  # (seeded on the CPU whatever the default device)
        images = images.to(device=device, dtype=dtype)
        if spec.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        classes = spec.configs[size].get("num_classes", 1000)
        labels = torch.randint(0, classes, (shape.batch,), generator=generator, device="cpu")
        return {"x": images, "labels": labels.to(device)}
    vocabulary = spec.configs[size]["vocab_size"]
    ids = torch.randint(1, vocabulary, (shape.batch, shape.length), generator=generator,
                        device="cpu")
    found = {"input_ids": ids.to(device),
             "attention_mask": torch.ones_like(ids, device=device)}
    if spec.kind == "seq2seq":
        target = torch.randint(1, vocabulary, (shape.batch, shape.target), generator=generator,
                               device="cpu")
        found["labels"] = target.to(device)
    else:  # causal LMs shift the labels themselves; the masked LM predicts every token
        found["labels"] = found["input_ids"]
    return found


def logits(output: Any) -> torch.Tensor:
    """A forward's answer: a vision model's tensor, a transformers model's `logits`."""
    return output if isinstance(output, torch.Tensor) else output.logits


def loss_of(spec: ZooModel, model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training loss, as users write it: transformers models compute it from `labels`,
    a vision model's logits go through cross entropy."""
    if spec.kind == "vision":
        return F.cross_entropy(model(batch["x"]), batch["labels"])
    return model(**batch).loss


def forward_kwargs(spec: ZooModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An inference call's keyword arguments: no labels (no loss); for seq2seq models the
    decoder's tokens are given (the labels shifted right, as the model does in training)."""
    if spec.kind == "vision":
        return {"x": batch["x"]}
    found = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if spec.kind == "seq2seq":
        start = spec.configs["tiny"]["decoder_start_token_id"]  # (the same at every size)
        found["decoder_input_ids"] = _shift_right(batch["labels"], start)
    else:
        found["use_cache"] = False  # a whole-sequence forward (scoring) keeps no cache
    return found


def _shift_right(labels: torch.Tensor, start: int) -> torch.Tensor:
    """The decoder's input for `labels`, as the model makes it in training."""
    return torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)


# -- the modes: each gives (step, args); the step calls the model through step.model_slot[0] --
def infer_step(spec: ZooModel, model: torch.nn.Module, batch: dict[str, torch.Tensor]
               ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """One forward of the model in eval mode (run under no_grad): the logits. The step takes
    the call's tensors; its other arguments (use_cache=False) are written into the call."""
    model_slot = [model]
    keywords = forward_kwargs(spec, batch)
    names = [k for k, v in keywords.items() if isinstance(v, torch.Tensor)]
    constants = {k: v for k, v in keywords.items() if k not in names}

    def infer(*tensors: torch.Tensor) -> torch.Tensor:
        return logits(model_slot[0](**dict(zip(names, tensors)), **constants))

    infer.model_slot = model_slot
    return infer, tuple(keywords[name] for name in names)


def train_step(spec: ZooModel, model: torch.nn.Module, batch: dict[str, torch.Tensor],
               lr: float = 1e-3, eps: float = 1e-8
               ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """One AdamW step: zero_grad, forward, loss, backward, optimizer.step(); the loss.
    `step.optimizer` is the optimizer."""
    model_slot = [model]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=eps)
    names = list(batch)

    def train(*values: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_of(spec, model_slot[0], dict(zip(names, values)))
        loss.backward()
        optimizer.step()
        return loss.detach()

    train.model_slot = model_slot
    train.optimizer = optimizer
    train.batch_names = names
    return train, tuple(batch.values())


def decode_step(spec: ZooModel, model: torch.nn.Module, batch: dict[str, torch.Tensor],
                new_tokens: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Greedy decoding with a KV cache, as users write the loop: the prompt once, then one
    token per call with `past_key_values`; the `new_tokens` tokens chosen."""
    model_slot = [model]

    def decode(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        output = model_slot[0](input_ids=input_ids, attention_mask=attention_mask,
                               use_cache=True)
        chosen = [output.logits[:, -1].argmax(dim=-1, keepdim=True)]
        for _ in range(new_tokens - 1):
            attention_mask = torch.cat([attention_mask, torch.ones_like(chosen[-1])], dim=1)
            output = model_slot[0](input_ids=chosen[-1], attention_mask=attention_mask,
                                   past_key_values=output.past_key_values, use_cache=True)
            chosen.append(output.logits[:, -1].argmax(dim=-1, keepdim=True))
        return torch.cat(chosen, dim=1)

    decode.model_slot = model_slot
    decode.tokens = batch["input_ids"].shape[0] * new_tokens
    return decode, (batch["input_ids"], batch["attention_mask"])


def instantiate(spec: ZooModel, mode: str, size: str = "tiny", device: str | None = None,
                dtype: torch.dtype | None = None, **options: Any
                ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """(step, args) for `mode` at `size`: a fresh seeded model each time, so an eager and a
    compiled instance can run side by side. `step.model` is the model and `step.calls()` the
    calls the step makes of it, as (label, keyword arguments), for ember.explain. `options`
    go to the mode's builder (train_step's lr and eps)."""
    if mode not in spec.modes:
        raise ValueError(f"{spec.name} has no {mode} mode (it has {', '.join(spec.modes)})")
    device, kind = placement(size, mode, device)
    dtype = dtype or kind
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"size {size!r} runs on CUDA, and this torch sees no CUDA device")
    model = build(spec, size, device, dtype, train=mode == "train")
    batch = inputs(spec, size, device, dtype)
    if mode == "infer":
        step, args = infer_step(spec, model, batch)
        step.calls = lambda: [("forward", forward_kwargs(spec, batch))]
    elif mode == "train":
        step, args = train_step(spec, model, batch, **options)
        step.calls = lambda: [("forward with loss",
                               {"x": batch["x"]} if spec.kind == "vision" else batch)]
    else:
        step, args = decode_step(spec, model, batch, spec.shapes[size].new_tokens)
        step.calls = lambda: decode_calls(model, batch)
    step.model, step.mode = model, mode
    return step, args


def decode_calls(model: torch.nn.Module, batch: dict[str, torch.Tensor]
                 ) -> list[tuple[str, dict[str, Any]]]:
    """The two calls a decoding loop makes: the prompt, and one token with the prompt's cache
    (made eagerly here)."""
    prompt = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  use_cache=True)
    with torch.no_grad():
        cache = model(**prompt).past_key_values
    token = batch["input_ids"][:, -1:]
    mask = torch.cat([batch["attention_mask"], torch.ones_like(token)], dim=1)
    return [("prompt", prompt),
            ("a token with the cache", dict(input_ids=token, attention_mask=mask,
                                            past_key_values=cache, use_cache=True))]


def explain_capture(step: Callable[..., Any]) -> list[dict[str, Any]]:
    """What ember.explain makes of each call the step makes of its model: graphs, graph
    breaks and eager islands, with their reasons (JSON-ready, one dict per call)."""
    import ember

    found = []
    with torch.set_grad_enabled(step.mode == "train"):
        for label, keywords in step.calls():
            explained = ember.explain(step.model)(**keywords)
            found.append(dict(
                call=label, graphs=explained.graph_count, breaks=explained.graph_break_count,
                break_reasons=[_reason(r) for r in explained.break_reasons],
                # NOTE: `eager_islands` is newer than this code: absent means none reported
                islands=[str(i) for i in getattr(explained, "eager_islands", [])],
                ops=sum(explained.ops_per_graph), capture_s=explained.compile_seconds))
    return found


def _reason(reason: Any) -> str:
    """`transformers/utils/generic.py:1068 in forward: <why>`, site-packages cut off."""
    where = str(getattr(reason, "location", "") or "")
    where = where.split("site-packages/")[-1]
    why = getattr(reason, "reason", str(reason))
    return f"{where}: {why}" if where else str(why)


def describe(spec: ZooModel, mode: str, size: str, device: str | None = None) -> str:
    """`GPT-2 (transformers GPT2LMHeadModel), inference: batch 2 x 128 tokens`."""
    shape = spec.shapes[size]
    what = {"infer": "inference", "train": "training step (AdamW)",
            "decode": f"greedy decoding with a KV cache, {shape.new_tokens} tokens"}[mode]
    if spec.kind == "vision":
        data = f"batch {shape.batch} x {shape.image}x{shape.image}" + (
            " channels_last" if spec.channels_last else "")
    else:
        data = f"batch {shape.batch} x {shape.length} tokens" + (
            f" -> {shape.target}" if spec.kind == "seq2seq" else "")
        data += ", prompt" if mode == "decode" else ""
    device, dtype = placement(size, mode, device)
    precision = str(dtype).removeprefix("torch.")
    return f"{spec.title}, {what}: {data}; {device} {precision}"


def workload_name(spec: ZooModel, mode: str) -> str:
    return f"{spec.name}-{mode}"


def workloads() -> tuple[Any, ...]:
    """Every (model, mode) as a bench Workload (ember/bench/workloads.py), in zoo order."""
    from ember.bench.workloads import Workload

    found = []
    for spec in MODELS:
        for mode in spec.modes:
            # decoding must choose eager's tokens; fp32 logits and losses within rounding,
            # bf16 ones (CUDA) within bf16's
            exact = dict(rtol=0, atol=0)
            found.append(Workload(
                workload_name(spec, mode), f"{spec.title} {mode}",
                describe(spec, mode, "quick").split(":")[0],
                functools.partial(instantiate, spec, mode),
                {size: dict(size=size) for size in SIZES},
                exact if mode == "decode" else dict(rtol=1e-4, atol=1e-4),
                grad=mode == "train", compile_model=True,
                tolerances={"cuda": exact if mode == "decode" else dict(rtol=5e-2, atol=5e-2)}))
    return tuple(found)
