"""ember.runtime.build: the content-addressed disk cache, compile errors that name the file,
libraries built as several translation units at once,
and a missing compiler, which makes the graph run eagerly with a warning (never a crash)."""

import logging
import subprocess

import pytest
import torch
from helpers import captured_log

from ember import config
from ember.backends import compile_graph
from ember.runtime import build as build_module
from ember.runtime.build import BuildError, build, find_compiler, kernel_function, load
from ember.runtime.compiled import CompiledGraph

SOURCE = "int add_one(int* a) { a[0] += 1; return 0; }\n"


@pytest.fixture
def cache(tmp_path):
    with config.override(cache_dir=tmp_path):
        yield tmp_path


@pytest.fixture
def compiler_calls(monkeypatch):
    """Every command ember runs through subprocess (compilations and --version probes)."""
    calls = []
    real = subprocess.run

    def run(command, *args, **kwargs):
        calls.append(list(command))
        return real(command, *args, **kwargs)

    monkeypatch.setattr(build_module.subprocess, "run", run)
    return calls


def test_a_second_build_of_the_same_source_is_a_cache_hit(cache, compiler_calls):
    first, cached = build(SOURCE, [])
    assert not cached and first.exists() and first.parent.parent == cache / "c"
    assert any("-shared" in call for call in compiler_calls)
    compiler_calls.clear()
    second, cached = build(SOURCE, [])
    assert cached and second == first
    assert compiler_calls == []  # the compiler is not even started


def test_a_different_flag_or_source_is_a_miss(cache, compiler_calls):
    first, _ = build(SOURCE, [])
    with config.override(cflags=config.settings.cflags + ["-DEMBER_TEST_FLAG=1"]):
        flagged, cached = build(SOURCE, [])
    assert not cached and flagged != first
    other, cached = build(SOURCE + "/* another kernel */\n", [])
    assert not cached and other not in (first, flagged)
    linked, cached = build(SOURCE, ["-lm"])
    assert not cached and linked != first


def test_a_built_library_loads_and_runs(cache):
    path, _ = build(SOURCE, [])
    function = kernel_function(load(path), "add_one", 1)
    value = torch.tensor([41], dtype=torch.int32, device="cpu")  # (a C kernel: CPU memory)
    assert function(value.data_ptr()) == 0 and value.item() == 42


def test_a_compile_failure_names_the_generated_file(cache):
    with pytest.raises(BuildError) as error:
        build("int broken( {\n", [])
    message = str(error.value)
    assert "failed on generated kernel source" in message
    path = message.split("generated kernel source ")[1].split(":")[0]
    assert path.endswith(".c") and path.startswith(str(cache))
    assert open(path).read() == "int broken( {\n"
    assert not list(cache.rglob("*.so"))  # no half-built library left behind


def test_an_explicit_compiler_that_does_not_exist_is_an_error_not_a_substitute():
    with config.override(cc="/nonexistent/ember-cc"):
        with pytest.raises(BuildError, match="EMBER_CC=/nonexistent/ember-cc"):
            find_compiler()
    assert find_compiler()  # the setting is looked up per value, not cached for good


def test_without_a_compiler_a_graph_runs_eagerly_with_a_warning(cache):
    def fn(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(5, device="cpu")  # (the C compiler is what is missing)
    with config.override(cc="/nonexistent/ember-cc"), captured_log("fallbacks") as records:
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
    assert not isinstance(compiled, CompiledGraph)
    (record,) = records
    assert record.levelno == logging.WARNING
    assert "runs eagerly" in record.getMessage()
    assert "EMBER_CC=/nonexistent/ember-cc" in record.getMessage()
    torch.testing.assert_close(compiled(x), fn(x))
    assert isinstance(compile_graph(torch.fx.symbolic_trace(fn), [x]), CompiledGraph)


@pytest.mark.parametrize("name", ["S1", "gelu_chain20", "softmax", "layer_norm"])
def test_without_a_compiler_a_seed_workload_gives_eager_s_bits(cache, name):
    # (what runs is the captured FX graph, op for op the function's own: eager's bits, not
    # eager's within a tolerance; the bench's check of S1 without a compiler once found 111
    # elements off, which was torch's own first parallel tanh: ember/bench/trial.py)
    import ember
    from ember.bench import workloads

    function, args = workloads.resolve(name).instantiate("tiny")
    with config.override(cc="/nonexistent/ember-cc", warm_start=False):
        compiled = ember.compile(function)
        results = [compiled(*args) for _ in range(2)]
    want = function(*args)
    assert all(torch.equal(got, want) for got in results)


def test_a_compiler_crash_is_retried_without_the_slp_vectorizer(cache, monkeypatch):
    calls = []
    real = subprocess.run

    def crashing_once(command, *args, **kwargs):
        calls.append(list(command))
        if len(calls) == 1:
            return subprocess.CompletedProcess(command, 1, "", "x.c:3:5: internal compiler "
                                               "error: Segmentation fault")
        return real(command, *args, **kwargs)

    monkeypatch.setattr(build_module.subprocess, "run", crashing_once)
    path, cached = build(SOURCE, [])
    assert not cached and path.exists() and len(calls) == 2
    assert "-fno-tree-slp-vectorize" in calls[1] and "-fno-tree-slp-vectorize" not in calls[0]


def test_gcc12s_slp_crash_on_a_small_int64_max_reduction_builds(cache):
    # (what the property tests found: GCC 12 -O3 -march=native crashed on this kernel)
    source = """#include <stdint.h>
int kernel0(int64_t* restrict a_in0, int64_t* restrict a_buf0) {
    int64_t status = 0;
    int64_t acc0 = INT64_MIN;
    for (int64_t r0_2 = 0; r0_2 < 2; r0_2++) {
        #pragma omp simd reduction(max:acc0)
        for (int64_t r0_3 = 0; r0_3 < 2; r0_3++) {
            int64_t v1 = a_in0[r0_3];
            acc0 = v1 > acc0 ? v1 : acc0;
        }
    }
    a_buf0[0] = (int64_t)acc0;
    return (int)(status != 0);
}
"""
    path, _ = build(source, [])
    function = kernel_function(load(path), "kernel0", 2)
    values = torch.tensor([3, -7], dtype=torch.int64, device="cpu")
    out = torch.zeros(1, dtype=torch.int64, device="cpu")
    assert function(values.data_ptr(), out.data_ptr()) == 0 and out.item() == 3


def test_one_source_built_by_threads_at_once(cache):
    # (a graph's forward and backward build side by side: one source in both was rewritten
    # while the compiler read it)
    import threading

    source = SOURCE + "\n/* built by threads */\n"
    errors = []

    def build_it():
        try:
            path, _ = build(source, [])
            value = torch.tensor([1], dtype=torch.int32, device="cpu")
            assert kernel_function(load(path), "add_one", 1)(value.data_ptr()) == 0
        except Exception as error:  # noqa: BLE001 (collected for the assert below)
            errors.append(error)

    threads = [threading.Thread(target=build_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def _kernels_source(count, broken=None):
    kernels = [f"int add_{i}(int* a) {{ a[0] += {i}; return 0; }}" if i != broken
               else f"int add_{i}(int* a) {{ return a[0] +; }}" for i in range(count)]
    return "#include <stdint.h>\n" + "".join(build_module.UNIT_BREAK + k for k in kernels) + "\n"


def test_units_share_the_kernels_out_balanced_each_after_the_prelude():
    source = _kernels_source(7)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build_module, "_UNIT_BYTES", 1)
        parts = build_module.units(source, cores=3)
        assert build_module.units(source, cores=1) == [source]
    assert len(parts) == 3
    kernels = [k for part in parts for k in part.split(build_module.UNIT_BREAK)[1:]]
    assert sorted(kernels) == sorted(source.split(build_module.UNIT_BREAK)[1:])
    assert all(part.startswith("#include <stdint.h>\n") for part in parts)
    assert build_module.units(source, cores=3) == [source]  # (too small to be worth it)


def test_a_library_built_as_units_at_once_loads_every_kernel(cache, compiler_calls, monkeypatch):
    monkeypatch.setattr(build_module, "_UNIT_BYTES", 1)
    monkeypatch.setattr(build_module, "usable_cores", lambda: 3)
    path, cached = build(_kernels_source(7), [])
    compiles = [call for call in compiler_calls if "-c" in call]
    links = [call for call in compiler_calls if "-shared" in call]
    assert not cached and len(compiles) == 3 and len(links) == 1
    assert not [f for f in cache.rglob("*") if f.suffix == ".o"]  # (the units' files gone)
    library = load(path)
    for i in range(7):
        value = torch.tensor([100], dtype=torch.int32, device="cpu")
        assert kernel_function(library, f"add_{i}", 1)(value.data_ptr()) == 0
        assert value.item() == 100 + i


def test_a_failing_unit_names_the_whole_generated_source(cache, monkeypatch):
    monkeypatch.setattr(build_module, "_UNIT_BYTES", 1)
    monkeypatch.setattr(build_module, "usable_cores", lambda: 3)
    source = _kernels_source(6, broken=4)
    with pytest.raises(BuildError) as error:
        build(source, [])
    path = str(error.value).split("generated kernel source ")[1].split(":")[0]
    assert open(path).read() == source
    assert not list(cache.rglob("*.so")) and not list(cache.rglob("*.o"))


def test_a_graph_built_as_units_answers_as_eager(cache, compiler_calls, monkeypatch):
    import ember

    monkeypatch.setattr(build_module, "_UNIT_BYTES", 1)
    monkeypatch.setattr(build_module, "usable_cores", lambda: 4)

    def f(x, y):
        a = torch.softmax(x, -1) * y
        return a.sum(0), (x - a).amax(1), torch.tanh(a @ y.t()).mean(), (x * 2).cumsum(0)

    x, y = torch.randn(16, 33, device="cpu"), torch.randn(16, 33, device="cpu")
    torch.testing.assert_close(ember.compile(f)(x, y), f(x, y))
    assert len([call for call in compiler_calls if "-c" in call]) >= 2
