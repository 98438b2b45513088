"""Faults never crash the user's program or mislead it: a damaged disk cache (a truncated, a
foreign, a corrupt library), an interrupted build, a compiler that leaves half a file, many
threads and processes compiling at once, a cache or dump directory that cannot be written,
and errors raised inside a compiled graph (said as eager says them, from the user's line)."""

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import pytest
import torch
from helpers import captured_log

import ember
from ember import config
from ember.backends import compile_graph
from ember.runtime import build as build_module
from ember.runtime import disk_cache
from ember.runtime.build import BuildError, build, kernel_function, load
from ember.runtime.compiled import CompiledGraph
from ember.runtime.training import TrainingGraph

ADD = "int add(int* a) {{ a[0] += {amount}; return 0; }}\n/* {tag} */\n"


@pytest.fixture
def cache(tmp_path):
    with config.override(cache_dir=tmp_path / "cache"):
        yield tmp_path / "cache"


def adder(amount: int, tag: str) -> str:
    """A library source that adds `amount` (`tag` makes it a source no test built before:
    a library this process has loaded once stays loaded under its path)."""
    return ADD.format(amount=amount, tag=tag)


def run_add(path) -> int:
    value = torch.tensor([40], dtype=torch.int32, device="cpu")
    assert kernel_function(load(path), "add", 1)(value.data_ptr()) == 0
    return value.item()


def rebuilt_after(damage, tag: str) -> tuple[bool, list[str]]:
    """Build a source, damage its cached library, build it again: (was the second build a
    cache hit, what the fallbacks channel said). A hit would load the damaged file: the
    caller checks the answer before anything is loaded."""
    source = adder(2, tag)
    path, cached = build(source, [])
    assert not cached
    damage(path)
    with captured_log("fallbacks") as records:
        again, cached = build(source, [])
    assert again == path
    return cached, [r.getMessage() for r in records]


def test_a_truncated_cached_library_is_rebuilt_not_loaded(cache):
    def truncate(path):
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])

    cached, said = rebuilt_after(truncate, "truncated")
    assert not cached and len(said) == 1 and "fails its check" in said[0]
    assert run_add(build(adder(2, "truncated"), [])[0]) == 42


def test_a_foreign_library_under_a_key_is_rebuilt(cache):
    other, _ = build(adder(5, "foreign other"), [])

    def replace_with_other(path):  # (its digest too: the digest covers the key)
        shutil.copy(other, path)
        shutil.copy(other.with_suffix(".digest"), path.with_suffix(".digest"))

    cached, said = rebuilt_after(replace_with_other, "foreign")
    assert not cached and len(said) == 1 and "digest" in said[0]
    assert run_add(build(adder(2, "foreign"), [])[0]) == 42  # not the other's 45


def test_a_corrupt_library_that_would_still_load_is_rebuilt(cache):
    def flip_a_byte(path):
        data = bytearray(path.read_bytes())
        data[len(data) - 100] ^= 0xFF  # (in the section headers' neighbourhood, still loadable)
        path.write_bytes(bytes(data))

    cached, said = rebuilt_after(flip_a_byte, "corrupt")
    assert not cached and len(said) == 1 and "fails its check" in said[0]
    missing, said = rebuilt_after(lambda path: path.with_suffix(".digest").unlink(), "undigested")
    assert not missing and "missing" in said[0]


def run_python(code: str, **environment: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), **environment)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)


COMPILE_AND_COMPARE = """
    import torch, ember
    def fn(x):
        return torch.sin(x) * 2 + 1
    torch.manual_seed(0)
    x = torch.randn(1000)
    compiled = ember.compile(fn)
    # (float32's tolerances: allclose's absolute 1e-8 fails where sin(x) * 2 + 1 is near 0)
    torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.records[-1].compiled.kernel_count == 1, "compiled"
    print("ok")
"""


def test_a_later_process_survives_a_truncated_library(tmp_path):
    """What killed every later process with SIGBUS: a library cut short in the cache."""
    first = run_python(COMPILE_AND_COMPARE, EMBER_CACHE_DIR=str(tmp_path))
    assert first.returncode == 0 and "ok" in first.stdout, first.stderr
    libraries = list(tmp_path.rglob("*.so"))  # (the kernels', and ember's C launcher)
    assert libraries
    for library in libraries:
        library.write_bytes(library.read_bytes()[:library.stat().st_size // 2])
    second = run_python(COMPILE_AND_COMPARE, EMBER_CACHE_DIR=str(tmp_path),
                        EMBER_LOGS="fallbacks")
    assert second.returncode == 0 and "ok" in second.stdout, second.stderr
    assert "fails its check" in second.stderr and "rebuilt" in second.stderr


def test_an_interrupted_build_leaves_nothing_behind(cache, monkeypatch):
    real = subprocess.run

    def interrupted(command, *args, **kwargs):
        output = command[command.index("-o") + 1]
        with open(output, "wb") as file:  # (what the compiler had written so far)
            file.write(b"\x7fELF partial")
        raise KeyboardInterrupt

    source = adder(3, "interrupted")
    monkeypatch.setattr(build_module.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(source, [])
    left = sorted(p.suffix for p in cache.rglob("*") if p.is_file())
    assert left == [".c", ".lock"], left  # the source and the lock file; no library, no temp
    monkeypatch.setattr(build_module.subprocess, "run", real)
    path, cached = build(source, [])
    assert not cached and run_add(path) == 43


def test_a_build_killed_outright_leaves_temporaries_the_next_build_removes(cache, tmp_path):
    # A process SIGKILLed while its compiler runs: no `finally` removes the compiler's
    # half-written temporary. (Its "compiler" writes half a library, then kills it.)
    killer = tmp_path / "killing-cc"
    killer.write_text("#!/bin/sh\nwhile [ \"$1\" != -o ]; do shift; done\n"
                      "printf '\\177ELF half' > \"$2\"\nkill -9 $PPID\n")
    killer.chmod(0o755)
    source = adder(5, "killed")
    code = f"""
        from ember.runtime.build import build
        build({source!r}, [])
    """
    killed = run_python(code, EMBER_CACHE_DIR=str(cache), EMBER_CC=str(killer))
    assert killed.returncode == -9, killed.stderr
    (left,) = [p for p in cache.rglob(".partial-*")]
    assert left.suffix == ".so" and left.read_bytes() == b"\x7fELF half"
    # another key's temporary in the same folder, whose builder still runs (its lock held),
    # stays; one of a key nobody builds goes
    running, dead = "ab" * 32, "cd" * 32
    for key in (running, dead):
        (left.parent / f".partial-{key}-x1y2.so").write_bytes(b"\x7fELF")
    import fcntl
    with open(left.parent / f"{running}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        with captured_log("fallbacks") as records:
            path, cached = build(source, [])
    assert not cached and run_add(path) == 45
    assert [p.name for p in cache.rglob(".partial-*")] == [f".partial-{running}-x1y2.so"]
    assert any("removed 2 temporaries" in r.getMessage() for r in records)


def test_a_killed_writers_temporary_of_no_key_goes_once_it_is_old(tmp_path):
    # (Triton modules' temporaries carry no key and no lock: a writer takes milliseconds)
    old, fresh = tmp_path / ".partial-abc123.py", tmp_path / ".partial-def456.py"
    for path in (old, fresh):
        path.write_text("# half a module")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert disk_cache.remove_stale(tmp_path) == [old]
    assert fresh.exists()


def test_a_compiler_that_succeeds_but_leaves_half_a_library(cache, monkeypatch):
    real = subprocess.run

    def truncating(command, *args, **kwargs):
        result = real(command, *args, **kwargs)
        output = command[command.index("-o") + 1]
        with open(output, "r+b") as file:
            file.truncate(os.path.getsize(output) // 2)
        return result

    monkeypatch.setattr(build_module.subprocess, "run", truncating)
    with pytest.raises(BuildError, match="incomplete library"):
        build(adder(4, "half"), [])
    assert not list(cache.rglob("*.so"))

    def fn(x):
        return torch.cos(x) - 3

    x = torch.randn(7)
    with captured_log("fallbacks") as records:
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
    assert not isinstance(compiled, CompiledGraph)  # eager, with the reason said
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "incomplete library" in records[0].getMessage()
    torch.testing.assert_close(compiled(x), fn(x))


def test_processes_building_one_key_at_once_compile_it_once(tmp_path):
    counter = tmp_path / "compiles"
    compiler = tmp_path / "counting-cc"
    real = shutil.which("cc") or shutil.which("gcc")
    compiler.write_text(f"#!/bin/sh\necho run >> {counter}\nexec {real} \"$@\"\n")
    compiler.chmod(0o755)
    code = f"""
        from ember.runtime.build import build
        path, _ = build({adder(6, "processes")!r}, [])
        print(path)
    """
    env = dict(os.environ, PYTHONPATH=os.getcwd(), EMBER_CACHE_DIR=str(tmp_path / "cache"),
               EMBER_CC=str(compiler))
    processes = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    assert len({out.strip() for out, _ in outputs}) == 1
    assert counter.read_text().count("run") == 1


def compile_from_threads(compiled, shapes, threads=8, fn=None):
    """Every thread calls `compiled` once per shape, each starting at another shape; the
    results are compared with eager's (`fn`, _fn by default)."""
    fn = fn or _fn
    inputs = {shape: torch.randn(shape) for shape in shapes}
    start = threading.Barrier(threads)
    wrong = []

    def work(offset):
        start.wait()
        for step in range(len(shapes)):
            x = inputs[shapes[(step + offset) % len(shapes)]]
            if not torch.allclose(compiled(x), fn(x), atol=1e-6):
                wrong.append(tuple(x.shape))

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert wrong == []


def _fn(x):
    return torch.sin(x) * 2 + x.sum()


SHAPES = [(n, 3) for n in range(1, 7)]


def test_threads_compile_each_shape_once():
    compiled = ember.compile(_fn, dynamic=False)
    compile_from_threads(compiled, SHAPES)
    assert len(compiled.records) == 6 and len(compiled.entries) == 6


def test_threads_respect_the_recompile_limit():
    compiled = ember.compile(_fn, dynamic=False)
    with config.override(recompile_limit=4):
        compile_from_threads(compiled, SHAPES)
    assert len(compiled.records) == 4 and len(compiled.entries) == 4


def _grouped(x):
    return torch.sin(x).view(x.shape[0], -1, 3).sum(-1) * 2  # (-1 needs a divisibility)


def test_threads_compile_each_shape_of_a_per_shape_symbolic_graph_once():
    # (view(b, -1, 3) of a [b, n] with both symbolic needs n % 3 == 0, which the sizes do
    # not carry yet: one capture, kernels per shape)
    compiled = ember.compile(_grouped, dynamic=True)
    compile_from_threads(compiled, [(n, 6) for n in range(2, 8)], fn=_grouped)
    (record,) = compiled.records  # (a size 1 would specialize: not among them)
    assert record.compiled.compiles == 6 and len(record.compiled.cache) == 6


def test_threads_share_one_compile_of_a_symbolic_graph(caplog):
    compiled = ember.compile(_fn, dynamic=True)
    with caplog.at_level(logging.INFO, logger="ember.kernels"), \
            config.override(logs=tuple(config.settings.logs) + ("kernels",)):
        compile_from_threads(compiled, [(n, 3) for n in range(2, 8)])
    (record,) = compiled.records
    assert isinstance(record.compiled, CompiledGraph)  # (one build for every shape)
    assert len([r for r in caplog.records if r.name == "ember.kernels"]) == 1


def test_an_unwritable_cache_is_named_and_the_program_runs_compiled(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # (a directory under a file cannot be made, even by root)

    def fn(x):
        return torch.tanh(x) * 3 - 1

    x = torch.randn(9)
    with config.override(cache_dir=blocker / "cache", dump_dir=blocker / "dump"), \
            captured_log("fallbacks") as records:
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
        assert isinstance(compiled, CompiledGraph) and compiled.kernel_count == 1
        torch.testing.assert_close(compiled(x), fn(x))
    said = [r.getMessage() for r in records]
    assert len(said) == 2, said
    assert any(f"EMBER_CACHE_DIR={blocker / 'cache'}" in s and "writable" in s for s in said)
    assert any(f"EMBER_DUMP={blocker / 'dump'}" in s and "writable" in s for s in said)
    assert not any("internal error" in s for s in said)


def _index_twice(x, index):
    y = x * 2
    picked = y[index]  # the statement an index error must point at
    return picked + 1


def _gather(x, index):
    return torch.gather(x, 1, index) + 1  # the statement a gather error must point at


def _eager_error(fn, *args):
    with pytest.raises(Exception) as caught:
        fn(*args)
    return caught.value


@pytest.mark.parametrize("fn, good, bad", [
    (_index_twice, torch.tensor([1, 2]), torch.tensor([1, 7])),
    (_gather, torch.zeros(5, 1, dtype=torch.int64), torch.tensor([[0], [5], [0], [0], [0]])),
], ids=["getitem", "gather"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_an_error_in_a_compiled_graph_is_eagers_from_the_users_line(fn, good, bad, training):
    x = torch.randn(5, 3, requires_grad=training)
    compiled = ember.compile(fn)
    torch.testing.assert_close(compiled(x, good), fn(x, good))
    assert isinstance(compiled.records[-1].compiled, TrainingGraph if training else CompiledGraph)
    expected = _eager_error(fn, x, bad)
    with pytest.raises(type(expected)) as caught:
        compiled(x, bad)
    assert str(caught.value) == str(expected)  # which index, dimension and size
    assert "index" in str(expected) and "dimension" in str(expected)
    # (the graph writes no input: the call ran eagerly from the function's start, and the
    # error is eager's own, chained to nothing of ember's; a user's handler would catch it)
    _assert_raised_at_the_statement(caught.value, fn, noted=False)
    assert caught.value.__context__ is None


def _assert_raised_at_the_statement(error: Exception, fn, noted: bool = True) -> None:
    """`error`'s traceback ends at fn's line marked "the statement", and (`noted`) a note
    names it."""
    last = traceback.extract_tb(error.__traceback__)[-1]
    code = fn.__code__
    line = next(n for n, text in enumerate(open(code.co_filename), 1)
                if "the statement" in text and n > code.co_firstlineno)
    assert (last.filename, last.lineno, last.name) == (code.co_filename, line, fn.__name__)
    if noted:
        assert any(f"{code.co_filename}:{line}" in note for note in error.__notes__)


def _phase_dependent(z):
    u, s, vh = torch.linalg.svd(z * 2)  # the statement whose backward raises
    return u.real.sum() + s.sum()


def test_an_error_in_a_compiled_backward_is_eagers_from_the_users_line():
    # (svd's backward refuses a loss that depends on the singular vectors' complex phase: a
    # library call's backward, run by the compiled backward; its error pointed into ember)
    z = torch.randn(3, 3, dtype=torch.complex64, requires_grad=True)
    with pytest.raises(RuntimeError) as eager:
        _phase_dependent(z).backward()
    compiled = ember.compile(_phase_dependent)
    loss = compiled(z)
    torch.testing.assert_close(loss, _phase_dependent(z))
    assert isinstance(compiled.records[-1].compiled, TrainingGraph)
    with pytest.raises(RuntimeError) as caught:
        loss.backward()
    assert str(caught.value) == str(eager.value)
    _assert_raised_at_the_statement(caught.value, _phase_dependent)


def _scaled_sum(x, y):
    return (x * y).sum(1, keepdim=True).relu() + y


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_a_compiled_graph_that_fails_where_eager_does_not_runs_eagerly_with_a_warning(
        training, monkeypatch):
    # (a fault of ember's own — once a CUDA output allocated in host memory, refused by every
    # Triton launch — must not end the user's program: eager answers, and says so)
    x, y = torch.randn(4, 8, requires_grad=training), torch.randn(4, 8)
    compiled = ember.compile(_scaled_sum)
    torch.testing.assert_close(compiled(x, y), _scaled_sum(x, y))  # (compiles; runs checked)
    graph = compiled.records[-1].compiled
    inner = graph.forward_graph if training else graph
    assert isinstance(inner, CompiledGraph)
    inner._run = inner._first_call  # (as if this were its first call)

    def refuses(*_):
        raise ValueError("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)")
    monkeypatch.setitem(inner.checked.__globals__, "kernel0", refuses)
    quiet = tuple(word for word in config.settings.logs if word != "raise")
    with captured_log("fallbacks") as records, config.override(logs=quiet):
        result = compiled(x, y)
    torch.testing.assert_close(result, _scaled_sum(x, y))
    if training:
        result.sum().backward()
        expected = x.detach().clone().requires_grad_()
        _scaled_sum(expected, y).sum().backward()
        torch.testing.assert_close(x.grad, expected.grad)
    said = [r.getMessage() for r in records]
    assert len(said) == 1 and "ValueError: Pointer argument" in said[0] \
        and "runs eagerly from now on" in said[0], said
    assert inner.runs_eagerly
    torch.testing.assert_close(compiled(x, y), _scaled_sum(x, y))


def test_a_training_graph_whose_forward_ir_fails_too_runs_the_fx_graph_with_a_warning(
        monkeypatch):
    # (the forward's own eager form is its IR interpreted: a fault in what the two share —
    # once a taped library call's symbolic planned strides — raised from both, and the
    # training step took it for the user's error)
    x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    compiled = ember.compile(_scaled_sum)
    torch.testing.assert_close(compiled(x, y), _scaled_sum(x, y))
    graph = compiled.records[-1].compiled
    assert isinstance(graph, TrainingGraph)

    def fails(*_):
        raise TypeError("empty_strided(): argument 'stride' must be tuple of ints")
    monkeypatch.setattr(graph.forward_graph, "_run", fails)
    monkeypatch.setattr(graph.forward_graph, "eager", fails)
    quiet = tuple(word for word in config.settings.logs if word != "raise")
    with captured_log("fallbacks") as records, config.override(logs=quiet):
        result = compiled(x, y)
    torch.testing.assert_close(result, _scaled_sum(x, y))
    result.sum().backward()
    expected = x.detach().clone().requires_grad_()
    _scaled_sum(expected, y).sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)
    said = [r.getMessage() for r in records]
    assert len(said) == 1 and "TypeError: empty_strided()" in said[0] \
        and "runs eagerly from now on" in said[0], said
    torch.testing.assert_close(compiled(x, y), _scaled_sum(x, y))  # (eager from now on)
