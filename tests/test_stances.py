"""Stances and resets: torch.compiler.set_stance, torch.compiler.reset(), ember.set_stance and
torch._dynamo.config.error_on_recompile act on ember's compiled functions as on Dynamo's
(ember/stances.py)."""

import pytest
import torch

import ember
from ember import stances


def _counting(calls: list):
    """A function and its compiled version, whose backend's graphs append "compiled" to
    `calls` when they run (an eager run appends nothing)."""
    def backend(gm, example_inputs):
        def run(*args):
            calls.append("compiled")
            return gm.forward(*args)

        return run

    def function(x):
        return x * 2 + 1

    return function, ember.compile(function, backend=backend)


@pytest.fixture(autouse=True)
def default_stances():
    import torch._dynamo

    yield
    torch.compiler.set_stance("default")
    stances._own[0] = "default"
    torch._dynamo.config.error_on_recompile = False


def test_force_eager_runs_every_call_eagerly_and_keeps_the_compiled_version():
    calls = []
    function, compiled = _counting(calls)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), function(x))
    assert len(compiled.entries) == 1 and calls == ["compiled"]
    calls.clear()
    torch.compiler.set_stance("force_eager")
    torch.testing.assert_close(compiled(torch.randn(3, 3)).shape, torch.Size([3, 3]))
    assert calls == [] and len(compiled.entries) == 1  # (eager, nothing compiled)
    torch.compiler.set_stance("default")
    compiled(x)
    assert calls == ["compiled"] and len(compiled.entries) == 1  # (the kept version)


def test_eager_on_recompile_uses_kept_versions_and_runs_new_inputs_eagerly():
    calls = []
    function, compiled = _counting(calls)
    x = torch.randn(4)
    compiled(x)
    calls.clear()
    with torch.compiler.set_stance("eager_on_recompile"):
        y = torch.randn(2, 3)
        torch.testing.assert_close(compiled(y), y * 2 + 1)
        compiled(x)
    assert calls == ["compiled"] and len(compiled.entries) == 1  # (y ran eagerly)
    fresh = ember.compile(lambda t: t - 1)
    with torch.compiler.set_stance("eager_on_recompile"):  # (a first call: eager as well)
        torch.testing.assert_close(fresh(x), x - 1)
    assert fresh.entries == []


def test_fail_on_recompile_raises_with_the_reason():
    calls = []
    _, compiled = _counting(calls)
    compiled(torch.randn(4))
    torch.compiler.set_stance("fail_on_recompile")
    compiled(torch.randn(4))  # (a kept version serves it)
    with pytest.raises(ember.RecompileError) as raised:
        compiled(torch.randn(4, dtype=torch.float64))
    message = str(raised.value)
    assert "function" in message and "test_stances.py" in message
    assert "would recompile under the stance 'fail_on_recompile'" in message
    assert "dtype" in message and "float64" in message
    fresh = ember.compile(lambda t: t - 1)
    with pytest.raises(RuntimeError, match="first call"):  # (as Dynamo: any compile fails)
        fresh(torch.randn(2))


def test_error_on_recompile_raises_only_on_a_recompile():
    import torch._dynamo

    torch._dynamo.config.error_on_recompile = True
    calls = []
    function, compiled = _counting(calls)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), function(x))  # (the first compile is allowed)
    with pytest.raises(ember.RecompileError, match=r"Recompiling .*shape changed \(4,\) -> "
                                                   r"\(2, 2\).*error_on_recompile"):
        compiled(torch.randn(2, 2))


def test_eager_then_compile_runs_the_first_call_eagerly():
    calls = []
    _, compiled = _counting(calls)
    with torch.compiler.set_stance("eager_then_compile"):
        compiled(torch.randn(4))
        assert compiled.entries == [] and calls == []
        compiled(torch.randn(4))
        compiled(torch.randn(4))
        assert len(compiled.entries) == 1 and calls == ["compiled", "compiled"]


def test_ember_set_stance_as_function_context_manager_and_decorator():
    calls = []
    _, compiled = _counting(calls)
    x = torch.randn(4)
    compiled(x)
    calls.clear()
    ember.set_stance("force_eager")
    compiled(x)
    assert calls == [] and stances.current() == "force_eager"
    ember.set_stance("default")
    with ember.set_stance("fail_on_recompile"):
        with pytest.raises(ember.RecompileError):
            compiled(torch.randn(5))
    assert stances.current() == "default"

    @ember.set_stance("force_eager")
    def eagerly(t):
        return compiled(t)

    assert stances.current() == "default"  # (decorating sets nothing)
    eagerly(x)
    assert calls == [] and stances.current() == "default"
    compiled(x)
    assert calls == ["compiled"]


def test_embers_own_stance_takes_precedence_over_torchs():
    torch.compiler.set_stance("force_eager")
    assert stances.current() == "force_eager"
    with ember.set_stance("eager_on_recompile"):
        assert stances.current() == "eager_on_recompile"
    assert stances.current() == "force_eager"


def test_unknown_and_unsupported_stances_are_clear_errors():
    with pytest.raises(ValueError, match="unknown stance 'force-eager'; the stances are "
                                         "default, force_eager"):
        ember.set_stance("force-eager")
    with pytest.raises(ValueError, match="use that"):
        ember.set_stance("aot_eager_then_compile")
    with pytest.raises(ValueError, match="skip_guard_eval_unsafe"):
        ember.set_stance("default", skip_guard_eval_unsafe=True)
    with pytest.raises(ValueError, match="backend="):
        ember.set_stance("default", force_backend="eager")
    assert stances.current() == "default"


def test_torch_compiler_reset_forgets_embers_compiled_versions():
    import torch._dynamo

    calls = []
    _, compiled = _counting(calls)
    module = ember.compile(torch.nn.Linear(3, 3))
    x = torch.randn(4)
    compiled(x)
    module(torch.randn(2, 3))
    assert len(compiled.entries) == 1 and len(module._compiled_forward.entries) == 1
    torch.compiler.reset()
    assert compiled.entries == [] and module._compiled_forward.entries == []
    compiled(x)
    assert len(compiled.entries) == 1  # (captured again)
    torch._dynamo.reset()
    assert compiled.entries == []
    compiled(x)
    ember.reset()
    assert compiled.entries == []


def test_a_torch_compile_function_still_follows_torchs_stance():
    compiled = torch.compile(lambda t: t + 1, backend="ember")
    compiled(torch.randn(4))
    with torch.compiler.set_stance("fail_on_recompile"):
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            compiled(torch.randn(2, 2, dtype=torch.float64))


def test_torchs_stances_ember_runs_otherwise_are_said_once():
    _, compiled = _counting([])
    stances._said.clear()
    with pytest.warns(UserWarning, match="run it as 'eager_then_compile'"):
        with torch.compiler.set_stance("aot_eager_then_compile"):
            compiled(torch.randn(4))
            assert compiled.entries == []  # (its first call ran eagerly)
            compiled(torch.randn(4))
            assert len(compiled.entries) == 1
    with pytest.warns(UserWarning, match="force_backend='eager'.*keep the backend"):
        with torch.compiler.set_stance("default", force_backend="eager"):
            compiled(torch.randn(4))


@pytest.mark.parametrize("set_stance", [ember.set_stance, torch.compiler.set_stance])
def test_a_stance_set_inside_a_compiled_function_is_a_break_that_says_what_to_do(set_stance):
    def function(x):
        set_stance("default")
        return x + 1

    report = ember.explain(function)(torch.randn(3))
    (reason,) = report.break_reasons
    assert reason.reason == "the compiler's stance is set inside the compiled function"
    assert reason.hint == "set it outside the compiled function, around the call: " \
                          "with ember.set_stance(...): f(x)"
    assert reason.location.line == function.__code__.co_firstlineno + 1
    x = torch.randn(3)
    torch.testing.assert_close(ember.compile(function)(x), x + 1)
    assert stances.current() == "default"


def test_dynamos_recompile_limit_where_the_user_set_it():
    import torch._dynamo

    def fn(x):
        return x * 2

    compiled = ember.compile(fn, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in range(1, 6):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x), fn(x))
    assert len(compiled.records) == 2  # (then eager, as past any limit)
    own = ember.compile(fn, dynamic=False, recompile_limit=3)  # (ember's argument first)
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in range(1, 6):
            own(torch.randn(n))
    assert len(own.records) == 3
