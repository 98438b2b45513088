"""Warm start before capture: a compiled function's cache entry — its guards, its runner and
its compiled graph — kept in the disk cache under the function's code, so that a new
process's first call of a known function neither captures nor compiles, nor imports the
capture or the compiler (issue 20, item 3; notes/2026-12-warm-start-before-capture.md).

Takes a CompiledFunction and a call's bound arguments; gives the cache entry rebuilt from the
disk cache, or None (then the call captures, and `keep` stores what it made). The key: the
function's code, its compile options and ember's settings, ember's, torch's and Python's
versions, the CPU and C compiler, the global modes guards read, and the arguments' types and
tensor layouts. What is kept: the guards as data (ember/capture/records.py), compiled again
in the new process and still checked on every call; the runner's source and constants; the
FX graph, whose compiled form comes from the graph's own warm-cache entry
(ember/runtime/warm_cache.py); the digests of the user's files whose code the capture inlined
or whose objects it names. An nn.Module's identity guard is kept as what it stood for: the
module found again through its source in the new process, of the class named, one object
per module and no hooks (checked when the entry is rebuilt, then guarded by identity again,
as after a capture); every attribute the capture read has a guard of its own
(notes/2026-12-warm-start-before-capture.md, "What a module's identity guard stands for").
An entry captured with symbolic sizes (automatic dynamic, dynamic=True) is kept under a key
without the arguments' sizes, looked up where the exact key has none (or one whose guards
refuse the call): its guards, relations over the symbols included, say which calls it
serves; its graph, compiled once for every shape, comes from the warm cache by the key it
was kept under (shapes.KeptForEveryShape).
Not kept (said on EMBER_LOGS=perf): graph breaks, CUDA graphs, backends other than ember's,
objects without a name (a lambda) or modules reached without a source, hooks, and reads that
only a module's identity answered. An entry whose digest, versions or files
do not check is removed and the call captured; one whose names do not resolve here is not
used; one whose modules or guards refuse the call is captured again.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import sys
import time
from typing import Any

import torch

from ember import config, dumps, logs, torch_internals, warm_reached
from ember.runtime import disk_cache, warm_cache, warm_records

KIND = "function"

# what this process's warm starts before capture did (tests count with them: a warm first
# call captures nothing); `stale`: an entry whose files changed, `unresolved`: one whose
# names this process does not resolve (a module not imported yet), `refused`: one whose
# guards refuse the call
counts = {"hits": 0, "misses": 0, "kept": 0, "not_kept": 0, "rejected": 0, "stale": 0,
          "unresolved": 0, "refused": 0}


@dataclasses.dataclass
class WarmCapture:
    """What a cache entry rebuilt without a capture knows of it (the fields of
    capture/captured.py's Captured that recompile messages, explain and dumps read)."""

    graph_module: torch.fx.GraphModule
    input_sources: list[Any]
    example_inputs: list[Any]
    guards: Any
    runner_source: str
    runner_namespace: dict[str, Any]
    scope: dict[str, Any]
    op_count: int
    runner_lines: list[str]
    break_reason: Any = None
    resumptions: list = dataclasses.field(default_factory=list)
    callees: dict = dataclasses.field(default_factory=dict)
    symbolic: bool = False


def wanted(function: Any) -> bool:
    """Does this compiled function keep and look for entries (cheap: before each capture)?"""
    from ember.api import CUDA_GRAPH_MODES

    return function.settings.get("warm_start", config.settings.warm_start) and \
        not warm_cache.is_bypassed() and function.backend_option == "ember" and \
        function.depth == 0 and function.mode not in CUDA_GRAPH_MODES


# -- the key ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Keys:
    """A call's two keys: `exact` (its arguments' sizes and int values included), under which
    an entry captured for static sizes is kept; `family` (without them: only ranks, dtypes,
    devices), under which one captured with symbolic sizes is kept, to be found for a call of
    other sizes (its guards say which it serves)."""

    exact: str
    family: str


def key_of(function: Any, arguments: dict[str, Any]) -> Keys | None:
    """The keys of this call's entry, None where an argument cannot be described."""
    settings = dataclasses.asdict(config.settings)
    settings.update(function.settings)
    for name in ("logs", "dump_dir", "cache_dir", "cache_max_mb"):  # (change no code)
        settings.pop(name)
    from ember.capture.records import code_digest

    common = [KIND, repr(sorted(warm_cache.versions().items())), sys.version,
              warm_cache.machine(), code_digest(function.function.__code__),
              repr((function.fullgraph, function.dynamic, function.mode)),
              repr(sorted(settings.items())),
              repr((torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                    torch.get_default_dtype(), torch_internals.autocast_state(),
                    torch.are_deterministic_algorithms_enabled()))]
    try:
        return Keys(*(_digest(common + ["sizes" if sizes else "symbols"] +
                              [f"{name}: {_describe(value, sizes)}"
                               for name, value in arguments.items()])
                      for sizes in (True, False)))
    except Exception:  # noqa: BLE001 (a sparse tensor's strides, an odd object)
        return None


def _digest(parts: list[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _describe(value: Any, sizes: bool = True, depth: int = 0) -> str:
    """An argument as the key sees it: a tensor's layout (`sizes`: its sizes and strides,
    else its rank), a plain value (an int's value only with `sizes`), a container's items
    (a dict's by their str keys), else its type (the guards say the rest)."""
    if isinstance(value, torch.Tensor):
        geometry = f"{tuple(value.shape)}{value.stride()}+{value.storage_offset()}" \
            if sizes else f"[{value.dim()}]"
        return (f"{type(value).__module__}.{type(value).__qualname__}{geometry} "
                f"{value.dtype} {value.device} {value.requires_grad}")
    kind = type(value)
    if kind in (type(None), bool, int, float, str):
        return f"{kind.__name__} {value!r}" if sizes or kind is not int else "int"
    if kind in (tuple, list) and depth < 3 and len(value) <= 64:
        return f"{kind.__name__}[{', '.join(_describe(v, sizes, depth + 1) for v in value)}]"
    if kind is dict and depth < 3 and len(value) <= 64 and \
            all(type(k) is str for k in value):  # (**kwargs: a model's inputs by name)
        return "dict{" + ", ".join(f"{k}: {_describe(v, sizes, depth + 1)}"
                                   for k, v in value.items()) + "}"
    return f"{kind.__module__}.{kind.__qualname__}"


# -- keep ---------------------------------------------------------------------------------
def keep(function: Any, entry: Any, keys: Keys) -> None:
    """Store a captured entry under its key (`keys.exact`, or `keys.family` for an entry
    captured with symbolic sizes) (never raises: it runs either way; why it is not
    kept is said on EMBER_LOGS=perf); a graph whose backward still compiles is kept once
    it is done (warm_cache.when_compiled), on another thread: its graph's key is computed
    there under this thread's modes now, those the graph was compiled under."""
    with _taped():
        modes = warm_cache.thread_modes()
    warm_cache.when_compiled(entry.compiled, lambda: _keep_now(function, entry, keys, modes),
                             again=False)


def _keep_now(function: Any, entry: Any, keys: Keys, modes: tuple) -> None:
    try:
        _keep(function, entry, keys.family if entry.captured.symbolic else keys.exact, modes)
    except Exception as error:  # noqa: BLE001
        from ember.capture.records import NotKept

        counts["not_kept"] += 1
        logs.channel("perf").info("%s: a new process captures it again (no warm start "
                                  "before capture: %s%s)", function.where,
                                  "" if isinstance(error, NotKept) else
                                  f"{type(error).__name__}: ", error)


def _keep(function: Any, entry: Any, key: str, modes: tuple) -> None:
    from ember.capture.records import Encoder, NotKept, inlined_file, made_by_dataclasses, versioned

    captured = entry.captured
    if captured.break_reason is not None or captured.resumptions or captured.callees:
        raise NotKept("it breaks the graph (entries without breaks are kept)")
    if captured.identity_reads:
        raise NotKept(f"it read {captured.identity_reads[0]}, which only the module's "
                      f"identity stands for")
    scope = captured.scope
    if not scope["GG"] or scope["GG"][0] is not function.function.__globals__:
        raise NotKept("its globals are not its function's")
    if any(value is torch_internals.hook_tables_unchanged for value in scope["K"]):
        raise NotKept("it calls a module with hooks (their tables are guarded as the objects "
                      "they are)")
    own = warm_reached.made_by_the_capture(captured)
    reached, identities = warm_reached.module_identities(captured, own)
    reached.update(warm_reached.unnamed_functions(captured, own))
    encoder = Encoder(reached)
    kept_guards = warm_reached.without_own(captured.guards, own)
    guards = warm_reached.hooks_counted_here(encoder.guards(kept_guards), scope["K"])
    symbol_reads = encoder.symbol_reads(kept_guards)
    identities = [[encoder.value(type(module)), [encoder.value(s) for s in found]]
                  for module, found in identities]
    modules = []
    for globals_dict in scope["GG"][1:]:  # (the globals of the functions it inlined)
        name = globals_dict.get("__name__")
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is None or module.__dict__ is not globals_dict:
            raise NotKept("it reads the globals of a module sys.modules does not hold")
        modules.append(name)
    owned = {id(o) for i in own for o in (scope["K"][i], vars(scope["K"][i]))}
    constants = [["plain", None] if index in own else warm_reached.constant(encoder, value, owned)
                 for index, value in enumerate(scope["K"])]
    inputs = [encoder.value(source) for source in captured.input_sources]
    namespace = [[name, encoder.value(value)] for name, value in
                 captured.runner_namespace.items()]
    graph = encoder.graph(captured.graph_module)
    examples = [_example(value) for value in captured.example_inputs]
    for code in captured.inlined_codes:  # (the code it inlined, by its file)
        if not (versioned(code.co_filename) or made_by_dataclasses(code)):
            path, digest = inlined_file(code)
            encoder.files[path] = digest
    compiled = entry.compiled
    passthrough = bool(getattr(compiled, "passthrough", False))
    every_shape = None
    if captured.symbolic and not passthrough:
        every_shape = _kept_for_every_shape(compiled, graph, captured)
    elif not passthrough:
        _check_graph_kept(function, graph, examples, captured, modes)
    record = {"versions": warm_cache.versions(), "where": function.where,
              "files": sorted([path, digest] for path, digest in encoder.files.items()),
              "guards": guards, "identities": identities, "modules": modules,
              "constants": constants,
              "input_sources": inputs, "runner": captured.runner_source,
              "runner_lines": list(captured.runner_lines), "namespace": namespace,
              "graph": graph, "examples": examples, "op_count": captured.op_count,
              "passthrough": passthrough, "symbol_reads": symbol_reads,
              "every_shape": every_shape}
    warm_records.write_record(KIND, key, record)
    counts["kept"] += 1


def _example(value: Any) -> list:
    """An example input as what makes a stand-in of it (the graph's warm-cache key reads the
    metadata alone)."""
    from ember.capture.records import NotKept

    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return ["tensor", type(value) is torch.nn.Parameter, list(value.shape),
                list(value.stride()), value.storage_offset(), str(value.dtype).split(".")[1],
                str(value.device), value.requires_grad]
    if type(value) in (bool, int, float):
        return ["plain", value]
    raise NotKept(f"an example input of type {type(value).__name__}")


def _stand_in(example: list) -> Any:
    if example[0] == "plain":
        return example[1]
    _, parameter, shape, stride, offset, dtype, device, requires_grad = example
    reach = offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1 \
        if all(shape) else offset
    tensor = torch.empty(reach, dtype=getattr(torch, dtype), device=device).as_strided(
        shape, stride, offset)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


def _kept_for_every_shape(compiled: Any, graph: list, captured: Any) -> list:
    """A symbolic capture's graph, compiled for every shape: where the warm cache keeps it
    (shapes.KeptForEveryShape, as plain data) — it must be there, and the FX graph kept must
    come back the same. (Its key is the one it was kept under: computed from the captured
    graph's symbolic examples, which the graph kept here does not carry.)"""
    from ember.capture.records import Decoder, NotKept

    kept = getattr(compiled, "kept_for_every_shape", None)
    if kept is None:
        raise NotKept("its graph is not compiled once for every shape (compiled per shape, "
                      "or without a warm-cache entry)")
    if Decoder().graph(graph).code != captured.graph_module.code:
        raise NotKept("its FX graph does not come back the same")
    if not disk_cache.entry_path(warm_cache.KIND, kept.key, ".pt").exists():
        raise NotKept("its compiled graph is not in the warm cache")
    return [kept.key, list(kept.scalars), kept.symbolic, kept.placeholders]


def _check_graph_kept(function: Any, graph: list, examples: list, captured: Any,
                      modes: tuple) -> None:
    """The compiled graph must come back in a new process: the FX graph rebuilt from what is
    kept gives the same code and the same warm-cache key, and the warm cache holds it."""
    from ember.capture.records import Decoder, NotKept

    rebuilt = Decoder().graph(graph)
    if rebuilt.code != captured.graph_module.code:
        raise NotKept("its FX graph does not come back the same")
    # (the function's settings and the caller's modes passed, not set: a keep runs on
    # another thread, and config.override sets settings process-wide)
    chosen = dataclasses.replace(config.settings, **function.settings)
    key = warm_cache.key_of(rebuilt, [_stand_in(e) for e in examples], chosen, modes)
    if key != warm_cache.key_of(captured.graph_module, list(captured.example_inputs), chosen,
                                modes):
        raise NotKept("its graph's warm-cache key differs for the graph kept")
    if not disk_cache.entry_path(warm_cache.KIND, key, ".pt").exists():
        raise NotKept("its compiled graph is not in the warm cache")


# -- find ---------------------------------------------------------------------------------
def load(function: Any, arguments: dict[str, Any], keys: Keys) -> Any:
    """The cache entry kept for this call — under its exact key, else (none there, or its
    guards refuse the call) under its family's: an entry captured with symbolic sizes —
    rebuilt for this process, or None (a miss, or an entry that fails a check: removed, or
    not for this process)."""
    started = time.perf_counter()
    found = False
    for key in (keys.exact, keys.family):
        path = disk_cache.entry_path(KIND, key, ".pt")
        try:
            record = warm_records.read_record(path, key, warm_cache.versions())
        except FileNotFoundError:
            continue
        except warm_records.Rejected as rejected:  # (removed; the family's may serve)
            _reject(path, "rejected", f"fails its check ({rejected})")
            entry = None
        else:
            entry = _entry(function, record, arguments, path)
        found = True
        if entry is not None:
            counts["hits"] += 1
            disk_cache.touch(path)
            if logs.enabled("perf"):
                logs.channel("perf").info("%s: warm start before capture in %.1f ms (%s)",
                                          function.where,
                                          (time.perf_counter() - started) * 1e3, path)
            return entry
    if not found:
        counts["misses"] += 1
    return None


def _entry(function: Any, record: dict, arguments: dict[str, Any], path: Any) -> Any:
    """The entry of `record` (kept at `path`) rebuilt for this call, or None."""
    from ember.capture.records import Unresolved

    try:
        changed = _changed_file(record)
        if changed is not None:
            return _reject(path, "stale", f"was made from another version of {changed}")
        return _rebuild(function, record, arguments)
    except Unresolved as error:
        counts["unresolved"] += 1
        logs.channel("recompiles").info("%s: the warm-start entry %s is not for this process "
                                        "(%s): captured", function.where, path, error)
        return None
    except Exception as error:  # noqa: BLE001 (never trusted: captured again)
        return _reject(path, "rejected", f"cannot be rebuilt ({type(error).__name__}: "
                                         f"{str(error)[:200]})")


def _reject(path: Any, kind: str, problem: str) -> None:
    counts[kind] += 1
    logs.channel("fallbacks").info("the warm-start entry %s %s: the call is captured again",
                                   path, problem)
    warm_cache.remove(path)
    return None


def _changed_file(record: dict) -> str | None:
    from ember.capture.records import file_digest

    for path, digest in record["files"]:
        if file_digest(path) != digest:
            return path
    return None


def _rebuild(function: Any, record: dict, arguments: dict[str, Any]) -> Any:
    """The entry's guards compiled for this call (None when they refuse it), its compiled
    graph from the warm cache (None when that is gone), its runner."""
    from ember.api import CacheEntry, CaptureRecord
    from ember.capture.guards import (
        MISS,
        LazyGuard,
        compile_guarded_runner,
        compile_guards,
        guard_source,
    )
    from ember.capture.records import Decoder, imported_module
    from ember.resumes import passthrough

    scope_globals = [function.function.__globals__]
    for name in record["modules"]:
        scope_globals.append(imported_module(name).__dict__)
    scope = {"GG": scope_globals, "G": scope_globals[0],
             "C": function.function.__closure__ or ()}
    reach = warm_reached.Reach(dict(scope, L=arguments))
    decoder = Decoder(reach)
    refusal = warm_reached.reach_modules(record["identities"], decoder, reach)
    if refusal is None:  # (K reaches the modules too)
        scope["K"] = [decoder.value(code) for code in record["constants"]]
        reach.namespace["K"] = scope["K"]  # (functions reached from a class kept in K)
        refusal = warm_reached.hooked(scope["K"], record["guards"])
    if refusal is not None:
        counts["refused"] += 1
        logs.channel("recompiles").info("%s: the warm-start entry does not serve this call "
                                        "(%s): captured", function.where, refusal)
        return None
    guards = decoder.guards(record["guards"], record["symbol_reads"])
    # the runner, whose `compiled` is set once the guards accept the call and the graph is
    # rebuilt; the guards compiled once, inside it (the guard function alone, which only a
    # later miss asks, is compiled then: a model's guards are thousands of lines)
    inputs = [decoder.value(code) for code in record["input_sources"]]
    namespace = dict({name: decoder.value(code) for name, code in record["namespace"]},
                     **scope)
    exec(builtins.compile(record["runner"], f"<ember runner {function.where}>", "exec"),
         namespace)  # noqa: S102 (our own code, from an entry whose digest checked)
    call = compile_guarded_runner(guards, scope, arguments, inputs, record["runner_lines"],
                                  namespace, function.where)
    if call is not None:
        guard, text = LazyGuard(guards, scope), call.ember_source
        accepted = call.guarded_inputs(arguments) is not MISS
    else:  # (names that clash: guards and runner apart)
        guard, text = compile_guards(guards, scope, arguments)
        accepted = guard(arguments)
    if not accepted:
        counts["refused"] += 1
        if logs.enabled("recompiles"):
            from ember.capture.guards import first_failure

            logs.channel("recompiles").info(
                "%s: the warm-start entry does not serve this call (%s): captured",
                function.where, logs.user_names(first_failure(guards, dict(scope, L=arguments))
                                                or "?"))
        return None
    gm = decoder.graph(record["graph"])
    examples = [_stand_in(example) for example in record["examples"]]
    if record["passthrough"]:
        compiled = passthrough(gm)
    else:
        from ember.dumps import graph_label

        with _compiling(function):
            if record["every_shape"] is not None:  # (compiled once for every shape)
                from ember.shapes import KeptForEveryShape, from_the_warm_cache

                key, scalars, symbolic, placeholders = record["every_shape"]
                compiled = from_the_warm_cache(gm, examples, graph_label(gm),
                                               KeptForEveryShape(key, tuple(scalars), symbolic,
                                                                 placeholders))
            else:
                compiled = warm_cache.Entry(gm, examples, graph_label(gm), _recompile).compiled
        if compiled is None:
            return None
    namespace["compiled"] = compiled
    if call is not None:
        call.__globals__["compiled"] = compiled
    captured = WarmCapture(gm, inputs, examples, guards, record["runner"], namespace, scope,
                           record["op_count"], list(record["runner_lines"]),
                           symbolic=record["every_shape"] is not None)
    _seen(function.frame_sizes, guards)
    if config.settings.dump_dir is not None and call is not None:  # (guards.py: the guard
        text = guard_source(guards, scope, arguments)[0]            # function, as captured)
    dumps.dump_entry(captured, text, call, function.where)
    function.record(CaptureRecord(1, [record["op_count"]], [], text, 0.0, gm, None, compiled))
    return CacheEntry(guard, namespace["run"], captured, text, call=call, compiled=compiled)


def _seen(frame_sizes: Any, guards: Any) -> None:
    """The sizes and ints the entry was captured for, as its capture would have told the
    function's FrameSizes (automatic dynamic: a later capture for other sizes makes the
    changed ones symbols, as after a capture in this process)."""
    for guard in guards.guards.values():
        if guard.kind == "tensor":  # (None where the capture made a dim a symbol)
            frame_sizes.see_tensor(guard.source.expr(), tuple(guard.expected[3]))
        elif guard.kind == "equals" and type(guard.expected) is int and \
                type(guard.source).__name__ != "CallSource":
            frame_sizes.read_int(guard.source.expr(), guard.expected)


def _compiling(function: Any) -> contextlib.ExitStack:
    """The modes `function`'s graphs are compiled in (CompiledFunction._entry): its settings,
    training graphs' library calls taped."""
    modes = contextlib.ExitStack()
    modes.enter_context(_taped())
    modes.enter_context(config.override(**function.settings))
    return modes


def _taped() -> contextlib.AbstractContextManager:
    """Training graphs' library calls taped, in this thread (autodiff/tape.py; where nothing
    imported it, that is its default already)."""
    tape = sys.modules.get("ember.autodiff.tape")
    return tape.kept(True) if tape is not None else contextlib.nullcontext()


def _recompile(gm: torch.fx.GraphModule, example_inputs: list[Any], label: str) -> Any:
    """A rebuilt graph's cold compile (the rare call its compiled form gives away)."""
    from ember.backends import compile_stages

    return compile_stages(gm, example_inputs, label)

