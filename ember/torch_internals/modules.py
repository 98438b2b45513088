"""nn.Module's call as torch runs it: the hook tables (a module's and the global ones) and the
guards on them, a forward set on the instance, calls routed to a compiled version
(nn.Module.compile's slot), and the wrappers torch puts around modules and optimizers
(DistributedDataParallel, an LR scheduler's step).
"""

from __future__ import annotations

import itertools
import operator
import weakref
from typing import Any

import torch
from torch.nn.modules import module as _module_module
from torch.utils.hooks import RemovableHandle


# -- hooks: what nn.Module's call runs around the forward ----------------------------------
def module_has_hooks(module: torch.nn.Module) -> bool:
    """Hooks on the module, or global module hooks, that calling forward would skip: forward
    hooks and pre-hooks, and backward hooks (nn.Module's call wraps the forward's inputs and
    outputs for them). (Every call of a compiled module asks: plain attribute reads.)"""
    return bool(module._forward_hooks or module._forward_pre_hooks or
                module._backward_hooks or module._backward_pre_hooks or
                _module_module._global_forward_hooks or
                _module_module._global_forward_pre_hooks or
                _module_module._global_backward_hooks or
                _module_module._global_backward_pre_hooks)


# The hook tables of a module, and the global ones, that decide what calling it runs: a
# capture that inlines a hooked module's call guards their keys (hook_tables_unchanged).
_MODULE_HOOK_TABLES = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                       "_forward_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_TABLES = ("_global_forward_pre_hooks", "_global_forward_hooks",
                       "_global_forward_hooks_with_kwargs", "_global_backward_hooks",
                       "_global_backward_pre_hooks")


def hooks_run_apart(module: torch.nn.Module) -> str | None:
    """Why a capture cannot inline this module's call as nn.Module's call runs it, with its
    hooks (None: it can, or there are none). Backward hooks wrap the forward's inputs and
    outputs in autograd functions of torch's; torch's own forward hooks (FSDP's all-gather
    and reshard, DDP's) talk to other processes. Both run as eager runs them, around the
    forward compiled on its own."""
    if module._backward_hooks or module._backward_pre_hooks or \
            _module_module._global_backward_hooks or _module_module._global_backward_pre_hooks:
        return "backward hooks"
    for hook in (*_module_module._global_forward_pre_hooks.values(),
                 *module._forward_pre_hooks.values(),
                 *_module_module._global_forward_hooks.values(),
                 *module._forward_hooks.values()):
        owner = getattr(hook, "__module__", None) or \
            getattr(getattr(hook, "__func__", None), "__module__", None) or ""
        if owner.split(".")[0] == "torch":
            return f"torch's own forward hooks ({getattr(hook, '__qualname__', hook)})"
    return None


def forward_hooks(module: torch.nn.Module) -> tuple[list, list]:
    """What nn.Module's call runs around the forward, in its order: the pre-hooks and the
    hooks, each as (table, hook id, hook, takes kwargs), globals first. (As _call_impl asks:
    a pre-hook takes kwargs by the module's table, even a global one.)"""
    pre = [(table, key, hook, key in module._forward_pre_hooks_with_kwargs)
           for table in (_module_module._global_forward_pre_hooks, module._forward_pre_hooks)
           for key, hook in table.items()]
    post = [(table, key, hook, key in module._forward_hooks_with_kwargs or
             key in _module_module._global_forward_hooks_with_kwargs)
            for table in (_module_module._global_forward_hooks, module._forward_hooks)
            for key, hook in table.items()]
    return pre, post


def hook_tables(module: torch.nn.Module | None) -> list[dict]:
    """The module's hook tables (None: the global ones)."""
    if module is None:
        return [getattr(_module_module, name) for name in _GLOBAL_HOOK_TABLES]
    return [getattr(module, name) for name in _MODULE_HOOK_TABLES]


def hook_tables_unchanged(handles_made: int, tables: list[dict], lengths: list[int],
                          keys: list[tuple]) -> bool:
    """Do the hook tables of the modules a capture inlined with their hooks still hold the
    hooks they held then? A guard: it runs on every call. Removing a hook shortens a table;
    registering one numbers a new handle, and only then are the keys compared.
    NOTE: a hook put into a table by hand, over an existing key, is not seen (as torch's
    own hooks API never does that)."""
    if list(map(len, tables)) != lengths:
        return False
    return RemovableHandle.next_id == handles_made or list(map(tuple, tables)) == keys


def instance_forward(module: torch.nn.Module) -> Any:
    """A `forward` set on the module instance (it shadows the class's: accelerate's and
    PEFT's wrappers, a user's monkeypatch), or None."""
    return module.__dict__.get("forward")


# -- calling a module: its forward, and routing its calls ----------------------------------
def call_with_forward(module: torch.nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
    """module(*args, **kwargs) with its hooks as they are (FSDP's all-gather before, its
    reshard after, a user's hooks) and `forward` run in place of the module's forward: the
    hooks read `module.forward`, so it is set on the instance for the call."""
    had = module.__dict__.get("forward")
    module.__dict__["forward"] = forward
    try:  # (_call_impl: not a call routed elsewhere by route_calls, which would come back)
        return module._call_impl(*args, **kwargs)
    finally:
        if had is None:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = had


def call_as_eager(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """module(*args, **kwargs) as eager runs it: hooks, the instance's forward — and not a
    call routed elsewhere by route_calls (which would come back here)."""
    return module._call_impl(*args, **kwargs)


def route_calls(module: torch.nn.Module, call: Any) -> None:
    """Calls of `module` (module(*args)) go to `call` (what nn.Module.compile() sets up)."""
    module.__dict__["_compiled_call_impl"] = call  # (a function: never a submodule)


def calls_routed(module: torch.nn.Module) -> bool:
    return module.__dict__.get("_compiled_call_impl") is not None


def is_distributed_data_parallel(module: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(module, DistributedDataParallel)


def scheduler_wrapped_optimizer(function: Any) -> torch.optim.Optimizer | None:
    """The optimizer whose `step` an LR scheduler replaced with `function`, else None.

    torch's LRScheduler wraps `optimizer.step` (an instance attribute, tagged
    `_wrapped_by_lr_sched`) to note that it ran; the optimizer is a weak reference in the
    wrapper's closure."""
    if not getattr(function, "_wrapped_by_lr_sched", False):
        return None
    for cell in getattr(function, "__closure__", None) or ():
        referent = cell.cell_contents
        if isinstance(referent, weakref.ref) and \
                isinstance(referent(), torch.optim.Optimizer):
            return referent()
    return None


def hooks_made() -> int:
    """How many hook handles torch has numbered so far (every register_*_hook makes one)."""
    return RemovableHandle.next_id


def modules_still_plain(handles_made: int, modules: list[torch.nn.Module],
                        instance_dicts: list[dict]) -> bool:
    """Are `modules` still called plainly — no hooks, no forward set on the instance — as
    when a capture inlined them? Torch numbers each hook's handle: while no hook was
    registered anywhere since, one comparison answers for hooks; else each module is looked
    at. (`instance_dicts`: the modules' __dict__s, looked up for "forward" in C.) A guard:
    it runs on every call."""
    if any(map(operator.contains, instance_dicts, itertools.repeat("forward"))):
        return False
    if RemovableHandle.next_id == handles_made:
        return True
    return not any(module_has_hooks(module) for module in modules)
