"""Ember: a JIT compiler for PyTorch programs.

    torch.compile(model, backend="ember")   # ember's kernels behind Dynamo's capture
    ember.benchmark(fn, x, desc="compiled")  # warm-up, device sync, median: 0.15 ms/call
"""

from ember import config
from ember.backends import backend
from ember.bench.harness import benchmark
from ember.torch_internals import register_dynamo_backend

register_dynamo_backend("ember", backend)

__all__ = ["backend", "benchmark", "config"]
__version__ = "0.1.0"
