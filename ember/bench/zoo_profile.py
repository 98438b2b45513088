"""Where a zoo model's time goes on CUDA, eager against ember: the top kernels by device time
under torch.profiler (ten calls after warm-up). python3 -m ember.bench.zoo_profile resnet50"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import ember
from ember.bench import zoo


def main() -> None:
    for name in sys.argv[1:]:
        spec = zoo.find(name)
        for variant in ("eager", "ember"):
            step, args = zoo.instantiate(spec, "infer", "full", "cuda")
            if variant == "ember":
                step.model_slot[0] = ember.compile(step.model)
            with torch.no_grad():
                for _ in range(3):
                    step(*args)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    for _ in range(10):
                        step(*args)
                    torch.cuda.synchronize()
            print(f"== {name} {variant}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14,
                                            max_name_column_width=70))


if __name__ == "__main__":
    main()
