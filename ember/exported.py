"""Export: a function or module compiled ahead of time into a program that a fresh process
loads from one file and runs without the model's source (issue 20, item 2).

    program = ember.export(model, x, dynamic_shapes={"x": {0: Dim("batch")}})
    print(program)                       # signature, constants, input checks, graph, kernels
    program.save("model.ember")          # one file: wrapper, kernels (source and binary),
    run = ember.load("model.ember")      # parameters and buffers as named constants
    run(x)                               # inputs checked: shapes, dtypes, devices, strides
    program.save("model", format="c")    # a C library and header (ember/exported_c.py)

Takes what ember's capture makes of one call (one graph, no breaks, no side effects on the
model) and the graph compiled by ember/aot.py; gives the program: its signature and checks
(exported_signature.py), its file and the loader (exported_file.py), its C library
(exported_c.py). Graph inputs that are not arguments become named constants (a module's
parameters and buffers by their paths); the capture's size guards become checks on the
arguments. It must not keep a reference to the model's code in what it saves.
"""

from __future__ import annotations

import inspect
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ember.capture.captured import after_graph_call
from ember.capture.symbols import mark_dynamic
from ember.exported_signature import (
    InputMismatch,
    InputSpec,
    Signature,
    check_inputs,
    flatten,
    match,
)
from ember.runtime.compiled import CompiledGraph


class ExportError(RuntimeError):
    """A function or module that cannot be exported, and why."""


# -- the program ----------------------------------------------------------------------------
class ExportedProgram:
    """A compiled graph with its signature and constants: callable, printable, savable."""

    def __init__(self, signature: Signature, constants: dict[str, torch.Tensor],
                 compiled: CompiledGraph, graph_text: str, compiled_text: str,
                 record: dict | None = None, analysed: Any = None):
        self.signature = signature
        self.constants = constants
        self.compiled = compiled
        self.graph_text = graph_text        # the captured FX graph
        self.compiled_text = compiled_text  # IR after passes, kernels, wrapper
        self._record = record               # what save() writes (made at export)
        self._analysed = analysed           # aot.Compiled (plan, analyses): at export only
        self._constant_inputs = [constants[name] if kind == "constant" else None
                                 for kind, name in signature.graph_inputs]
        self._result = _result_function(signature.result_source)
        # (compiled once: a call evaluates them with L, the bound arguments)
        self._relations = [(compile(code, "<ember export: size check>", "eval"), readable)
                           for code, readable in signature.relations]
        self._expressions = [compile(which, "<ember export: input>", "eval")
                             if kind == "expression" else None
                             for kind, which in signature.graph_inputs]
        self._fast = _fast_path(self)

    @property
    def parameters(self) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers (and other tensors it read), by name."""
        return dict(self.constants)

    @property
    def guards(self) -> list[str]:
        """What each call checks of its inputs: each leaf, then the size relations."""
        return [spec.describe() for spec in self.signature.inputs] + \
            self.signature.relation_texts()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fast is not None and not kwargs:
            result = self._fast(args)
            if result is not _MISS:
                return result
        signature = self.signature
        leaves: list[Any] = []
        bound = self._bind(args, kwargs)
        for name, value in bound:
            match(value, signature.structure[signature.parameters.index(name)], name, leaves)
        check_inputs(signature, leaves)
        arguments = dict(bound)
        scope = {"torch": torch, "L": arguments}
        for code, readable in self._relations:
            if not eval(code, scope):  # noqa: S307 (the capture's own guards)
                raise InputMismatch(f"the program's sizes must keep {readable}; these "
                                    f"arguments do not")
        inputs = [leaves[which] if kind == "argument" else constant if kind == "constant"
                  else eval(code, scope)  # noqa: S307 (the capture's own expression)
                  for (kind, which), constant, code in zip(
                      signature.graph_inputs, self._constant_inputs, self._expressions)]
        return self._result(arguments, self.compiled(*inputs))

    def _bind(self, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
        names = self.signature.parameters
        if len(args) > len(names):
            raise InputMismatch(f"the program takes {len(names)} arguments "
                                f"({', '.join(names)}), got {len(args)}")
        bound = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise InputMismatch(f"the program has no argument {name!r} (its arguments: "
                                    f"{', '.join(names)})")
            if name in bound:
                raise InputMismatch(f"argument {name} given twice")
            bound[name] = value
        missing = [name for name in names if name not in bound]
        if missing:
            raise InputMismatch(f"missing argument {', '.join(missing)}")
        return [(name, bound[name]) for name in names]

    def as_text(self) -> str:
        return "\n\n".join(["# signature", self.signature.as_text(self.constants),
                            "# graph", self.graph_text.strip(), self.compiled_text.strip()]
                           ) + "\n"

    __str__ = as_text

    def memory_analysis(self) -> Any:
        return self._analysis().memory_analysis()

    def cost_analysis(self) -> Any:
        return self._analysis().cost_analysis()

    def _analysis(self) -> Any:
        if self._analysed is None:
            raise RuntimeError("a loaded program carries no schedule: analyse it where it "
                               "was exported")
        return self._analysed

    def save(self, path: str | Path, format: str = "ember") -> Path:  # noqa: A002
        """Write the program to `path`: one file (format="ember"), or a C library and its
        header (format="c", ember/exported_c.py; `path` then names the library's stem)."""
        if format == "c":
            from ember import exported_c

            return exported_c.save(self, Path(path))
        if format != "ember":
            raise ValueError(f"save: format must be 'ember' or 'c', got {format!r}")
        if self._record is None:
            raise RuntimeError("save: this program was loaded from a file; copy that file")
        from ember import exported_file

        return exported_file.write(self._record, Path(path))


_MISS = object()


def _fast_path(program: ExportedProgram) -> Any:
    """For a program whose arguments are tensors of fixed shapes (the common case): one
    generated function that checks them all in one expression and calls the graph, or
    answers _MISS (the full checks then run, and name what differs). None where the
    arguments are nested, values or dynamic."""
    signature = program.signature
    leaves = signature.inputs
    if [s[0] for s in signature.structure] != ["leaf"] * len(leaves) or signature.relations \
            or any(spec.kind != "tensor" or spec.strides is None for spec in leaves) or \
            any(kind == "expression" for kind, _ in signature.graph_inputs):
        return None
    namespace: dict[str, Any] = {"Tensor": torch.Tensor, "MISS": _MISS,
                                 "compiled": program.compiled, "result": program._result}
    tests = []
    for i, spec in enumerate(leaves):
        namespace[f"dtype{i}"] = _dtype(spec.dtype)
        namespace[f"device{i}"] = torch.device(spec.device)
        tests.append(f"type(a{i}) is Tensor and a{i}.dtype is dtype{i} and "
                     f"a{i}.device == device{i} and a{i}.shape == {tuple(spec.shape)!r} and "
                     f"a{i}.stride() == {tuple(spec.strides)!r} and not a{i}.requires_grad")
    inputs = []
    for index, (kind, which) in enumerate(signature.graph_inputs):
        if kind == "argument":
            inputs.append(f"a{which}")
        else:
            namespace[f"c{index}"] = program.constants[which]
            inputs.append(f"c{index}")
    names = ", ".join(f"a{i}" for i in range(len(leaves)))
    bound = "{" + ", ".join(f"{name!r}: a{i}" for i, name in enumerate(signature.parameters)) \
        + "}" if "L[" in signature.result_source else "None"
    text = (f"def fast(args):\n    if len(args) != {len(leaves)}: return MISS\n"
            + (f"    {names}, = args\n" if leaves else "")
            + "    if not (" + (" and\n            ".join(tests) or "True") + "): return MISS\n"
            + f"    return result({bound}, compiled({', '.join(inputs)}))\n")
    exec(compile(text, "<ember export: call>", "exec"), namespace)  # noqa: S102 (ours)
    return namespace["fast"]


def _dtype(text: str) -> torch.dtype:
    return getattr(torch, text.replace("torch.", ""))


def _result_function(source: str) -> Any:
    namespace = {"torch": torch}
    exec(compile(source, "<ember export: result>", "exec"), namespace)  # noqa: S102 (ours)
    return namespace["result"]


# -- export ---------------------------------------------------------------------------------
def export(model: Any, *example_args: Any, dynamic_shapes: Any = None) -> ExportedProgram:
    """`model` (a function, an nn.Module or a torch.export.ExportedProgram) captured for
    these arguments as one graph and compiled for inference on the CPU. `dynamic_shapes`, as
    torch.export spells it (per argument, by position or name: {dim: Dim or True}), makes
    those sizes symbols: the program then serves every size in their range."""
    from ember.api import compile as ember_compile

    if isinstance(model, torch.export.ExportedProgram):
        if not example_args:
            args, kwargs = model.example_inputs or ((), {})
            if kwargs:
                raise ExportError("ember.export: this torch.export program takes keyword "
                                  "inputs; pass its example arguments positionally")
            example_args = tuple(args)
        model = model.module()
    if isinstance(model, torch.nn.Module):
        function, prefix = type(model).forward, 1
        where = type(model).__name__
    elif callable(model):
        function, prefix = model, 0
        where = getattr(model, "__qualname__", type(model).__name__)
    else:
        raise ExportError(f"ember.export needs a function, an nn.Module or a "
                          f"torch.export.ExportedProgram, got {type(model).__name__}")
    try:
        names = list(inspect.signature(function).parameters)[prefix:]
        parameter_kinds = list(inspect.signature(function).parameters.values())[prefix:]
    except (TypeError, ValueError):
        raise ExportError(f"ember.export: {where} has no Python signature") from None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameter_kinds):
        raise ExportError(f"ember.export: {where} takes *args or **kwargs; export a function "
                          f"with named parameters")
    if len(example_args) > len(names):
        raise ExportError(f"ember.export: {where} takes {len(names)} arguments, "
                          f"{len(example_args)} were given")
    names = names[:len(example_args)]
    leaves: list[tuple[str, Any]] = []
    structure = [flatten(value, name, leaves) for name, value in zip(names, example_args)]
    # the leaves as the capture sees them: tensors detached (own objects, so that marks for
    # dynamic sizes stay off the caller's tensors and each graph input is found by identity)
    values = [value.detach() if isinstance(value, torch.Tensor) else value
              for _, value in leaves]
    dims = _dynamic_dims(dynamic_shapes, names, structure, leaves)
    for index, marks in dims.items():
        for dim, (_, low, high) in marks.items():
            mark_dynamic(values[index], dim, min=low, max=high)
    arguments = tuple(_rebuild(s, values) for s in structure)
    started = time.perf_counter()
    with torch.no_grad():
        compiled_function = ember_compile(model, fullgraph=True,
                                          dynamic=None if dims else False)
        try:
            lowered = compiled_function.lower(*arguments)
        except Exception as error:  # (capture's refusal, said with the user's line)
            raise ExportError(f"ember.export: {where} cannot be captured as one graph: "
                              f"{error}") from None
        analysed = lowered.compile()
    return _program(lowered, analysed, names, structure, leaves, values, dims, where,
                    time.perf_counter() - started)


def _rebuild(structure: list, values: list[Any]) -> Any:
    kind = structure[0]
    if kind == "leaf":
        return values[structure[1]]
    if kind == "dict":
        return {key: _rebuild(inner, values) for key, inner in structure[1]}
    items = [_rebuild(inner, values) for inner in structure[1]]
    return tuple(items) if kind == "tuple" else items


def _dynamic_dims(dynamic_shapes: Any, names: list[str], structure: list,
                  leaves: list[tuple[str, Any]]) -> dict[int, dict[int, tuple[str, int, int]]]:
    """Leaf index → {dim: (symbol, min, max)} from torch.export's dynamic_shapes."""
    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, dict):
        unknown = set(dynamic_shapes) - set(names)
        if unknown:
            raise ExportError(f"ember.export: dynamic_shapes names {sorted(unknown)}, which "
                              f"are not arguments ({', '.join(names)})")
        per_argument = [dynamic_shapes.get(name) for name in names]
    else:
        per_argument = list(dynamic_shapes)
        if len(per_argument) != len(names):
            raise ExportError(f"ember.export: dynamic_shapes has {len(per_argument)} entries "
                              f"for {len(names)} arguments")
    found: dict[int, dict[int, tuple[str, int, int]]] = {}
    for name, spec, inner in zip(names, per_argument, structure):
        if spec is None:
            continue
        if inner[0] != "leaf" or not isinstance(leaves[inner[1]][1], torch.Tensor):
            raise ExportError(f"ember.export: dynamic_shapes for {name}: only tensor "
                              f"arguments take dynamic sizes here")
        tensor = leaves[inner[1]][1]
        items = spec.items() if isinstance(spec, dict) else \
            [(dim, d) for dim, d in enumerate(spec) if d is not None]
        for dim, dimension in items:
            if not 0 <= dim < tensor.dim():
                raise ExportError(f"ember.export: dynamic_shapes for {name}: dimension {dim} "
                                  f"out of range for shape {tuple(tensor.shape)}")
            symbol = getattr(dimension, "__name__", None) or f"{name}_{dim}"
            low = max(int(getattr(dimension, "min", 2) or 2), 2)
            high = getattr(dimension, "max", None)
            high = sys.maxsize - 1 if high is None or high > 2 ** 62 else int(high)
            if not low <= tensor.shape[dim] <= high:
                raise ExportError(f"ember.export: {name}'s dimension {dim} is "
                                  f"{tensor.shape[dim]}, outside its range [{low}, {high}] "
                                  f"(sizes 0 and 1 are not dynamic)")
            found.setdefault(inner[1], {})[dim] = (symbol, low, high)
    return found


def _program(lowered: Any, analysed: Any, names: list[str], structure: list,
             leaves: list[tuple[str, Any]], values: list[Any], dims: dict, where: str,
             seconds: float) -> ExportedProgram:
    captured = lowered.captured
    if captured.resumptions or captured.break_reason is not None:
        raise ExportError(f"ember.export: {where} breaks its graph "
                          f"({captured.break_reason}); an exported program is one graph")
    compiled = analysed.compiled
    if type(compiled) is not CompiledGraph:
        reason = getattr(compiled, "reason", None) or "; ".join(
            getattr(compiled, "islands", []) or []) or type(compiled).__name__
        raise ExportError(f"ember.export: {where} does not compile whole into ember's C "
                          f"kernels ({reason}); export serves such graphs only")
    gm = captured.graph_module
    arguments = lowered._arguments
    scope = dict(captured.scope, L=arguments, C=lowered.function.function.__closure__ or ())
    graph_inputs, constants = [], {}
    for source in captured.input_sources:
        value = eval(source.expr(), {"torch": torch}, scope)  # noqa: S307 (ours)
        index = next((i for i, v in enumerate(values) if v is value), None)
        if index is not None:
            graph_inputs.append(["argument", index])
            continue
        if _over_arguments(source.expr(), names):  # (computed per call, as the capture does)
            graph_inputs.append(["expression", source.expr()])
            continue
        if not isinstance(value, torch.Tensor):
            raise ExportError(f"ember.export: the graph reads {source.expr()}, a "
                              f"{type(value).__name__}, which is not an argument")
        name = _constant_name(source.expr(), constants,
                              lowered.function.function.__code__.co_freevars)
        constants[name] = value.detach()
        graph_inputs.append(["constant", name])
    if any(t.device.type != "cpu" for t in constants.values()) or any(
            isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in values):
        raise ExportError("ember.export: the program's tensors must be on the CPU (CUDA "
                          "graphs' Triton kernels are not exported yet)")
    inputs = []
    for index, (name, value) in enumerate(leaves):
        if isinstance(value, torch.Tensor):
            marks = dims.get(index, {})
            shape = [list(marks[d]) if d in marks else int(n) for d, n in enumerate(value.shape)]
            inputs.append(InputSpec(name, "tensor", shape,
                                    None if marks else list(value.stride()),
                                    str(value.dtype), str(value.device)))
        elif value is None or type(value) in (bool, int, float, str):
            inputs.append(InputSpec(name, "value", value=value))
        else:
            raise ExportError(f"ember.export: argument {name} is a {type(value).__name__}; "
                              f"arguments are tensors, numbers, strings, None and tuples, "
                              f"lists and dicts of them")
    result_source, outputs = _result(captured, gm, where, names, arguments)
    relations = _relations(captured, names, leaves, dims, where)
    signature = Signature(names, inputs, structure, graph_inputs, outputs, result_source,
                          relations)
    graph_text = gm.code
    compiled_text = analysed.as_text()
    program = ExportedProgram(signature, constants, compiled, graph_text, compiled_text,
                              analysed=analysed)
    from ember import exported_file

    program._record = exported_file.record(program, gm)
    program.export_seconds = seconds
    return program


def _constant_name(expression: str, taken: dict, free_names: tuple[str, ...]) -> str:
    """A readable name for a graph input that is not an argument: a module's parameter or
    buffer by its path (lin.weight), a global or a closure's variable by its name."""
    text = re.sub(r"\._(?:modules|parameters|buffers)\[['\"]([^'\"]+)['\"]\]", r".\1",
                  expression)
    text = re.sub(r"^L\[['\"][^'\"]+['\"]\]\.?", "", text)
    text = re.sub(r"^G+\[(?:\d+\]\[)?['\"]([^'\"]+)['\"]\]", r"\1", text)
    text = re.sub(r"^C\[(\d+)\]\.cell_contents",
                  lambda found: free_names[int(found[1])] if int(found[1]) < len(free_names)
                  else found[0], text)
    text = re.sub(r"[^A-Za-z0-9_.]+", "_", text).strip("._") or "constant"
    name, count = text, 1
    while name in taken:
        name, count = f"{text}_{count}", count + 1
    return name


class _Output:
    def __init__(self, index: int):
        self.index = index


def _relations(captured: Any, names: list[str], leaves: list[tuple[str, Any]],
               dims: dict, where: str) -> list[list[str]]:
    """The capture's size guards as checks over the arguments; an ExportError where the
    compile fixed a size the user asked to be dynamic."""
    if not captured.symbolic:
        return []
    reads = captured.guards.symbol_reads
    readable_names = {}  # symbol -> the user's name for it (batch)
    for index, marks in dims.items():
        for dim, (symbol, _, _) in marks.items():
            for name, read in reads.items():
                if read.kind == "size" and read.index == dim and \
                        _leaf_expression(read.source.expr(), leaves, index, names):
                    readable_names[name] = symbol
    relations = []
    for guard in captured.guards.guards.values():
        if guard.kind != "size":
            continue
        relation = guard.expected
        code = relation.template.format(*(source.expr() for source in relation.sources))
        readable = relation.template.format(*(source.expr() for source in relation.sources))
        for symbol in sorted(relation.symbols, key=len, reverse=True):
            read = reads[symbol]
            code = re.sub(rf"\b{symbol}\b", f"({read.code(read.source.expr())})", code)
            readable = re.sub(rf"\b{symbol}\b", readable_names.get(symbol, read.describe()),
                              readable)
        if not _over_arguments(code, names):
            raise ExportError(f"ember.export: {where}'s sizes are guarded by {readable}, "
                              f"which reads more than its arguments")
        bounds = re.fullmatch(r"(-?\d+) <= (\w+) <= (-?\d+)", relation.template)
        if bounds and bounds[1] == bounds[3] and bounds[2] in readable_names:
            raise ExportError(f"ember.export: dynamic_shapes: ember's compile fixed "
                              f"{readable_names[bounds[2]]} to {bounds[1]} (a step of the "
                              f"graph does not serve other sizes; EMBER_LOGS=recompiles,"
                              f"fallbacks says which); export it without dynamic_shapes")
        relations.append([code, readable.replace("L['", "").replace("']", "")])
    return relations


def _leaf_expression(expression: str, leaves: list, index: int, names: list[str]) -> bool:
    """Is `expression` (a capture's source) the leaf `index` of the arguments?"""
    name = leaves[index][0]
    spelled = re.sub(r"^L\[['\"]([^'\"]+)['\"]\]", r"\1", expression)
    return spelled == name or spelled.replace('"', "'") == name


def _over_arguments(expression: str, names: list[str]) -> bool:
    """Does a capture's expression read only the user's arguments (and torch)?"""
    roots = re.findall(r"\bL\[['\"]([^'\"]+)['\"]\]", expression)
    rest = re.sub(r"\bL\[['\"][^'\"]+['\"]\]", "", expression)
    return bool(roots) and set(roots) <= set(names) and \
        not re.search(r"\b(?:G|GG|C|K)\[", rest)


def _result(captured: Any, gm: torch.fx.GraphModule, where: str, names: list[str],
             arguments: dict[str, Any]) -> tuple[str, list]:
    """The capture's code after its graph call, as `def result(L, outputs)`, and the
    result's nesting (read by running it on stand-ins of the outputs). Code that does more
    than compute the result from the outputs and the arguments (side effects on the model,
    its arguments or globals) cannot be exported."""
    if captured.assumed_checks:
        raise ExportError(f"ember.export: {where} checks a tensor's value and raises where it "
                          f"fails ({captured.assumed_checks[0]}): compiled code runs the "
                          f"function eagerly there, which an exported program cannot; export "
                          f"it without the check (validate_args=False for a distribution)")
    lines = after_graph_call(captured.runner_lines)
    pure = lines is not None and all(
        re.match(r"^(\w+ = |return )", line) and
        (_over_arguments(line, names) or "L[" not in line) and
        not re.search(r"\b(?:G|GG|C|K)\[", line) for line in lines)
    if not pure:
        raise ExportError(f"ember.export: {where} has side effects beside its result (it "
                          f"sets attributes, appends to lists or changes globals); an exported "
                          f"program returns its result only")
    source = "def result(L, outputs):\n" + "".join(f"    {line}\n" for line in lines)
    output_node = next(node for node in gm.graph.nodes if node.op == "output")
    count = len(output_node.args[0]) if isinstance(output_node.args[0], (tuple, list)) else 1
    try:
        value = _result_function(source)({k: arguments[k] for k in names},
                                          [_Output(i) for i in range(count)])
    except Exception as error:  # noqa: BLE001 (code that needs more than the arguments)
        raise ExportError(f"ember.export: {where}'s result needs more than its arguments "
                          f"({type(error).__name__}: {error})") from None

    def describe(value: Any) -> list:
        if isinstance(value, _Output):
            return ["output", value.index]
        if type(value) in (tuple, list):
            return [type(value).__name__, [describe(v) for v in value]]
        if type(value) is dict and all(isinstance(k, str) for k in value):
            return ["dict", [[k, describe(v)] for k, v in value.items()]]
        if value is None or type(value) in (bool, int, float, str):
            return ["value", value]
        raise ExportError(f"ember.export: {where} returns a {type(value).__name__}; an "
                          f"exported program returns tensors, numbers and tuples, lists and "
                          f"dicts of them")

    return source, describe(value)
