"""Giving up is free: a function or module whose calls all run eagerly (capture failed, or past
the recompile limit) is called directly after EAGER_CALLS_BEFORE_DIRECT such calls — same
results as eager, no more captures, guards no longer evaluated, said once on the fallbacks
channel. (What it costs per call: python -m ember.bench.overhead; tests never time.)"""

from __future__ import annotations

import torch
from capture.checks import same
from helpers import captured_log

import ember
from ember import api, config

AFTER = api.EAGER_CALLS_BEFORE_DIRECT
calls: list[int] = []


def uncapturable(x):
    calls.append(1)
    try:  # (a break inside an except block: the frame runs eagerly)
        raise ValueError
    except ValueError:
        ember.graph_break()
    return x * 2


class Uncapturable(torch.nn.Module):
    def forward(self, x):
        calls.append(1)
        try:
            raise ValueError
        except ValueError:
            ember.graph_break()
        return x.relu()


def t(*shape, seed=0):
    # (drawn on the CPU, then on the tests' device: EMBER_TEST_DEVICE=cuda sets the default)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def count_guard_calls(compiled: api.CompiledFunction) -> list[int]:
    """How often the (one) eager entry is asked from now on."""
    (entry,) = compiled.entries
    asked, call = [], entry.call
    entry.call = lambda arguments: asked.append(1) or call(arguments)
    return asked


def test_a_function_that_runs_eagerly_is_called_directly_after_a_few_calls():
    compiled = ember.compile(uncapturable)
    with captured_log("fallbacks") as records:
        same(compiled(t(3)), uncapturable(t(3)))  # captures, fails, runs eagerly
        asked = count_guard_calls(compiled)
        for seed in range(AFTER):
            same(compiled(t(3, seed=seed)), uncapturable(t(3, seed=seed)))
        assert len(asked) == AFTER and compiled.direct is not None
        del calls[:]
        for seed in range(3 * AFTER):  # (any inputs: no guard asked, no capture)
            x = t(seed % 4 + 1, seed=seed).double()
            same(compiled(x), x * 2)
        assert len(calls) == 3 * AFTER and len(asked) == AFTER
    assert len(compiled.records) == 1 and len(compiled.entries) == 1
    said = [r.getMessage() for r in records if "called directly" in r.getMessage()]
    assert len(said) == 1 and "uncapturable" in said[0] and "inside an except block" in said[0]


def test_another_grad_mode_is_captured_again_and_then_called_directly_too():
    compiled = ember.compile(uncapturable)
    for _ in range(AFTER + 1):
        compiled(t(3))
    assert compiled.direct_modes == {True}
    with torch.no_grad():
        same(compiled(t(3)), t(3) * 2)
        assert len(compiled.records) == 2  # (tried again: capture could succeed there)
        for _ in range(AFTER):
            compiled(t(3))
    assert compiled.direct_modes == {True, False} and len(compiled.records) == 2


def test_a_module_that_runs_eagerly_is_called_as_eager_calls_it():
    model = Uncapturable()
    compiled = ember.compile(model)
    for seed in range(AFTER + 1):
        same(compiled(t(4, seed=seed)), model(t(4, seed=seed)))
    assert compiled._compiled_forward.direct is not None
    seen = []
    handle = model.register_forward_hook(lambda module, args, out: seen.append(out))
    del calls[:]
    out = compiled(t(4))  # (its hooks run, as eager runs them)
    handle.remove()
    same(out, t(4).relu())
    assert len(calls) == 1 and len(seen) == 1 and seen[0] is out
    assert len(compiled._compiled_forward.records) == 1


def test_a_function_with_a_compiled_version_is_never_called_directly():
    def fn(x):  # float32 compiles; float64 runs eagerly (a raise caught inside)
        if x.dtype == torch.float64:
            try:
                raise ValueError
            except ValueError:
                pass
        return x + 1

    compiled = ember.compile(fn, backend="eager")
    compiled(t(3))
    for _ in range(2 * AFTER):
        same(compiled(t(3).double()), t(3).double() + 1)
    assert compiled.direct is None and len(compiled.entries) == 2
    same(compiled(t(3)), t(3) + 1)


def test_past_the_recompile_limit_kept_versions_serve_until_none_did_for_a_while():
    # (n: a shape; dynamic=False, or automatic dynamic would serve every n from one capture)
    compiled = ember.compile(lambda x, n: x.repeat(n), backend="eager", dynamic=False)
    x = t(2)
    with config.override(recompile_limit=2):
        for n in (1, 2, 3):  # (3: past the limit, eager)
            same(compiled(x, n), x.repeat(n))
        for n in range(4, 4 + AFTER - 1):
            compiled(x, n)
        same(compiled(x, 1), x.repeat(1))  # a kept version serves: the eager run starts again
        same(compiled(x, 20), x.repeat(20))
        assert compiled.direct is None
        for n in range(21, 21 + AFTER - 1):
            same(compiled(x, n), x.repeat(n))
    assert compiled.given_up and compiled.direct is not None and len(compiled.entries) == 2


def test_reset_forgets_that_a_function_is_called_directly():
    compiled = ember.compile(uncapturable)
    for _ in range(AFTER + 1):
        compiled(t(3))
    assert compiled.direct is not None
    ember.reset()
    assert compiled.direct is None
    same(compiled(t(3)), t(3) * 2)
    assert len(compiled.records) == 1 and len(compiled.entries) == 1  # (captured again)
