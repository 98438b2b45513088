"""One layer's kernels under several tile heuristics, in one process, timed in interleaved
rounds: the quick A/B of a tiling change before the zoo's (ember/bench/zoo_ab.py takes the
same `ember:tile.field=value` variants over whole models, minutes of compiling each).

    python3 -m ember.bench.tile_ab [--cases bn_train,bias_grad] \\
        --variants tc,ember,ember:tile.column_xblock=128,ember:tile.column_rblock=16

The cases (fp32 on CUDA, batch 32; `--device cpu` for a look at tiny sizes):
- bn_train: a ResNet-50 batch norm's training forward and backward (from a channels-last
  gradient) on a channels-last [32, 256, 56, 56] activation (statistics, normalize, both
  parameters' gradients and the input's): column reductions over 100352 rows of 256
  channels, split;
- bn_relu_train: the same followed by a ReLU, as the model has it;
- bias_grad: a Linear's bias gradient and a LayerNorm's over [8192, 768] (columns, short);
- row_softmax: a softmax over [4096, 8192] rows (for contrast: a row reduction).

Per case and variant: the median of the rounds' ms per call, the spread, the ratio to the
first variant, the effective bandwidth (the case's inputs read once and its outputs written
once, over the time: a floor on what the kernels move) and the largest difference of the
first answer (every output and gradient) from eager's.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

import ember
from ember.bench.harness import wait_for_ember
from ember.bench.zoo_ab import compiling_as, interleaved, synchronizer, variants_of


@dataclasses.dataclass
class Case:
    fn: Callable
    inputs: Callable[[str], list[torch.Tensor]]   # device -> fresh inputs
    backward: bool                                 # the step also backpropagates a sum


def _image(device: str, shape=(32, 256, 56, 56)) -> list[torch.Tensor]:
    if device == "cpu":
        shape = (2, shape[1] // 8, 14, 14)
    x = torch.randn(shape, device=device).to(memory_format=torch.channels_last)
    weight = torch.rand(shape[1], device=device) + 0.5
    bias = torch.randn(shape[1], device=device)
    return [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()]


def _rows(device: str, shape: tuple[int, int]) -> list[torch.Tensor]:
    if device == "cpu":
        shape = (shape[0] // 64, shape[1] // 8)
    return [torch.randn(shape, device=device, requires_grad=True)]


CASES = {
    "bn_train": Case(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                     _image, True),
    "bn_relu_train": Case(lambda x, w, b: F.relu(F.batch_norm(x, None, None, w, b,
                                                              training=True)),
                          _image, True),
    "bias_grad": Case(lambda x: F.layer_norm(x, x.shape[-1:]) + x.sum(0),
                      lambda device: _rows(device, (8192, 768)), True),
    "row_softmax": Case(lambda x: F.softmax(x, -1),
                        lambda device: _rows(device, (4096, 8192)), False),
}


def _step(fn: Callable, case: Case, inputs: list[torch.Tensor]) -> Callable:
    """A call of fn, and its backward from a random gradient laid out as the output (as a
    model's next layer hands it back: channels-last after a channels-last convolution)."""
    gradient = []

    def run():
        out = fn(*inputs)
        if not case.backward:
            return [out]
        if not gradient:
            generator = torch.Generator(out.device).manual_seed(1)
            gradient.append(torch.randn(out.shape, generator=generator, device=out.device)
                            .to(memory_format=torch.channels_last if out.dim() == 4
                                else torch.contiguous_format))
        grads = torch.autograd.grad(out, inputs, gradient[0])
        return [out, *grads]
    return run


def _compiled(case: Case, variant: str) -> Callable:
    if variant == "eager":
        return case.fn
    if variant == "tc":
        return torch.compile(case.fn)
    return ember.compile(case.fn)


def compare(name: str, variants: list[str], rounds: int, calls: int, device: str) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    inputs = case.inputs(device)
    steps, answers = {}, {}
    for variant in variants:
        with compiling_as(variant):
            steps[variant] = _step(_compiled(case, variant), case, inputs)
            steps[variant]()
            wait_for_ember()  # (a first call may have run eagerly beside the kernels' build)
            answers[variant] = steps[variant]()
    reference = _step(case.fn, case, inputs)()
    moved = sum(t.numel() * t.element_size() for t in inputs + reference)
    times = interleaved(steps, rounds, calls, synchronizer(device))
    base = statistics.median(times[variants[0]])
    print(f"== {name} ({device}): {rounds} rounds of {calls} calls; {moved / 1e6:.0f} MB "
          f"in and out", flush=True)
    for variant in variants:
        median = statistics.median(times[variant])
        difference = max((a.float() - b.float()).abs().max().item()
                         for a, b in zip(answers[variant], reference))
        print(f"  {variant:<48} {median:8.3f} ms  ({min(times[variant]):.3f}-"
              f"{max(times[variant]):.3f})  x{median / base:5.2f}  "
              f"{moved / median / 1e6:6.0f} GB/s  diff {difference:.3g}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="bn_train,bias_grad")
    parser.add_argument("--variants", default="eager,tc,ember")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    options = parser.parse_args()
    for name in options.cases.split(","):
        compare(name, variants_of(options.variants), options.rounds, options.calls,
                options.device)


if __name__ == "__main__":
    main()
