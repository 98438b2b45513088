"""ember.explain(fn)(*args): capture once, with a backend that runs the graphs eagerly, and
report what ember made of the call — graphs, breaks with their reasons and hints, guards, ops,
eager islands, CUDA graphs — as torch._dynamo.explain does."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ember.api import CaptureRecord, compile
from ember.capture.errors import Unsupported
from ember.compiled_module import CompiledModule


@dataclasses.dataclass
class ExplainOutput:
    """What ember.explain(fn)(*args) reports (like torch._dynamo.explain)."""

    graphs: list[torch.fx.GraphModule]
    graph_count: int
    graph_break_count: int
    break_reasons: list[Unsupported]
    guards: list[str]
    ops_per_graph: list[int]
    compile_seconds: float
    cuda_graphs: list[str] = dataclasses.field(default_factory=list)  # per graph, if asked
    # nodes ember's backend runs eagerly inside the compiled graphs (and why)
    eager_islands: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}",
                 f"Graph break count: {self.graph_break_count}",
                 f"Op count: {sum(self.ops_per_graph)}"]
        if self.break_reasons:
            lines.append("Break reasons:")
            seen: dict[tuple, int] = {}
            for number, reason in enumerate(self.break_reasons, start=1):
                key = (reason.reason, tuple((place.filename, place.line)
                                            for place in reason.user_stack))
                if key in seen and reason.user_stack:
                    # (a function called at a break is compiled on its own, and meets the
                    # same construct again in its own frame)
                    lines.append(f"  {number}. the same as {seen[key]}, met again where "
                                 f"{reason.user_stack[-1].function} is compiled on its own")
                    continue
                seen[key] = number
                lines.append(f"  {number}. {reason.reason}")
                if reason.user_stack:
                    lines.extend(f"       {line}"
                                 for line in reason.describe_stack().splitlines())
                if reason.hint:
                    lines.append(f"     hint: {reason.hint}")
        if self.ops_per_graph:
            lines.append("Ops per graph: " + ", ".join(map(str, self.ops_per_graph)))
        if self.cuda_graphs:
            lines.append("CUDA graphs: " + "; ".join(self.cuda_graphs))
        if self.eager_islands:
            lines.append("Eager islands:")
            lines.extend(f"  {number}. {island}"
                         for number, island in enumerate(self.eager_islands, start=1))
        lines.append(f"Guards: {sum(text.count('if not') for text in self.guards)}")
        lines.append(f"Capture time: {self.compile_seconds * 1000:.1f} ms")
        return "\n".join(lines)


def explain(function: Callable | torch.nn.Module, **options: Any) -> Callable[..., ExplainOutput]:
    """ember.explain(fn)(*args, **kwargs): capture once and report graphs, breaks, guards."""

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        from ember.backends import explaining_backend
        from ember.runtime.partitioned import eager_islands

        options.setdefault("backend", explaining_backend)  # (eager, and which nodes would be)
        compiled = compile(function, **options)
        # (a module is called as a call calls it: its hooks — a lazy module's initializing
        # pre-hook among them — run around the compiled forward)
        target = compiled._compiled_forward if isinstance(compiled, CompiledModule) \
            else compiled
        collector: list[CaptureRecord] = []
        target.reset()
        target.collector = collector
        compiled(*args, **kwargs)
        records = collector
        graphs = [r.graph for r in records if r.graph is not None]
        return ExplainOutput(
            graphs=graphs, graph_count=sum(r.graphs for r in records),
            graph_break_count=sum(len(r.breaks) for r in records),
            break_reasons=[b for r in records for b in r.breaks],
            guards=[r.guards for r in records if r.guards],
            ops_per_graph=[n for r in records for n in r.ops],
            compile_seconds=sum(r.seconds for r in records),
            cuda_graphs=[r.cuda_graph.status() for r in records if r.cuda_graph is not None],
            eager_islands=[i for r in records for i in eager_islands(r.compiled)])

    return run
