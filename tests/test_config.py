"""ember.config: every switch declared once, read from the environment, overridable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("variable, value, allowed", [
    ("EMBER_RECOMPILE_LIMIT", "abc", "whole number >= 1"),
    ("EMBER_RECOMPILE_LIMIT", "0", "whole number >= 1"),
    ("EMBER_SHAPE_COMPILES", "-2", "whole number >= 1"),
    ("EMBER_PARALLEL_THRESHOLD", "lots", "whole number >= 0"),
    ("EMBER_BACKEND", "tritno", "c, triton, interp"),
    ("EMBER_SHAPE_PADDING", "sometimes", "auto, always, never"),
    ("EMBER_DISABLE", "maybe", "1, true, yes, on or 0, false, no, off"),
    ("EMBER_MATMUL_EPILOGUE", "2", "1, true, yes, on or 0, false, no, off"),
    ("EMBER_LOGS", "graph_break", "graph_breaks, recompiles"),
])
def test_a_bad_setting_names_the_variable_and_its_values(variable, value, allowed):
    with pytest.raises(config.SettingError) as error:
        config.load({variable: value})
    message = str(error.value)
    assert message.startswith(f"{variable}={value!r} is not a valid setting") and \
        allowed in message


@pytest.mark.parametrize("flag", ["-ffast-math", "-Ofast", "-ffinite-math-only",
                                  "-funsafe-math-optimizations", "-fno-signed-zeros",
                                  "-fassociative-math", "-freciprocal-math"])
def test_flags_that_change_eagers_results_are_refused(flag):
    with pytest.raises(config.SettingError, match=f"EMBER_CFLAGS=.*{flag}.*would change"):
        config.load({"EMBER_CFLAGS": f"-O3 {flag} -fopenmp"})
    assert config.load({"EMBER_CFLAGS": "-O2 -fno-math-errno"}).cflags == \
        ["-O2", "-fno-math-errno"]


def test_an_empty_cache_dir_is_the_default_not_the_current_directory():
    default = config.load({}).cache_dir
    assert default == Path("~/.cache/ember").expanduser()
    assert config.load({"EMBER_CACHE_DIR": ""}).cache_dir == default
    assert config.load({"EMBER_CACHE_DIR": "  "}).cache_dir == default


def test_a_near_miss_of_a_setting_is_warned_of():
    with pytest.warns(UserWarning, match="EMBER_BAKCEND is not an ember setting.*EMBER_BACKEND"):
        config.load({"EMBER_BAKCEND": "c"})


def test_import_fails_on_a_bad_setting_naming_it():
    env = dict(os.environ, PYTHONPATH=os.getcwd(), EMBER_RECOMPILE_LIMIT="abc")
    result = subprocess.run([sys.executable, "-c", "import ember"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ember.config.SettingError: EMBER_RECOMPILE_LIMIT='abc'") and \
        "whole number" in last
