"""Dynamic shapes, stage 3 (issue 18): views, slices, cat, flip, arange and attention over
symbolic sizes on the C and Triton backends, and greedy decoding with a growing KV cache.
Every call is compared with eager; builds are counted on EMBER_LOGS=kernels, captures on
records."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.shapes import ShapeSpecialized


def t(*shape, seed=0):
    # drawn on the CPU (a seeded CPU generator), then placed where tests make tensors (the
    # GPU under EMBER_TEST_DEVICE=cuda)
    drawn = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), device="cpu")
    return drawn.to(torch.get_default_device())


def forward_of(compiled):
    return getattr(compiled, "_compiled_forward", compiled)


def compiled_once(compiled):
    records = forward_of(compiled).records
    assert len(records) == 1 and not isinstance(records[0].compiled, ShapeSpecialized), \
        getattr(records[0].compiled, "reason", "")


# (function, its inputs at size n[, the dims marked dynamic per input]): without marks every
# dim of every input is a symbol (dynamic=True)
CASES = {
    "transpose": (lambda x: x.t() * 2, lambda n: (t(n, 5, seed=n),)),
    "sum_inner": (lambda x: (x * 2).sum(1), lambda n: (t(3, n, seed=n),)),
    "reshape_flat": (lambda x: x.reshape(-1) * 2 + 1, lambda n: (t(n, 6, seed=n),)),
    "heads": (lambda x: x.view(x.shape[0], x.shape[1], 2, -1).transpose(1, 2).exp(),
              lambda n: (t(n, n + 1, 8, seed=n),), [(0, 1)]),
    "slice_from_one": (lambda x: x[1:] * 2, lambda n: (t(n, 4, seed=n),)),
    "slice_to_last": (lambda x: x[:, :-1] - x[:, 1:], lambda n: (t(3, n, seed=n),)),
    "select_first": (lambda x: x[0] * 2, lambda n: (t(n, 4, seed=n),)),
    "select_column": (lambda x: x[:, 0] + x[:, -1], lambda n: (t(n, 4, seed=n),)),
    "cat_rows": (lambda x, y: torch.cat([x, y], 0) * 2, lambda n: (t(n, 4, seed=n), t(3, 4))),
    "cat_cache": (lambda k, new: torch.cat([k, new], 2).sum(-1),
                  lambda n: (t(2, 3, n, 4, seed=n), t(2, 3, 1, 4))),
    "flip": (lambda x: x.flip(0) + x, lambda n: (t(n, 4, seed=n),)),
    "arange": (lambda x: x + torch.arange(x.shape[0]), lambda n: (t(n, seed=n),)),
    "arange_from": (lambda x: x * torch.arange(x.shape[0], 2 * x.shape[0]),
                    lambda n: (t(n, seed=n),)),
    "expand": (lambda x, y: y.expand(x.shape[0], x.shape[1]) * x,
               lambda n: (t(n, n + 1, seed=n), t(1, n + 1))),
    # padded by an amount computed from a symbolic size: constant_pad_nd's C++ kernel refuses
    # symbols (transformers' attention masks on CUDA); torch's Python meta kernel takes them
    "pad_by_size": (lambda x: F.pad(x, (1, x.shape[0]), value=1.5) * 2,
                    lambda n: (t(n, 3, seed=n),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_view_over_symbolic_sizes_builds_once(name, kernel_backend, builds):
    fn, make, *marks = CASES[name]
    compiled = ember.compile(fn, dynamic=None if marks else True)
    for n in (3, 5, 9, 16):
        args = make(n)
        for tensor, dims in zip(args, marks[0] if marks else ()):
            for dim in dims:
                ember.mark_dynamic(tensor, dim)
        torch.testing.assert_close(compiled(*args), fn(*args))
    compiled_once(compiled)
    assert len(builds()) == 1, builds()


class Block(nn.Module):
    """A pre-norm transformer block: causal attention written out, then an MLP."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                 nn.Linear(2 * width, width))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (part.view(b, s, self.heads, -1).transpose(1, 2)
                   for part in self.qkv(self.norm1(x)).split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


@pytest.mark.slow_in_interpreter
def test_an_attention_block_over_fifty_sequence_lengths_compiles_twice(kernel_backend, builds):
    # the first call compiles statically, the first recompile makes the length a symbol
    torch.manual_seed(0)
    block = Block().eval()
    compiled = ember.compile(block)
    with torch.no_grad():
        for s in range(3, 53):  # (batch 4: the symbolic compile, at length 4, must not pin
            x = t(4, s, 16, seed=s)  # the length to the batch's value)
            torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-4)
    records = forward_of(compiled).records
    assert len(records) == 2 and not isinstance(records[1].compiled, ShapeSpecialized)
    assert len(builds()) == 2, builds()


def test_value_linking_leaves_unrelated_equal_sizes_correct(kernel_backend):
    # a source first seen in the recompile whose size equals the changed one's becomes a
    # symbol too (decoding's cache); where that link is false the answer is still eager's

    def fn(x, extra=None):
        return x * 2 if extra is None else x.sum(0) + extra.sum(0)

    compiled = ember.compile(fn)
    torch.testing.assert_close(compiled(t(7, 3)), fn(t(7, 3)))
    for n in (8, 9, 10):  # (extra's 7 rows are linked to x's old 7: a symbol, never wrong)
        args = (t(n, 3, seed=n), t(7, 3, seed=n + 1))
        torch.testing.assert_close(compiled(*args), fn(*args))
    args = (t(11, 3), t(4, 3))
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert len(compiled.records) <= 3


def gpt2():
    transformers = pytest.importorskip("transformers")
    config_ = transformers.GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2,
                                      n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config_).eval()


def greedy(model, prompt, steps):
    """Greedy decoding as users write it: the prompt, then a token a call with the cache."""
    mask = torch.ones_like(prompt)
    out = model(input_ids=prompt, attention_mask=mask, use_cache=True)
    chosen = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(steps - 1):
        mask = torch.cat([mask, torch.ones_like(chosen[-1])], 1)
        out = model(input_ids=chosen[-1], attention_mask=mask,
                    past_key_values=out.past_key_values, use_cache=True)
        chosen.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(chosen, 1)


@pytest.mark.slow_in_interpreter
def test_gpt2_greedy_decoding_compiles_twice_over_32_steps(kernel_backend, builds):
    # prompt (static), then the first step with the cache's length a symbol (it is linked to
    # the attention mask's, which grew): every later step, and a second run with a new
    # cache, hits that compile
    model = gpt2()
    prompt = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(1),
                           device="cpu").to(torch.get_default_device())
    compiled = ember.compile(model)
    with torch.no_grad():
        want = greedy(model, prompt, 32)
        assert torch.equal(greedy(compiled, prompt, 32), want)
        assert torch.equal(greedy(compiled, prompt, 32), want)
    records = forward_of(compiled).records
    assert len(records) == 2, [type(r.compiled).__name__ for r in records]
    assert not isinstance(records[1].compiled, ShapeSpecialized)
    assert any(entry.captured.symbolic for entry in forward_of(compiled).entries)
    assert len(builds()) == 2, builds()
