"""torch.compile's arguments on ember.compile (ember/options.py): mode and options, disable,
and ember's own recompile_limit and name; and torch.compile(backend="ember", mode=...,
options=...)."""

import logging

import pytest
import torch
from helpers import DEVICE

import ember


def _double_relu(x):
    return torch.relu(x) * 2


def test_disable_gives_the_model_itself():
    assert ember.compile(_double_relu, disable=True) is _double_relu
    model = torch.nn.Linear(2, 2)
    assert ember.compile(model, disable=True) is model
    assert ember.compile(disable=True)(_double_relu) is _double_relu


def test_options_ember_knows_apply_to_that_function_only():
    x = torch.randn(6, device=DEVICE)
    interpreted = ember.compile(_double_relu, options={"backend": "interp"})
    torch.testing.assert_close(interpreted(x), _double_relu(x))
    assert type(interpreted.records[0].compiled).__name__ == "InterpretedGraph"
    compiled = ember.compile(_double_relu)
    compiled(x)
    assert type(compiled.records[0].compiled).__name__ == "CompiledGraph"


def test_options_ember_does_not_know_are_named_in_one_warning():
    with pytest.warns(UserWarning, match="coordinate_descent_tuning, max_fusion_size"):
        compiled = ember.compile(_double_relu, options={"max_fusion_size": 8,
                                                        "coordinate_descent_tuning": True,
                                                        "epilogue_fusion": False})
    x = torch.randn(5, device=DEVICE)
    torch.testing.assert_close(compiled(x), _double_relu(x))


def test_bad_options_are_refused_with_the_option_named():
    with pytest.raises(ValueError, match="parallel_threshold=-3"):
        ember.compile(_double_relu, options={"parallel_threshold": -3})
    with pytest.raises(RuntimeError, match="either mode or options"):
        ember.compile(_double_relu, mode="reduce-overhead", options={"epilogue_fusion": True})
    with pytest.raises(ValueError, match="recompile_limit"):
        ember.compile(_double_relu, recompile_limit=0)


def test_recompile_limit_and_name_are_the_functions_own(caplog):
    compiled = ember.compile(_double_relu, recompile_limit=2, name="double_relu",
                             dynamic=False)
    with caplog.at_level(logging.WARNING, logger="ember.recompiles"):
        for size in range(2, 7):
            x = torch.randn(size, device=DEVICE)
            torch.testing.assert_close(compiled(x), _double_relu(x))
    assert len(compiled.entries) == 2 and compiled.given_up
    assert compiled.where.startswith("double_relu (")
    said = [r.getMessage() for r in caplog.records if r.name == "ember.recompiles"]
    assert len(said) == 1 and "double_relu" in said[0] and "recompile limit" in said[0]


def test_list_mode_options_as_inductor_lists_them():
    modes = ember.list_mode_options()
    assert modes["reduce-overhead"] == {"triton.cudagraphs": True}
    assert ember.list_mode_options("max-autotune")["triton.cudagraphs"] is True
    with pytest.raises(ValueError, match="unknown mode"):
        ember.list_mode_options("fastest")


@pytest.mark.parametrize("how", [dict(mode="reduce-overhead"), dict(mode="max-autotune"),
                                 dict(options={"epilogue_fusion": False})])
def test_torch_compile_hands_its_mode_and_options_to_ember(how):
    compiled = torch.compile(_double_relu, backend="ember", **how)
    for _ in range(3):  # (a CUDA graph records on the first call and replays after)
        x = torch.randn(7, device=DEVICE)
        torch.testing.assert_close(compiled(x), _double_relu(x))
