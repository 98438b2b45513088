"""An exported program's signature: the arguments' nesting and leaves (tensors with their
shapes, dtypes, devices and strides; values baked into the graph), the graph's inputs, the
result's nesting; and the checks each call makes, with errors that name the argument.
Plain data only (what the export file keeps); it knows nothing of capture or kernels.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


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
        dims = ", ".join(str(d) if isinstance(d, int) else
                         f"{d[0]}∈[{d[1]}, {d[2] if d[2] < 2 ** 62 else 'inf'}]"
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

    def relation_texts(self) -> list[str]:
        """The size relations in the user's names, once each (x's and y's batch read alike)."""
        return list(dict.fromkeys(readable for _, readable in self.relations))

    def as_text(self, constants: dict[str, torch.Tensor]) -> str:
        lines = [f"def program({', '.join(self.parameters)}):"]
        lines += [f"    input  {spec.describe()}" for spec in self.inputs]
        for name, tensor in constants.items():
            lines.append(f"    const  {name}: {str(tensor.dtype).replace('torch.', '')}"
                         f"{list(tensor.shape)}")
        lines += [f"    check  {readable}" for readable in self.relation_texts()]
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


def flatten(value: Any, name: str, leaves: list[tuple[str, Any]]) -> list:
    """The nesting of `value` (tuples, lists, dicts of str keys) as plain data; its leaves
    appended to `leaves` with the names a user would write."""
    if type(value) in (tuple, list):
        return [type(value).__name__, [flatten(item, f"{name}[{i}]", leaves)
                                       for i, item in enumerate(value)]]
    if type(value) is dict:
        if not all(isinstance(key, str) for key in value):
            raise InputMismatch(f"argument {name}: a dict whose keys are not all strings")
        return ["dict", [[key, flatten(item, f"{name}[{key!r}]", leaves)]
                         for key, item in value.items()]]
    leaves.append((name, value))
    return ["leaf", len(leaves) - 1]


def match(value: Any, structure: list, name: str, leaves: list[Any]) -> None:
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
            match(item, inner, f"{name}[{i}]", leaves)
        return
    keys = [key for key, _ in structure[1]]
    if not isinstance(value, dict) or sorted(value) != sorted(keys):
        found = sorted(value) if isinstance(value, dict) else f"a {type(value).__name__}"
        raise InputMismatch(f"argument {name}: expected a dict with keys {keys}, got {found}")
    for key, inner in structure[1]:
        match(value[key], inner, f"{name}[{key!r}]", leaves)


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
        if value.requires_grad and torch.is_grad_enabled():
            raise InputMismatch(f"argument {spec.name} requires grad: an exported program "
                                f"computes no gradients (call it under torch.no_grad(), or "
                                f"pass {spec.name}.detach())")
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
