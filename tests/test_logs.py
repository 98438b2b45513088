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
