"""ember/warm_entries.py: a new process's first call of a known function starts from its
cache entry — no capture, no compile, and neither imported (counted, never timed) — with
eager's answers; a changed function, helper file or global is captured again (never a
stale answer); guards still refuse other calls; a corrupt or foreign entry is rebuilt;
EMBER_WARM_START=0 keeps none. Each process runs on a temporary EMBER_CACHE_DIR."""

import collections.abc
import dataclasses
import enum
import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers import rewrite_cache_record, run_warm_program

import ember
from ember import api, config, warm_entries
from ember.capture import records
from ember.capture.guards import GuardSet
from ember.capture.sources import AttrSource, GlobalSource, ItemSource, LocalSource

ROOT = Path(__file__).resolve().parents[1]

HELPERS = """
def shifted(x):
    return x - 0.5
"""

CONSTANTS = """
SHIFT = 0.01
"""

USER_CODE = """
import os

import torch
import torch.nn.functional as F

import constants
import helpers

SCALE = 2.0
LOG = []


def f(x, y):  # (a helper inlined from another file, a global of its own)
    return helpers.shifted(torch.relu(x @ y + 1)).softmax(-1) * SCALE, x.t()


def g(x):  # (a constant of another module, read through it)
    for _ in range(3):
        x = F.gelu(x * 1.01 + constants.SHIFT)
    return x


def h(x, y):  # (an input written in place, a global list appended to)
    x.add_(1)
    LOG.append(len(LOG))
    return x * y


def swap(x, y):  # (a graph that computes nothing)
    return y, x


def model_call(x):  # (a global nn.Module: found again through the global)
    return MODEL(x)


def loss(x, w):  # (a training graph)
    return (torch.sin(x) @ w).relu().pow(2).sum()


def _validator_of(low):
    def validator(value):
        return isinstance(value, int) and value >= low
    return validator


class Config:  # (a library's strict config keeps validators made in closures)
    __validators__ = {"size": [_validator_of(int(os.environ.get("LOWEST_SIZE", "0")))]}
    size = 4
    extra = None


CONFIG = Config()


def validated(x):  # (a closure reached through a class, a type that builtins does not name)
    check = type(CONFIG).__validators__["size"][0]
    if check(CONFIG.size) and isinstance(CONFIG.extra, type(None)):
        return x + 1
    return x - 1


MODEL = torch.nn.Linear(4, 4)


def density(x, y):  # (a distribution made inside: guards through ember's class_lookup, and
    return torch.distributions.Normal(x, y.abs() + 0.1).log_prob(x * 0.5)  # checks assumed)


def switched(q, k):  # (torch's backend switches: an enum of torch's C++, a flag)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]), torch.backends.cudnn.flags(enabled=False):
        return F.scaled_dot_product_attention(q[None], k[None], k[None]).sin()
"""

# Calls each named function of user_code on n x n inputs for each size, compares with
# eager (results and inputs written in place), and reports what the process did.
DRIVER = """
import json, sys
import torch
import ember
from ember import warm_entries
sys.path.insert(0, sys.argv[1])
import user_code

def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.allclose(a, b, atol=1e-6)
    return type(a) is type(b) and len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))

torch.manual_seed(0)
sizes = [int(s) for s in sys.argv[3].split(",")]
for name in sys.argv[2].split(","):
    function = getattr(user_code, name)
    compiled = ember.compile(function)
    for n in sizes:
        args = [torch.randn(n, n) for _ in range(function.__code__.co_argcount)]
        copies = [a.clone() for a in args]
        got = compiled(*args)
        want = function(*copies)
        assert same(got, want), name
        assert all(torch.equal(a, c) for a, c in zip(args, copies)), name
imported = [m for m in ("ember.capture.captured", "ember.backends", "ember.lower",
                        "ember.autodiff.tape", "sympy") if m in sys.modules]
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("report", json.dumps({"counts": warm_entries.counts, "log": user_code.LOG,
                            "imported": imported}))
"""

# A training step: the gradients of the compiled loss against eager's
TRAINING = """
import json, sys
import torch
import ember
from ember import warm_entries
sys.path.insert(0, sys.argv[1])
import user_code

torch.manual_seed(0)
x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
ember.compile(user_code.loss)(x, w).backward()
grads = [x.grad.clone(), w.grad.clone()]
x.grad = w.grad = None
user_code.loss(x, w).backward()
assert torch.allclose(grads[0], x.grad, atol=1e-5)
assert torch.allclose(grads[1], w.grad, atol=1e-5)
imported = [m for m in ("ember.capture.captured", "ember.backends", "sympy")
            if m in sys.modules]
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("report", json.dumps({"counts": warm_entries.counts, "imported": imported}))
"""


# A softmax over rows of changing length, on Triton's interpreter: after its first shape,
# compiled once for every shape, whose rows of other classes (500, 5000) run other builds
ROWS = """
import json, os, sys
os.environ["EMBER_BACKEND"] = "triton"
os.environ["TRITON_INTERPRET"] = "1"
import torch
import ember
from ember import warm_entries
from ember.runtime import warm_cache

def f(x):
    return torch.softmax(x * 2, -1) + 1

compiled = ember.compile(f)
generator = torch.Generator().manual_seed(0)
for length in (600, 700, 300, 5000):
    x = torch.randn(4, length, generator=generator)
    torch.testing.assert_close(compiled(x), f(x))
warm_cache.finish_keeps()
print("report", json.dumps({"counts": warm_entries.counts}))
"""


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    _write(folder, {"helpers.py": HELPERS, "constants.py": CONSTANTS,
                    "user_code.py": USER_CODE, "driver.py": DRIVER,
                    "training.py": TRAINING, "rows.py": ROWS})
    return folder


def _run(project: Path, names: str, sizes: str = "4", warm: str = "1",
         program: str = "driver.py") -> dict:
    return run_warm_program(project, program, names, sizes, warm=warm)


def _counts(**found: int) -> dict:
    return {**{name: 0 for name in warm_entries.counts}, **found}


def _entries(project: Path) -> list[Path]:
    return sorted((project.parent / "cache" / warm_entries.KIND).rglob("*.pt"))


def test_a_second_process_neither_captures_nor_compiles(project):
    first = _run(project, "f,g,h,swap")
    assert first["counts"] == _counts(misses=4, kept=4), first["said"][-3000:]
    second = _run(project, "f,g,h,swap")
    assert second["counts"] == _counts(hits=4), second["said"][-3000:]
    # (nothing of the capture or the compiler is even imported, nor sympy, which the
    # capture's first fake tensor imports)
    assert second["imported"] == []
    assert second["log"] == [0, 1]  # (the compiled call appended, then eager's)
    assert second["said"].count("warm start before capture") == 4


@pytest.mark.slow  # (11 s of Triton's interpreter; the cold compile's placeholders are
@pytest.mark.skipif(importlib.util.find_spec("triton") is None,  # tested in this process too)
                    reason="triton is not installed")
def test_a_symbolic_entry_s_other_row_classes_compile_cold_from_what_it_kept(project):
    # (the second process starts both entries before capture; rows of another class than
    # the first build's go to the graph compiled cold, on symbolic examples made again
    # from the entry: eager's answers, the program checks)
    first = _run(project, "", program="rows.py")
    assert first["counts"] == _counts(misses=2, kept=2), first["said"][-3000:]
    second = _run(project, "", program="rows.py")
    assert second["counts"] == _counts(hits=2), second["said"][-3000:]
    assert second["said"].count("a warm-started graph needs its eager form") == 1
    assert "captured in" not in second["said"]


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_a_closure_a_class_keeps_is_found_again_through_the_class(project, monkeypatch):
    first = _run(project, "validated")
    assert first["counts"] == _counts(misses=1, kept=1), first["said"][-3000:]
    second = _run(project, "validated")
    assert second["counts"] == _counts(hits=1), second["said"][-3000:]
    # (another closure in its place, of the same code, whose cell says otherwise: the
    # entry's guards refuse the call, captured again, with eager's answer: the driver checks)
    monkeypatch.setenv("LOWEST_SIZE", "5")
    third = _run(project, "validated")
    assert third["counts"] == _counts(refused=1, kept=1), third["said"][-3000:]


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_an_entry_whose_guards_use_embers_own_helpers_starts_warm(project):
    # (the second process has not imported ember.capture.attributes, whose class_lookup the
    # guards call: imported then, not a reason to capture again)
    first = _run(project, "density")
    assert first["counts"] == _counts(misses=1, kept=1), first["said"][-3000:]
    second = _run(project, "density")
    assert second["counts"] == _counts(hits=1), second["said"][-3000:]


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_a_function_under_backend_switches_starts_warm(project):
    first = _run(project, "switched")
    assert first["counts"] == _counts(misses=1, kept=1), first["said"][-3000:]
    second = _run(project, "switched")
    assert second["counts"] == _counts(hits=1), second["said"][-3000:]


def test_a_training_graph_starts_warm_with_eager_s_gradients(project):
    first = _run(project, "", program="training.py")
    assert first["counts"] == _counts(misses=1, kept=1), first["said"][-3000:]
    second = _run(project, "", program="training.py")
    assert second["counts"] == _counts(hits=1) and second["imported"] == []


def test_guards_are_still_checked_on_every_call(project):
    _run(project, "f")
    # (4 x 4: the entry; 5 x 5: its guards refuse, captured — with symbolic sizes, as after
    # a capture for 4 x 4 in this process: automatic dynamic — and kept under the key of
    # every size; 4 x 4 again: the entry)
    report = _run(project, "f", "4,5,4")
    assert report["counts"] == _counts(hits=1, misses=1, kept=1), report["said"][-3000:]
    assert "captured with symbolic sizes" in report["said"]


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_an_entry_captured_with_symbolic_sizes_serves_other_sizes(project):
    first = _run(project, "f,g", "4,5")
    assert first["counts"] == _counts(misses=4, kept=4), first["said"][-3000:]
    # (4 x 4: its own entry; 5 x 5 and 7 x 7: the one captured for 5 x 5 with symbolic
    # sizes, found under the key of every size, its guards checked: nothing captured, and
    # neither the capture nor sympy imported)
    second = _run(project, "f,g", "4,7,5")
    assert second["counts"] == _counts(hits=4), second["said"][-3000:]
    assert "ember.capture.captured" not in second["imported"]
    assert "sympy" not in second["imported"]
    assert "captured in" not in second["said"]
    # (3 x 3 first: the symbolic entry, then 2 x 2 too — sizes 0 and 1 are never symbols,
    # 2 is the smallest — in this process, without a capture)
    third = _run(project, "f", "3,2")
    assert third["counts"] == _counts(hits=1), third["said"][-3000:]
    assert "captured in" not in third["said"]


def test_a_changed_function_is_captured_again(project):
    _run(project, "f,g")
    _write(project, {"user_code.py": USER_CODE.replace("x * 1.01", "x * 1.02")})
    report = _run(project, "f,g")
    # (f's code is the same, and so are the files it reads: its entry serves; g's is not)
    assert report["counts"] == _counts(hits=1, misses=1, kept=1)


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_a_changed_file_of_inlined_code_is_captured_again(project):
    _run(project, "f,g")
    _write(project, {"helpers.py": HELPERS.replace("0.5", "0.25")})
    report = _run(project, "f,g")
    assert report["counts"] == _counts(hits=1, stale=1, kept=1), report["said"][-3000:]
    assert "was made from another version of" in report["said"]
    assert _run(project, "f,g")["counts"] == _counts(hits=2)  # (kept again, whole)


@pytest.mark.parametrize("change", [
    ("user_code.py", USER_CODE, "SCALE = 2.0", "SCALE = 3.0", "f"),  # (a global of its own)
    pytest.param(("constants.py", CONSTANTS, "0.01", "0.02", "g"),  # (another module's, read
                 marks=pytest.mark.slow),  # through it; two processes: a CI slice)
])
def test_a_changed_global_is_captured_again(project, change):
    file, text, old, new, name = change
    _run(project, name)
    _write(project, {file: text.replace(old, new)})
    report = _run(project, name)  # (compared with eager's answer: the new value's)
    assert report["counts"] == _counts(refused=1, kept=1)


def test_a_corrupt_or_foreign_entry_is_rebuilt(project):
    _run(project, "f")
    [entry] = _entries(project)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    report = _run(project, "f")
    assert report["counts"] == _counts(rejected=1, misses=0, kept=1)
    assert "fails its check" in report["said"]

    def foreign(record):
        record["versions"]["torch"] = "1.0.0"

    rewrite_cache_record(entry, foreign)
    assert _run(project, "f")["counts"] == _counts(rejected=1, kept=1)

    def damaged(record):  # (a digest that vouches for a record no process could rebuild)
        record["runner"] = "def run(L):\n    return ("

    rewrite_cache_record(entry, damaged)
    assert _run(project, "f")["counts"] == _counts(rejected=1, kept=1)
    assert _run(project, "f")["counts"] == _counts(hits=1)


def test_warm_start_off_keeps_nothing(project):
    assert _run(project, "f", warm="0")["counts"] == _counts()
    assert not _entries(project)


@pytest.mark.slow  # (two processes; CI runs a slice of these: tests/conftest.py)
def test_a_function_that_calls_a_global_module_starts_warm(project):
    # (the module's identity guard is kept as what it stood for: the module read again
    # through the global, its class by name; tests/runtime/test_warm_start_modules.py)
    assert _run(project, "model_call")["counts"] == _counts(misses=1, kept=1)
    assert _run(project, "model_call")["counts"] == _counts(hits=1)


def test_import_ember_imports_neither_the_capture_nor_the_compiler():
    code = ("import sys, torch, ember; print(sorted(m for m in ('ember.capture.captured', "
            "'ember.capture.calls', 'ember.backends', 'ember.lower', 'ember.autodiff.tape', "
            "'ember.codegen.c', 'sympy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
    assert callable(ember.backend) and ember.backend.__module__ == "ember.backends"


# -- in this process ----------------------------------------------------------------------
def _scaled(x, scale=2.0):
    return x * scale


def test_the_key_names_the_code_the_options_the_modes_and_the_arguments():
    x = torch.randn(3)
    plain = api.CompiledFunction(_scaled)
    key = warm_entries.key_of(plain, {"x": x, "scale": 2.0})
    assert key == warm_entries.key_of(api.CompiledFunction(_scaled), {"x": x, "scale": 2.0})
    others = [
        warm_entries.key_of(api.CompiledFunction(_scaled, dynamic=False),
                            {"x": x, "scale": 2.0}),
        warm_entries.key_of(api.CompiledFunction(_scaled, settings={"parallel_threshold": 7}),
                            {"x": x, "scale": 2.0}),
        warm_entries.key_of(plain, {"x": x, "scale": 3.0}),
        warm_entries.key_of(plain, {"x": torch.randn(4), "scale": 2.0}),
        warm_entries.key_of(plain, {"x": x.double(), "scale": 2.0}),
        warm_entries.key_of(api.CompiledFunction(_add_one), {"x": x, "scale": 2.0}),
    ]
    with torch.no_grad():
        others.append(warm_entries.key_of(plain, {"x": x, "scale": 2.0}))
    with config.override(backend="interp"):
        others.append(warm_entries.key_of(plain, {"x": x, "scale": 2.0}))
    assert len({key, *others}) == len(others) + 1
    # (the key of every size: a tensor's rank, not its sizes; an int's type, not its value;
    # a dict's items by name, as **kwargs hold a model's inputs)
    assert key.family == warm_entries.key_of(plain, {"x": torch.randn(7), "scale": 2.0}).family
    assert warm_entries.key_of(plain, {"x": x, "scale": 2}).family == \
        warm_entries.key_of(plain, {"x": x, "scale": 3}).family
    assert key.family != warm_entries.key_of(plain, {"x": torch.randn(3, 3),
                                                     "scale": 2.0}).family
    assert warm_entries.key_of(plain, {"x": {"a": x}}).exact != \
        warm_entries.key_of(plain, {"x": {"a": torch.randn(5)}}).exact


def _add_one(x, scale=2.0):
    return x + 1


def test_guards_and_graphs_come_back_from_plain_data():
    guards = GuardSet()
    guards.add("global", None, ("default_dtype", torch.float32))
    guards.add("id", GlobalSource("torch"), torch)
    guards.add("id", GlobalSource("_scaled"), _scaled)
    guards.add("type", ItemSource(LocalSource("xs"), 0), torch.Tensor)
    guards.add("equals", AttrSource(GlobalSource("config"), "x"), 2.5)
    guards.add("tensor", LocalSource("x"), (torch.Tensor, torch.float16,
                                            torch.device("cpu"), (3, 4), (4, 1), False))
    encoder = records.Encoder()
    back = records.Decoder().guards(encoder.guards(guards))
    assert list(back.guards) == list(guards.guards)
    assert [g.expected for g in back.guards.values()] == \
        [g.expected for g in guards.guards.values()]
    assert Path(__file__).resolve().as_posix() in encoder.files  # (_scaled's file, digested)
    gm = torch.fx.symbolic_trace(lambda x: torch.softmax(x * 2, dim=-1).t() + x.sum())
    assert records.Decoder().graph(records.Encoder().graph(gm)).code == gm.code


def test_objects_without_a_name_are_not_kept():
    encoder = records.Encoder()
    for value in (torch.nn.Linear(2, 2), lambda x: x, torch.zeros(2), object()):
        with pytest.raises(records.NotKept):
            encoder.value(value)
    with pytest.raises(records.Unresolved):  # (a module this process has not imported)
        records.Decoder().value(["module", "no_such_module_here"])
    changed = ["function", __name__, "_scaled", "0" * 64]
    with pytest.raises(records.Unresolved):  # (a function whose code is another now)
        records.Decoder().value(changed)


class _Kind(enum.Enum):
    ONE = 1


class _Holder:
    @staticmethod
    def bucket(x):
        return x

    @classmethod
    def make(cls):
        return cls()


@functools.wraps(_add_one)
def _renaming(*args, **kwargs):  # (a decorator's wrapper: its name finds the wrapper)
    return _add_one(*args, **kwargs)


@dataclasses.dataclass
class _Output:
    value: int = 0


def test_values_libraries_hold_are_found_again_by_name():
    # what transformers' models reach: the function under a decorator (by __wrapped__), an
    # enum's member, a module's own singleton, a class's staticmethod as its __dict__ holds
    # it, NoneType, torch.ops.aten; each decoded back to the very object
    encoder = records.Encoder()
    for value in (_renaming.__wrapped__, _Kind.ONE, dataclasses._FIELD,
                  vars(_Holder)["bucket"], vars(_Holder)["make"], type(None),
                  type(_add_one),  # (the interpreter's types: through the types module)
                  torch.ops.aten):  # (an op namespace: through torch.ops)
        assert records.Decoder().value(encoder.value(value)) is value
    assert records.versioned(collections.abc.Mapping.get.__code__.co_filename)  # (frozen)
    made = _Output.__init__.__code__  # (written by @dataclass: its class's file decides it)
    assert records.made_by_dataclasses(made)
    assert not records.made_by_dataclasses(_add_one.__code__)


def test_inlined_code_is_vouched_for_only_by_the_file_that_holds_it(tmp_path, monkeypatch):
    (tmp_path / "edited_after_import.py").write_text("def double(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_after_import

    code = edited_after_import.double.__code__
    path, digest = records.inlined_file(code)
    assert path == os.path.realpath(tmp_path / "edited_after_import.py")
    # (edited after this process imported it: the file no longer holds the code it ran)
    (tmp_path / "edited_after_import.py").write_text("def double(x):\n    return x * 3\n")
    with pytest.raises(records.NotKept):
        records.inlined_file(code)


def test_a_file_older_than_the_process_vouches_for_its_code_uncompiled(tmp_path, monkeypatch):
    # (a library's files, installed before the process started: the process imported them
    # as they are; compiling them again to compare would cost about a second for BERT's)
    path = tmp_path / "installed_before.py"
    path.write_text("def triple(x):\n    return x * 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import installed_before

    code = installed_before.triple.__code__
    compiled = []
    codes_of = records._codes_of
    monkeypatch.setattr(records, "_codes_of", lambda *a: compiled.append(a) or codes_of(*a))
    # (as if the process had started an hour from now: the file is older than it)
    monkeypatch.setattr(records, "_process_start", lambda: time.time() + 3600)
    assert records.inlined_file(code)[0] == os.path.realpath(path)
    assert compiled == []
    # (the file as changed since the process started: compiled and compared)
    monkeypatch.setattr(records, "_process_start", lambda: time.time() - 3600)
    assert records.inlined_file(code)[0] == os.path.realpath(path)
    assert len(compiled) == 1
    path.write_text("def triple(x):\n    return x * 4\n")
    with pytest.raises(records.NotKept):
        records.inlined_file(code)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="read from Linux's /proc")
def test_the_process_start_is_known_and_past():
    started = records._process_start()
    assert started is not None and started <= time.time() + 1  # (the clock tick's rounding)
    assert not records._older_than_this_process(__file__) or \
        os.stat(__file__).st_mtime < started


def test_a_file_s_digest_follows_its_edits(tmp_path):
    path = tmp_path / "edited.py"
    for text, age in (("x = 1\n", 10), ("x = 2\n", 10), ("x = 3\n", 0), ("x = 4\n", 0)):
        path.write_text(text)  # (the same size each time)
        stamp = time.time() - age  # (an old file is read once per change of its stamp;
        os.utime(path, (stamp, stamp))  # one modified just now, every time)
        assert records.file_digest(str(path)) == hashlib.sha256(text.encode()).hexdigest()
        assert records.file_digest(str(path)) == hashlib.sha256(text.encode()).hexdigest()


def test_a_code_s_digest_names_its_file_and_its_nested_code():
    def module(result: int, path: str):
        source = f"def f():\n    def g():\n        return {result}\n    return g\n"
        return compile(source, path, "exec")

    first, other_file, nested_edit = module(1, "/a.py"), module(1, "/b.py"), module(2, "/a.py")
    assert first == other_file  # (code objects compare equal across files ...)
    digests = {records.code_digest(code) for code in (first, other_file, nested_edit)}
    assert len(digests) == 3   # (... their digests do not)
    assert records.code_digest(module(1, "/a.py")) == records.code_digest(first)


def _softmax_rows(x, w):
    return torch.softmax(x @ w, -1) * x.shape[0] + x[1:].sum(0)


def test_a_symbolic_graph_kept_without_its_examples_compiles_cold_for_every_shape():
    # (a function's entry keeps its FX graph without the capture's symbolic examples; the
    # rare call its compiled form gives away compiles it cold, on examples made again from
    # what describe_placeholders kept: one compile, right at every size)
    from ember.lower.symbolic import describe_placeholders, restore_placeholders
    from ember.shapes import _compile_again

    compiled = api.CompiledFunction(_softmax_rows, dynamic=True)
    w = torch.randn(6, 6)
    x = torch.randn(4, 6)
    torch.testing.assert_close(compiled(x, w), _softmax_rows(x, w))
    gm = compiled.records[-1].graph
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = [x, w][:len(placeholders)] if len(placeholders) == 2 else None
    assert examples is not None, [n.name for n in placeholders]
    described = describe_placeholders(gm, examples)
    assert described["symbols"] and described["symbols"][0][1:3] == [4, 2]  # (hint, low)
    bare = records.Decoder().graph(records.Encoder().graph(gm))
    assert all("example_value" not in n.meta for n in bare.graph.nodes)
    cold = _compile_again(restore_placeholders(bare, described), examples, "cold", True)
    for rows in (2, 3, 9):
        x = torch.randn(rows, 6)
        torch.testing.assert_close(cold(x, w)[0], _softmax_rows(x, w))  # (the graph's outputs)


def test_a_torchscript_function_is_found_again_by_its_python_name():
    from transformers.models.deberta_v2 import modeling_deberta_v2  # (scripts its helpers)

    function = modeling_deberta_v2.make_log_bucket_position
    assert type(function).__name__ == "ScriptFunction"
    encoder = records.Encoder()
    assert records.Decoder().value(encoder.value(function)) is function
    # (an installed library's file is digested, so an upgrade makes an entry stale; Python's
    # own library and torch's are named by their versions)
    assert any(path.endswith("modeling_deberta_v2.py") for path in encoder.files)
    assert not records.versioned(modeling_deberta_v2.__file__)
    assert records.versioned(collections.abc.__file__) and records.versioned(torch.__file__)


def _attention_loss(x, wq, wk, wv):
    q, k, v = (x @ w for w in (wq, wk, wv))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v).pow(2).sum()


def test_a_graph_rebuilt_from_its_entry_splits_for_training_as_the_captured_one():
    # (an entry keeps its FX graph without the capture's example values; the lowering reads
    # whether an attention call's operands require grad from them: a graph rebuilt without
    # that bit saved other values for its backward than the kept forward did, and a warm
    # process's backward compiled cold raised)
    from ember.backends import compile_stages

    x = torch.randn(2, 3, 8, 4)
    weights = [torch.randn(4, 4, requires_grad=True) for _ in range(3)]
    compiled = api.CompiledFunction(_attention_loss)
    compiled(x, *weights)
    gm = compiled.records[-1].graph
    rebuilt = records.Decoder().graph(records.Encoder().graph(gm))
    assert all("example_value" not in n.meta for n in rebuilt.graph.nodes)
    splits = [compile_stages(graph, [x, *weights], "g").split.backward_inputs
              for graph in (gm, rebuilt)]
    assert splits[0] == splits[1]
