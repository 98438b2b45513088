"""ember.runtime.compiled: the first call is checked; a layout ember did not predict makes
the graph run eagerly from then on, from the inputs the caller passed, with a warning."""

import logging

import torch
from helpers import captured_log

from ember.codegen.wrapper import LayoutMismatch, WrapperSource
from ember.runtime.compiled import CompiledGraph


def _eager(x, scale):
    x.mul_(scale)
    return x + 1


def _graph(checked_text: str) -> CompiledGraph:
    namespace = {"LayoutMismatch": LayoutMismatch}
    fast = WrapperSource("def call(args):\n    raise AssertionError('fast path')\n", namespace)
    checked = WrapperSource(checked_text, namespace)
    return CompiledGraph(checked, fast, tensor_positions=[0], argument_count=2, eager=_eager,
                         label="graph_test", kernel_count=1, library_count=1,
                         written_inputs=[0])


def test_a_layout_mismatch_falls_back_to_eager_from_the_original_inputs():
    compiled = _graph("def call(args):\n"
                      "    args[0].add_(100)\n"             # written before the check fails
                      "    raise LayoutMismatch('lib0')\n")
    x = torch.arange(4.0)
    with captured_log("fallbacks") as records:
        result = compiled(x, 3)
    assert torch.equal(x, torch.arange(4.0) * 3)            # mutated once, by eager
    assert torch.equal(result, torch.arange(4.0) * 3 + 1)
    (record,) = records
    assert record.levelno == logging.WARNING and "graph_test" in record.getMessage()
    y = torch.ones(2)
    assert torch.equal(compiled(y, 2), torch.full((2,), 3.0))  # eager from now on


def test_after_a_checked_first_call_the_fast_wrapper_runs():
    compiled = _graph("def call(args):\n    return args[0] * 10\n")
    x = torch.ones(2)
    assert torch.equal(compiled(x, 5), torch.full((2,), 10.0))
    try:
        compiled(x, 5)
    except AssertionError as error:
        assert str(error) == "fast path"
    else:
        raise AssertionError("the fast wrapper did not run")


# -- kernels compiled beside the first run (compile_plan.compiled_later) ------------------------

class _StandInLaunch:
    """A DeviceLaunch's part that a launch reads: a launcher that records its arguments."""

    def __init__(self, calls: list):
        self.calls = calls
        self.grid = (4, 1, 1)

    def prefix(self) -> tuple:
        def launcher(*args):
            self.calls.append(args)
        return (launcher, "function0", "metadata0")


def _graph_compiled_later(later, loaded, eager_first=False):
    """A graph whose first (checked) run launches kernel0 through a PendingLaunch on `loaded`
    (the kernel, once compiled and loaded) and whose wrappers come from `later`."""
    from ember.runtime.triton_launch import PendingLaunch

    pending = PendingLaunch(loaded, (4, 1, 1))
    checked = WrapperSource("def call(args):\n"
                            "    args[0].add_(100)\n"  # (a write the first run makes)
                            "    pending(4, 1, 1, 7, args[0])\n"
                            "    return args[0] * 10\n", {"pending": pending})
    return CompiledGraph(checked, None, tensor_positions=[0], argument_count=2, eager=_eager,
                         label="graph_later", kernel_count=1, library_count=0,
                         written_inputs=[0], later=later, eager_first=eager_first)


def test_a_first_run_beside_the_compile_waits_for_its_kernels_then_takes_the_fast_wrapper():
    import concurrent.futures
    import threading

    calls = []
    launches, later = concurrent.futures.Future(), concurrent.futures.Future()
    fast = WrapperSource("def call(args):\n    return args[0] * 20\n", {})
    compiled = _graph_compiled_later(later, launches)
    kept = []  # (what warm_cache.when_compiled asks: the graph kept once its kernels are in)
    compiled.when_settled(lambda: kept.append(compiled.wrappers[1]))
    assert kept == []

    def compile_finishes():
        launches.set_result(_StandInLaunch(calls))
        later.set_result((WrapperSource("def call(args):\n    return None\n", {}), fast))

    threading.Timer(0.05, compile_finishes).start()
    x = torch.ones(2)
    assert torch.equal(compiled(x, 3), torch.full((2,), 1010.0))  # waited for kernel0
    (launched,) = calls
    assert launched[:6] == (4, 1, 1, 7, "function0", "metadata0") and launched[6] is x
    assert kept == [fast]  # (before the first call returned)
    assert compiled.wrappers[1] is fast and compiled.wrapper_source == fast.text
    assert torch.equal(compiled(torch.ones(2), 3), torch.full((2,), 20.0))  # the fast one


def test_calls_while_the_kernels_compile_run_eagerly_and_the_first_after_runs_them():
    import concurrent.futures
    import threading

    calls = []
    launches, later = concurrent.futures.Future(), concurrent.futures.Future()
    fast = WrapperSource("def call(args):\n    return args[0] * 20\n", {})
    compiled = _graph_compiled_later(later, launches, eager_first=True)
    kept = []
    compiled.when_settled(lambda: kept.append(compiled.wrappers[1]))
    x = torch.arange(4.0)
    with captured_log("perf") as records:
        result = compiled(x, 3)
    assert torch.equal(x, torch.arange(4.0) * 3)  # eager's write, once
    assert torch.equal(result, torch.arange(4.0) * 3 + 1)
    assert calls == [] and kept == []  # (nothing launched, nothing kept yet)
    assert "run eagerly while its kernels compile" in records[0].getMessage()
    z = torch.arange(4.0)
    assert torch.equal(compiled(z, 2), torch.arange(4.0) * 2 + 1)  # (still compiling)
    assert torch.equal(z, torch.arange(4.0) * 2) and calls == [] and kept == []

    def compile_finishes():
        launches.set_result(_StandInLaunch(calls))
        later.set_result((WrapperSource("def call(args):\n    return None\n", {}), fast))

    timer = threading.Timer(0.05, compile_finishes)
    timer.start()
    timer.join()
    assert kept == [fast]  # (kept once the kernels are in, before any other call)
    y = torch.ones(2)
    with captured_log("perf") as records:
        assert torch.equal(compiled(y, 3), torch.full((2,), 1010.0))  # the checked run
    assert len(calls) == 1 and kept == [fast]
    assert "in after 2 calls run eagerly" in records[0].getMessage()
    assert torch.equal(compiled(torch.ones(2), 3), torch.full((2,), 20.0))  # the fast one


def test_a_first_call_after_the_kernels_compiled_runs_them():
    import concurrent.futures

    calls = []
    launches, later = concurrent.futures.Future(), concurrent.futures.Future()
    launches.set_result(_StandInLaunch(calls))
    later.set_result((WrapperSource("def call(args):\n    return None\n", {}),
                      WrapperSource("def call(args):\n    return args[0] * 20\n", {})))
    compiled = _graph_compiled_later(later, launches, eager_first=True)
    assert torch.equal(compiled(torch.ones(2), 3), torch.full((2,), 1010.0))
    assert len(calls) == 1


def test_a_graph_about_to_be_recorded_waits_for_its_kernels_instead_of_running_eagerly():
    # (runtime/cudagraphs asks it before recording: eager's kernels would be recorded)
    import concurrent.futures
    import threading

    calls = []
    launches, later = concurrent.futures.Future(), concurrent.futures.Future()
    compiled = _graph_compiled_later(later, launches, eager_first=True)
    compiled.compiled_from_now()

    def compile_finishes():
        launches.set_result(_StandInLaunch(calls))
        later.set_result((WrapperSource("def call(args):\n    return None\n", {}),
                          WrapperSource("def call(args):\n    return args[0] * 20\n", {})))

    threading.Timer(0.05, compile_finishes).start()
    assert torch.equal(compiled(torch.ones(2), 3), torch.full((2,), 1010.0))  # (waited)
    assert len(calls) == 1

def test_kernels_that_fail_to_compile_beside_the_first_run_leave_the_graph_to_eager():
    import concurrent.futures

    launches, later = concurrent.futures.Future(), concurrent.futures.Future()
    error = RuntimeError("ptxas failed")
    launches.set_exception(error)
    later.set_exception(error)
    compiled = _graph_compiled_later(later, launches)
    x = torch.arange(4.0)
    with captured_log("fallbacks") as records:
        result = compiled(x, 3)
    assert torch.equal(x, torch.arange(4.0) * 3)  # written once, by eager, from the inputs
    assert torch.equal(result, torch.arange(4.0) * 3 + 1)
    (record,) = records
    assert record.levelno == logging.WARNING and "did not compile" in record.getMessage() \
        and "ptxas failed" in record.getMessage()
    assert torch.equal(compiled(torch.ones(2), 2), torch.full((2,), 3.0))  # eager from now on


def test_kernels_compile_beside_the_first_run_only_where_nothing_shows_the_code():
    from ember import compile_plan, config
    from ember.runtime import triton_launch

    with config.override(kernels_later=True):
        # (the interpreter compiles nothing: its kernels are there at once)
        assert compile_plan._compiles_later(None) is not triton_launch.interpreting()
        assert not compile_plan._compiles_later(object())  # a dump folder
    with config.override(kernels_later=False):
        assert not compile_plan._compiles_later(None)
