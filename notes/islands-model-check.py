"""timm models in channels_last, eager vs ember: does any graph run eagerly or keep an eager
island (EMBER_LOGS=fallbacks shows why), do the results match, and how fast is each.
python notes/islands-model-check.py cuda resnet50,convnext_atto,efficientnet_b0 [batch] [size]
"""

import sys
import time

import timm
import torch

import ember
from ember.backends import backend

device, names = sys.argv[1], sys.argv[2].split(",")
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 8
size = int(sys.argv[4]) if len(sys.argv) > 4 else 224
for name in names:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10).eval().to(device)
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    made = []

    def recording(gm, example_inputs, made=made):
        made.append(backend(gm, example_inputs))
        return made[-1]

    with torch.no_grad():
        compiled = ember.compile(model, backend=recording)
        start = time.perf_counter()
        got = compiled(x)
        first = time.perf_counter() - start
        error = (got - model(x)).abs().max().item()
        kinds = [type(g).__name__ for g in made]
        islands = [i for g in made for i in getattr(g, "islands", [])]
        eager = ember.benchmark(model, x, min_time=0.3).median * 1e3
        ours = ember.benchmark(compiled, x, min_time=0.3).median * 1e3
    print(f"{name} {device} batch {batch}x{size}: graphs {kinds}, islands {islands}, "
          f"max err {error:.2e}, first call {first:.2f} s, eager {eager:.3f} ms, "
          f"ember {ours:.3f} ms", flush=True)
