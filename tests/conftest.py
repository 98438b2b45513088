"""Test-wide setup. Triton kernels are tested on the CPU through Triton's interpreter, which
must be chosen before anything imports triton (its own library functions are made at import):
so TRITON_INTERPRET=1 is set here, first, unless EMBER_TEST_DEVICE=cuda runs the suite on a
GPU."""

import os

if os.environ.get("EMBER_TEST_DEVICE", "cpu") != "cuda":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("EMBER_TEST_DEVICE", "cpu") == "cuda":
    # tensors the tests (and the functions they compile) make land on the GPU
    torch.set_default_device("cuda")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with Dynamo's caches empty (no recompile limits carried over)."""
    torch._dynamo.reset()
    yield
