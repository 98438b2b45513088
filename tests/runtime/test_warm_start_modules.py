"""A compiled nn.Module starts warm in a new process (ember/warm_entries.py): its first call
neither captures nor compiles (counted: the capture and the compiler are not even imported)
and gives eager's outputs, in inference and through a training step (eager's gradients,
parameters and running statistics). The module's identity guards are replaced, for the kept
entry, by what they stood for: its class by name (its file by digest), each module reached
again through its source, no hooks. So a changed attribute (an int the forward reads,
`training`) is captured again; a hook is not kept and says why; a lambda an attribute
holds is found again through its module; a changed method is stale; another class at a
module's place, or one module where there were two, refuses the entry. Each process runs
on a temporary EMBER_CACHE_DIR. In this process: what a module's identity guard used to
stand for without a guard of its own — a module container's length, truth, keys and
members — is guarded by its answer (a container changed between calls is captured again:
it gave the old answer)."""

import textwrap
from pathlib import Path

import pytest
import torch
from helpers import run_warm_program

import ember
from ember import warm_entries

MODELS = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width, scale=3):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.scale = scale  # (an int the forward reads)

    def forward(self, x):
        return self.norm(self.act(self.proj(x))) * self.scale + x

    def act(self, x):  # (a method the forward calls: inlined)
        return torch.nn.functional.gelu(x)


class Model(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.blocks = nn.ModuleList([Block(width), Block(width, scale=2)])
        self.norm = nn.BatchNorm1d(width)  # (reads `training`)
        self.head = nn.Linear(width, 3)

    @property
    def width(self):  # (a property the forward reads: kept by its getter's name)
        return self.head.in_features

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x.reshape(-1, self.width)))
"""

# Builds models.Model, changes it as argv[3] says, and compares the compiled module with an
# eager copy: inference (eval, no grad), or two SGD steps of a training loop (argv[2]).
DRIVER = """
import copy, json, sys
import torch
import ember
from ember import warm_entries
sys.path.insert(0, sys.argv[1])
import models

torch.manual_seed(0)
model = models.Model()
changes = [c for c in sys.argv[3].split(",") if c]
if "scale" in changes:
    model.blocks[0].scale = 5
if "lambda" in changes:  # (an attribute that has no name to be found again by)
    model.blocks[0].act = lambda t: t.relu()
if "swap" in changes:  # (another class where the capture saw a LayerNorm)
    model.blocks[0].norm = torch.nn.Identity()
if "shared" in changes:  # (one block where the capture saw two)
    model.blocks[1] = model.blocks[0]
if "hook" in changes:
    model.blocks[1].register_forward_hook(lambda module, args, out: out * 2)
if "root_hook" in changes:  # (run by the compiled module around its compiled forward)
    model.register_forward_hook(lambda module, args, out: out + 1)
eager = copy.deepcopy(model)
compiled = ember.compile(model)
x = torch.randn(4, 8)
if sys.argv[2] == "infer":
    if "train" not in changes:
        model.eval(), eager.eval()
    with torch.no_grad():
        for _ in range(2):
            assert torch.allclose(compiled(x), eager(x), atol=1e-5)
else:
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    for _ in range(2):
        for m, run, optimizer in zip((model, eager), (compiled, eager), optimizers):
            optimizer.zero_grad()
            run(x).pow(2).sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert torch.allclose(p.grad, q.grad, atol=1e-5), name
        for optimizer in optimizers:
            optimizer.step()
    for p, q in zip(model.state_dict().values(), eager.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-5)  # (parameters, running statistics)
# (sympy: the capture's first fake tensor imports it, and so does eager's optimizer)
imported = [m for m in ("ember.capture.captured", "ember.backends", "sympy")
            if m in sys.modules and (m != "sympy" or sys.argv[2] == "infer")]
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("report", json.dumps({"counts": warm_entries.counts, "imported": imported}))
"""

# The user's case: `python train.py`, its model class defined in the script itself
SCRIPT = """
import json, sys
import torch
import ember
from ember import warm_entries


class MyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                          torch.nn.Linear(32, 4))
        self.temperature = 2.0

    def forward(self, x):
        return (self.layers(x) / self.temperature).softmax(-1)


def main():
    torch.manual_seed(0)
    eager = MyModel()
    model = ember.compile(eager)
    x = torch.randn(8, 16)
    assert torch.allclose(model(x), eager(x), atol=1e-6)

    def shifted(x):  # (a function that closes over the module)
        return eager(x) - 0.5

    assert torch.allclose(ember.compile(shifted)(x), shifted(x), atol=1e-6)


main()
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("report", json.dumps({"counts": warm_entries.counts,
                            "imported": [m for m in ("ember.capture.captured", "sympy")
                                         if m in sys.modules]}))
"""


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    for name, text in {"models.py": MODELS, "driver.py": DRIVER, "train.py": SCRIPT}.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def _run(project: Path, mode: str = "infer", changes: str = "",
         program: str = "driver.py") -> dict:
    return run_warm_program(project, program, mode, changes)


def _counts(**found: int) -> dict:
    return {**{name: 0 for name in warm_entries.counts}, **found}


@pytest.mark.parametrize("mode", [pytest.param("infer", marks=pytest.mark.slow), "train"])
def test_a_module_starts_warm_in_a_second_process(project, mode):
    first = _run(project, mode)
    assert first["counts"] == _counts(misses=1, kept=1), first["said"][-3000:]
    second = _run(project, mode)
    assert second["counts"] == _counts(hits=1), second["said"][-3000:]
    assert second["imported"] == []  # (nothing captured, nothing compiled)


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_the_user_s_script_run_twice_starts_warm(project):
    assert _run(project, program="train.py")["counts"] == _counts(misses=2, kept=2)
    second = _run(project, program="train.py")
    assert second["counts"] == _counts(hits=2) and second["imported"] == []


def test_a_hook_on_the_compiled_module_itself_runs_around_the_warm_entry(project):
    _run(project)
    assert _run(project, changes="root_hook")["counts"] == _counts(hits=1)


@pytest.mark.parametrize("change", [pytest.param("scale", marks=pytest.mark.slow), "train"])
def test_a_changed_attribute_is_captured_again_with_eager_s_answer(project, change):
    _run(project)
    report = _run(project, changes=change)
    # (the guards on what the forward read refuse it: an int, BatchNorm's `training`)
    assert report["counts"] == _counts(refused=1, kept=1), report["said"][-3000:]
    # (kept again under the same key: the last entry kept serves)
    assert _run(project, changes=change)["counts"] == _counts(hits=1)


@pytest.mark.parametrize(("change", "reason"), [
    ("swap", "is a Identity, not a LayerNorm"),
    pytest.param("shared", "is now L['self']._modules['blocks']._modules['0']",
                 marks=pytest.mark.slow),  # (two processes each: CI runs a slice of these)
    pytest.param("hook", "a hook, or a forward, was set on a module the compiled code calls",
                 marks=pytest.mark.slow),
])
def test_another_module_tree_refuses_the_entry(project, change, reason):
    _run(project)
    report = _run(project, changes=change)
    assert report["counts"]["refused"] == 1 and report["counts"]["hits"] == 0, \
        report["said"][-3000:]
    assert reason in report["said"]


@pytest.mark.slow  # (two processes, 6 s; test_warm_entries tests the closure a class keeps)
def test_a_lambda_a_module_holds_is_found_again_through_the_module(project):
    # (no name finds it: the source that reached it does, in the new process, and its code
    # must be the same — the driver compares with eager's answer)
    first = _run(project, changes="lambda")
    assert first["counts"] == _counts(misses=1, kept=1), first["said"][-3000:]
    assert _run(project, changes="lambda")["counts"] == _counts(hits=1)


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_a_hooked_module_is_captured_in_each_process_and_says_why(project):
    first = _run(project, changes="hook")
    assert first["counts"] == _counts(misses=1, not_kept=1), first["said"][-3000:]
    assert "it calls a module with hooks" in first["said"]
    assert "a new process captures it again" in first["said"]
    assert _run(project, changes="hook")["counts"] == _counts(misses=1, not_kept=1)


def test_a_changed_method_is_stale(project):
    _run(project)
    (project / "models.py").write_text(textwrap.dedent(MODELS).replace(
        "functional.gelu(x)", "functional.silu(x)"))
    report = _run(project)  # (the driver compares with eager's new answer)
    assert report["counts"] == _counts(stale=1, kept=1), report["said"][-3000:]
    assert "was made from another version of" in report["said"]
    assert _run(project)["counts"] == _counts(hits=1)


ZOO_PROGRAM = """
import json, sys
import torch
import ember
from ember import warm_entries
from ember.bench import zoo

spec, mode = zoo.find(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
step, args = zoo.instantiate(spec, mode, "tiny", "cpu")
torch.manual_seed(0)
eager_step, eager_args = zoo.instantiate(spec, mode, "tiny", "cpu")
step.model_slot[0] = ember.compile(step.model_slot[0])
with torch.set_grad_enabled(mode == "train"):
    for _ in range(2 if mode == "train" else 1):  # (a training graph is kept whole: from
        got, want = step(*args), eager_step(*eager_args)  # its second step on)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("report", json.dumps({"counts": warm_entries.counts,
                            "imported": [m for m in ("ember.capture.captured",)
                                         if m in sys.modules]}))
"""


@pytest.mark.parametrize("model, mode", [
    ("gpt2", "infer"), pytest.param("t5", "infer", marks=pytest.mark.slow),
    pytest.param("bert", "train", marks=pytest.mark.slow)])  # (~10 s each: two processes)
def test_a_transformers_model_starts_warm_before_capture(tmp_path, model, mode):
    # (the real library's forward: under a decorator whose wrapper holds it, reading an
    # enum's member, dataclasses' sentinel, a staticmethod, @dataclass's __init__ and
    # Mapping.get from a frozen module, all found again by name in the new process; BERT's
    # training forward makes a CrossEntropyLoss, which only the entry holds)
    pytest.importorskip("transformers")
    project = tmp_path / "project"
    project.mkdir()
    (project / "zoo_model.py").write_text(ZOO_PROGRAM)
    first = run_warm_program(project, "zoo_model.py", model, mode)
    assert first["counts"] == _counts(misses=1, kept=1), first["said"][-3000:]
    second = run_warm_program(project, "zoo_model.py", model, mode)
    assert second["counts"] == _counts(hits=1), second["said"][-3000:]
    assert second["imported"] == []  # (nothing captured)


# -- in this process: what a module's identity guard no longer stands for ----------------
class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
        self.extra = torch.nn.ModuleDict({"a": torch.nn.ReLU()})

    def forward(self, x):
        for name in self.extra:
            x = self.extra[name](x)
        if "b" in self.extra:
            x = x + 1
        return x * len(self.layers)


def test_a_module_container_s_length_keys_and_members_are_guarded():
    model = _Stack()
    compiled = ember.compile(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
        model.layers.append(torch.nn.Linear(4, 4))  # (len: 1 -> 2)
        assert torch.equal(compiled(x), model(x))
        model.extra["b"] = torch.nn.Tanh()  # (`in`, and the keys iterated)
        assert torch.equal(compiled(x), model(x))
    assert len(compiled._compiled_forward.entries) == 3

