"""Shape sweeps and decoding on the CPU (issue 18, stage 3): what one compile for a family of
shapes buys, eager against ember (the default, dynamic=None) against torch.compile (its
default, automatic dynamic), measured one after the other in one process.

--sweep: a pre-norm transformer block over 50 sequence lengths, first call included (each
length called once: the compiles are in the total), then the same 50 lengths again (steady
state). --decode: greedy decoding of a small GPT-2 (random weights) with its KV cache, a
first run (compiles included) and a second run (steady state), tokens per second, tokens
checked against eager's. --steady: the block at one length, ember static (dynamic=False)
against ember dynamic (sequence dim marked, first compiled at another length), alternated.
--training: the same comparison for a training step (forward, backward, SGD step; issue 18,
stage 5) of an MLP over a marked batch and of the block over a marked length.

    python3 -m ember.bench.dynamic_sweep [--sweep] [--decode] [--steady] [--training]
                                         [--no-inductor]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import ember
from ember.bench.harness import benchmark, wait_for_ember


class Block(nn.Module):
    """Pre-norm attention (causal mask built from the length) and an MLP."""

    def __init__(self, width: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (part.view(b, s, self.heads, -1).transpose(1, 2)
                   for part in self.qkv(self.norm1(x)).split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


def contenders(model: nn.Module, inductor: bool) -> dict[str, Callable]:
    found = {"eager": model, "ember": ember.compile(copy.deepcopy(model))}
    if inductor:
        import torch._dynamo

        torch._dynamo.reset()
        found["torch.compile"] = torch.compile(copy.deepcopy(model))
    return found


def sweep(lengths: range, inductor: bool) -> None:
    torch.manual_seed(0)
    model = Block().eval()
    inputs = [torch.randn(4, s, 64) for s in lengths]
    want = [model(x) for x in inputs]
    print(f"shape sweep: a transformer block (width 64, 4 heads, batch 4) over {len(lengths)} "
          f"sequence lengths ({lengths.start}..{lengths.stop - 1})")
    with torch.no_grad():
        for name, fn in contenders(model, inductor).items():
            started = time.perf_counter()
            for x, expected in zip(inputs, want):
                torch.testing.assert_close(fn(x), expected, rtol=1e-4, atol=1e-4)
            first = time.perf_counter() - started
            wait_for_ember()
            passes = []
            for _ in range(5):
                started = time.perf_counter()
                for x in inputs:
                    fn(x)
                passes.append(time.perf_counter() - started)
            again = statistics.median(passes)
            print(f"  {name:14s} first pass {first:7.2f} s   steady pass {again * 1e3:8.1f} ms"
                  f"{_compiles(fn)}")


def _compiles(fn: Any) -> str:
    forward = getattr(fn, "_compiled_forward", None)
    return f"   ({len(forward.records)} captures)" if forward is not None else ""


def gpt2() -> nn.Module:
    import transformers

    config = transformers.GPT2Config(vocab_size=512, n_positions=128, n_embd=64, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def greedy(model: Callable, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    mask = torch.ones_like(prompt)
    out = model(input_ids=prompt, attention_mask=mask, use_cache=True)
    chosen = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(steps - 1):
        mask = torch.cat([mask, torch.ones_like(chosen[-1])], 1)
        out = model(input_ids=chosen[-1], attention_mask=mask,
                    past_key_values=out.past_key_values, use_cache=True)
        chosen.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(chosen, 1)


def decode(steps: int, inductor: bool) -> None:
    model = gpt2()
    prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    print(f"decoding: GPT-2 (2 layers, width 64, random weights), prompt 8, {steps} tokens")
    with torch.no_grad():
        want = greedy(model, prompt, steps)
        for name, fn in contenders(model, inductor).items():
            started = time.perf_counter()
            first_tokens = greedy(fn, prompt, steps)
            first = time.perf_counter() - started
            wait_for_ember()
            runs = []
            for _ in range(5):  # (the median: the first runs after a compile vary most)
                started = time.perf_counter()
                tokens = greedy(fn, prompt, steps)
                runs.append(time.perf_counter() - started)
            same = torch.equal(first_tokens, want) and torch.equal(tokens, want)
            again = statistics.median(runs)
            print(f"  {name:14s} first run {first:7.2f} s   steady {again * 1e3:7.1f} ms "
                  f"({steps / again:7.0f} tokens/s)   eager's tokens: {same}{_compiles(fn)}")


def steady(length: int, rounds: int) -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, length, 64)
    static = ember.compile(copy.deepcopy(model), dynamic=False)
    dynamic = ember.compile(copy.deepcopy(model))
    with torch.no_grad():
        other = torch.randn(4, length + 5, 64)
        ember.mark_dynamic(other, 1)
        dynamic(other)
        static(x)
        dynamic(x)
        times: dict[str, list[float]] = {"static": [], "dynamic": []}
        for _ in range(rounds):
            for name, fn in (("static", static), ("dynamic", dynamic)):
                times[name].append(benchmark(fn, x, repeat=5, min_time=0.2).median)
    a, b = statistics.median(times["static"]), statistics.median(times["dynamic"])
    print(f"steady state, the block at length {length}: static {a * 1e6:.0f} us, dynamic "
          f"{b * 1e6:.0f} us ({b / a:.2f}x)")


def training_step(model: nn.Module, **options: Any) -> Callable:
    """A compiled SGD step of `model` on the mean square of its output."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return ember.compile(step, **options)


def training_steady(rounds: int) -> None:
    """A training step compiled statically against one compiled with the marked dim symbolic
    (first at another size), at the same shape, alternated."""
    mlp = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                        nn.Linear(256, 256))
    for name, model, shape, dim in (("mlp", mlp, (64, 256), 0),
                                    ("block", Block(), (4, 16, 64), 1),
                                    ("block", Block(), (4, 128, 64), 1)):
        torch.manual_seed(0)
        x = torch.randn(shape)
        static = training_step(copy.deepcopy(model), dynamic=False)
        dynamic = training_step(copy.deepcopy(model))
        other = torch.randn([n + 5 if d == dim else n for d, n in enumerate(shape)])
        ember.mark_dynamic(other, dim)
        dynamic(other)
        static(x)
        dynamic(x)
        wait_for_ember()
        # (one call of each in turn, many times, timed by the wall clock and by the CPU time
        # the process spent: on a machine shared past its cores a call's wall time is
        # mostly its waits for a core, the CPU time is its work; OMP_NUM_THREADS=1 for that)
        times: dict[str, list[float]] = {"static": [], "dynamic": []}
        work: dict[str, list[float]] = {"static": [], "dynamic": []}
        for _ in range(rounds * 40):
            for kind, fn in (("static", static), ("dynamic", dynamic)):
                started, cpu = time.perf_counter(), time.process_time()
                fn(x)
                work[kind].append(time.process_time() - cpu)
                times[kind].append(time.perf_counter() - started)
        a, b = statistics.median(times["static"]), statistics.median(times["dynamic"])
        cpu_a, cpu_b = statistics.median(work["static"]), statistics.median(work["dynamic"])
        print(f"steady state, a training step of the {name} at {list(shape)} (dim {dim} "
              f"symbolic): median wall static {a * 1e6:.0f} us, dynamic {b * 1e6:.0f} us "
              f"({b / a:.2f}x); median CPU time {cpu_a * 1e6:.0f} / {cpu_b * 1e6:.0f} us "
              f"({cpu_b / cpu_a:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--steady", action="store_true")
    parser.add_argument("--training", action="store_true")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-inductor", action="store_true", help="leave torch.compile out")
    options = parser.parse_args()
    everything = not (options.sweep or options.decode or options.steady or options.training)
    if options.sweep or everything:
        sweep(range(3, 53), not options.no_inductor)
    if options.decode or everything:
        decode(options.steps, not options.no_inductor)
    if options.steady or everything:
        for length in (16, 128):
            steady(length, options.rounds)
    if options.training or everything:
        training_steady(options.rounds)


if __name__ == "__main__":
    main()
