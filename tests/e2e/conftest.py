"""The end-to-end suite runs once per kernel backend: C, and Triton under its interpreter (on
CPU tensors: tests/conftest.py sets TRITON_INTERPRET=1), so every generated Triton kernel is
checked against eager without a GPU. With EMBER_TEST_DEVICE=cuda (on a GPU machine) the tensors
the tests make are CUDA tensors and the Triton kernels are compiled and run on the device."""

import importlib.util
import os

import pytest

from ember import config

DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
BACKENDS = ["triton"] if DEVICE == "cuda" else ["c", "triton"]


@pytest.fixture(autouse=True, params=BACKENDS)
def kernel_backend(request):
    """Which code generator compiles the test's graphs."""
    if request.param == "triton" and importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    with config.override(backend=request.param):
        yield request.param


def pytest_collection_modifyitems(config, items):
    """A test marked slow_in_interpreter is slow (tests/conftest.py) in its Triton case on the
    CPU, where Triton's interpreter runs its kernels element by element."""
    if DEVICE == "cuda":
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        if item.get_closest_marker("slow_in_interpreter") is not None and callspec is not None \
                and callspec.params.get("kernel_backend") == "triton":
            item.add_marker(pytest.mark.slow)
