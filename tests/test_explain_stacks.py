"""ember.explain gives each break's user stack (the caller's line, then the helper's), and
`python -m ember explain file.py:function` prints the same report (ember/explain_command.py);
the recompile-limit warning names the user's function and line."""

import logging
from pathlib import Path

import torch

import ember
from ember import config


def helper(y):
    z = y.sin()
    print("a graph break")
    return z * 2


def forward(x):
    a = x + 1
    b = helper(a)
    return b.cos()


FORWARD = forward.__code__.co_firstlineno
HELPER = helper.__code__.co_firstlineno
HERE = Path(__file__).name


def test_a_break_in_a_helper_has_the_callers_line_and_the_helpers():
    report = ember.explain(forward)(torch.randn(4))
    assert (report.graph_count, report.graph_break_count) == (4, 2)
    first, second = report.break_reasons
    assert [(Path(p.filename).name, p.line, p.function) for p in first.user_stack] == [
        (HERE, FORWARD + 2, "forward"), (HERE, HELPER + 2, "helper")]
    assert [str(p) for p in second.user_stack] == [str(p) for p in first.user_stack]
    text = str(report)
    assert (f"Break reasons:\n"
            f"  1. print() inside the compiled function\n"
            f"       {HERE}:{FORWARD + 2} in forward: b = helper(a)\n"
            f"       {HERE}:{HELPER + 2} in helper: print(\"a graph break\")\n"
            f"     hint: print outside, or accept that this function runs eagerly\n"
            f"  2. the same as 1, met again where helper is compiled on its own\n") in text


def test_a_break_in_the_function_itself_has_one_line():
    def direct(x):
        x = x * 2
        print("here")
        return x

    report = ember.explain(direct)(torch.randn(3))
    (reason,) = report.break_reasons
    assert [(p.line, p.function) for p in reason.user_stack] == [
        (direct.__code__.co_firstlineno + 2, "test_a_break_in_the_function_itself_has_one_line"
         ".<locals>.direct")]


def test_the_command_line_prints_the_same_report(capsys):
    from ember.__main__ import main

    assert main(["explain", f"{__file__}:forward", "torch.randn(4)"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ember.explain of forward in {__file__}\n")
    assert "Graph count: 4\nGraph break count: 2\n" in out
    assert f"       {HERE}:{FORWARD + 2} in forward: b = helper(a)\n" \
           f"       {HERE}:{HELPER + 2} in helper: print(\"a graph break\")\n" in out


def test_the_command_line_says_what_to_change(capsys):
    from ember.__main__ import main

    assert main(["explain", f"{__file__}:forward"]) == 2
    assert "forward takes x: give them as a Python expression" in capsys.readouterr().err
    assert main(["explain", f"{__file__}:nothing"]) == 2
    err = capsys.readouterr().err
    assert "has no 'nothing' (its functions and modules: " in err and "forward, helper" in err
    assert main(["explain", f"{__file__}:forward", "torch.randn("]) == 2
    assert "the arguments 'torch.randn(' raised SyntaxError" in capsys.readouterr().err
    assert main(["explain", "no_such_file.py:f"]) == 2
    assert "no such file: no_such_file.py" in capsys.readouterr().err


def test_the_recompile_limit_warning_is_a_plain_sentence_naming_the_users_lines(caplog):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    compiled = ember.compile(model, recompile_limit=1, dynamic=False, backend="eager")
    compiled_line = test_the_recompile_limit_warning_is_a_plain_sentence_naming_the_users_lines \
        .__code__.co_firstlineno + 2
    logging.getLogger("ember").addHandler(caplog.handler)
    try:
        with config.override(logs=frozenset()), caplog.at_level(logging.WARNING, "ember"):
            compiled(torch.randn(2, 4))
            compiled(torch.randn(3, 4)); call_line = _line()  # noqa: E702
            compiled(torch.randn(5, 4))
    finally:
        logging.getLogger("ember").removeHandler(caplog.handler)
    said = [r.getMessage() for r in caplog.records if r.name == "ember.recompiles"]
    assert said == [
        f"Sequential.forward (torch's code, compiled at {__file__}:{compiled_line}) has reached "
        f"its recompile limit of 1 compiled version, so from now on a call that none of them "
        f"accepts runs eagerly. The call from {__file__}:{call_line} needed a new version "
        f"because input.shape[0] changed 2 -> 3. To keep more versions, pass "
        f"ember.compile(..., recompile_limit=N) or set EMBER_RECOMPILE_LIMIT; to compile one "
        f"version for every size, mark the changing dimension with ember.mark_dynamic."]


def _line():
    import sys

    return sys._getframe(1).f_lineno


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        print("inside the block")
        return y.relu()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x * 2) + 1


def test_a_break_inside_a_submodule_is_listed_under_the_models_line():
    net, x = Net(), torch.randn(2, 4)
    report = ember.explain(net)(x)
    first, second = report.break_reasons
    net_line = Net.forward.__code__.co_firstlineno + 1
    block_line = Block.forward.__code__.co_firstlineno + 2
    assert [(p.line, p.function) for p in first.user_stack] == [
        (net_line, "Net.forward"), (block_line, "forward")]
    assert [p.line for p in second.user_stack] == [net_line, block_line]
    assert "  2. the same as 1, met again where Block.forward is compiled on its own\n" \
        in str(report)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(net)(x), net(x))


def test_the_graph_breaks_channel_names_the_callers_lines(caplog):
    logging.getLogger("ember").addHandler(caplog.handler)
    try:
        with config.override(logs=frozenset({"graph_breaks"})), \
                caplog.at_level(logging.INFO, "ember"):
            x = torch.randn(4)
            torch.testing.assert_close(ember.compile(forward)(x), forward(x))
    finally:
        logging.getLogger("ember").removeHandler(caplog.handler)
    said = [r.getMessage() for r in caplog.records if r.name == "ember.graph_breaks"]
    line = (f"graph break at {__file__}:{HELPER + 2} in helper, called from {__file__}:"
            f"{FORWARD + 2} in forward: print() inside the compiled function")
    assert said == [line, line]  # (in forward's capture, then in helper's own)
