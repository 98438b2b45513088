"""Hypothesis settings for the property tests: derandomized, so CI sees the same examples on
every run; `pytest --hypothesis-profile=explore` draws fresh random examples, many more."""

import pytest
from hypothesis import HealthCheck, settings

from ember import config

settings.register_profile(
    "ci", derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "explore", max_examples=500, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _raise_internal_errors():
    """An internal error is a bug to report with its traceback, not a silent eager fallback."""
    with config.override(logs=config.settings.logs | {"raise"}):
        yield
