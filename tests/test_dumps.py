"""EMBER_DUMP writes what a person can map back to their code (ember/dumps.py): a folder per
graph named after the function and the line the graph starts at, the FX graph with `# File:`
lines, the guards, the runner and the entry function as they run, and each resume function."""

import re

import torch

import ember
from ember import config


def helper(y):
    z = y.sin()
    print("a graph break")
    return z * 2


def forward(x):
    a = x + 1
    b = helper(a)
    return b.cos()


FORWARD = forward.__code__.co_firstlineno  # (def forward(x):)
HELPER = helper.__code__.co_firstlineno


def _folders(root):
    return sorted(path.name[4:] for path in root.iterdir())  # (without the NNN_ counter)


def test_folders_are_named_after_the_function_and_the_line_the_graph_starts_at(tmp_path):
    x = torch.randn(4)
    with config.override(dump_dir=tmp_path):
        torch.testing.assert_close(ember.compile(forward)(x), forward(x))
    assert _folders(tmp_path) == sorted([
        f"forward_test_dumps.py-{FORWARD + 1}",   # a = x + 1
        f"helper_test_dumps.py-{HELPER + 1}",     # z = y.sin(): helper compiled at the break
        f"helper_test_dumps.py-{HELPER + 3}",     # return z * 2, after the print
        f"forward_test_dumps.py-{FORWARD + 3}",   # return b.cos()
    ])
    assert all(re.fullmatch(r"\d{3}_.*", path.name) for path in tmp_path.iterdir())


def test_the_fx_graph_has_file_lines_and_guards_runner_and_entry_are_beside_it(tmp_path):
    with config.override(dump_dir=tmp_path):
        ember.compile(forward)(torch.randn(4))
    folder = next(tmp_path.glob(f"*_forward_test_dumps.py-{FORWARD + 1}"))
    graph = (folder / "fx_graph.py").read_text()
    assert f"# File: {__file__}:{FORWARD + 1} in forward, code: a = x + 1" in graph
    guards = (folder / "guards.py").read_text()
    assert guards.startswith(f"# forward ({__file__}:{FORWARD})\ndef guard(L):")
    assert "L['x']" in guards and "G['helper']" in guards
    runner = (folder / "runner.py").read_text()
    assert "compiled(" in runner and "def run(L)" in runner
    entry = (folder / "entry.py").read_text()
    assert "def call(L):" in entry and "return MISS" in entry and "compiled(*inputs)" in entry
    # the resume function that runs the rest of forward after helper's call
    resumes = list(folder.glob("resume_test_dumps-*.txt"))
    assert len(resumes) == 1, sorted(p.name for p in folder.iterdir())
    text = resumes[0].read_text()
    assert f"resumes forward ({__file__}:{FORWARD + 2})" in text and "RESUME" in text


def test_a_torch_module_is_named_after_the_users_line(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with config.override(dump_dir=tmp_path):
        compiled = ember.compile(model)
        line = _line() - 1
        with torch.no_grad():  # (a training graph would add a folder for its backward)
            torch.testing.assert_close(compiled(torch.ones(2, 4)), model(torch.ones(2, 4)))
    assert _folders(tmp_path) == [f"Sequential.forward_test_dumps.py-{line}"]
    assert compiled._compiled_forward.where == \
        f"Sequential.forward (torch's code, compiled at {__file__}:{line})"


def _line():
    import sys

    return sys._getframe(1).f_lineno


def test_graphs_through_torch_compile_are_named_from_dynamos_stack_traces(tmp_path):
    def scaled(x):
        return x * 3

    with config.override(dump_dir=tmp_path):
        torch.compile(scaled, backend="ember")(torch.randn(4))
    line = scaled.__code__.co_firstlineno + 1
    assert _folders(tmp_path) == [f"scaled_test_dumps.py-{line}"]
    graph = (next(tmp_path.iterdir()) / "fx_graph.py").read_text()
    assert f"test_dumps.py:{line} in scaled, code: return x * 3" in graph
