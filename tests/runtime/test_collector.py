"""runtime/collector.py: Python's cyclic collector is paused while a call is captured and
compiled, not while it runs, and left as it was found."""

import gc
import threading

import pytest
import torch

import ember
import ember.capture.captured
from ember.runtime import collector


@pytest.fixture
def seen_while_capturing(monkeypatch):
    """Whether the collector was on, at each capture."""
    seen = []
    capture = ember.capture.captured.capture

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return capture(*args, **kwargs)

    monkeypatch.setattr(ember.capture.captured, "capture", watched)
    return seen


def _fn(record):
    def fn(x):
        y = torch.sin(x) + 1
        record.append(gc.isenabled())  # (a break: this runs in Python, mid-call)
        return y * 2

    return fn


def test_a_capture_runs_with_the_collector_paused_and_the_calls_do_not(seen_while_capturing):
    record = []
    compiled = ember.compile(_fn(record))
    x = torch.randn(8)
    assert gc.isenabled()
    compiled(x)
    compiled(x)
    assert gc.isenabled()
    assert seen_while_capturing and not any(seen_while_capturing)
    assert record == [True, True]


def test_a_collector_the_program_turned_off_stays_off(seen_while_capturing):
    compiled = ember.compile(_fn([]))
    gc.disable()
    try:
        compiled(torch.randn(8))
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert seen_while_capturing and not any(seen_while_capturing)


def test_overlapping_pauses_of_two_threads_restore_it_once_the_last_ends():
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def second():
        first_in.wait()
        with collector.paused():
            second_in.set()
            first_out.wait()
            seen.append(gc.isenabled())  # (the first pause ended: still paused for this one)
        seen.append(gc.isenabled())

    thread = threading.Thread(target=second)
    thread.start()
    with collector.paused():
        first_in.set()
        second_in.wait()
    first_out.set()
    thread.join()
    assert seen == [False, True] and gc.isenabled()
