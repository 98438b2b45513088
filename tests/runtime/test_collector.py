"""runtime/collector.py: Python's cyclic collector is paused while a call is captured and
compiled, and left as it was found."""

import gc
import threading

import torch

import ember
from ember.runtime import collector


def _seen_by(record):
    def fn(x):
        y = torch.sin(x) + 1
        record.append(gc.isenabled())  # (a break: this runs in Python, mid-call)
        return y * 2

    return fn


def test_a_first_call_runs_with_the_collector_paused_and_later_calls_do_not():
    record = []
    compiled = ember.compile(_seen_by(record))
    x = torch.randn(8)
    assert gc.isenabled()
    compiled(x)
    assert gc.isenabled()
    compiled(x)
    assert record == [False, True]


def test_a_collector_the_program_turned_off_stays_off():
    record = []
    compiled = ember.compile(_seen_by(record))
    gc.disable()
    try:
        compiled(torch.randn(8))
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert record == [False]


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
