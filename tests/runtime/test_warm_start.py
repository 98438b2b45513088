"""ember.runtime.warm_cache: a new process's first call rebuilds the compiled graph from the
disk cache (nothing lowered, nothing built: counted, never timed), for C and Triton kernels
(Triton's interpreter here), whole graphs and graphs with eager islands; a corrupt or foreign
entry is rebuilt with eager's answer; the cache's size cap removes the least recently used."""

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import rewrite_cache_record

import ember
from ember import config
from ember.__main__ import main
from ember.runtime import disk_cache, warm_cache, warm_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _warm_start_on():
    """(tests/conftest.py turns warm starts off for the rest of the suite)"""
    with config.override(warm_start=True):
        yield

# NOTE: every value a program draws comes from a seeded generator (torch seeds its default
# generator at random in each process): each process then computes the same numbers, and
# prints their bits (`bits`), which the second process must reproduce exactly. An unseeded
# model made each process's model another one, and one draw in about 500 put a gradient
# where eager's own float32 rounding is past the comparison's 1e-5 (ember's is float64's
# there): a failure once in many CI runs, of no warm start's doing.
BITS = """
import hashlib

def bits(*tensors):
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()
"""

PROGRAM = BITS + """
import copy
import torch
import ember
from ember.runtime import warm_cache

torch.manual_seed(0)

def f(x, y):
    scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
    return torch.relu(x @ y + 1).softmax(-1) * scale, x.t()

m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
x, y, z = torch.randn(4, 4), torch.randn(4, 4), torch.randn(3, 4)
got, view = ember.compile(f)(x, y)
want, _ = f(x, y)
assert torch.allclose(got, want, atol=1e-6) and view.data_ptr() == x.data_ptr()
with torch.no_grad():
    inferred = ember.compile(m)(z)
    assert torch.allclose(inferred, m(z), atol=1e-6)
# (under grad mode, never differentiated, as a decoding loop's calls: its backward is never
# compiled, and the graph is kept with its forward alone)
read = ember.compile(m)(y)
assert torch.allclose(read, m(y), atol=1e-6) and read.requires_grad

def step(model, x):  # (a training graph: its forward and backward are kept too)
    loss = torch.nn.functional.gelu(model(x)).pow(2).sum()
    loss.backward()
    return loss

compiled_model, eager_model = m, copy.deepcopy(m)
loss = ember.compile(step)(compiled_model, z)
assert torch.allclose(loss, step(eager_model, z), atol=1e-5)
for p, q in zip(compiled_model.parameters(), eager_model.parameters()):
    assert torch.allclose(p.grad, q.grad, atol=1e-5)
print("bits", bits(got, inferred, read, loss, *[p.grad for p in compiled_model.parameters()]))
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("counts", warm_cache.counts)
"""


ISLANDS = BITS + """
import copy
import torch
import ember
from ember.runtime import warm_cache

def f(x, w):  # (fake quantization has no meta kernel: an eager island between two regions)
    a = torch.tanh(x @ w)
    q = torch.fake_quantize_per_tensor_affine(a, 0.1, 0, -128, 127)
    return (q * 2 + 1).relu(), a.sum()

def step(model, x):  # (a training graph with the island: its regions train)
    a = torch.tanh(model(x))
    q = torch.fake_quantize_per_tensor_affine(a, 0.1, 0, -128, 127)
    loss = (q * 2 + a).pow(2).sum()
    loss.backward()
    return loss

torch.manual_seed(0)
x, w = torch.randn(4, 5), torch.randn(5, 6)
compiled = ember.compile(f)
answers = []
for _ in range(2):  # (a region's first call runs its checked wrapper)
    answers.extend(compiled(x, w))
    for got, want in zip(answers[-2:], f(x, w)):
        assert torch.allclose(got, want, atol=1e-5)
compiled_model = torch.nn.Linear(5, 6)
eager_model = copy.deepcopy(compiled_model)
loss = ember.compile(step)(compiled_model, x)
assert torch.allclose(loss, step(eager_model, x), atol=1e-5)
for p, q in zip(compiled_model.parameters(), eager_model.parameters()):
    assert torch.allclose(p.grad, q.grad, atol=1e-5)
print("bits", bits(*answers, loss, *[p.grad for p in compiled_model.parameters()]))
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("counts", warm_cache.counts)
"""

BACKENDS = ["c", pytest.param("triton", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"))]


def _process(cache: Path, program: str = PROGRAM, backend: str = "c") -> str:
    # (ember's root first; what the caller's path holds too: packages installed there)
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    environment = dict(os.environ, PYTHONPATH=path, EMBER_CACHE_DIR=str(cache),
                       EMBER_WARM_START="1", EMBER_BACKEND=backend,
                       EMBER_LOGS="perf,kernels,fallbacks")
    if backend == "triton":  # (CPU tensors: Triton's interpreter runs the kernels)
        environment["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=environment, timeout=300, cwd=cache.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _counts(output: str) -> dict:
    return ast.literal_eval(output.split("counts ", 1)[1].splitlines()[0])


def _bits(output: str) -> str:
    return output.split("bits ", 1)[1].split()[0]


# what a process says when it builds or looks up kernels (EMBER_LOGS=kernels)
BUILT = {"c": (" built ", "cache hit"), "triton": ("Triton kernels",)}


def _second_process_hits(cache: Path, program: str, backend: str, graphs: int
                         ) -> tuple[str, str]:
    """(what the first process said, what the second said)."""
    first = _process(cache, program, backend)
    kept = _counts(first)["kept"]
    assert kept == graphs and "compiled in" in first, first[-3000:]
    assert BUILT[backend][0] in first and "not kept" not in first
    second = _process(cache, program, backend)
    assert _counts(second) == {"hits": kept, "misses": 0, "kept": 0, "not_kept": 0,
                               "rejected": 0}, second[-3000:]
    assert "compiled in" not in second  # (the stages' clock: nothing lowered or scheduled)
    assert not any(said in second for said in BUILT[backend])  # (not even a lookup)
    assert second.count("warm start from the disk cache") == kept
    # (the same kernels on the same numbers: a warm start gives the cold compile's bits)
    assert _bits(second) == _bits(first)
    return first, second


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_process_lowers_and_builds_nothing(tmp_path, backend):
    _second_process_hits(tmp_path / "cache", PROGRAM, backend, graphs=4)


@pytest.mark.parametrize("backend", ["c", pytest.param("triton", marks=[
    pytest.mark.slow, *BACKENDS[1].marks])])  # (Triton's interpreter: 20 s, a CI slice)
def test_a_graph_with_eager_islands_is_kept_whole(tmp_path, backend):
    _, second = _second_process_hits(tmp_path / "cache", ISLANDS, backend, graphs=2)
    # (still said: the islands run eagerly in the new process too)
    assert second.count("fake_quantize_per_tensor_affine runs as an eager island") == 2


@pytest.fixture
def cache(tmp_path):
    with config.override(cache_dir=tmp_path):
        ember.reset()
        yield tmp_path
        ember.reset()


def _add_one(x):
    return torch.sin(x) + 1


def _compile_once(x):
    # (the graph's entry alone: the function's entry before capture, ember/warm_entries.py,
    # would find it without a capture; tests/test_warm_capture.py tests that one)
    shutil.rmtree(Path(config.settings.cache_dir) / "function", ignore_errors=True)
    before = dict(warm_cache.counts)
    result = ember.compile(_add_one)(x)
    ember.reset()
    return result, {k: warm_cache.counts[k] - before[k] for k in before}


def _entries(cache):
    return sorted((cache / "warm").rglob("*.pt"))


def test_an_entry_is_kept_then_hit_in_the_same_process(cache):
    x = torch.randn(100)
    result, counts = _compile_once(x)
    assert counts["kept"] == 1 and len(_entries(cache)) == 1
    result, counts = _compile_once(x)
    assert counts["hits"] == 1 and counts["kept"] == 0
    assert torch.allclose(result, _add_one(x), atol=1e-6)


def test_a_corrupt_entry_is_rebuilt_with_eager_s_answer(cache):
    x = torch.randn(100)
    _compile_once(x)
    [entry] = _entries(cache)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    result, counts = _compile_once(x)
    assert counts == {"hits": 0, "misses": 0, "kept": 1, "not_kept": 0, "rejected": 1}
    assert torch.allclose(result, _add_one(x), atol=1e-6)
    _, counts = _compile_once(x)  # (the entry written again is whole)
    assert counts["hits"] == 1


def test_a_foreign_version_entry_is_ignored(cache):
    x = torch.randn(100)
    _compile_once(x)
    [entry] = _entries(cache)
    rewrite_cache_record(entry, lambda record: record["versions"].update(torch="1.0.0"))
    result, counts = _compile_once(x)
    assert counts["rejected"] == 1 and counts["hits"] == 0 and counts["kept"] == 1
    assert torch.allclose(result, _add_one(x), atol=1e-6)


def test_other_inputs_or_settings_are_other_entries(cache):
    _compile_once(torch.randn(100))
    _, counts = _compile_once(torch.randn(101))
    assert counts["misses"] == 1
    with config.override(parallel_threshold=7):
        _, counts = _compile_once(torch.randn(100))
    assert counts["misses"] == 1
    assert len(_entries(cache)) == 3


def test_a_graph_that_cannot_be_kept_says_so_and_runs(cache):
    x = torch.randn(10)
    with config.override(backend="interp", logs=frozenset({"perf"})):
        result, counts = _compile_once(x)
    assert counts["not_kept"] == 1 and not _entries(cache)
    assert torch.allclose(result, _add_one(x))


def _fake_entry(folder: Path, key: str, megabytes: float, age: float) -> Path:
    path = folder / key[:2] / f"{key}.so"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * int(megabytes * 2**20))
    path.with_suffix(".digest").write_text("x")
    for file in (path, path.with_suffix(".digest")):
        os.utime(file, (time.time() - age, time.time() - age))
    return path


def test_the_size_cap_removes_the_least_recently_used(cache):
    old = _fake_entry(cache / "c", "aa" * 32, 0.5, age=300)
    used = _fake_entry(cache / "c", "bb" * 32, 0.5, age=200)
    new = _fake_entry(cache / "warm", "cc" * 32, 0.5, age=100)
    disk_cache.touch(used)  # (a hit: used most recently now)
    with config.override(cache_max_mb=1):
        removed = disk_cache.enforce_cap(keep=None)
    assert removed >= 2**19
    assert not old.exists() and not old.with_suffix(".digest").exists()
    assert used.exists() and not new.exists()  # (to 90% of the cap: two of three go)
    assert disk_cache.cache_info()["bytes"] <= 0.9 * 2**20
    with config.override(cache_max_mb=0):  # (no cap)
        assert disk_cache.enforce_cap() == 0


def test_cache_info_and_clear(cache, capsys):
    from ember.runtime import c_launcher

    # (ember's C launcher is built into the cache of the first test that loads it: a GPU run
    # of the suite may come here first)
    c_launcher.launcher()
    launchers = ember.cache_info()["kinds"].get("c", {}).get("entries", 0)
    _compile_once(torch.randn(100, device="cpu"))  # (a C build: an entry of ember's cache)
    info = ember.cache_info()
    assert info["kinds"]["warm"]["entries"] == 1
    assert info["kinds"]["c"]["entries"] == launchers + 1
    assert main(["cache", "--clear"]) == 0
    assert "warm" in capsys.readouterr().out
    assert ember.cache_info()["bytes"] == 0


def _loss(x, w):
    return (torch.sin(x) @ w).relu().sum()


@pytest.mark.parametrize("differentiated", [True, False])
def test_a_rebuilt_training_graph_gives_eager_s_gradients_and_falls_back_cold(
        cache, differentiated):
    from ember.backends import compile_stages

    gm = torch.fx.symbolic_trace(_loss)
    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    entry = warm_cache.Entry(gm, [x, w], "g", compile_stages)
    assert entry.compiled is None
    with config.override(eager_first=False):
        cold = compile_stages(gm, [x, w], "g")
        if differentiated:  # (its backward compiled before the keep: kept whole)
            cold(x, w).backward()
            x.grad = w.grad = None
    entry.keep(cold)
    warm_cache.finish_keeps()
    rebuilt = warm_cache.Entry(gm, [x, w], "g", compile_stages).compiled
    assert type(rebuilt).__name__ == "TrainingGraph"
    # (else kept with its forward alone: its backward compiled cold when first needed)
    assert rebuilt.backward_started == differentiated
    rebuilt(x, w).backward()
    grads = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    cold(x, w).backward()  # (the same kernels: the same bits)
    assert torch.equal(grads[0], x.grad) and torch.equal(grads[1], w.grad)
    x.grad = w.grad = None
    _loss(x, w).backward()
    assert torch.allclose(grads[0], x.grad, atol=1e-5)
    assert torch.allclose(grads[1], w.grad, atol=1e-5)
    # the forward's eager form (a layout check failing, aliased inputs): the graph compiled
    # cold, its interpreter's forward
    with torch.no_grad():
        compiled = rebuilt.forward_graph(x, w)
        fallback = rebuilt.forward_graph.eager(x, w)
    assert len(compiled) == len(fallback)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(compiled, fallback))


def test_a_training_graph_is_kept_once_its_kernels_are_in_though_no_call_ran_them(cache):
    # (a training loop's first calls run eagerly while the forward's C library builds: two
    # steps may both; the graph is kept once the library is in, with its forward alone)
    from ember.backends import compile_stages, wait_for_background_compiles

    gm = torch.fx.symbolic_trace(_loss)
    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    entry = warm_cache.Entry(gm, [x, w], "g", compile_stages)
    with config.override(eager_first=True, kernels_later=True, backend="c"):
        cold = compile_stages(gm, [x, w], "g")
    assert not cold.forward_graph.kernels_in
    kept = warm_cache.counts["kept"]
    entry.keep(cold)  # (building: no call has run it)
    wait_for_background_compiles(start_deferred=False)
    warm_cache.finish_keeps()
    assert warm_cache.counts["kept"] == kept + 1 and len(_entries(cache)) == 1
    rebuilt = warm_cache.Entry(gm, [x, w], "g", compile_stages).compiled
    assert type(rebuilt).__name__ == "TrainingGraph" and not rebuilt.backward_started
    loss = rebuilt(x, w)
    loss.backward()
    eager_x, eager_w = x.detach().requires_grad_(), w.detach().requires_grad_()
    eager_loss = _loss(eager_x, eager_w)
    eager_loss.backward()
    torch.testing.assert_close(loss, eager_loss)
    torch.testing.assert_close(x.grad, eager_x.grad)
    torch.testing.assert_close(w.grad, eager_w.grad)


def test_a_cold_backward_that_would_not_take_what_the_kept_forward_saved_says_so(cache):
    from ember.backends import compile_stages

    gm = torch.fx.symbolic_trace(_loss)
    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    entry = warm_cache.Entry(gm, [x, w], "g", compile_stages)
    with config.override(eager_first=False):
        entry.keep(compile_stages(gm, [x, w], "g"))  # (with its forward alone)
    warm_cache.finish_keeps()
    [kept] = _entries(cache)
    # (as if the graph split otherwise: the saved values in another order)
    rewrite_cache_record(kept, lambda record: record["backward_inputs"].reverse())
    rebuilt = warm_cache.Entry(gm, [x, w], "g", compile_stages).compiled
    with pytest.raises(RuntimeError, match="does not take what that forward saved"):
        rebuilt(x, w).backward()


def _rename_kernels(record: dict) -> None:
    for _, namespace in (record["checked"], record["fast"]):
        for _, code in namespace:
            if code[0] == "triton_interpreted":
                code[2] = "no_such_kernel"


def test_a_corrupt_or_foreign_triton_entry_is_rebuilt_with_eager_s_answer(cache):
    pytest.importorskip("triton")
    from ember.runtime import triton_launch

    if not triton_launch.interpreting():  # (EMBER_TEST_DEVICE=cuda: kernels compiled for real)
        pytest.skip("damages an interpreted kernel's record (TRITON_INTERPRET=1)")
    x = torch.randn(100)
    with config.override(backend="triton"):
        _, counts = _compile_once(x)
        assert counts["kept"] == 1
        [entry] = _entries(cache)
        record = warm_records.loads(entry.read_bytes())
        assert record["versions"]["triton"].endswith(" interpreted") and record["modules"]
        damages = [
            lambda: entry.write_bytes(entry.read_bytes()[:-100]),  # (cut short)
            lambda: rewrite_cache_record(entry, lambda r: r["versions"].update(triton="0.0.1")),
            # (its kernel is not in its module)
            lambda: rewrite_cache_record(entry, _rename_kernels),
        ]
        for damage in damages:
            damage()
            result, counts = _compile_once(x)
            assert counts == {"hits": 0, "misses": 0, "kept": 1, "not_kept": 0,
                              "rejected": 1}
            assert torch.allclose(result, _add_one(x), atol=1e-6)
        result, counts = _compile_once(x)
        assert counts["hits"] == 1 and torch.allclose(result, _add_one(x), atol=1e-6)


class _Launcher:  # (what DeviceLaunch.prefix reads of a compiled kernel's launcher)
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def launch(self, *args):
        pass


class _Kernel:
    def __init__(self, handle: int, packed: tuple = (4, 1, 0), digest: str = "abc"):
        self.run, self.function, self.packed_metadata, self.hash = \
            _Launcher(), handle, packed, digest


def test_a_compiled_triton_kernel_is_kept_by_what_compiles_it(cache, monkeypatch):
    # (no GPU here: the compiled kernel is a stand-in; what is checked is that the launch's
    # values only its process knows — launcher, handle — are kept as parts of the kernel,
    # never by value, and that a kernel compiled otherwise in the new process is refused)
    from ember.runtime import triton_launch
    from ember.runtime.warm_values import Decoder, Encoder

    module = triton_launch.load_module("# a module of Triton kernels\n")
    source = triton_launch.CompileSource(module.__name__, "kernel0", (("x", "*fp32"),),
                                         (True,), (("num_warps", 4),), ("cuda", 90, 32), 0)
    launch = triton_launch.DeviceLaunch(_Kernel(987654321987), (7, 1, 1), source)
    launcher, handle, *_ = launch.prefix()
    # (kernel1: a kernel that differs only in its name, launched as kernel0's binary)
    namespace = {"kernel0": launch, "launch0": launcher, "function1": handle,
                 "kernel1": triton_launch.DeviceLaunch(launch.compiled, (3, 1, 1), source)}
    encoder = Encoder(torch.fx.symbolic_trace(_add_one))
    codes = encoder.namespace(namespace, "def call(args):\n    launch0(7, 1, 1, function1)\n")
    assert dict(codes)["launch0"] == ["triton_part", "kernel0", 0]
    assert dict(codes)["function1"] == ["triton_part", "kernel0", 1]
    assert "987654321987" not in repr(codes)
    rebuilt = []
    kernels = [_Kernel(123), _Kernel(5, digest="other"), _Kernel(5, packed=(8, 1, 0))]

    def rebuild(text, source, grid):  # (compiled in the new process: another handle)
        assert text == "# a module of Triton kernels\n" and source.name == "kernel0"
        rebuilt.append(triton_launch.DeviceLaunch(kernels[len(rebuilt)], grid, source))
        return rebuilt[-1]

    monkeypatch.setattr(triton_launch, "rebuild_launch", rebuild)
    decoded = Decoder(None, [], [], encoder.modules).namespace(codes)
    assert decoded["function1"] == 123 and decoded["kernel0"] is rebuilt[0]
    assert decoded["launch0"] == rebuilt[0].compiled.run.launch
    assert len(rebuilt) == 1 and decoded["kernel1"].compiled is rebuilt[0].compiled
    assert decoded["kernel1"].grid == (3, 1, 1)
    for _ in kernels[1:]:  # (Triton compiled it otherwise here: another hash, other metadata)
        with pytest.raises(ValueError):
            Decoder(None, [], [], encoder.modules).namespace(codes)


def test_reduce_overhead_s_training_graphs_are_other_entries():
    # (compiled for CUDA graphs, a training graph's library calls keep no tape: one compiled
    # in the default mode must not be found for it, autodiff/tape.py)
    from ember.autodiff import tape

    gm = torch.fx.symbolic_trace(_loss)
    inputs = [torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)]
    with tape.kept(False):
        graphed = warm_cache.key_of(gm, inputs)
    assert graphed != warm_cache.key_of(gm, inputs)


def _quantized(x):
    q = torch.fake_quantize_per_tensor_affine(torch.tanh(x), 0.1, 0, -128, 127)
    return (q * 2).relu()


def test_a_graph_with_islands_whose_region_cannot_be_kept_says_so(cache):
    from helpers import captured_log

    x = torch.randn(10)
    with config.override(backend="interp"), captured_log("perf") as records:
        result = ember.compile(_quantized)(x)
        warm_cache.finish_keeps()  # (said by the keeping thread, once the eager runs end)
    said = [r.getMessage() for r in records if "not kept" in r.getMessage()]
    assert len(said) == 1 and "InterpretedGraph" in said[0] and not _entries(cache)
    assert torch.allclose(result, _quantized(x))


def test_a_rebuilt_wrapper_s_other_builds_are_the_cold_graph_s_or_say_they_are_missing():
    # (a warm start sends a call its kept build does not serve to the graph compiled cold;
    # a loaded export has no cold graph: the call says what it needed)
    from ember.codegen.wrapper import BuildNotKept
    from ember.runtime.warm_values import Decoder

    class Cold:
        wrappers = (None, type("Wrapper", (), {"namespace": {
            "rows": lambda key, args: ("rows", key, args)}})())

    rebuilt = Decoder(None, [], [], cold=lambda: Cold).value(["cold_build", "rows"])
    assert rebuilt((512, (1,)), ["x"]) == ("rows", (512, (1,)), ["x"])
    missing = Decoder(None, [], []).value(["cold_build", "rows"])
    with pytest.raises(BuildNotKept, match="rows of another length class"):
        missing((512, (1,)), ["x"])


def test_a_function_with_settings_of_its_own_is_kept_under_them(cache):
    # (its graph's key computed under the function's settings, passed rather than set
    # process-wide: a keep runs on another thread than the caller's)
    from ember import warm_entries

    before, settings = dict(warm_entries.counts), config.settings
    x = torch.randn(100)
    compiled = ember.compile(_add_one, options={"parallel_threshold": 7})
    assert torch.allclose(compiled(x), _add_one(x), atol=1e-6)
    warm_cache.finish_keeps()
    assert warm_entries.counts["kept"] == before["kept"] + 1
    assert warm_entries.counts["not_kept"] == before["not_kept"]
    assert config.settings is settings


def test_a_plain_record_is_read_back_and_one_naming_a_function_is_refused():
    import pickle

    shared = ["source", "LocalSource", [["plain", "x"]]]  # (written once, read back as one)
    record = {"versions": {"ember": "0"}, "guards": [["id", shared, ["plain", 2.5 + 1j]],
                                                     ["type", shared, ["plain", None]]]}
    data = warm_records.dumps(record)
    assert data.startswith(warm_records.PLAIN)
    back = warm_records.loads(data)
    assert back == record and back["guards"][0][1] is back["guards"][1][1]
    with pytest.raises(pickle.UnpicklingError, match="names posix.getcwd"):
        warm_records.loads(warm_records.PLAIN + pickle.dumps(os.getcwd))
    with_tensor = warm_records.dumps({"constant": torch.arange(3.0)})  # (torch.save's)
    assert not with_tensor.startswith(warm_records.PLAIN)
    assert torch.equal(warm_records.loads(with_tensor)["constant"], torch.arange(3.0))


def test_a_graph_is_kept_on_the_keeping_thread_in_the_order_asked():
    import threading

    kept = []
    for name in ("graph", "entry"):  # (a function's entry names the graph kept before it)
        warm_cache.when_compiled(object(), lambda name=name: kept.append(
            (name, threading.current_thread().name)))
    warm_cache.finish_keeps()
    assert [name for name, _ in kept] == ["graph", "entry"]
    assert all(thread.startswith("ember-keep") for _, thread in kept)



def test_no_graph_is_kept_while_a_first_call_runs_eagerly_beside_its_compile():
    # (the keep's encoding would take the GIL from that run: it waits for its end)
    import threading

    from ember.runtime.compiled import eager_beside_the_compile

    running, release, kept = threading.Event(), threading.Event(), []

    def eager():
        running.set()
        assert release.wait(10)
        return kept[:]

    seen = []
    first = threading.Thread(target=lambda: seen.append(
        eager_beside_the_compile(eager, (), "graph")))
    first.start()
    assert running.wait(10)
    warm_cache.when_compiled(object(), lambda: kept.append("graph"))
    time.sleep(0.2)  # (time for the keeping thread to have kept it, were it not waiting)
    assert kept == []
    release.set()
    first.join(10)
    warm_cache.finish_keeps()
    assert seen == [[]] and kept == ["graph"]

SYMBOLIC = BITS + """
import copy
import torch
import ember
from ember.runtime import warm_cache

def f(x, w):  # (a second shape: automatic dynamic compiles it once for every shape)
    return torch.softmax(x @ w, -1) * x.shape[0] + x.mean(0)

def scaled(x, n):  # (an int that changes: a symbol taken as a 0-d tensor)
    return x * n + 1

def step(model, x):  # (a training graph of symbolic sizes: forward and backward)
    loss = torch.nn.functional.gelu(model(x)).pow(2).mean()
    loss.backward()
    return loss

generator = torch.Generator().manual_seed(0)
w = torch.randn(8, 8, generator=generator)
answers = []
compiled_f, compiled_scaled = ember.compile(f), ember.compile(scaled)
for rows, n in ((4, 2), (5, 3), (7, 4), (6, 5)):
    x = torch.randn(rows, 8, generator=generator)
    answers += [compiled_f(x, w), compiled_scaled(x, n)]
    assert torch.allclose(answers[-2], f(x, w), atol=1e-5)
    assert torch.allclose(answers[-1], scaled(x, n), atol=1e-6)
model = torch.nn.Linear(8, 3)
with torch.no_grad():
    model.weight.copy_(torch.randn(3, 8, generator=generator))
    model.bias.copy_(torch.randn(3, generator=generator))
eager_model, compiled_step = copy.deepcopy(model), ember.compile(step)
for rows in (3, 6, 9):
    x = torch.randn(rows, 8, generator=generator)
    answers.append(compiled_step(model, x))
    assert torch.allclose(answers[-1], step(eager_model, x), atol=1e-5)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)
        answers.append(p.grad.clone())
        p.grad = q.grad = None
print("bits", bits(*answers))
ember.runtime.warm_cache.finish_keeps()  # (a keep runs on its own thread)
print("counts", warm_cache.counts)
"""


@pytest.mark.parametrize("backend", ["c", pytest.param("triton", marks=[
    pytest.mark.slow, *BACKENDS[1].marks])])  # (Triton's interpreter: 8 s, a CI slice)
def test_graphs_compiled_for_every_shape_start_warm(tmp_path, backend):
    # (three functions, each compiled for its first shape, then once for every shape: six
    # graphs, none lowered again in the second process, on symbolic fakes or otherwise)
    first, second = _second_process_hits(tmp_path / "cache", SYMBOLIC, backend, 6)
    assert first.count("lowered on symbolic fakes") == 3, first[-3000:]
    assert "lowered on symbolic fakes" not in second


def test_a_taped_call_is_kept_with_its_slots_as_slots():
    # (autodiff's TapedCall compares by identity, and `fill` tells its Slots from tuples:
    # kept field by field, a Slot as a Slot; a named tuple of another library is not kept)
    import collections

    from ember.autodiff.tape import TapedCall
    from ember.ir.library import Slot, fill
    from ember.runtime.warm_values import Encoder, NotKept

    call = TapedCall(torch.ops.aten.avg_pool2d.default, (Slot(0), [2, 2]), {}, False,
                     (True,), 3)
    encoder = Encoder(torch.fx.symbolic_trace(_add_one))
    back = encoder.decoder.value(encoder.value(call))
    assert type(back) is TapedCall and back is not call and back.index == 3
    x = torch.randn(1, 1, 4, 4)
    assert torch.equal(back.target(*fill(back.args, [x])), call.target(*fill(call.args, [x])))
    other = collections.namedtuple("Other", "index")(0)
    with pytest.raises(NotKept):
        encoder.value(other)
