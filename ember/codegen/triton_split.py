"""Split reductions in Triton kernels: a row too long for too few programs is cut into chunks,
each program folds its chunk into partial results stored in a workspace, and a later stage
combines them (the finishing kernel, the next level's partial stage, or a gathering stage
that finishes each row once for the stages after it).

A mixin of the kernel writer (ember/codegen/triton.py) beside ReductionWriting
(triton_reductions.py), which calls gather_partials where a split row's reduction is read
and store_partials where a chunk's is done. It must not decide the tiling (triton_tiling.py's
maybe_split does).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ember.codegen import triton_tiling
from ember.codegen.text import Scope
from ember.codegen.triton_rules import compute_type
from ember.codegen.triton_tiling import pow2
from ember.ir.graph import Node
from ember.ir.ops import Kind, Op
from ember.ir.sizes import guess

_TORCH_TYPES = {"tl.float32": torch.float32, "tl.float64": torch.float64,
                "tl.int32": torch.int32, "tl.int64": torch.int64, "tl.int16": torch.int16,
                "tl.int8": torch.int8, "tl.uint8": torch.uint8}


@dataclasses.dataclass(eq=False)
class Workspace:
    """Scratch memory of a split reduction: each chunk's partial result per row."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def root(self) -> Workspace:
        return self


class SplitWriting:
    """The split-reduction methods of TritonKernelWriter (see there for the attributes they
    use; accumulator_type, finish, initial and the Welford statistics are ReductionWriting's)."""

    @functools.cached_property
    def levels(self) -> dict[Node, int]:
        """1 + the highest level of the kernel's reductions a reduction reads (a variance
        after its mean is level 2): each level is one more pass over the rows."""
        members, levels = self.members, {}

        def level(node: Node, seen: set) -> int:
            if node in levels:
                return levels[node]
            if node in self.centered_means:  # (walked with its mean: one level)
                levels[node] = level(self.centered_means[node], set())
                return levels[node]
            found = 0
            stack = list(node.inputs)
            while stack:
                current = stack.pop()
                if current in seen:
                    continue
                seen.add(current)
                if current.kind is Kind.REDUCTION and current in members:
                    found = max(found, level(current, set()))
                    continue
                buffer = self.buffer_of.get(current)
                if buffer is not None and current not in members and buffer.role != "alias":
                    continue  # loaded: not computed here
                stack.extend(current.inputs)
            levels[node] = found + 1 if node.kind is Kind.REDUCTION else found
            return levels[node]

        for node in self.kernel.members:
            if node.kind is Kind.REDUCTION:
                level(node, set())
        return {n: v for n, v in levels.items() if n.kind is Kind.REDUCTION}

    def partial_spaces(self, node: Node) -> list[tuple[str, torch.dtype]]:
        """(name suffix, dtype) of each workspace of the node's partial results."""
        spaces = [("", _TORCH_TYPES[self.accumulator_type(node)])]
        if node in self.centered_means:  # (each chunk's mean, squares' sum and count)
            spaces += [("_m2", spaces[0][1]), ("_count", spaces[0][1])]
        if node.op in (Op.ARGMAX, Op.ARGMIN):
            spaces.append(("_at", torch.int64))
        return spaces

    def workspaces_of(self, node: Node) -> list[Workspace]:
        if node not in self.workspaces:
            shape = (self.tiling.parts, self.xnumel)
            name = f"{self.kernel.name}_ws{len(self.workspaces)}"
            self.workspaces[node] = [Workspace(name + suffix, shape, dtype)
                                     for suffix, dtype in self.partial_spaces(node)]
        return self.workspaces[node]

    def store_partials(self, node: Node, scope: Scope, acc: str, position: str | None) -> str:
        """This chunk's partial result of each row, into the node's workspace."""
        partial = self.finish(node, scope, acc, position, raw=True)
        spaces = self.workspaces_of(node)
        mask = f", mask={self.masks['x']}" if "x" in self.masks else ""
        at = f"tl.program_id(1) * {self.xnumel} + x"
        self.emit(scope, f"tl.store({self.argument(spaces[0])} + {at}, {partial[0]}{mask})")
        if len(partial) > 1:
            self.emit(scope, f"tl.store({self.argument(spaces[1])} + {at}, {partial[1]}{mask})")
        return partial[0]

    def gather_partials(self, node: Node, scope: Scope) -> str:
        """A reduction finished from its chunks' partial results (or loaded, where a stage of
        its own finished it)."""
        if self.levels[node] in self.gathered_levels:
            return self.load_finished(node, scope)
        return self.combine_partials(node, scope)

    def combine_partials(self, node: Node, scope: Scope) -> str:
        """A reduction finished from its chunks' partial results, in this program."""
        if node in self.centered_means:
            return self.gather_welford(node, scope)
        init = self.initial(node.op, node.inputs[0].dtype, self.accumulator_type(node))
        values, *position = self.load_partials(node, scope, [init, "0"])
        return self.finish(node, scope, values, position[0] if position else None)

    def final_grid_parts(self) -> int:
        """The finishing kernel of a split reduction runs one program per chunk when it stores
        whole rows (each stores its chunk), else one per row."""
        return self.tiling.parts if self.split and self.full_stores else 1

    @functools.cached_property
    def gathered_levels(self) -> frozenset[int]:
        """The levels whose reductions a gathering stage finishes, each row's chunks combined
        once into a finished workspace that the later stages load: those read by a later stage
        that runs a program per chunk, where every such program combining every chunk would
        load at least the heuristics' gather_stage_bytes in all (see triton_tiling)."""
        if not self.split:
            return frozenset()
        top = max(self.levels.values())
        parts = self.tiling.parts
        found = set()
        for level in range(1, top + 1):
            if level == top and self.final_grid_parts() == 1:
                continue  # (read only by the finishing kernel, one program per row block)
            width = sum(dtype.itemsize for node, at in self.levels.items() if at == level
                        for _, dtype in self.partial_spaces(node))
            if guess(self.xnumel) * parts * parts * width >= \
                    triton_tiling.HEURISTICS.gather_stage_bytes:
                found.add(level)
        return frozenset(found)

    def finished_space(self, node: Node) -> Workspace:
        """Where a gathering stage stores the node's finished value, one per row."""
        key = ("finished", node)
        if key not in self.workspaces:
            dtype = _TORCH_TYPES[self.finished_type(node)]
            self.workspaces[key] = [Workspace(f"{self.kernel.name}_ws{len(self.workspaces)}",
                                              (1, self.xnumel), dtype)]
        return self.workspaces[key][0]

    def finished_type(self, node: Node) -> str:
        """The type of the value combine_partials gives (booleans kept as int8)."""
        if node in self.centered_means:
            return self.accumulator_type(node)
        if node.op in (Op.ANY, Op.ALL) or node.dtype is torch.bool:
            return "tl.int8"
        if node.op in (Op.ARGMAX, Op.ARGMIN):
            return "tl.int64"
        return compute_type(node.dtype)

    def store_finished(self, node: Node, scope: Scope) -> None:
        """A gathering stage's work for one reduction: its chunks combined, stored."""
        value = self.combine_partials(node, scope)
        mask = f", mask={self.masks['x']}" if "x" in self.masks else ""
        self.emit(scope, f"tl.store({self.argument(self.finished_space(node))} + x, "
                         f"{value}.to({self.finished_type(node)}){mask})")

    def load_finished(self, node: Node, scope: Scope) -> str:
        mask = f", mask={self.masks['x']}" if "x" in self.masks else ""
        value = f"tl.load({self.argument(self.finished_space(node))} + x{mask})"
        if self.finished_type(node) == "tl.int8":
            value = f"({value} != 0)"
        return self.define(scope, value, frozenset({"x"}))

    def load_partials(self, node: Node, scope: Scope, others: list[str]) -> list[str]:
        """Each of the node's workspaces as a [XBLOCK, parts] tile (lanes past the last part,
        and masked rows, read as `others`)."""
        parts = self.tiling.parts
        lanes = pow2(parts)
        part = self.fresh("part")
        self.emit(scope, f"{part} = tl.arange(0, {lanes})[None, :]")
        masks = [self.masks["x"]] if "x" in self.masks else []
        if lanes != parts:
            masks.append(f"({part} < {parts})")
        at = f"{part} * {self.xnumel} + x"
        loaded = []
        for space, other in zip(self.workspaces_of(node), others):
            mask = f", mask={' & '.join(masks)}, other={other}" if masks else ""
            loaded.append(self.define(scope, f"tl.load({self.argument(space)} + {at}{mask})",
                                      frozenset({"x", "r"})))
        return loaded
