"""Export: a function or module compiled ahead of time into a program that a fresh process
loads from one file and runs without the model's source (issue 20, item 2).

    program = ember.export(model, x, dynamic_shapes={"x": {0: Dim("batch")}})
    print(program)                       # signature, constants, input checks, graph, kernels
    program.save("model.ember")          # one file: wrapper, kernels (source and binary),
    run = ember.load("model.ember")      # parameters and buffers as named constants
    run(x)                               # inputs checked: shapes, dtypes, devices, strides
    program.save("model", format="c")    # a C library and header (ember/exported_c.py)

Takes what ember's capture makes of one call (one graph, no breaks, no side effects on the
model) and the graph compiled by ember/aot.py; gives the program, its file (the encoding of
runtime/warm_values.py, as the warm cache keeps a graph) and the loader. It must not import
the model's code at load time: parameters and buffers travel as tensors, the kernels as their
source and their binary (rebuilt from the source only where the binary was made for another
CPU or compiler), the graph's eager form as FX's generated code over torch's functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import io
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

from ember.codegen.wrapper import WrapperSource
from ember.runtime import build, disk_cache, warm_cache
from ember.runtime.compiled import CompiledGraph
from ember.runtime.warm_values import Decoder, Encoder, NotKept

FORMAT = "ember-export-1"
MAGIC = b"EMBER-EXPORT\n"

# what loads did in this process (tests count with them: a binary used, or rebuilt)
counts = {"binaries_loaded": 0, "rebuilt": 0}


class ExportError(RuntimeError):
    """A function or module that cannot be exported, and why."""


class ExportFileError(ValueError):
    """A file that is not an ember export, or one that is damaged or made for another
    ember."""


class InputMismatch(TypeError):
    """An exported program called with an argument other than those it was exported for."""


# -- signature ------------------------------------------------------------------------------
@dataclasses.dataclass
class InputSpec:
    """One leaf of the arguments: a tensor (its checks), or a value baked into the graph."""

    name: str                     # as the user spells it: x, xs[1], options['scale']
    kind: str                     # "tensor" or "value"
    shape: list = dataclasses.field(default_factory=list)    # ints, or [symbol, min, max]
    strides: list | None = None   # exact strides; None: row-major (a dynamic shape's)
    dtype: str = ""
    device: str = ""
    value: Any = None

    def describe(self) -> str:
        if self.kind == "value":
            return f"{self.name} = {self.value!r} (baked into the graph)"
        dims = ", ".join(str(d) if isinstance(d, int) else f"{d[0]}∈[{d[1]}, {d[2]}]"
                         for d in self.shape)
        layout = "row-major" if self.strides is None else f"strides {tuple(self.strides)}"
        return f"{self.name}: {self.dtype}[{dims}] on {self.device}, {layout}"


@dataclasses.dataclass
class Signature:
    parameters: list[str]         # the function's parameters, in order (binding calls)
    inputs: list[InputSpec]       # the leaves of the arguments, in order
    structure: list               # each parameter's nesting (see _flatten)
    # per graph input: ["argument", leaf], ["constant", name] or ["expression", Python over
    # the arguments L, as the capture computes it: torch.tensor(L['n'])]
    graph_inputs: list
    outputs: list                 # the result's nesting: ["output", i], ["value", v], ...
    # the capture's code after its graph call, `def result(L, outputs)`: builds the result
    # (Python values computed from the arguments included); nothing else
    result_source: str = ""
    # a dynamic program's size relations, as the capture guards them: [Python over the
    # arguments L, the same in the user's names] (`2 <= L['x'].shape[0] <= 32`)
    relations: list = dataclasses.field(default_factory=list)

    def as_text(self, constants: dict[str, torch.Tensor]) -> str:
        lines = [f"def program({', '.join(self.parameters)}):"]
        lines += [f"    input  {spec.describe()}" for spec in self.inputs]
        for name, tensor in constants.items():
            lines.append(f"    const  {name}: {str(tensor.dtype).replace('torch.', '')}"
                         f"{list(tensor.shape)}")
        lines += [f"    check  {readable}" for _, readable in self.relations]
        lines.append(f"    return {render_structure(self.outputs)}")
        return "\n".join(lines)


def render_structure(structure: list) -> str:
    kind = structure[0]
    if kind == "output":
        return f"out{structure[1]}"
    if kind == "value":
        return repr(structure[1])
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {render_structure(v)}" for k, v in structure[1]) + "}"
    items = ", ".join(render_structure(item) for item in structure[1])
    return f"({items}{',' if len(structure[1]) == 1 else ''})" if kind == "tuple" \
        else f"[{items}]"


def _flatten(value: Any, name: str, leaves: list[tuple[str, Any]]) -> list:
    """The nesting of `value` (tuples, lists, dicts of str keys) as plain data; its leaves
    appended to `leaves` with the names a user would write."""
    if type(value) in (tuple, list):
        return [type(value).__name__, [_flatten(item, f"{name}[{i}]", leaves)
                                       for i, item in enumerate(value)]]
    if type(value) is dict:
        if not all(isinstance(key, str) for key in value):
            raise ExportError(f"argument {name}: a dict whose keys are not all strings")
        return ["dict", [[key, _flatten(item, f"{name}[{key!r}]", leaves)]
                         for key, item in value.items()]]
    leaves.append((name, value))
    return ["leaf", len(leaves) - 1]


def _match(value: Any, structure: list, name: str, leaves: list[Any]) -> None:
    """`value`'s leaves appended to `leaves`, where its nesting is `structure`; else an
    InputMismatch naming the argument."""
    kind = structure[0]
    if kind == "leaf":
        leaves.append(value)
        return
    if kind in ("tuple", "list"):
        if not isinstance(value, (tuple, list)) or len(value) != len(structure[1]):
            found = f"a {type(value).__name__}" + (f" of {len(value)}" if isinstance(
                value, (tuple, list)) else "")
            raise InputMismatch(f"argument {name}: expected a {kind} of {len(structure[1])} "
                                f"items, got {found}")
        for i, (item, inner) in enumerate(zip(value, structure[1])):
            _match(item, inner, f"{name}[{i}]", leaves)
        return
    keys = [key for key, _ in structure[1]]
    if not isinstance(value, dict) or sorted(value) != sorted(keys):
        found = sorted(value) if isinstance(value, dict) else f"a {type(value).__name__}"
        raise InputMismatch(f"argument {name}: expected a dict with keys {keys}, got {found}")
    for key, inner in structure[1]:
        _match(value[key], inner, f"{name}[{key!r}]", leaves)


def _dtype(text: str) -> torch.dtype:
    return getattr(torch, text.replace("torch.", ""))


def check_inputs(signature: Signature, leaves: list[Any]) -> None:
    """Each leaf as the program was exported for; else an InputMismatch naming it."""
    symbols: dict[str, tuple[int, str]] = {}
    for spec, value in zip(signature.inputs, leaves):
        if spec.kind == "value":
            if type(value) is not type(spec.value) or value != spec.value:
                raise InputMismatch(f"argument {spec.name}: the program was exported for "
                                    f"{spec.name}={spec.value!r} (baked into its graph); got "
                                    f"{value!r:.60}")
            continue
        if not isinstance(value, torch.Tensor):
            raise InputMismatch(f"argument {spec.name}: expected a tensor, got "
                                f"{type(value).__name__}")
        if str(value.dtype) != spec.dtype:
            raise InputMismatch(f"argument {spec.name}: expected dtype {spec.dtype}, got "
                                f"{value.dtype}")
        if str(value.device) != spec.device:
            raise InputMismatch(f"argument {spec.name}: expected a tensor on {spec.device}, "
                                f"got one on {value.device}")
        if value.dim() != len(spec.shape):
            raise InputMismatch(f"argument {spec.name}: expected {len(spec.shape)} "
                                f"dimensions, got shape {tuple(value.shape)}")
        for dim, (size, want) in enumerate(zip(value.shape, spec.shape)):
            if isinstance(want, int):
                if size != want:
                    raise InputMismatch(f"argument {spec.name}: expected shape "
                                        f"{_shape_text(spec.shape)}, got {tuple(value.shape)} "
                                        f"(dimension {dim} differs)")
                continue
            symbol, low, high = want
            if not low <= size <= high:
                raise InputMismatch(f"argument {spec.name}: dimension {dim} ({symbol}) must "
                                    f"lie in [{low}, {high}], got {size}")
            if symbol in symbols and symbols[symbol][0] != size:
                raise InputMismatch(f"argument {spec.name}: dimension {dim} is {symbol}, "
                                    f"which {symbols[symbol][1]} sets to {symbols[symbol][0]}; "
                                    f"got {size}")
            symbols.setdefault(symbol, (size, spec.name))
        strides = spec.strides if spec.strides is not None else _row_major(value.shape)
        if any(n > 1 and s != t for n, s, t in zip(value.shape, value.stride(), strides)):
            raise InputMismatch(f"argument {spec.name}: expected strides {tuple(strides)}, "
                                f"got {value.stride()} (pass {spec.name}.contiguous())")


def _shape_text(shape: list) -> str:
    return "(" + ", ".join(str(d) if isinstance(d, int) else d[0] for d in shape) + ")"


def _row_major(shape: Any) -> list[int]:
    strides, step = [], 1
    for size in reversed(list(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return strides[::-1]


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

    @property
    def parameters(self) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers (and other tensors it read), by name."""
        return dict(self.constants)

    @property
    def guards(self) -> list[str]:
        """What each call checks of its inputs."""
        return [spec.describe() for spec in self.signature.inputs]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        signature = self.signature
        leaves: list[Any] = []
        bound = self._bind(args, kwargs)
        for name, value in bound:
            _match(value, signature.structure[signature.parameters.index(name)], name, leaves)
        check_inputs(signature, leaves)
        arguments = dict(bound)
        for expression, readable in signature.relations:
            if not eval(expression, {"torch": torch}, {"L": arguments}):  # noqa: S307 (ours)
                raise InputMismatch(f"the program's sizes must keep {readable}; these "
                                    f"arguments do not")
        inputs = [leaves[which] if kind == "argument" else constant if kind == "constant"
                  else eval(which, {"torch": torch}, {"L": arguments})  # noqa: S307 (ours)
                  for (kind, which), constant in zip(signature.graph_inputs,
                                                     self._constant_inputs)]
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
        buffer = io.BytesIO()
        torch.save(self._record, buffer)
        payload = buffer.getvalue()
        path = Path(path)
        path.write_bytes(MAGIC + _digest(payload).encode() + b"\n" + payload)
        return path


def _result_function(source: str) -> Any:
    namespace = {"torch": torch}
    exec(compile(source, "<ember export: result>", "exec"), namespace)  # noqa: S102 (ours)
    return namespace["result"]


def _digest(payload: bytes) -> str:
    return "sha256:" + hashlib.sha256(payload).hexdigest()


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
    structure = [_flatten(value, name, leaves) for name, value in zip(names, example_args)]
    # the leaves as the capture sees them: tensors detached (own objects, so that marks for
    # dynamic sizes stay off the caller's tensors and each graph input is found by identity)
    values = [value.detach() if isinstance(value, torch.Tensor) else value
              for _, value in leaves]
    dims = _dynamic_dims(dynamic_shapes, names, structure, leaves)
    for index, marks in dims.items():
        for dim, (_, low, high) in marks.items():
            _mark(values[index], dim, low, high)
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


def _mark(tensor: torch.Tensor, dim: int, low: int, high: int) -> None:
    from ember.capture.symbols import mark_dynamic

    mark_dynamic(tensor, dim, min=low, max=high)


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
        name = _constant_name(source.expr(), constants)
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
    program._record = _record(program, gm)
    program.export_seconds = seconds
    return program


def _constant_name(expression: str, taken: dict) -> str:
    """A readable name for a graph input that is not an argument: a module's parameter or
    buffer by its path (lin.weight), a global by its name."""
    text = re.sub(r"\._(?:modules|parameters|buffers)\[['\"]([^'\"]+)['\"]\]", r".\1",
                  expression)
    text = re.sub(r"^L\[['\"][^'\"]+['\"]\]\.?", "", text)
    text = re.sub(r"^G\[['\"]([^'\"]+)['\"]\]", r"\1", text)
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
    lines = captured.runner_lines
    pure = bool(lines) and lines[0].startswith("outputs = compiled(") and all(
        re.match(r"^(\w+ = |return )", line) and
        (_over_arguments(line, names) or "L[" not in line) and
        not re.search(r"\b(?:G|GG|C|K)\[", line) for line in lines[1:])
    if not pure:
        raise ExportError(f"ember.export: {where} has side effects beside its result (it "
                          f"sets attributes, appends to lists or changes globals); an exported "
                          f"program returns its result only")
    source = "def result(L, outputs):\n" + "".join(f"    {line}\n" for line in lines[1:])
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


# -- the file -------------------------------------------------------------------------------
def _record(program: ExportedProgram, gm: torch.fx.GraphModule) -> dict:
    compiled = program.compiled
    try:
        graph = warm_cache._record(compiled, gm)
    except NotKept as error:
        raise ExportError(f"ember.export: the compiled graph cannot be saved: {error}") \
            from None
    binaries = []
    for source, link in graph["libraries"]:
        path = next((p for p, made in build.built_from.items()
                     if made == (source, list(link))), None)
        if path is None:
            raise ExportError("ember.export: a kernel library's binary is not known")
        binaries.append(torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8))
    signature = program.signature
    attributes = {node.target: _fetch(gm, node.target).detach()
                  for node in gm.graph.nodes if node.op == "get_attr"
                  and isinstance(_fetch(gm, node.target), torch.Tensor)}
    return {
        "format": FORMAT,
        "versions": {k: v for k, v in warm_cache.versions().items() if k != "format"},
        "machine": warm_cache.machine(),
        "cflags": list(_flags()),
        "signature": {"parameters": signature.parameters,
                      "inputs": [dataclasses.asdict(spec) for spec in signature.inputs],
                      "structure": signature.structure,
                      "graph_inputs": signature.graph_inputs,
                      "outputs": signature.outputs,
                      "result_source": signature.result_source,
                      "relations": signature.relations},
        "constants": program.constants,
        "attributes": attributes,
        "graph": graph,
        "binaries": binaries,
        "eager": _eager_record(gm),
        "graph_text": program.graph_text,
        "compiled_text": program.compiled_text,
    }


def _flags() -> list[str]:
    from ember import config

    return list(config.settings.cflags) + ["-shared", "-fPIC"]


def _fetch(module: Any, target: str) -> Any:
    value = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _eager_record(gm: torch.fx.GraphModule) -> list | None:
    """The graph's eager form — FX's generated code and the globals it names (torch's
    functions and ops) — for the calls a compiled graph hands to eager; None where a global
    cannot be named in a new process."""
    code = gm.graph.python_code(root_module="self")
    encoder = Encoder(gm)
    names = []
    for name, value in code.globals.items():
        if isinstance(value, types.ModuleType):
            names.append([name, ["module", value.__name__]])
        elif value is type(None):
            names.append([name, ["none_type"]])
        else:
            try:
                names.append([name, encoder.value(value)])
            except NotKept:
                return None
    return [code.src, names]


def load(path: str | Path) -> ExportedProgram:
    """The program saved at `path`, ready to call; its kernels' binaries loaded, or rebuilt
    from their source where they were made for another CPU or C compiler."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ExportFileError(f"ember.load: cannot read {path}: {error}") from None
    if not data.startswith(MAGIC):
        raise ExportFileError(f"ember.load: {path} is not an ember export (it does not start "
                              f"with {MAGIC!r}; save one with ember.export(...).save(path))")
    digest, _, payload = data[len(MAGIC):].partition(b"\n")
    if digest.decode(errors="replace") != _digest(payload):
        raise ExportFileError(f"ember.load: {path} is damaged: its contents do not match the "
                              f"digest written when it was saved (cut short or altered)")
    try:
        record = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as error:  # noqa: BLE001 (a file torch cannot read back)
        raise ExportFileError(f"ember.load: {path} cannot be read ({type(error).__name__}: "
                              f"{str(error)[:200]})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise ExportFileError(f"ember.load: {path} is in format {found!r}; this ember reads "
                              f"{FORMAT!r}")
    try:
        return _loaded(record, path)
    except ExportFileError:
        raise
    except Exception as error:  # noqa: BLE001 (say which file, and which versions)
        raise ExportFileError(
            f"ember.load: {path} cannot be rebuilt here ({type(error).__name__}: "
            f"{str(error)[:300]}); it was made by {record.get('versions')}, this is "
            f"{ {k: v for k, v in warm_cache.versions().items() if k != 'format'} }") from None


def _loaded(record: dict, path: Path) -> ExportedProgram:
    saved = record["signature"]
    signature = Signature(saved["parameters"], [InputSpec(**spec) for spec in saved["inputs"]],
                          saved["structure"], saved["graph_inputs"], saved["outputs"],
                          saved["result_source"], saved["relations"])
    holder = _holder(record["attributes"])
    eager = _eager(record["eager"], holder, path)
    graph = record["graph"]
    decoder = _ExportDecoder(holder, graph["libraries"], graph["tensors"], record)
    checked, fast = (WrapperSource(text, decoder.namespace(namespace))
                     for text, namespace in (graph["checked"], graph["fast"]))
    kernels, libraries, fallbacks = graph["counts"]
    compiled = CompiledGraph(checked, fast, list(graph["tensor_positions"]),
                             graph["argument_count"], eager, f"export {path.name}", kernels,
                             libraries, list(graph["written_inputs"]), fallbacks)
    return ExportedProgram(signature, dict(record["constants"]), compiled,
                           record["graph_text"], record["compiled_text"])


def _holder(attributes: dict[str, torch.Tensor]) -> Any:
    """An object whose dotted attributes are the graph's attributes (for FX's code and the
    wrapper's ["attribute", target] values)."""
    root = types.SimpleNamespace()
    for target, tensor in attributes.items():
        node = root
        *path, last = target.split(".")
        for part in path:
            if not hasattr(node, part):
                setattr(node, part, types.SimpleNamespace())
            node = getattr(node, part)
        setattr(node, last, tensor)
    return root


def _eager(saved: list | None, holder: Any, path: Path) -> Any:
    if saved is None:
        def refuse(*args: Any) -> Any:
            raise RuntimeError(f"{path.name}: the compiled graph gave up on this call and the "
                               f"program carries no eager form")
        return refuse
    source, names = saved
    decoder = _ExportDecoder(holder, [], [], {})
    namespace = {name: importlib.import_module(code[1]) if code[0] == "module" else
                 type(None) if code[0] == "none_type" else decoder.value(code)
                 for name, code in names}
    exec(compile(source, f"<ember export {path.name}: eager form>", "exec"),  # noqa: S102
         namespace)
    forward = namespace["forward"]
    return lambda *args: forward(holder, *args)


class _ExportDecoder(Decoder):
    """The warm cache's decoder, with the kernels' libraries from the export's binaries (or
    rebuilt from their source on another CPU or compiler)."""

    def __init__(self, holder: Any, libraries: list, tensors: list, record: dict):
        super().__init__(holder, libraries, tensors)
        self.record = record

    def _library(self, index: int) -> Any:
        if index not in self.loaded:
            source, link = self.libraries[index]
            if self.record["machine"] == warm_cache.machine():
                library = self._binary(index, source, list(link))
                counts["binaries_loaded"] += 1
            else:  # (made for another CPU or compiler: -march=native code may not run here)
                library, _ = build.build(source, list(link))
                counts["rebuilt"] += 1
            self.loaded[index] = build.load(library)
        return self.loaded[index]

    def _binary(self, index: int, source: str, link: list[str]) -> Path:
        """The saved binary, placed in the kernel cache under the key it was built with."""
        data = self.record["binaries"][index].numpy().tobytes()
        key = build.cache_key(source, list(self.record["cflags"]) + link,
                              build.find_compiler())
        library = disk_cache.entry_path("c", key, ".so")
        if not disk_cache.usable(library, key):
            with disk_cache.building("c", key, ".so") as library:
                if not disk_cache.usable(library, key):  # (placed while this one waited)
                    with disk_cache.temporary(library.parent, ".so", key) as partial:
                        partial.write_bytes(data)
                        disk_cache.commit(partial, library, key)
        build.built_from[str(library)] = (source, list(link))
        return library
