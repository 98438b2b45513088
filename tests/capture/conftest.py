"""Fixtures shared by the capture tests."""

import logging

import pytest

from ember import config


@pytest.fixture
def recompiles(caplog):
    """Recompile log lines (EMBER_LOGS=recompiles)."""
    root = logging.getLogger("ember")
    root.addHandler(caplog.handler)
    try:
        with config.override(logs=frozenset({"recompiles"})):
            yield caplog
    finally:
        root.removeHandler(caplog.handler)
