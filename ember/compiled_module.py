"""ember.compile(module): a CompiledModule wraps the module and compiles its class's forward
(ember/api.py's CompiledFunction, the module passed as `self`); hooks, DDP and FSDP-sharded
submodules run as eager runs them, around compiled parts."""

from __future__ import annotations

from typing import Any

import torch

from ember import api, logs, torch_internals
from ember.capture.module_calls import eager_fast_path
from ember.giving_up import dynamo_compiling


def compile_apart(module: torch.nn.Module, options: dict[str, Any], itself: bool = True
                  ) -> None:
    """Calls of `module` (made outside a graph, after a break) reach its compiled version; so
    do those of its submodules whose hooks a capture does not inline (FSDP's sharded parts:
    the module's own forward may break at the first and run the rest as Python, a loop over
    its layers)."""
    for part in module.modules():
        if part is module and not itself or \
                part is not module and torch_internals.hooks_run_apart(part) is None:
            continue
        if isinstance(part, CompiledModule) or torch_internals.calls_routed(part):
            continue
        torch_internals.route_calls(part, CompiledModule(part, **options).__call__)


class CompiledModule(torch.nn.Module):
    """ember.compile(module): the module's forward, compiled; the module's state stays its own
    (parameters, buffers and train/eval live in `_orig_mod`)."""

    def __init__(self, module: torch.nn.Module, **options: Any):
        super().__init__()
        self._orig_mod = module
        # (a submodule, so its state is the wrapper's; also in the instance's __dict__: read
        # on every call, where nn.Module's __getattr__, twice over, cost microseconds)
        object.__setattr__(self, "_orig_mod", module)
        self._wrapped: CompiledModule | None = None
        if torch_internals.is_distributed_data_parallel(module):
            # DDP's forward runs as it is (it prepares the gradient buckets, and autograd
            # runs its all-reduce hooks as gradients are made); the model inside is compiled,
            # and DDP's calls of it (module(*args)) reach the compiled version
            # (not registered as a submodule: state_dict and parameters stay the DDP's)
            object.__setattr__(self, "_wrapped", CompiledModule(module.module, **options))
            torch_internals.route_calls(module.module, self._wrapped.__call__)
            self._compiled_forward = self._wrapped._compiled_forward
        else:
            self._compiled_forward = api.CompiledFunction(type(module).forward, **options)
            # submodules with hooks a capture does not inline (FSDP-sharded blocks, backward
            # hooks) break the forward's graph where they are called: each is compiled on its
            # own, its hooks run around it
            compile_apart(module, options, itself=False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self._orig_mod
        if self._wrapped is not None:
            return module(*args, **kwargs)
        if torch_internals.instance_forward(module) is not None:
            # (a forward set on the instance shadows the class's: called as eager calls it,
            # hooks and all — before the hooks' path, which sets the instance's forward)
            return torch_internals.call_as_eager(module, args, kwargs)
        if torch_internals.module_has_hooks(module):
            # hooks (FSDP's all-gather and reshard, a user's) run as eager runs them, around
            # the compiled forward
            return torch_internals.call_with_forward(module, self._call_forward, args, kwargs)
        fast_path = eager_fast_path(module, args, kwargs, torch.is_grad_enabled())
        if fast_path is not None:
            logs.channel("fallbacks").info("%s runs eagerly: %s", type(module).__name__,
                                           fast_path)
            return torch_internals.call_as_eager(module, args, kwargs)
        return self._compiled_forward(module, *args, **kwargs)

    def _call_forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled_forward(self._orig_mod, *args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Ahead of time: the module's forward captured for these arguments (ember/aot.py)."""
        from ember import aot

        return aot.lower(self._compiled_forward, args, kwargs, prefix=(self._orig_mod,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if dynamo_compiling():  # (torch.compile traces the module itself)
            return self._orig_mod(*args, **kwargs)
        if self._forward_hooks or self._forward_pre_hooks:
            return super().__call__(*args, **kwargs)
        forward = self._compiled_forward
        if forward.direct is not None and torch.is_grad_enabled() in forward.direct_modes:
            # (its forward runs eagerly for good: the module is called as eager calls it)
            return torch_internals.call_as_eager(self._orig_mod, args, kwargs)
        return self.forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig_mod, name)
