"""What a function's warm-start entry reaches instead of keeping (ember/warm_entries.py): the
objects its guards know by identity, found again through a source in each new process —
nn.Modules (with their __dict__s, the hooks-free check their identity stood for), closures
without a name (a library's validators, their code checked by digest) — and the modules the
capture made itself, whose guards hold on every call and are dropped. Takes a capture's
guards and scope; gives the objects by id with their sources, the guards and constants as
kept, and, where an entry is rebuilt, why its modules no longer serve a call.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ember import torch_internals


def made_by_the_capture(captured: Any) -> set[int]:
    """The scope's K that hold modules made inside the compiled code (transformers' BERT
    makes a CrossEntropyLoss in its forward): the capture made one, inlined its forward and
    guards it as K[i]; nothing but the entry can reach it, so those guards hold for every
    call, and a new process needs neither them nor the module. Kept so only where no runner
    line and no other guard reads it."""
    from ember.capture.sources import ConstantSource

    constants = captured.scope["K"]
    found = {guard.source.index for guard in captured.guards.guards.values()
             if guard.kind == "id" and isinstance(guard.source, ConstantSource) and
             isinstance(constants[guard.source.index], torch.nn.Module) and
             guard.expected is constants[guard.source.index]}
    read = captured.runner_source + "".join(captured.runner_lines)
    return {index for index in found
            if f"K[{index}]" not in read and
            not any(value is constants[index] for value in captured.runner_namespace.values())
            and not any(guard.expected is constants[index] and
                        rooted_at(guard.source) != index
                        for guard in captured.guards.guards.values())}


def rooted_at(source: Any) -> int | None:
    """The K index a source reads from (K[i].attr, K[i]._buffers['w']), else None."""
    from ember.capture import sources

    while isinstance(source, (sources.AttrSource, sources.ItemSource, sources.EntrySource)):
        source = source.base
    return source.index if isinstance(source, sources.ConstantSource) else None


def without_own(guards: Any, own: set[int]) -> Any:
    """`guards` less those on the entry's own objects (made_by_the_capture)."""
    if not own:
        return guards
    kept = guards.only({guard.kind for guard in guards.guards.values()})
    kept.guards = {key: guard for key, guard in guards.guards.items()
                   if rooted_at(guard.source) not in own}
    kept.shapes = guards.shapes
    return kept


def module_identities(captured: Any, own: set[int] = frozenset()
                       ) -> tuple[dict[int, tuple[Any, Any]], list]:
    """The nn.Modules the capture knows by identity ("id" guards), each with the sources that
    reach it: a new process finds them again through these (the first of each), its
    __dict__ through the module (ember/capture/records.py's `reached`); and the list of
    (module, sources). What the identity guard stood for besides is guarded on its own
    (notes/2026-12-warm-start-before-capture.md, "What a module's identity guard stands
    for"): the entry checks the module's class by name, that the sources keep reaching one
    object each and distinct objects apart, and no hooks (reach_modules)."""
    from ember.capture.records import NotKept
    from ember.capture.sources import AttrSource

    found: dict[int, tuple[Any, list]] = {}
    for guard in captured.guards.guards.values():
        if guard.kind == "id" and isinstance(guard.expected, torch.nn.Module):
            if rooted_at(guard.source) in own:
                continue
            if not _reachable(guard.source):
                raise NotKept(f"a {type(guard.expected).__name__} reached through "
                              f"{guard.source.expr()}, not from the call")
            found.setdefault(id(guard.expected), (guard.expected, []))[1].append(guard.source)
    reached: dict[int, tuple[Any, Any]] = {}
    for module, sources in found.values():
        reached[id(module)] = (module, sources[0])
        reached[id(module.__dict__)] = (module.__dict__, AttrSource(sources[0], "__dict__"))
    return reached, list(found.values())


def unnamed_functions(captured: Any, own: set[int]) -> dict[int, tuple[Any, Any]]:
    """Functions without a name to find them by that the guards know by identity, each with
    the source that reached it (from the call, or from an object the entry keeps by name): a
    closure a library's class decorator made (huggingface_hub's strict dataclasses keep
    their validators in `BartConfig.__validators__`). A new process finds each again through
    its source, its code checked by digest (records.Decoder), then guards it by identity."""
    from ember.capture.records import has_name

    found = {}
    for guard in captured.guards.guards.values():
        function = guard.expected
        if guard.kind != "id" or not isinstance(function, types.FunctionType) or \
                has_name(function):
            continue
        root = rooted_at(guard.source)
        if root in own or not (_reachable(guard.source) or root is not None and
                               isinstance(captured.scope["K"][root], type)):
            continue
        found.setdefault(id(function), (function, guard.source))
    return found


def _reachable(source: Any) -> bool:
    """Does `source` read from the call's arguments, globals or closure (not from what the
    entry keeps, K: a module kept there has no way back)?"""
    from ember.capture import sources

    while isinstance(source, (sources.AttrSource, sources.ItemSource, sources.EntrySource)):
        source = source.base
    return isinstance(source, (sources.LocalSource, sources.GlobalSource,
                               sources.ClosureSource))


def constant(encoder: Any, value: Any, owned: set[int] = frozenset()) -> list:
    """One of the scope's K as kept. A list, dict or set there is one the guards read as it
    is at each call (the modules a capture inlined and their __dict__s, a hooked module's
    hook tables, refused before): kept only where each item is reached again (modules,
    their __dict__s), never as a copy that a guard would then read unchanged forever. A
    list's items that are the entry's own (`owned`: modules made by the capture and their
    __dict__s, which nothing can hook) are left out."""
    from ember.capture.records import NotKept

    if type(value) is list and owned:
        value = [item for item in value if id(item) not in owned]
    if type(value) in (list, dict, set):
        items = value.values() if type(value) is dict else value
        if not all(id(item) in encoder.reached for item in items):
            raise NotKept(f"a {type(value).__name__} its guards read as the object it is")
    return encoder.value(value)


def hooks_counted_here(guards: list, constants: list) -> list:
    """The kept guards with modules_still_plain's count of hook handles made so far (this
    process's: a fast path while no hook was registered since) read again where the entry
    is rebuilt, after `hooked` has found no hooks there."""
    arguments = _plain_guard_arguments(guards, constants)
    if arguments is not None:
        arguments[0] = ["hooks_made"]
    return guards


def _plain_guard_arguments(guards: list, constants: list) -> list | None:
    """The kept arguments of the guard modules_still_plain answers (module_calls.py: one per
    capture that inlines modules) — the count of hook handles, the modules, their
    __dict__s — or None."""
    for _, source, _ in guards:
        if source is not None and source[1] == "CallSource":
            base, _, arguments, _ = source[2]
            if base[0] == "source" and base[1] == "ConstantSource" and \
                    constants[base[2][0][1]] is torch_internals.modules_still_plain:
                return arguments[1]
    return None


# -- where the entry is rebuilt ------------------------------------------------------------
class Reach:
    """The objects reached through sources for this call (a module, its __dict__), each
    source read once."""

    def __init__(self, namespace: dict[str, Any]):
        self.namespace = namespace
        self.found: dict[str, Any] = {}

    def __call__(self, source: Any) -> Any:
        expr = source.expr()
        if expr not in self.found:
            self.found[expr] = source.evaluate(self.namespace)
        return self.found[expr]


def reach_modules(identities: list, decoder: Any, reach: Reach) -> str | None:
    """The modules the capture knew by identity, found through their sources in this call:
    why they are not what the capture saw (None: they are). Each must be of the class the
    capture saw (by name; its file checked by digest), every source of one module must reach
    one object, and two modules must stay two objects (`a is b` was answered so)."""
    seen: dict[int, str] = {}
    for kind_code, source_codes in identities:
        kind = decoder.value(kind_code)
        sources = [decoder.value(code) for code in source_codes]
        try:
            found = [reach(source) for source in sources]
        except Exception as error:  # noqa: BLE001 (a module no longer there)
            return f"{sources[0].expr()} cannot be read ({type(error).__name__})"
        if type(found[0]) is not kind:
            return f"{sources[0].expr()} is a {type(found[0]).__qualname__}, not a " \
                   f"{kind.__qualname__}"
        for source, module in zip(sources[1:], found[1:]):
            if module is not found[0]:
                return f"{source.expr()} is no longer {sources[0].expr()}"
        if id(found[0]) in seen:
            return f"{sources[0].expr()} is now {seen[id(found[0])]}"
        seen[id(found[0])] = sources[0].expr()
    return None


def hooked(constants: list, guards: list) -> str | None:
    """Why the modules the capture inlined are no longer called plainly here — a hook, or a
    forward set on the instance (None: they are), looked at module by module: the guard's
    own fast path (no hook registered since its count) then takes this process's count."""
    arguments = _plain_guard_arguments(guards, constants)
    if arguments is None:
        return None
    modules, dicts = (constants[code[2][0][1]] for code in arguments[1:])
    if not torch_internals.modules_still_plain(-1, modules, dicts):
        return "a hook, or a forward, was set on a module the compiled code calls"
    return None
