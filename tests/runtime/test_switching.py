"""While a GPU graph's first call compiles, the interpreter hands the GIL over every 0.2 ms
(ember/runtime/switching.py); Python's interval, or the program's own, comes back after it,
whichever threads were inside and in whatever order they left."""

import sys
import threading

import pytest
import torch

import ember
from ember.runtime import switching


def test_the_interval_is_quick_inside_and_restored_after():
    before = sys.getswitchinterval()
    with switching.quick():
        assert sys.getswitchinterval() == pytest.approx(switching.QUICK)
        with switching.quick():
            assert sys.getswitchinterval() == pytest.approx(switching.QUICK)
        assert sys.getswitchinterval() == pytest.approx(switching.QUICK)
    assert sys.getswitchinterval() == before


def test_threads_leaving_in_any_order_restore_it_once():
    before = sys.getswitchinterval()
    inside, leave = threading.Barrier(3), threading.Event()
    seen = []

    def hold():
        with switching.quick():
            inside.wait()
            leave.wait()
            seen.append(sys.getswitchinterval())

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        with switching.quick():
            inside.wait(timeout=10)
        still = sys.getswitchinterval()  # (two threads still inside)
    finally:
        leave.set()
        for thread in threads:
            thread.join(timeout=10)
    assert still == pytest.approx(switching.QUICK)
    assert seen == [pytest.approx(switching.QUICK)] * 2
    assert sys.getswitchinterval() == before


def test_a_programs_own_interval_set_meanwhile_stays():
    before = sys.getswitchinterval()
    try:
        with switching.quick():
            sys.setswitchinterval(0.001)
        assert sys.getswitchinterval() == 0.001
    finally:
        sys.setswitchinterval(before)


def test_a_cpu_first_call_leaves_the_interval_alone():
    before = sys.getswitchinterval()
    seen = []

    def f(x):
        seen.append(sys.getswitchinterval())  # (read while capturing: a side effect)
        return x * 2

    x = torch.randn(3, device="cpu")
    torch.testing.assert_close(ember.compile(f)(x), f(x))
    assert seen[0] == before and sys.getswitchinterval() == before
