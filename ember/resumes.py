"""Resume functions: the rest of a compiled function after a graph break, built and compiled
the first time a break reaches it (ember/api.py's CompiledFunction makes them; the capture
says where each resumes: ember/capture/breaks.py). Also the graphs that compute nothing and
run as plain functions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import dumps, logs

if TYPE_CHECKING:
    from ember.api import CompiledFunction
    from ember.capture.captured import Resumption


def passthrough(graph_module: torch.fx.GraphModule) -> Callable | None:
    """A graph that computes nothing (it hands its inputs on: the values a graph break's
    resume function needs, a returned loss) runs as a plain function, not through a backend:
    a compiled identity would cost a call, and a training graph's autograd.Function, per step."""
    nodes = list(graph_module.graph.nodes)
    if any(node.op not in ("placeholder", "output") for node in nodes):
        return None
    position = {node: k for k, node in enumerate(n for n in nodes if n.op == "placeholder")}
    result = nodes[-1].args[0]

    def hand_on(*args: Any) -> Any:
        return torch.fx.node.map_arg(result, lambda node: args[position[node]])

    hand_on.passthrough = True
    return hand_on


# Resume functions nest (a break in a resume function makes another); past this depth they
# run as plain Python (a loop whose every iteration breaks would otherwise nest without end).
MAX_RESUME_DEPTH = 16


class Resume:
    """A resume function, built and ember-compiled the first time a break reaches it.

    It resumes the original function's code at instruction `start` (of that code, not of the
    resume function whose break made it): a break that a resume function meets again at the
    same place (a loop whose every iteration breaks) resumes through the same Resume, so
    the code after it is compiled once, and its guards are checked on the next iteration."""

    def __init__(self, parent: CompiledFunction, spec: Resumption, start: int,
                 lasti: int | None):
        self.parent = parent
        self.spec = spec
        self.start = start
        self.lasti = lasti  # (an exception handler's entry: the instruction that raised)
        self.compiled: Callable | None = None
        self._making = threading.Lock()
        self.dump_folder = None  # (EMBER_DUMP: the folder of the graph whose break made it)

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            with self._making:  # (threads that reach it together build it once)
                if self.compiled is None:
                    self._make()
        return self.compiled(*args)

    def _make(self) -> None:
        parent, spec = self.parent, self.spec
        from ember.capture.breaks import resume_function

        code = parent.origin[0]
        function, offset = resume_function(parent.function, code, self.start, spec.stack,
                                           spec.locals, spec.cells, self.lasti)
        dumps.dump_resume(self.dump_folder, function, code, self.start)
        if spec.name == "resume_handler":
            # (an exception handler, reached when the native part raised: the rare path
            # runs as Python, and so does the rest of the function after it)
            logs.channel("graph_breaks").info(
                "%s: an exception was raised in a try block; its handler and what "
                "follows run as Python", parent.where)
            self.compiled = function
        elif parent.depth + 1 >= MAX_RESUME_DEPTH:
            logs.channel("graph_breaks").info(
                "%s: breaks nest %d deep; the rest runs as Python", parent.where,
                MAX_RESUME_DEPTH)
            self.compiled = function
        else:
            from ember.api import CompiledFunction

            self.compiled = CompiledFunction(
                function, fullgraph=False, dynamic=parent.dynamic, mode=parent.mode,
                backend=parent.backend, depth=parent.depth + 1, collector=parent.collector,
                where=parent.where, origin=(code, offset), resumes=parent.resumes,
                settings=parent.settings, recompile_limit=parent.recompile_limit)
            self.compiled.called_from = parent.called_from  # (it runs in the same frame)
