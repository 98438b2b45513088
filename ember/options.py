"""torch.compile's `mode=` and `options=` for ember, and ember's own settings per function.

    ember.compile(fn, options={"matmul_epilogue": False})   # an ember setting, this fn only
    ember.compile(fn, options={"triton.cudagraphs": True})  # Inductor's name for a mode's part
    ember.list_mode_options()                               # what each mode turns on

An option is one of ember's settings (the fields of `config.Settings`, named as there: the
EMBER_* variables without the prefix, in lower case) or one of Inductor's options that ember
has an equivalent of (INDUCTOR_EQUIVALENTS). Options ember does not know are reported in one
warning, naming them, and ignored — code written for torch.compile keeps running.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from ember import config

# Inductor option -> ember's setting (None: a part of a mode, handled by the mode)
INDUCTOR_EQUIVALENTS: dict[str, str | None] = {
    "triton.cudagraphs": None,        # CUDA graphs: mode="reduce-overhead"
    "epilogue_fusion": "matmul_epilogue",
    "shape_padding": "shape_padding",
}

_MODE_OPTIONS = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True},
}

# The modes that tune kernels (config.Settings.max_autotune; see ember/tuning.py)
TUNING_MODES = ("max-autotune", "max-autotune-no-cudagraphs")

# Settings that only the process as a whole can have (read at import or per process), and
# those read on every call rather than while compiling (recompile_limit is an argument).
_PROCESS_WIDE = {"logs", "dump_dir", "cache_dir", "disable", "triton_workers",
                 "triton_file_key", "recompile_limit", "shape_compiles"}


def list_mode_options(mode: str | None = None) -> dict[str, Any]:
    """The options each mode stands for (as torch._inductor.list_mode_options)."""
    if mode is None:
        return {name: dict(options) for name, options in _MODE_OPTIONS.items()}
    if mode not in _MODE_OPTIONS:
        raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(_MODE_OPTIONS)}")
    return dict(_MODE_OPTIONS[mode])


@dataclasses.dataclass(frozen=True)
class Resolved:
    settings: dict[str, Any]   # config.Settings fields to override while compiling
    cuda_graphs: bool          # options asked for CUDA graphs (as mode="reduce-overhead")


def resolve(options: dict[str, Any] | None) -> Resolved:
    """ember's settings for `options`; unknown ones said in one warning."""
    if not options:
        return Resolved({}, False)
    if not isinstance(options, dict):
        raise TypeError(f"ember.compile: options must be a dict, got {type(options).__name__}")
    fields = {field.name: field for field in dataclasses.fields(config.Settings)}
    settings: dict[str, Any] = {}
    cuda_graphs = False
    unknown = []
    for key, value in options.items():
        name = INDUCTOR_EQUIVALENTS.get(key, key) if key in INDUCTOR_EQUIVALENTS else key
        if key == "triton.cudagraphs":
            cuda_graphs = bool(value)
        elif name in fields and name not in _PROCESS_WIDE:
            try:
                settings[name] = _checked(name, value)
            except ValueError as error:
                raise ValueError(f"ember.compile: option {key}={value!r}: {error}") from None
        else:
            unknown.append(key)
    if unknown:
        known = sorted((set(fields) - _PROCESS_WIDE) | set(INDUCTOR_EQUIVALENTS))
        warnings.warn(f"ember.compile ignores options it does not know: "
                      f"{', '.join(sorted(map(str, unknown)))} (it knows: {', '.join(known)})",
                      stacklevel=3)
    return Resolved(settings, cuda_graphs)


def _checked(name: str, value: Any) -> Any:
    """`value` for setting `name`, validated as its EMBER_* variable's text would be."""
    flag = next(flag for flag in config.FLAGS if flag.name == name)
    current = getattr(config.settings, name)
    if isinstance(value, bool):
        text = "1" if value else "0"
    elif isinstance(value, (list, tuple)):
        text = " ".join(map(str, value))
    else:
        text = str(value)
    if not isinstance(value, (str, list, tuple)) and isinstance(current, bool) != \
            isinstance(value, bool):
        raise TypeError(f"ember.compile: option {name!r} takes a {type(current).__name__} "
                        f"(or the text {flag.env} takes), got {value!r}")
    return flag.parse(text)
