"""Modules with forward hooks are inlined as nn.Module's call runs them: pre-hooks, forward,
hooks, in one graph; what the hooks change is replayed; the hook tables are guarded. Also
hooks registered by the captured code, and `with lock:` over a threading lock."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from checks import same

import ember
from ember.capture.errors import GraphRaised


@pytest.fixture(autouse=True)
def on_the_cpu():
    with torch.device("cpu"):
        yield


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return self.second(self.first(x).relu() * scale)


def block() -> Block:
    torch.manual_seed(0)
    return Block()


def one_graph(model, *args, **kwargs) -> None:
    report = ember.explain(model)(*args, **kwargs)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons


def test_a_pre_hook_that_replaces_the_input():
    model = block()
    model.first.register_forward_pre_hook(lambda module, args: args[0] * 2)  # (not a tuple)
    model.second.register_forward_pre_hook(lambda module, args: (args[0] - 1,))
    one_graph(model, t(2, 4))
    same(ember.compile(model)(t(2, 4)), model(t(2, 4)))


def test_a_hook_that_replaces_the_output_and_one_that_returns_none():
    model = block()
    model.first.register_forward_hook(lambda module, args, output: output.tanh() + args[0])
    model.first.register_forward_hook(lambda module, args, output: None)
    model.second.register_forward_hook(lambda module, args, output: output * 3)
    one_graph(model, t(2, 4))
    same(ember.compile(model)(t(2, 4)), model(t(2, 4)))


def test_hooks_that_record_outputs_in_a_list_and_a_dict_from_outside():
    model = block()
    seen: list = []
    by_name: dict = {}

    def record(name):
        def hook(module, args, output):
            seen.append(output)
            by_name.setdefault(name, []).append(output.sum())
        return hook

    model.first.register_forward_hook(record("first"))
    model.second.register_forward_hook(record("second"))
    one_graph(model, t(2, 4))
    compiled = ember.compile(model)
    for seed in (0, 1):
        seen.clear()
        by_name.clear()
        expected = model(t(2, 4, seed=seed))
        expected_seen, expected_by_name = list(seen), copy.copy(by_name)
        seen.clear()
        by_name.clear()
        same(compiled(t(2, 4, seed=seed)), expected)
        same(seen, expected_seen)
        same(by_name, expected_by_name)
    assert len(compiled._compiled_forward.entries) == 1


def test_hooks_with_kwargs_see_and_replace_the_keywords():
    model = block()

    def pre(module, args, kwargs):
        return (args[0] + 1,), {**kwargs, "scale": kwargs.get("scale", 1.0) * 2}

    def post(module, args, kwargs, output):
        return output * kwargs["scale"]

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)
    wrapper = torch.nn.Sequential(model)  # (called from captured code: the hooks inlined)
    wrapped_call = ember.compile(lambda x: model(x, scale=3.0).sum(-1))
    one_graph(wrapper, t(2, 4))
    same(ember.compile(wrapper)(t(2, 4)), wrapper(t(2, 4)))
    same(wrapped_call(t(2, 4)), model(t(2, 4), scale=3.0).sum(-1))


def test_hooks_prepended_and_always_called_run_in_eager_s_order():
    model = block()
    order: list = []
    model.first.register_forward_hook(lambda m, a, o: order.append("a") or o + 1)
    model.first.register_forward_hook(lambda m, a, o: order.append("b") or o * 2,
                                      prepend=True)
    model.first.register_forward_hook(lambda m, a, o: order.append("c") or o - 3,
                                      always_call=True)
    wrapper = torch.nn.Sequential(model)
    expected = wrapper(t(2, 4))
    expected_order = list(order)
    order.clear()
    same(ember.compile(wrapper)(t(2, 4)), expected)
    assert order == expected_order == ["b", "a", "c"]


def test_global_module_hooks_are_inlined_around_every_module():
    wrapper = torch.nn.Sequential(block())
    calls: list = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: calls.append(type(module).__name__) or output + 0.5)
    try:
        expected = wrapper(t(2, 4))
        expected_calls = list(calls)
        calls.clear()
        same(ember.compile(wrapper)(t(2, 4)), expected)
        assert calls == expected_calls == ["Linear", "Linear", "Block", "Sequential"]
    finally:
        handle.remove()


def test_removing_or_adding_a_hook_recompiles_with_the_reason(recompiles):
    model = block()
    handle = model.first.register_forward_hook(lambda module, args, output: output * 10)
    compiled = ember.compile(model)
    same(compiled(t(2, 4)), model(t(2, 4)))
    handle.remove()
    same(compiled(t(2, 4)), model(t(2, 4)))
    assert "a hook was added to, or removed from, a module" in recompiles.text
    model.first.register_forward_pre_hook(lambda module, args: (args[0] * 0,))
    same(compiled(t(2, 4)), model(t(2, 4)))
    model.second.register_forward_hook(lambda module, args, output: output + 7)
    same(compiled(t(2, 4)), model(t(2, 4)))
    assert len(compiled._compiled_forward.entries) == 4
    assert compiled._compiled_forward.records[-1].graphs == 1


def test_a_hook_registered_by_the_compiled_code_runs_in_its_graph_and_stays():
    # (transformers installs its output-recording hooks on the first call that asks for
    # hidden states: registered when the effects replay, traced in the same graph)
    def install(model, log):
        if not getattr(model, "installed", False):
            for name, child in model.named_children():
                def hook(module, args, output, name=name):
                    log.append((name, output.shape))
                child.register_forward_hook(hook)
            model.installed = True

    def run(model, x, log):
        install(model, log)
        return model(x)

    model, log = block(), []
    reference, reference_log = copy.deepcopy(model), []
    report = ember.explain(run)(copy.deepcopy(model), t(2, 4), [])
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    compiled = ember.compile(run)
    for seed in (0, 1):
        same(compiled(model, t(2, 4, seed=seed), log),
             run(reference, t(2, 4, seed=seed), reference_log))
        assert log == reference_log and len(log) == 2 * (seed + 1)
        assert [len(m._forward_hooks) for m in (model.first, model.second)] == [1, 1]


def test_a_backward_hook_keeps_the_module_apart():
    # (backward hooks wrap the forward's inputs and outputs in torch's autograd functions:
    # the module is compiled on its own, its hooks run around it as eager runs them)
    model = block()
    model.second.register_full_backward_hook(lambda module, grad_in, grad_out:
                                             (grad_in[0] * 10,))
    report = ember.explain(model)(t(2, 4))
    assert report.graph_break_count == 1 and "backward hooks" in str(report.break_reasons[0])


@pytest.mark.parametrize("make_lock", [threading.Lock, threading.RLock],
                         ids=["lock", "rlock"])
def test_a_with_lock_block_is_captured_and_its_effects_replayed_under_the_lock(make_lock):
    lock = make_lock()
    seen: list = []

    def fn(x):
        with lock:
            y = x.sin()
        with lock:
            seen.append(y.sum())
        return y * 2

    report = ember.explain(fn)(t(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    seen.clear()
    compiled = ember.compile(fn)
    for seed in (0, 1):
        same(compiled(t(3, seed=seed)), fn(t(3, seed=seed)))
    same(seen, [t(3).sin().sum()] * 2 + [t(3, seed=1).sin().sum()] * 2)
    assert not lock._is_owned() if hasattr(lock, "_is_owned") else not lock.locked()
    # (the replay takes the lock around the block that changed something, and only there)
    captured = compiled.entries[0].captured
    called = [getattr(value, "__name__", "") for name, value in captured.runner_namespace.items()
              if f"{name}(" in captured.runner_source and value is not GraphRaised]
    assert called == ["acquire", "append", "release"]


def test_functions_made_inside_with_closures_outlive_the_call():
    # (what a hook registered by the captured code is: rebuilt after the graph with cells
    # holding what its frame left there, one per cell, shared as they were)
    def fn(x, scale):
        total = x.sum()

        def get():
            return total * scale

        def bump(amount):
            nonlocal total
            total = total + amount
            return total

        return get, bump

    report = ember.explain(fn)(t(3), 2.0)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    get, bump = ember.compile(fn)(t(3), 2.0)
    expected_get, expected_bump = fn(t(3), 2.0)
    same(get(), expected_get())
    same(bump(1.0), expected_bump(1.0))
    same(get(), expected_get())  # (the two share their cell, as eager's do)


def test_the_handle_of_a_hook_registered_inside_is_the_real_one():
    # (stored in a list from outside, and returned: each the replayed registration's)
    def install(model, x, handles, log):
        handles.append(model.first.register_forward_hook(
            lambda module, args, output: log.append(output.sum())))
        handle = model.second.register_forward_pre_hook(lambda module, args: (args[0] * 2,),
                                                        prepend=True)
        return model(x), handle

    model, handles, log = block(), [], []
    reference, reference_log = copy.deepcopy(model), []
    report = ember.explain(install)(copy.deepcopy(model), t(2, 4), [], [])
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    result, returned = ember.compile(install)(model, t(2, 4), handles, log)
    expected, _ = install(reference, t(2, 4), [], reference_log)
    same(result, expected)
    same(log, reference_log)
    assert [type(h).__name__ for h in (*handles, returned)] == ["RemovableHandle"] * 2
    assert list(model.first._forward_hooks) == [handles[0].id]
    assert list(model.second._forward_pre_hooks) == [returned.id]
    handles[0].remove()
    returned.remove()
    assert not model.first._forward_hooks and not model.second._forward_pre_hooks


def test_a_module_called_in_a_loop_is_guarded_once_and_a_later_hook_still_reaches_it():
    # (the plain-modules guard walks its list on every call where any hook was made since the
    # capture: a decoding loop unrolled eight times listed each module eight times)
    from torch.utils.hooks import RemovableHandle

    layer = torch.nn.Linear(4, 4)

    def steps(x):
        for _ in range(8):
            x = layer(x).tanh()
        return x

    compiled = ember.compile(steps)
    same(compiled(t(2, 4)), steps(t(2, 4)))
    entry = compiled.entries[0]
    listed = [value for value in entry.call.__globals__["K"]
              if isinstance(value, list) and value and value[0] is layer]
    assert len(listed) == 1 and len(listed[0]) == 1
    made = RemovableHandle.next_id
    layer.register_forward_hook(lambda module, args, output: output * 2)
    assert RemovableHandle.next_id == made + 1
    same(compiled(t(2, 4)), steps(t(2, 4)))
    assert len(compiled.entries) == 2
