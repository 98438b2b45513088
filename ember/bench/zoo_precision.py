"""MobileNetV3 on CUDA, ember against eager in float32 and bfloat16 (the bench's bf16 check
failed on 22% of the logits): a wrong answer or bf16 rounding? Also torch.compile's error.

    python3 -m ember.bench.zoo_precision [--bisect]

--bisect compiles growing prefixes of the network (stem, then each stage of blocks, then the
head) and prints each prefix's error against a float64 run of the same weights: where ember's
error leaves eager's is the layer to look at.
"""
import argparse
import copy

import torch

import ember
from ember.bench import zoo


def whole_model() -> None:
    spec = zoo.find("mobilenetv3")
    for dtype in (torch.float32, torch.bfloat16):
        step, args = zoo.instantiate(spec, "infer", "full", "cuda", dtype)
        with torch.no_grad():
            expected = step(*args).float()
            step.model_slot[0] = ember.compile(step.model)
            got = step(*args).float()
            double, dargs = zoo.instantiate(spec, "infer", "full", "cuda", torch.float64)
            reference = double(*dargs).float()
        print(dtype, "ember-eager", (got - expected).abs().max().item(),
              "eager-fp64", (expected - reference).abs().max().item(),
              "ember-fp64", (got - reference).abs().max().item(),
              "scale", reference.abs().max().item())


def prefixes(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    stem = [model.conv_stem, model.bn1]
    found = []
    for stage in range(len(model.blocks)):
        for block in range(len(model.blocks[stage])):
            layers = stem + [model.blocks[s] for s in range(stage)] + \
                [model.blocks[stage][b] for b in range(block + 1)]
            found.append((f"blocks.{stage}.{block}", torch.nn.Sequential(*layers)))
    head = [model.global_pool, model.conv_head, model.norm_head, model.act2]
    found.append(("head", torch.nn.Sequential(*stem, model.blocks, *head)))
    return found


def bisect(size: str, device: str) -> None:
    spec = zoo.find("mobilenetv3")
    step, (x,) = zoo.instantiate(spec, "infer", size, device, torch.bfloat16)
    model = step.model
    double = copy.deepcopy(model).double()
    with torch.no_grad():
        for (name, prefix), (_, reference_prefix) in zip(prefixes(model), prefixes(double)):
            expected = prefix(x).float()
            got = ember.compile(prefix)(x).float()
            reference = reference_prefix(x.double()).float()
            scale = reference.abs().max().item()
            print(f"{name:12s} ember-eager {(got - expected).abs().max().item():.4g} "
                  f"eager-fp64 {(expected - reference).abs().max().item():.4g} "
                  f"ember-fp64 {(got - reference).abs().max().item():.4g} scale {scale:.4g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bisect", action="store_true")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda")
    options = parser.parse_args()
    bisect(options.size, options.device) if options.bisect else whole_model()


if __name__ == "__main__":
    main()
