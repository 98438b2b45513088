"""Lowering a graph whose sizes are symbols: torch's SymInts become ember's `Size` here, once.

`SymbolTable` names the symbols in the order the graph's tensor inputs show them (s0, s1, ...:
the same graph gives the same names, so one kernel source serves every capture of it) and
records in `Graph.symbols` where each is read (input index, dim). `symbolic_inputs` gives the
fake meta tensors the tracer runs on, from the capture's (or Dynamo's) fake example values.
It must not decide anything about a size: it only converts.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ember import torch_internals
from ember.ir.graph import Graph
from ember.ir.sizes import Dim, Size, Symbol, Undecided
from ember.lower.registry import Unsupported
from ember.torch_internals import tree_map


class SymbolTable:
    """torch's symbols -> ember's, and SymInt -> Size (memoized by expression)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.symbols: dict[Any, Symbol] = {}
        self.memo: dict[Any, Dim] = {}
        # torch symbols a guard pinned to one value (`view(2, s, 4, 2)` of a symbolic last dim
        # guards it == 8 by narrowing its range, not always by a replacement): constants
        self.constants: dict[Any, int] = {}

    def read_input(self, shape: Any, index: int) -> None:
        """Name the symbols that input `index`'s dims are (the first read of each)."""
        for dim, value in enumerate(shape):
            expression = torch_internals.symbolic_expression(value)
            if torch_internals.is_symbol(expression) and expression not in self.symbols \
                    and expression not in self.constants:
                low, high = torch_internals.symbol_bounds(value, expression)
                if low == high:
                    self.constants[expression] = low
                    continue
                symbol = Symbol(f"s{len(self.symbols)}", low, high)
                self.symbols[expression] = symbol
                self.graph.symbols[symbol.name] = (index, dim)

    def size(self, value: Any) -> Any:
        """A SymInt as an int or a Size; anything else as it is."""
        if not isinstance(value, torch.SymInt):
            return value
        expression = torch_internals.symbolic_expression(value)
        if isinstance(expression, int):
            return expression
        found = self.memo.get(expression)
        if found is None:
            found = self.memo[expression] = self._convert(expression)
        return found

    def _convert(self, expression: Any) -> Dim:
        choice = torch_internals.min_max_arguments(expression)
        if choice is not None:  # (decided from the ranges: Max(1, s - 1) is s - 1, s >= 2)
            kind, arguments = choice
            values = [self._convert(argument) for argument in arguments]
            best = values[0]
            for value in values[1:]:
                if (value >= best) if kind == "max" else (value <= best):
                    best = value
            return best
        terms = torch_internals.polynomial_terms(expression)
        if terms is None:
            raise Undecided(f"the size {expression} is not a polynomial of the input sizes "
                            f"(issue 18, stage 3)")
        table: dict[tuple[Symbol, ...], int] = {}
        for symbols, coefficient in terms:
            for s in symbols:
                if s in self.constants:
                    coefficient *= self.constants[s]
            try:
                monomial = tuple(sorted(self.symbols[s] for s in symbols
                                        if s not in self.constants))
            except KeyError:
                raise Undecided(f"the size {expression} is not read from a tensor input's "
                                f"dims") from None
            table[monomial] = table.get(monomial, 0) + coefficient
        return Size.make(table)

    def dims(self, values: Any) -> tuple:
        return tuple(self.size(v) for v in values)

    def convert(self, tree: Any) -> Any:
        return tree_map(self.size, tree)


def placeholder_examples(module: torch.fx.GraphModule, example_inputs: list[Any]) -> list[Any]:
    """Each input's symbolic example: the placeholder's fake value (ember's capture and Dynamo
    both keep one), else the example input itself."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise Unsupported("placeholders and example inputs disagree")
    examples = []
    for node, value in zip(placeholders, example_inputs):
        example = node.meta.get("example_value", node.meta.get("val"))
        if example is None or type(example) is not type(value) and \
                not (isinstance(example, torch.Tensor) and isinstance(value, torch.Tensor)) \
                and not isinstance(example, torch.SymInt):
            example = value
        examples.append(example)
    return examples


def describe_placeholders(module: torch.fx.GraphModule, example_inputs: list[Any]) -> dict:
    """The placeholders' symbolic examples as plain data — each symbol's hint and range, each
    tensor's sizes, strides and offset as Python over the symbols, each SymInt's, and the
    relations their ShapeEnv holds (a divisibility the lowering may have relied on) — what
    a symbolic graph's compiled code assumes: part of its warm-cache key, and what
    `restore_placeholders` makes the examples again from in another process (a graph
    rebuilt by a warm start before capture, compiled cold again for every shape)."""
    inputs: list[list] = []
    symbols: dict[Any, torch.SymInt] = {}  # (each symbol met, with a SymInt of its ShapeEnv)
    for value in placeholder_examples(module, example_inputs):
        if isinstance(value, torch.Tensor) and torch_internals.is_symbolic(value):
            geometry = [list(value.shape), list(value.stride()), [value.storage_offset()]]
            inputs.append(["tensor", *[[_render(d, symbols) for d in part]
                                       for part in geometry],
                           str(value.dtype).removeprefix("torch."), str(value.device),
                           value.requires_grad])
        elif isinstance(value, torch.SymInt):
            inputs.append(["int", _render(value, symbols)])
        else:
            inputs.append(["plain"])
    described, relations = [], []
    for symbol, value in symbols.items():
        shape_env = torch_internals.shape_env_of(value)
        described.append([str(symbol), torch_internals.symbol_hint(shape_env, symbol),
                          *torch_internals.symbol_range(shape_env, symbol)])
        relations = relations or [str(relation) for relation in
                                  torch_internals.shape_guards(shape_env)]
    return {"inputs": inputs, "symbols": described, "relations": relations}


def _render(value: Any, symbols: dict[Any, torch.SymInt]) -> str:
    """A size as Python over its symbols' names (each symbol noted in `symbols`)."""
    if not isinstance(value, torch.SymInt):
        return str(int(value))
    expression = torch_internals.symbolic_expression(value)
    if not hasattr(expression, "free_symbols"):
        return str(int(expression))
    for symbol in expression.free_symbols:
        symbols.setdefault(symbol, value)
    return torch_internals.render_python(expression, {s: str(s)
                                                      for s in expression.free_symbols})


def restore_placeholders(module: torch.fx.GraphModule, described: dict) -> torch.fx.GraphModule:
    """`module` with its placeholders' symbolic examples made again from
    `describe_placeholders` (on a new ShapeEnv: ranges kept, its other relations not; a
    question they answered is undecided here, and the graph compiles per shape)."""
    fake_mode, shape_env = torch_internals.make_symbolic_fake_mode()
    names = {name: torch_internals.ranged_symbol(shape_env, name, hint, low, high)
             for name, hint, low, high in described["symbols"]}

    def size(text: str) -> Any:
        return eval(text, {"__builtins__": {"min": min, "max": max}}, names)  # noqa: S307
        # (ember's own rendering of the kept expressions: names, ints, + - * // min max)

    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for node, kept in zip(placeholders, described["inputs"]):
        if kept[0] == "tensor":
            _, shape, stride, (offset,), dtype, device, requires_grad = kept
            with fake_mode:
                fake = torch.empty_strided([size(d) for d in shape], [size(d) for d in stride],
                                           dtype=getattr(torch, dtype), device=device)
                if offset != "0":
                    fake = fake.as_strided(fake.shape, fake.stride(), size(offset))
            node.meta["example_value"] = fake.requires_grad_(requires_grad)
        elif kept[0] == "int":
            node.meta["example_value"] = size(kept[1])
    return module


def fake_mode(examples: list[Any]) -> Any:
    for value in examples:
        mode = torch_internals.fake_mode_of(value)
        if mode is not None and torch_internals.is_symbolic(value):
            return mode
    raise Unsupported("no symbolic fake tensor among the inputs")


def meta_like(fake: torch.Tensor) -> torch.Tensor:
    """A fake meta tensor with `fake`'s symbolic geometry (call under its fake mode)."""
    return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device="meta")


def symbolic_arguments(tracer: Any, module: torch.fx.GraphModule, example_inputs: list[Any]
                       ) -> tuple[Any, list[Any]]:
    """(the fake mode to trace under, the graph's arguments): each tensor input a fake meta
    tensor with its symbolic geometry, bound to a graph input whose sizes are `Size`s; a
    SymInt argument as it is (converted where an op takes it)."""
    examples = placeholder_examples(module, example_inputs)
    mode = fake_mode(examples)
    graph, arguments = tracer.graph, []
    for value in examples:
        if isinstance(value, torch.Tensor):
            with mode:
                meta = meta_like(value)
            tracer.symbols.read_input(value.shape, len(graph.inputs))
            graph.add_input(tracer.dims(value.shape), value.dtype, tracer.dims(value.stride()))
            tracer.bind_input(meta, len(graph.inputs) - 1)
            arguments.append(meta)
        elif isinstance(value, (torch.SymFloat, torch.SymBool)):
            raise Unsupported("symbolic scalar input")
        else:
            arguments.append(value)
    return mode, arguments
