"""Dynamic shapes, stage 1 (issue 18): sizes as symbols in capture, guards as relations on
them, dynamic=None/True/False, mark_dynamic/mark_static. Each test compares every call with
eager and counts captures (compiled.records) and backend compiles exactly."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from checks import same

import ember
from ember import config, torch_internals


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), device="cpu")


@pytest.fixture(autouse=True)
def on_the_cpu():
    with torch.device("cpu"):
        yield


@pytest.fixture
def logged(caplog):
    """Lines of the recompiles and guards channels."""
    root = logging.getLogger("ember")
    root.addHandler(caplog.handler)
    try:
        with config.override(logs=frozenset({"recompiles", "guards"})):
            yield caplog
    finally:
        root.removeHandler(caplog.handler)


def counting_backend():
    """A backend that runs the graph as eager does and counts its compiles (it serves any
    shape, as backend="eager" does, so a symbolic capture compiles once)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend.serves_any_shape = True
    return backend, graphs


def mlp_like(x):
    b = x.shape[0]
    y = x.view(b, 2, -1).relu() * 2
    return y.sum(1) + torch.arange(b).unsqueeze(1), b * 3


def run_sizes(compiled, fn, sizes, make):
    for size in sizes:
        x = make(size)
        same(compiled(x), fn(x), f"size {size}")


# -- dynamic=None, True, False ------------------------------------------------------------
def test_thirty_batch_sizes_capture_twice_by_default():
    backend, graphs = counting_backend()
    compiled = ember.compile(mlp_like, backend=backend)
    run_sizes(compiled, mlp_like, range(2, 32), lambda b: t(b, 8, seed=b))
    assert len(compiled.records) == 2 and len(graphs) == 2  # static 2, then symbolic
    assert compiled.entries[0].captured.symbolic


def first_half(x):
    return (x[: x.shape[0] // 2] * 2).sum(-1) + x.shape[0]


def test_by_default_embers_own_backend_falls_back_per_shape_where_it_cannot_be_symbolic():
    # automatic dynamic makes a symbolic capture on the first recompile; b // 2 is not a
    # polynomial of the sizes (a floor-division atom: not carried by Size), so that graph's
    # kernels are built per shape, and later recompiles of the function stay static
    compiled = ember.compile(first_half)
    with config.override(recompile_limit=3):
        run_sizes(compiled, first_half, range(4, 10), lambda b: t(b, 8, seed=b))
    assert len(compiled.records) == 2 and compiled.entries[0].captured.symbolic
    assert compiled.symbolic_refused
    assert "not a polynomial" in compiled.records[1].compiled.reason


def test_by_default_embers_own_backend_compiles_mlp_like_once_for_the_family():
    # view(b, 2, -1), arange(b): symbolic since stage 3 (issue 18)
    compiled = ember.compile(mlp_like)
    run_sizes(compiled, mlp_like, range(2, 8), lambda b: t(b, 8, seed=b))
    assert len(compiled.records) == 2 and not compiled.symbolic_refused


def test_thirty_batch_sizes_capture_once_under_dynamic_true():
    backend, graphs = counting_backend()
    compiled = ember.compile(mlp_like, backend=backend, dynamic=True)
    run_sizes(compiled, mlp_like, range(2, 32), lambda b: t(b, 8, seed=b))
    assert len(compiled.records) == 1 and len(graphs) == 1


def test_dynamic_false_recompiles_to_the_limit_then_runs_eagerly():
    backend, graphs = counting_backend()
    compiled = ember.compile(mlp_like, backend=backend, dynamic=False)
    with config.override(recompile_limit=4):
        run_sizes(compiled, mlp_like, range(2, 32), lambda b: t(b, 8, seed=b))
    assert len(compiled.records) == 4 and len(graphs) == 4
    assert compiled.given_up


def test_sizes_zero_and_one_are_never_symbols():
    backend, graphs = counting_backend()
    compiled = ember.compile(lambda x: x * 2 + x.shape[0], backend=backend, dynamic=True)
    run_sizes(compiled, lambda x: x * 2 + x.shape[0], [0, 1, 2, 5, 9, 0, 1],
              lambda b: t(b, 3, seed=b))
    # 0 and 1 each an entry of its own, specialized (dim 1 is a symbol in all three); 2, 5, 9
    # one entry
    assert len(compiled.records) == 3 and len(graphs) == 3
    symbolic, one, zero = (entry.guard_source for entry in compiled.entries)
    assert "shape[0] == 0" in zero and "shape[0] == 1" in one and "2 <= s0" in symbolic


def test_a_python_int_used_as_a_size_becomes_a_symbol_after_it_changes():
    def take(x, n):
        return x[:, :n] * 2 + torch.arange(n), n + 1

    backend, graphs = counting_backend()
    compiled = ember.compile(take, backend=backend)
    for n in [3, 4, 5, 6, 7]:
        same(compiled(t(4, 9), n), take(t(4, 9), n), f"n={n}")
    assert len(compiled.records) == 2 and len(graphs) == 2
    graph = compiled.entries[0].captured.graph_module
    assert "arange(l__n" in graph.code.replace("L__n", "l__n")  # (n is an input, not 4)


# -- shape arithmetic stays symbolic --------------------------------------------------------
def heads(x):
    b, t_, c = x.shape
    h = 2
    d = x.shape[2] // h
    y = x.view(b, -1, h, d).transpose(1, 2)
    positions = torch.arange(x.shape[1])
    return y * positions.view(1, 1, -1, 1), len(x) * x.size(1) + x.numel()


def test_shape_arithmetic_view_and_arange_stay_symbolic_in_one_capture():
    backend, graphs = counting_backend()
    compiled = ember.compile(heads, backend=backend, dynamic=True)
    for shape in [(2, 3, 8), (3, 5, 8), (4, 7, 12), (5, 2, 16), (2, 9, 6)]:
        same(compiled(t(*shape)), heads(t(*shape)), f"shape {shape}")
    assert len(compiled.records) == 1 and len(graphs) == 1
    code = graphs[0].code
    assert "floordiv" in code and "size(2)" in code and "size(1)" in code
    assert "view(size, -1, 2, floordiv)" in code


def test_branching_on_a_symbolic_size_installs_a_relation(logged):
    def branchy(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    compiled = ember.compile(branchy, backend="eager", dynamic=True)
    run_sizes(compiled, branchy, [5, 6, 9, 3, 2, 4, 7], lambda b: t(b, 2, seed=b))
    # one capture for sizes above 4, one for 2..4
    assert len(compiled.records) == 2
    guards = compiled.entries[1].guard_source
    assert "s0 > 4" in guards or "4 < s0" in guards or "5 <= s0" in guards


def test_two_dynamic_sizes_that_must_be_equal_leave_a_relation():
    compiled = ember.compile(lambda x, y: x + y, backend="eager", dynamic=True)
    for n in [3, 6]:
        same(compiled(t(n), t(n, seed=1)), t(n) + t(n, seed=1))
    assert len(compiled.records) == 1
    text = compiled.entries[0].guard_source
    assert "s0 == s1" in text or "s1 == s0" in text


# -- marks ----------------------------------------------------------------------------------
def test_mark_static_holds_under_dynamic_true():
    backend, graphs = counting_backend()
    compiled = ember.compile(mlp_like, backend=backend, dynamic=True)
    for b, c in [(3, 8), (5, 8), (3, 10)]:
        x = t(b, c)
        ember.mark_static(x, 1)
        same(compiled(x), mlp_like(x))
    assert len(compiled.records) == 2  # (c changed: a capture of its own)
    assert re.search(r"\bv\d+\.shape\[1\] == 8", compiled.entries[1].guard_source)


def test_mark_dynamic_with_min_and_max():
    backend, graphs = counting_backend()
    compiled = ember.compile(mlp_like, backend=backend)
    for b in [4, 7, 16, 20]:
        x = t(b, 8)
        ember.mark_dynamic(x, 0, min=3, max=16)
        same(compiled(x), mlp_like(x))
    # symbolic from the first call (no static capture first); 20 is past max: another
    assert len(compiled.records) == 2
    assert "3 <= s0 <= 16" in compiled.entries[1].guard_source
    assert compiled.entries[1].captured.symbolic


def test_torch_dynamo_marks_are_read():
    compiled = ember.compile(mlp_like, backend="eager")
    for b in [4, 7, 9]:
        x = t(b, 8)
        torch._dynamo.mark_dynamic(x, 0)
        same(compiled(x), mlp_like(x))
    assert len(compiled.records) == 1


def test_dynamic_false_ignores_marks_and_says_so(logged):
    compiled = ember.compile(mlp_like, backend="eager", dynamic=False)
    x = t(4, 8)
    ember.mark_dynamic(x, 0)
    same(compiled(x), mlp_like(x))
    assert not compiled.entries[0].captured.symbolic
    assert any("dynamic=False specializes it" in r.getMessage() for r in logged.records)


# -- what users read ------------------------------------------------------------------------
def test_recompile_message_says_which_relation_broke(logged):
    compiled = ember.compile(mlp_like, backend="eager", dynamic=True)
    compiled(t(4, 8))
    compiled(t(1, 8))
    messages = [r.getMessage() for r in logged.records]
    assert any("because x.size()[0] = 1 breaks 2 <= s0" in m for m in messages), messages


def test_guard_text_in_logs_and_explain(logged):
    compiled = ember.compile(mlp_like, backend="eager", dynamic=True)
    compiled(t(4, 8))
    guard_lines = [r.getMessage() for r in logged.records if "guards of" in r.getMessage()]
    assert "s0 = v" in guard_lines[-1] and "if not (2 <= s0)" in guard_lines[-1]
    report = ember.explain(mlp_like, dynamic=True)(t(4, 8))
    assert any("2 <= s0" in text for text in report.guards)


# -- what stays as it was ---------------------------------------------------------------------
def test_data_dependent_sizes_still_break_with_their_reason():
    def masked(x):
        return x[x > 0] * 2

    report = ember.explain(masked, dynamic=True)(t(6, 3))
    assert report.graph_break_count == 1
    compiled = ember.compile(masked, backend="eager", dynamic=True)
    for b in [4, 6, 8]:
        same(compiled(t(b, 3, seed=b)), masked(t(b, 3, seed=b)))


def test_the_static_path_never_makes_a_shape_env(monkeypatch):
    def refuse():
        raise AssertionError("a static capture made a ShapeEnv")

    monkeypatch.setattr(torch_internals, "make_symbolic_fake_mode", refuse)
    compiled = ember.compile(mlp_like, backend="eager", dynamic=False)
    run_sizes(compiled, mlp_like, [3, 4], lambda b: t(b, 8))
    compiled = ember.compile(mlp_like, backend="eager")  # (first call: static)
    run_sizes(compiled, mlp_like, [3, 3], lambda b: t(b, 8))


def test_text_of_a_symbolic_size_is_its_value():
    def named(x):
        return {f"rows{x.shape[0]}": x * 2}, str(len(x)), isinstance(x.shape[0], int)

    compiled = ember.compile(named, backend="eager", dynamic=True)
    for b in [3, 5]:
        same(compiled(t(b, 2)), named(t(b, 2)))


def test_ember_backend_compiles_per_shape_under_one_capture():
    # NOTE: stage 1 — one capture serves the family, but ember's kernels are still built per
    # concrete shape (backends.ShapeSpecialized), least recently used dropped
    compiled = ember.compile(first_half, dynamic=True)
    with config.override(shape_compiles=2):
        for b in [4, 6, 8, 4]:  # (b // 2 >= 2: a half of 1 row would be specialized)
            same(compiled(t(b, 4, seed=b)), first_half(t(b, 4, seed=b)))
    assert len(compiled.records) == 1
    specialized = compiled.records[0].compiled
    assert specialized.compiles == 4 and len(specialized.cache) == 2  # (3 dropped, then again)


def test_past_the_recompile_limit_new_shapes_run_eagerly():
    # a growing size (a decoding loop's cache) must not build kernels at every call
    compiled = ember.compile(first_half, dynamic=True)
    with config.override(recompile_limit=3):
        for b in [4, 6, 8, 10, 12, 4]:
            same(compiled(t(b, 4, seed=b)), first_half(t(b, 4, seed=b)))
    specialized = compiled.records[0].compiled
    assert len(compiled.records) == 1
    assert specialized.compiles == 3 and specialized.eager_calls == 2  # (10, 12; 4 kept)


def test_what_the_backend_guards_on_the_symbols_becomes_a_guard(logged):
    # a symbolic lowering runs on the capture's ShapeEnv: a relation it records while
    # compiling (here, the backend's own branch on s0) must be checked on later calls
    answers = []

    def branching(gm, example_inputs):
        fake = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["example_value"]
        answers.append(bool(fake.shape[0] > 10))
        return gm.forward

    branching.serves_any_shape = True
    compiled = ember.compile(lambda x: x * 2, backend=branching, dynamic=True)
    for rows in [12, 20, 5]:
        same(compiled(t(rows, 3)), t(rows, 3) * 2)
    assert answers == [True, False] and len(compiled.records) == 2
    assert any("s0 > 10" in r.getMessage() for r in logged.records)


def test_a_view_input_beside_a_symbolic_int():
    # the fake of a view fakes its base as well: symbols the ShapeEnv makes for the base are
    # read from `L['ids']._base` (this was a KeyError in capture)
    def positions(ids, past: int = 0):
        return ids + torch.arange(past, past + ids.shape[1]).unsqueeze(0)

    compiled = ember.compile(positions, backend="eager")
    ids = torch.arange(10).view(2, 5)
    for args in [(ids,), (ids[:, :1], 5), (ids[:, :1], 6), (ids[:, :2], 7)]:
        same(compiled(*args), positions(*args))
    assert all(record.graphs == 1 for record in compiled.records)  # (none ran eagerly)


def test_text_of_a_symbolic_shape_is_its_value():
    # str(x.shape) went through str()'s own rule, which did not specialize: "torch.Size([s77,
    # 2])" reached the user (a wrong answer once automatic dynamic ran under ember's backend)
    def texts(x):
        shape = x.shape
        return x * len(str(shape)), [str(shape), repr(shape), "%s" % (shape,),  # noqa: UP031
                                     "{}".format(shape), f"{shape}", " ".join(map(str, shape))]

    compiled = ember.compile(texts, backend="eager", dynamic=True)
    for rows in [3, 5, 12]:
        same(compiled(t(rows, 2)), texts(t(rows, 2)))


class Window:
    """A cache as transformers' DynamicSlidingWindowLayer keeps one: a Python int on the
    object, read, branched on and written back by each call."""

    def __init__(self, window):
        self.window = window
        self.length = 0

    def update(self, x):
        self.length += x.shape[1]
        full = self.length >= self.window
        offset = max(self.length - self.window + 1, 0)
        return full, offset


def windowed(x, cache):
    full, offset = cache.update(x)
    positions = torch.arange(offset, cache.length)
    return x.sum(1, keepdim=True) * positions + (1.0 if full else 0.0)


def test_an_int_attribute_of_an_object_from_the_call_becomes_a_symbol_after_it_changes():
    # a decoding cache's length: one capture for the first call, one with the length a
    # symbol for every later one (it used to be a constant guarded on its value: a capture
    # per step, up to the recompile limit)
    backend, graphs = counting_backend()
    compiled = ember.compile(windowed, backend=backend)
    mine, theirs = Window(64), Window(64)
    for step in range(8):
        x = t(2, 3 if step == 0 else 1, seed=step)
        same(compiled(x, mine), windowed(x, theirs), f"step {step}")
        assert mine.length == theirs.length
    assert len(compiled.records) == 2 and len(graphs) == 2
    assert compiled.entries[0].captured.symbolic
    # past the window the branch goes the other way: a guard on it, a capture more
    mine.window = theirs.window = 11
    x = t(2, 1, seed=9)
    same(compiled(x, mine), windowed(x, theirs), "past the window")
    assert mine.length == theirs.length == 11


def test_an_int_attribute_that_never_changes_stays_a_constant():
    backend, graphs = counting_backend()
    compiled = ember.compile(windowed, backend=backend)
    for step in range(3):
        cache, theirs = Window(64), Window(64)
        x = t(2, 3, seed=step)
        same(compiled(x, cache), windowed(x, theirs), f"call {step}")
    assert len(graphs) == 1 and not compiled.entries[0].captured.symbolic


def test_a_view_whose_storage_offset_is_a_symbol_compiles_twice(logged):
    # pieces of a split whose sizes change (torchvision RetinaNet's levels): the offset is a
    # symbol, read as x.storage_offset() (read as x.stride()[None], the guard failed on
    # every call and each call compiled again, to the recompile limit)
    def fn(x):
        return x * 2

    compiled = ember.compile(fn)
    for k in range(3, 9):
        piece = t(1, 3 * k + 5, 4, seed=k).split([2 * k, k + 5], dim=1)[1][0]
        same(compiled(piece), fn(piece))
    assert len(compiled.records) == 2
    assert any("storage_offset()" in line and "[None]" not in line
               for line in logged.messages)
