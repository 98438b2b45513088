"""Triton compile workers (runtime/triton_pool.py): a kernel a worker compiled is in Triton's
disk cache under the key this process asks for (its own compile adds no entry), and a kernel
that does not compile comes back as a failure with Triton's message. Compiled for an H200's
target (sm_90) on any machine: compiling needs no GPU. Runs in a subprocess, outside the test
suite's TRITON_INTERPRET=1 (under which @triton.jit makes no compilable kernel)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import json, os, tempfile
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    from ember.runtime import triton_launch, triton_pool
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    SOURCE = """import triton
    import triton.language as tl


    @triton.jit
    def good(p, q):
        x = tl.program_id(0) * 1024 + tl.arange(0, 1024)
        tl.store(q + x, tl.load(p + x) * 3 + 1)


    @triton.jit
    def bad(p, q):
        x = tl.program_id(0) * 1000 + tl.arange(0, 1000)
        tl.store(q + x, tl.load(p + x))
    """
    module = triton_launch.load_module(SOURCE)
    signature = {"p": "*fp32", "q": "*fp32"}
    pool = triton_pool.CompilePool(2, True)
    replies = [pool.submit(module.__file__, name, signature, {}, {"num_warps": 4},
                           ("cuda", 90, 32)).result() for name in ("good", "bad")]
    cache = os.environ["TRITON_CACHE_DIR"]
    before = len(os.listdir(cache))
    triton_launch.install_file_key()
    triton.compile(ASTSource(module.good, signature, {}, {}), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 4})
    after = len(os.listdir(cache))
    # the process points Triton's cache elsewhere (the benchmark does, workload by workload):
    # the workers started before compile into the new folder
    os.environ["TRITON_CACHE_DIR"] = moved = tempfile.mkdtemp()
    again = pool.submit(module.__file__, "good", signature, {}, {"num_warps": 8},
                        ("cuda", 90, 32)).result()
    moved_before = len(os.listdir(moved))
    triton.compile(ASTSource(module.good, signature, {}, {}), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 8})
    pool.close()
    print(json.dumps({"replies": replies, "before": before, "after": after, "again": again,
                      "moved": [moved_before, len(os.listdir(moved))],
                      "old": len(os.listdir(cache))}))
''')


def test_a_worker_compiles_into_the_cache_this_process_reads():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    (good_done, _), (bad_done, why) = found["replies"]
    assert good_done and not bad_done
    assert "power of 2" in why or "arange" in why, why
    assert found["before"] == found["after"] >= 1  # (the good kernel's entry, found again)
    assert found["again"][0] and found["moved"][0] == found["moved"][1] >= 1
    assert found["old"] == found["after"]  # (nothing more written where it no longer looks)


WARM_SCRIPT = textwrap.dedent('''
    import json, os, tempfile
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    from ember.runtime import triton_launch, triton_pool

    module = triton_launch.load_module(
        "import triton\\nimport triton.language as tl\\n\\n\\n@triton.jit\\n"
        "def good(p, q):\\n"
        "    x = tl.program_id(0) * 1024 + tl.arange(0, 1024)\\n"
        "    tl.store(q + x, tl.load(p + x) * 3 + 1)\\n")
    pool = triton_pool.CompilePool(2, True, ("cuda", 90, 32))
    reply = pool.submit(module.__file__, "good", {"p": "*fp32", "q": "*fp32"}, {},
                        {"num_warps": 4}, ("cuda", 90, 32)).result()
    pool.close(wait=120)  # (a loaded machine: the second worker may still be warming up)
    cache = os.environ["TRITON_CACHE_DIR"]
    names = [name for _, _, files in os.walk(cache) for name in files]
    print(json.dumps({"reply": reply, "names": names}))
''')


def test_workers_warm_up_for_the_gpu_in_a_cache_of_their_own():
    # (each worker's first compile pays Triton's one-time costs: paid at start, for the
    # graph's GPU, while the graph is captured and lowered; the user's cache gets nothing)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["EMBER_LOGS"] = "perf"
    run = subprocess.run([sys.executable, "-c", WARM_SCRIPT], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["reply"][0] is True
    warmed = [line for line in run.stderr.splitlines() if "warmed up in" in line]
    assert sorted(line.split(":")[0] for line in warmed) == [
        "[ember.perf] Triton worker 0", "[ember.perf] Triton worker 1"], run.stderr[-2000:]
    assert any(name.startswith("good.") for name in found["names"])
    assert not any(name.startswith("warm.") for name in found["names"]), found["names"]


def test_workers_that_cannot_start_answer_every_task_so_the_process_compiles_it(monkeypatch):
    # (each worker is started by its own thread; one that fails leaves no task waiting)
    from ember.runtime import triton_pool

    def refused(*args, **kwargs):
        raise OSError("no processes left")

    monkeypatch.setattr(triton_pool.subprocess, "Popen", refused)
    pool = triton_pool.CompilePool(2, False)
    futures = [pool.submit("kernels.py", f"kernel{i}", {}, {}, {}, ("cuda", 90, 32))
               for i in range(5)]
    replies = [future.result(timeout=10) for future in futures]
    pool.close(wait=5)
    assert replies == [(False, "worker not started: no processes left")] * 5
    assert not any(thread.is_alive() for thread in pool.threads)
