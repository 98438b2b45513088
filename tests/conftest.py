"""Test-wide setup. Triton kernels are tested on the CPU through Triton's interpreter, which
must be chosen before anything imports triton (its own library functions are made at import):
so TRITON_INTERPRET=1 is set here, first, unless EMBER_TEST_DEVICE=cuda runs the suite on a
GPU.

`make test` runs the files in two processes (pytest-xdist, TEST_WORKERS in the Makefile): a
test must not lean on what another file's tests imported or left behind.

CI (CI=true: 2 cores, a 15-minute budget for the suite) runs every test not marked `slow` and
a fixed slice of the slow ones: those whose test id hashes to 0 modulo SLOW_SLICES, the same
ones on every run, leaving out the Triton-interpreter cases of tests marked
slow_in_interpreter (minutes each; their C cases run, where they have any). `pytest -m slow`
(or any run outside CI) runs them all."""

import hashlib
import os

if os.environ.get("EMBER_TEST_DEVICE", "cpu") != "cuda":
    os.environ["TRITON_INTERPRET"] = "1"
# Graphs compile afresh in every test (a warm entry another test left would rebuild a graph
# without the internals tests look at); tests/runtime/test_warm_start.py turns it on.
os.environ["EMBER_WARM_START"] = "0"
# Every Triton kernel is written even where one of the same structure was (and renamed for
# it): a renamed kernel that differs from its own writing raises (codegen/kernel_reuse.py).
os.environ.setdefault("EMBER_CHECK_REUSED_KERNELS", "1")
# A first call runs the compiled graph even while its kernels compile (on a GPU, where they
# compile beside it): a test that calls once checks the kernels, not eager's answer again;
# tests/runtime/test_compiled.py and tests/test_backends.py test the eager first call.
os.environ["EMBER_EAGER_FIRST"] = "0"
# A function whose graph breaks is timed against eager after its first calls and may be
# called directly from then on (giving_up.TRIAL_ROUNDS): a decision the host's load could
# tip, so tests/test_eager_trial.py turns it on where it tests it, with the times set.
os.environ["EMBER_EAGER_TRIAL"] = "0"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("EMBER_TEST_DEVICE", "cpu") == "cuda":
    # tensors the tests (and the functions they compile) make land on the GPU
    torch.set_default_device("cuda")


SLOW_SLICES = 5


def in_ci_slice(test_id: str) -> bool:
    return int(hashlib.sha1(test_id.encode()).hexdigest(), 16) % SLOW_SLICES == 0


@pytest.hookimpl(trylast=True)  # (after tests/e2e's hook marks its slow-in-interpreter cases)
def pytest_collection_modifyitems(config, items):
    if os.environ.get("CI") != "true" or config.getoption("markexpr"):
        return
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        # (a test without a kernel_backend parameter runs only Triton's kernels)
        if item.get_closest_marker("slow_in_interpreter") is not None and \
                params.get("kernel_backend", "triton") == "triton":
            # (minutes each under Triton's interpreter; their C cases run, and the CUDA runs
            # of the suite run them compiled)
            item.add_marker(pytest.mark.skip(reason="slow under Triton's interpreter: CI runs "
                                                    "its C case (pytest -m slow: all)"))
        elif not in_ci_slice(item.nodeid):
            item.add_marker(pytest.mark.skip(
                reason=f"slow: CI runs one slow test in {SLOW_SLICES} (pytest -m slow: all)"))


@pytest.fixture
def builds(caplog):
    """What was built so far in the test, as a function: one line per C file built or loaded
    and per Triton module made (EMBER_LOGS=kernels; tests of one build per shape family)."""
    import logging

    from ember import config

    root = logging.getLogger("ember")
    root.addHandler(caplog.handler)
    try:
        with config.override(logs=frozenset({"kernels"})):
            yield lambda: [r.getMessage() for r in caplog.records if r.name == "ember.kernels"]
    finally:
        root.removeHandler(caplog.handler)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with Dynamo's caches empty (no recompile limits carried over)."""
    torch._dynamo.reset()
    yield
