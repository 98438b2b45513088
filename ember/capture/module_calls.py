"""Calls of nn.Modules during capture: the forward inlined, with the module's forward hooks
and pre-hooks as nn.Module's call runs them (their tables guarded), hooks the captured code
registers, and nn.Module's walks of its tree. What cannot be inlined — DDP, backward hooks,
torch's own hooks — is `Unsupported`, and the module is compiled apart (ember/api.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_internals
from ember.capture import semantics
from ember.capture.calls import call_value
from ember.capture.errors import Unsupported
from ember.capture.sources import AttrSource, ItemSource
from ember.capture.values import (
    Const,
    DictValue,
    HookHandleValue,
    IteratorValue,
    ModuleValue,
    SequenceValue,
    Value,
)

if TYPE_CHECKING:
    from ember.capture.interpreter import Frame
    from ember.capture.session import Session


def call_module(session: Session, module_value: ModuleValue, args: list[Value],
                kwargs: dict[str, Value], parent: Frame | None) -> Value:
    module = module_value.value
    if isinstance(module, torch.jit.ScriptModule):  # (scripted or traced: no Python forward)
        raise Unsupported(f"{type(module).__name__} is a TorchScript module: it runs "
                          "natively, outside the graph",
                          "compile the Python module instead of its scripted or traced form")
    if torch_internals.is_distributed_data_parallel(module):
        session.compile_apart.append(module.module)
        raise Unsupported("DistributedDataParallel's forward runs outside the graph (it readies "
                          "the gradient buckets that autograd's hooks all-reduce); the model "
                          "inside is compiled on its own", "expected with DDP")
    apart = torch_internals.hooks_run_apart(module)
    if apart is not None:
        session.compile_apart.append(module)
        raise Unsupported(f"{type(module).__name__} has {apart}: they run outside the "
                          f"graph, around its forward, which is compiled on its own",
                          "expected for FSDP-sharded modules; else remove the hooks")
    if torch_internals.module_has_hooks(module) or _registered_hooks(session, module, "pre") \
            or _registered_hooks(session, module, "post"):
        try:
            return _call_with_hooks(session, module_value, args, kwargs, parent)
        except Unsupported:
            # (the call runs natively at the break: its hooks as eager runs them, around
            # its forward compiled on its own)
            session.compile_apart.append(module)
            raise
    fast_path = eager_fast_path(module, args, kwargs, session.grad_enabled)
    if fast_path is not None:
        raise Unsupported(fast_path, "expected: eager's result differs from the traced path's")
    if type(module) is torch.nn.TransformerEncoder:  # (eager_fast_path read it unguarded)
        session.identity_reads.append("nn.TransformerEncoder's choice of eager's path")
    if id(module) not in session.inlined_ids:  # (once: a loop inlines a module many times)
        session.inlined_ids.add(id(module))
        session.inlined_modules.append(module)
    return _call_forward(session, module_value, args, kwargs, parent)


def _call_forward(session: Session, module_value: ModuleValue, args: list[Value],
                  kwargs: dict[str, Value], parent: Frame | None) -> Value:
    """The module's forward, inlined: a forward set on the instance, else the class's."""
    module = module_value.value
    if not session.plain_guarded:
        # one guard for every module the capture inlines: a hook registered on one of them
        # later must reach the next call (the lists fill as the capture goes on)
        session.plain_guarded = True
        session.guard_answer(
            torch_internals.modules_still_plain,
            (torch_internals.hooks_made(), session.constant_source(session.inlined_modules),
             session.constant_source(session.inlined_dicts)), True,
            "a hook, or a forward, was set on a module the compiled code calls")
    own = torch_internals.instance_forward(module)
    if own is not None:  # (a forward set on the instance — what nn.Module's call runs —
        # guarded through the source it is read by)
        source = AttrSource(module_value.source, "forward") if module_value.source else None
        return call_value(session, session.wrap(own, source), list(args), kwargs, parent)
    if id(module.__dict__) not in session.inlined_ids:
        session.inlined_ids.add(id(module.__dict__))
        session.inlined_dicts.append(module.__dict__)
    forward = type(module).forward
    function = session.wrap(forward, None, guard=False)
    return call_value(session, function, [module_value, *args], kwargs, parent)


def _call_with_hooks(session: Session, module_value: ModuleValue, args: list[Value],
                     kwargs: dict[str, Value], parent: Frame | None) -> Value:
    """`module(*args, **kwargs)` inlined as nn.Module's call runs it: the forward pre-hooks
    (which may replace the arguments), the forward, the forward hooks (which may replace the
    result), globals first. The hooks are Python like any other: what they change is a side
    effect of the capture. (Always-called hooks differ only when the forward raises, which
    no capture does: it breaks, and the call runs natively.)"""
    module = module_value.value
    _guard_hook_tables(session, module)
    pre, post = _hooks_in_order(session, module_value)
    arguments: Value = SequenceValue(list(args), tuple)
    keywords: Value = DictValue(dict(kwargs))
    for callee, with_kwargs in pre:
        if with_kwargs:
            answer = call_value(session, callee, [module_value, arguments, keywords], {},
                                parent)
            if not _is_none(answer):
                parts = semantics.unpack(session, answer) if _is_tuple(answer) else []
                if len(parts) != 2:
                    raise Unsupported("a forward pre-hook with kwargs returned neither None "
                                      "nor (args, kwargs)", "eager raises RuntimeError here")
                arguments, keywords = parts
        else:
            answer = call_value(session, callee, [module_value, arguments], {}, parent)
            if not _is_none(answer):
                arguments = answer if _is_tuple(answer) else SequenceValue([answer], tuple)
    if not isinstance(keywords, DictValue):
        raise Unsupported(f"a forward pre-hook's keyword arguments are {keywords.describe()}")
    positional = semantics.unpack(session, arguments)
    fast_path = eager_fast_path(module, positional, keywords.items, session.grad_enabled)
    if fast_path is not None:
        raise Unsupported(fast_path, "expected: eager's result differs from the traced path's")
    result = _call_forward(session, module_value, positional, dict(keywords.items), parent)
    for callee, with_kwargs in post:
        operands = [module_value, arguments, keywords, result] if with_kwargs else \
            [module_value, arguments, result]
        answer = call_value(session, callee, operands, {}, parent)
        if not _is_none(answer):
            result = answer
    return result


# nn.Module's registrations of forward hooks and pre-hooks: which kind, and their flags
HOOK_REGISTRATIONS = {
    torch.nn.Module.register_forward_pre_hook: ("pre", ("prepend", "with_kwargs")),
    torch.nn.Module.register_forward_hook: ("post", ("always_call", "prepend", "with_kwargs")),
}


def register_hook(session: Session, function: Any, args: list[Value],
                   kwargs: dict[str, Value]) -> Value:
    """`module.register_forward_hook(hook, ...)` (or a pre-hook) in captured code: a side
    effect, made for real when the effects are replayed; the rest of the capture calls the
    module with the hook. (transformers installs its output-recording hooks so, on the first
    call that asks for hidden states or attentions.)"""
    kind, names = HOOK_REGISTRATIONS[function]
    module, *rest = args
    if len(rest) + ("hook" in kwargs) != 1 or set(kwargs) - {*names, "hook"} or \
            not all(isinstance(v, Const) for k, v in kwargs.items() if k != "hook"):
        raise Unsupported(f"{function.__name__} with arguments other than the hook and its "
                          "flags as constants")
    hook = rest[0] if rest else kwargs["hook"]
    flags = {name: bool(kwargs[name].value) if name in kwargs else False for name in names}
    if torch_internals.hooks_run_apart(module.value) is not None:
        raise Unsupported(f"{function.__name__} on a module whose hooks run apart")
    handle = HookHandleValue()
    session.side_effects.register_hook(module, kind, hook, flags,
                                       functools.partial(_register_for_real, function), handle)
    return handle


def _register_for_real(function: Any, module: torch.nn.Module, hook: Any, *flags: bool
                       ) -> Any:
    """The replay of _register_hook (flags by name, sorted): the hook's handle."""
    names = sorted(HOOK_REGISTRATIONS[function][1])
    return function(module, hook, **dict(zip(names, flags)))


def _hooks_in_order(session: Session, module_value: ModuleValue
                    ) -> tuple[list[tuple[Value, bool]], list[tuple[Value, bool]]]:
    """The pre-hooks and the hooks the call runs, in order, as (hook, takes kwargs): the
    global ones, then the module's, with those the captured code registered put where
    registering puts them (at the end, or first where it asked to prepend)."""
    module = module_value.value
    found = []
    for kind, hooks in zip(("pre", "post"), torch_internals.forward_hooks(module)):
        global_, own = [], []
        for table, key, hook, with_kwargs in hooks:
            entry = (_hook_value(session, module_value, table, key, hook), with_kwargs)
            (own if table is getattr(module, _HOOK_TABLE[kind]) else global_).append(entry)
        for hook, with_kwargs, prepend in _registered_hooks(session, module, kind):
            if prepend:
                own.insert(0, (hook, with_kwargs))
            else:
                own.append((hook, with_kwargs))
        found.append(global_ + own)
    return found[0], found[1]


_HOOK_TABLE = {"pre": "_forward_pre_hooks", "post": "_forward_hooks"}


def _registered_hooks(session: Session, module: torch.nn.Module, kind: str) -> tuple:
    return session.side_effects.hooks.get((id(module), kind), ())


def _guard_hook_tables(session: Session, module: torch.nn.Module) -> None:
    """Guard that the module's hook tables, and the global ones, keep the hooks the capture
    inlined: one guard for all of a capture's hooked modules (its lists fill as it goes on)."""
    if not session.hooked_modules:
        session.guard_answer(
            torch_internals.hook_tables_unchanged,
            (torch_internals.hooks_made(), session.constant_source(session.hook_tables),
             session.constant_source(session.hook_lengths),
             session.constant_source(session.hook_keys)), True,
            "a hook was added to, or removed from, a module the compiled code calls with "
            "its hooks (or a global module hook changed)")
        _note_hook_tables(session, torch_internals.hook_tables(None))
    if any(known is module for known in session.hooked_modules):
        return
    session.hooked_modules.append(module)
    _note_hook_tables(session, torch_internals.hook_tables(module))


def _note_hook_tables(session: Session, tables: list[dict]) -> None:
    session.hook_tables.extend(tables)
    session.hook_lengths.extend(len(table) for table in tables)
    session.hook_keys.extend(tuple(table) for table in tables)


def _hook_value(session: Session, module_value: ModuleValue, table: dict, key: int,
                hook: Any) -> Value:
    """A hook as a tracked value, read through its table (so that what the hook reads from
    its closure or its object is guarded through it); the hook itself is pinned by the
    tables' guard, not by one of its own."""
    name = next((name for name in _HOOK_TABLE.values()
                 if table is getattr(module_value.value, name)), None)
    if name is not None and module_value.source is not None:
        owner = AttrSource(module_value.source, name)
    else:
        owner = session.constant_source(table)
    return session.wrap(hook, ItemSource(owner, key), guard=False)


def _is_none(value: Value) -> bool:
    return isinstance(value, Const) and value.value is None


def _is_tuple(value: Value) -> bool:
    return isinstance(value, SequenceValue) and value.kind is tuple or \
        isinstance(value, Const) and type(value.value) is tuple


def eager_fast_path(module: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any],
                    grad_enabled: bool) -> str | None:
    """Why `module(*args, **kwargs)` must run as eager runs it, or None. (Arguments: values
    or tracked values; `grad_enabled`: the grad mode the call meets, the captured code's.)
    nn.TransformerEncoder in eval with a padding mask runs its layers on a nested tensor,
    whose padded positions come out 0 — a path chosen from the mask's data, and skipped
    where torch.compiler.is_compiling(), which capture answers True."""
    if type(module) is not torch.nn.TransformerEncoder or \
            not getattr(module, "use_nested_tensor", False) or module.layers[0].training:
        return None
    mask = kwargs.get("src_key_padding_mask", args[2] if len(args) > 2 else None)
    if mask is None or (isinstance(mask, Const) and mask.value is None):
        return None
    if grad_enabled and any(p.requires_grad for p in module.parameters()):
        return None  # (eager's slow path too)
    return ("nn.TransformerEncoder with a padding mask in eval runs eager's nested-tensor "
            "path (its padded positions come out 0)")


def module_method(session: Session, receiver: ModuleValue, method: Any, args: list[Value],
                  kwargs: dict[str, Value]) -> Value | None:
    """What nn.Module's own methods that ember answers without running them give (its walks,
    a `to` that changes nothing), or None: the method is run as code."""
    walk = MODULE_WALKS.get(method)
    if walk is not None:
        return walk_module(session, receiver, walk, args, kwargs)
    if method is torch.nn.Module.to and cast_changes_nothing(session, receiver, args, kwargs):
        return receiver
    return None


def cast_changes_nothing(session: Session, receiver: ModuleValue, args: list[Value],
                         kwargs: dict[str, Value]) -> bool:
    """Does `module.to(...)` leave every parameter and buffer as it is (a router cast to the
    dtype it has, each call)? Then the call is the module itself: nn.Module.to's _apply reads
    each parameter's gradient and sets its .data, which a graph cannot hold. Guarded; False
    where the arguments are not plain values (a tensor to take the dtype of)."""
    try:
        values = [semantics.python_value(a) for a in args]
        keywords = {k: semantics.python_value(v) for k, v in kwargs.items()}
        device, dtype, _, memory_format = torch_internals.parse_to(*values, **keywords)
    except (Unsupported, TypeError, RuntimeError):
        return False
    if memory_format is not None or not _cast_changes_nothing(receiver.value, device, dtype):
        return False
    session.guard_module_answer(receiver, _cast_changes_nothing, (device, dtype), True,
                                f"{receiver.describe()}.to(...) now changes its tensors")
    return True


def _cast_changes_nothing(module: torch.nn.Module, device: torch.device | None,
                          dtype: torch.dtype | None) -> bool:
    for tensor in (*module.parameters(), *module.buffers()):
        if dtype is not None and tensor.dtype != dtype and \
                (tensor.is_floating_point() or tensor.is_complex()):
            return False
        if device is not None and (tensor.device.type != device.type or
                                   device.index is not None and tensor.device != device):
            return False
    return True


# nn.Module's own generator methods: (which registry they walk, whole tree or direct
# children, with names). They read the module tree and nothing else, so running them at
# capture time is safe; the tree they saw is guarded (each registry's keys and contents).
MODULE_WALKS = {
    torch.nn.Module.modules: ("_modules", True, False),
    torch.nn.Module.named_modules: ("_modules", True, True),
    torch.nn.Module.children: ("_modules", False, False),
    torch.nn.Module.named_children: ("_modules", False, True),
    torch.nn.Module.parameters: ("_parameters", True, False),
    torch.nn.Module.named_parameters: ("_parameters", True, True),
    torch.nn.Module.buffers: ("_buffers", True, False),
    torch.nn.Module.named_buffers: ("_buffers", True, True),
}


def walk_module(session: Session, receiver: ModuleValue, walk: tuple[str, bool, bool],
                 args: list[Value], kwargs: dict[str, Value]) -> Value:
    registry, whole_tree, named = walk
    if args or kwargs or receiver.source is None:
        raise Unsupported("nn.Module's module/parameter walks with arguments, or of a module "
                          "made inside the compiled function")
    found: list[tuple[str, Value]] = []
    seen: set[int] = set()

    def visit(module: torch.nn.Module, source: Any, prefix: str) -> None:
        children = session.wrap(module._modules, AttrSource(source, "_modules"))
        if registry == "_modules":
            if whole_tree and id(module) not in seen:
                seen.add(id(module))
                found.append((prefix, session.wrap(module, source)))
        else:
            entries = session.wrap(getattr(module, registry),
                                   AttrSource(source, registry)).items
            for name, value in entries.items():
                tensor = getattr(module, registry)[name]
                if tensor is not None and id(tensor) not in seen:
                    seen.add(id(tensor))
                    found.append((prefix + ("." if prefix else "") + name, value))
        for name, child in module._modules.items():
            if child is None:
                continue
            child_source = ItemSource(AttrSource(source, "_modules"), name)
            child_prefix = prefix + ("." if prefix else "") + name
            if not whole_tree:  # children(): the direct ones, once each
                if id(child) not in seen:
                    seen.add(id(child))
                    found.append((child_prefix, children.items[name]))
                continue
            visit(child, child_source, child_prefix)

    visit(receiver.value, receiver.source, "")
    items = [SequenceValue([Const(name), value], tuple) if named else value
             for name, value in found]
    return IteratorValue(items)
