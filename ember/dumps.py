"""What EMBER_DUMP writes for a captured graph besides the backend's stages, named so that a
person can map it back to their code.

Takes a captured graph (its nodes' stack traces: the bytecode positions capture recorded, or
Dynamo's), the guard function, the runner and the resume functions; gives a folder per graph
named after the function and the line the graph starts at (`003_forward_model.py-12`), the FX
graph with `# File: model.py:12 in forward` lines, and the guards, the runner and each resume
function as they run. It reads and writes text only: nothing here changes what runs.
"""

from __future__ import annotations

import dis
import re
import types
import weakref
from pathlib import Path
from typing import Any

import torch

from ember import config, logs

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')

# the folder each graph's files went to (the backend's stages, the entry's guards and runner)
_folders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def graph_label(gm: torch.fx.GraphModule) -> str:
    """`forward (model.py:12)`: the function whose code the graph's first op comes from (the
    outermost frame of its stack trace: the compiled function, not a helper it inlined) and
    the line of that op; `graph` when no node carries a stack trace. A graph of torch's own
    code (nn.Sequential's forward) is named after the user's line that compiled it."""
    if "ember_label" in gm.meta:
        return gm.meta["ember_label"]
    for node in gm.graph.nodes:
        frames = _FRAME.findall(node.meta.get("stack_trace") or "")
        if frames:
            filename, line, function = frames[0]
            function = function.rpartition("<locals>.")[2]  # (a nested function: its name)
            return f"{function} ({Path(filename).name}:{line})"
    return "graph"


def folder_for(gm: torch.fx.GraphModule, label: str) -> Path | None:
    """The dump folder of this graph: the one made for it already, else a new one (None when
    EMBER_DUMP is off)."""
    folder = _folders.get(gm)
    if folder is None:
        folder = logs.dump_folder(label)
        if folder is not None:
            _folders[gm] = folder
    return folder


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The FX graph as Python, each op under a `# File: model.py:12 in forward, code: ...`
    line taken from its stack trace."""
    try:
        return gm.print_readable(print_output=False)
    except Exception:  # noqa: BLE001 (a graph FX cannot print verbosely: its plain code)
        return gm.code


def dump_entry(captured: Any, guard_text: str, call: Any, where: str) -> Path | None:
    """Beside the graph: guards.py (the guard function), runner.py (fetches the inputs, calls
    the compiled graph, replays side effects, builds the result) and, where guards and runner
    run as one function, entry.py: that function, as it runs."""
    if config.settings.dump_dir is None:
        return None
    gm = captured.graph_module
    folder = folder_for(gm, graph_label(gm))
    if folder is None:
        return None
    header = f"# {where}\n"
    logs.dump(folder, "fx_graph.py", graph_text(gm))
    logs.dump(folder, "guards.py", header + guard_text)
    logs.dump(folder, "runner.py", header + captured.runner_source)
    source = getattr(call, "ember_source", None)
    if source is not None:
        logs.dump(folder, "entry.py", header + "# the guards, then the runner: what each call "
                  "runs\n" + source)
    return folder


def dump_resume(folder: Path | None, function: types.FunctionType, code: types.CodeType,
                start: int) -> None:
    """A resume function beside the graph whose break made it: where in the user's code it
    resumes, and its bytecode (assembled, it has no source of its own)."""
    if folder is None:
        return
    instructions = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    line = next((i.positions.lineno for i in instructions[start:]
                 if i.positions is not None and i.positions.lineno is not None), None)
    resumed = function.__code__
    parameters = ", ".join(resumed.co_varnames[:resumed.co_argcount])
    text = (f"# {resumed.co_name}: resumes {code.co_qualname} ({code.co_filename}:{line}) at "
            f"instruction {start} of its code, after the graph break\n"
            f"# parameters: {parameters}\n\n{_disassembly(resumed)}")
    logs.dump(folder, f"resume_{Path(code.co_filename).stem}-{line}_{start}.txt", text)


def _disassembly(code: types.CodeType) -> str:
    import io

    out = io.StringIO()
    dis.dis(code, file=out)
    return out.getvalue()
