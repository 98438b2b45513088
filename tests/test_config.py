"""ember.config: every switch declared once, read from the environment, overridable."""

from pathlib import Path

from ember import config


def test_settings_come_from_the_environment_with_defaults():
    settings = config.load({})
    assert settings.logs == frozenset() and settings.dump_dir is None
    assert settings.parallel_threshold == 32768 and not settings.disable
    assert "-ffast-math" not in settings.cflags and "-fopenmp" in settings.cflags
    custom = config.load({"EMBER_LOGS": "graph_breaks, kernels;perf", "EMBER_DISABLE": "yes",
                          "EMBER_DUMP": "/tmp/ember-dump", "EMBER_CFLAGS": "-O1 -g",
                          "EMBER_PARALLEL_THRESHOLD": "7"})
    assert custom.logs == {"graph_breaks", "kernels", "perf"} and custom.disable
    assert custom.dump_dir == Path("/tmp/ember-dump") and custom.cflags == ["-O1", "-g"]
    assert custom.parallel_threshold == 7
    assert not config.load({"EMBER_DISABLE": "off"}).disable


def test_override_is_scoped():
    before = config.settings
    with config.override(parallel_threshold=3) as settings:
        assert settings.parallel_threshold == 3 and config.settings is settings
    assert config.settings is before


def test_every_flag_is_described():
    text = config.describe()
    for flag in config.FLAGS:
        assert flag.env in text and flag.help.split()[0] in text
    assert {f.name for f in config.FLAGS} == set(config.Settings.__dataclass_fields__)
