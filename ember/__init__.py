"""Ember: a JIT compiler for PyTorch programs.

    fast = ember.compile(model_or_fn)          # ember's own bytecode capture + kernels
    torch.compile(model, backend="ember")      # ember's kernels behind Dynamo's capture
    ember.explain(fn)(*args)                   # graphs, breaks and their reasons, guards
    ember.set_stance("force_eager")            # as torch.compiler.set_stance (which acts too)
    ember.benchmark(fn, x, desc="compiled")    # warm-up, device sync, median: 0.15 ms/call
    ember.export(model, x).save(path)          # a program a fresh process runs: ember.load
"""

from typing import Any

from ember import config, stances
from ember.api import compile, graph_break, reset
from ember.capture.symbols import mark_dynamic, mark_static
from ember.options import list_mode_options
from ember.stances import RecompileError, set_stance
from ember.torch_internals import register_dynamo_backend

# NOTE: `import ember` imports what a compiled function's call needs when it starts warm
# (ember/warm_entries.py); these are imported at their first use (the compiler, the capture,
# the benchmark harness, export): a module attribute looked up here.
_LATER = {"backend": "ember.backends", "benchmark": "ember.bench.harness",
          "explain": "ember.explanation", "export": "ember.exported",
          "load": "ember.exported_file"}


def __getattr__(name: str) -> Any:
    if name in _LATER:
        import importlib

        value = getattr(importlib.import_module(_LATER[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ember' has no attribute {name!r}")


def _backend(gm: Any, example_inputs: list[Any], *, mode: str | None = None,
             options: dict[str, Any] | None = None) -> Any:
    """torch.compile's backend "ember" (ember/backends.py, imported at its first graph)."""
    from ember.backends import backend as compile_graph

    return compile_graph(gm, example_inputs, mode=mode, options=options)


register_dynamo_backend("ember", _backend)
stances._chain_reset()  # (torch.compiler.reset() forgets ember's compiled versions too)


def cache_info() -> dict:
    """What the disk cache (EMBER_CACHE_DIR) holds: its folder, size and cap, and per kind of
    entry (c: kernel libraries, warm: compiled graphs for a warm start, function: functions'
    entries for a warm start before capture) the entries, bytes and last use.
    `python -m ember cache [--clear]` prints it (and empties the cache)."""
    from ember.runtime import warm_cache
    from ember.runtime.disk_cache import cache_info as info

    warm_cache.finish_keeps()  # (what is being kept is counted)
    return info()


__all__ = ["backend", "benchmark", "cache_info", "compile", "config", "explain", "export",
           "graph_break", "list_mode_options", "load", "mark_dynamic", "mark_static",
           "RecompileError", "reset", "set_stance"]
__version__ = "0.1.0"
