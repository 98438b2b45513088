"""Ember: a JIT compiler for PyTorch programs.

    torch.compile(model, backend="ember")   # ember's kernels behind Dynamo's capture
"""

from ember import config
from ember.backends import backend
from ember.torch_internals import register_dynamo_backend

register_dynamo_backend("ember", backend)

__all__ = ["backend", "config"]
__version__ = "0.1.0"
