import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with Dynamo's caches empty (no recompile limits carried over)."""
    torch._dynamo.reset()
    yield
