"""ember.logs: channels print only when switched on (warnings always); the dump folder."""

import logging

from ember import config, logs


def test_channels_switch_on_by_name_or_all():
    with config.override(logs=frozenset({"kernels"})):
        assert logs.channel("kernels").isEnabledFor(logging.DEBUG)
        assert not logs.channel("perf").isEnabledFor(logging.DEBUG)
        assert logs.channel("perf").isEnabledFor(logging.WARNING)
    with config.override(logs=frozenset({"all"})):
        assert logs.enabled("guards") and logs.channel("guards").isEnabledFor(logging.DEBUG)


def test_dump_folders_are_numbered_and_off_by_default(tmp_path):
    with config.override(dump_dir=None):
        assert logs.dump_folder("graph") is None
        logs.dump(None, "x.txt", "ignored")
    with config.override(dump_dir=tmp_path):
        first, second = logs.dump_folder("graph"), logs.dump_folder("graph")
    assert first != second and first.parent == tmp_path and first.name.endswith("_graph")
    logs.dump(first, "ir.txt", "text")
    assert (first / "ir.txt").read_text() == "text"


def test_a_misspelt_channel_is_an_error_that_lists_the_channels():
    import pytest

    with pytest.raises(config.SettingError) as raised:
        config.load({"EMBER_LOGS": "recompile,kernels"})
    message = str(raised.value)
    assert "unknown channel recompile (did you mean 'recompile' -> 'recompiles'?)" in message
    assert ("the channels are graph_breaks, recompiles, guards, ir, kernels, output_code, perf, "
            "fallbacks, all, raise") in message


def test_every_channel_and_raise_is_described_in_help_and_readme():
    from pathlib import Path

    from ember.__main__ import USAGE

    described = config.describe()
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert set(config.LOG_HELP) == set(config.LOG_WORDS)
    for word, text in config.LOG_HELP.items():
        assert f"  {word:<14} {text}" in described
        assert f"| `{word}` |" in readme, word
    assert "explain" in USAGE


def test_output_code_prints_the_kernels_and_the_wrapper(caplog):
    import torch

    import ember

    def fn(x):
        return (x * 2).relu() + 1

    logging.getLogger("ember").addHandler(caplog.handler)
    try:
        with config.override(logs=frozenset({"output_code"}), backend="c"), \
                caplog.at_level(logging.INFO, logger="ember.output_code"):
            x = torch.randn(64)
            torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    finally:
        logging.getLogger("ember").removeHandler(caplog.handler)
    said = [r.getMessage() for r in caplog.records if r.name == "ember.output_code"]
    assert len(said) == 2, said
    kernels, wrapper = said
    assert kernels.startswith("fn (test_logs.py:") and ": C kernels:\n" in kernels
    assert "#include" in kernels and "int kernel0(" in kernels and "a_out0[" in kernels
    assert ": wrapper (Python that launches the kernels):\ndef call(args):" in wrapper
    assert "kernel0(in0.data_ptr(), out0.data_ptr())" in wrapper
