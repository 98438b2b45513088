"""Named log channels (EMBER_LOGS=graph_breaks,recompiles,...) and the dump directory.

A channel is a `logging.Logger` named `ember.<channel>`; it prints to stderr when the channel is
listed in EMBER_LOGS. Warnings (a fallback to eager, a failed compile) always print.
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from ember import config

CHANNELS = config.LOG_CHANNELS

# All channels hang under the "ember" logger, which prints to stderr and does not pass records
# on to the root logger (an application's logging setup stays untouched).
_root = logging.getLogger("ember")
if not _root.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    _root.addHandler(_handler)
    _root.propagate = False
    _root.setLevel(logging.DEBUG)


def channel(name: str) -> logging.Logger:
    """The logger of one channel: everything when EMBER_LOGS lists it, else warnings only."""
    assert name in CHANNELS, name
    logger = logging.getLogger(f"ember.{name}")
    logger.setLevel(logging.DEBUG if enabled(name) else logging.WARNING)
    return logger


def enabled(name: str) -> bool:
    return name in config.settings.logs or "all" in config.settings.logs


def show_code(label: str, what: str, text: str) -> None:
    """EMBER_LOGS=output_code: generated source (kernels, wrapper), printed whole."""
    if enabled("output_code"):
        channel("output_code").info("%s: %s:\n%s", label, what, text)


_dump_counter = itertools.count()


_unwritable_dumps: set[Path] = set()


def dump_folder(label: str) -> Path | None:
    """A fresh folder under EMBER_DUMP for one compiled graph, or None when dumping is off (or
    EMBER_DUMP cannot be written: said once, and compiling goes on)."""
    root = config.settings.dump_dir
    if root is None or root in _unwritable_dumps:
        return None
    folder = root / f"{next(_dump_counter):03d}_{folder_name(label)}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _cannot_dump(root, error)
        return None
    return folder


def folder_name(label: str) -> str:
    """A graph's label as a folder name: `forward (model.py:12)_backward` ->
    `forward_model.py-12_backward`; only letters, digits and `._-` stay."""
    text = label.replace(" (", "_").replace(":", "-").replace(")", "")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "graph"


def dump(folder: Path | None, name: str, text: str | Callable[[], str]) -> None:
    """Write `text` (or what the callable gives: an IR printed only when dumping is on) to
    `name` in `folder`; nothing when `folder` is None."""
    if folder is None:
        return
    try:
        (folder / name).write_text(text() if callable(text) else text)
    except OSError as error:
        _cannot_dump(folder, error)


def _cannot_dump(where: Path, error: OSError) -> None:
    root = config.settings.dump_dir
    if root in _unwritable_dumps:
        return
    _unwritable_dumps.add(root)
    channel("fallbacks").warning(
        "EMBER_DUMP=%s cannot be written (%s: %s): nothing more is dumped in this process; "
        "set EMBER_DUMP to a writable directory (compiling goes on)", root,
        type(error).__name__, error)


_TORCH_FOLDER = str(Path(torch.__file__).parent)
_LIBRARY_FOLDERS = (_TORCH_FOLDER, str(Path(__file__).parent))


def in_torch(filename: str) -> bool:
    """Is this code torch's own (nn.Sequential's forward), not the user's?"""
    return filename.startswith(_TORCH_FOLDER)


def in_library(filename: str) -> bool:
    """Is this code torch's or ember's own (not the user's)?"""
    return filename.startswith(_LIBRARY_FOLDERS)


def user_site() -> tuple[str, int] | None:
    """The file and line of the innermost caller outside torch and ember (where the user's
    code called into them), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if not in_library(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


def from_site() -> str:
    """` from model.py:30`: the user's line that made the call under way, or nothing."""
    site = user_site()
    return f" from {site[0]}:{site[1]}" if site is not None else ""


_ARGUMENT = re.compile(r"\bL\['(\w+)'\]")


def user_names(text: str) -> str:
    """A guard's description in the user's names: `L['x'].shape` -> `x.shape`."""
    return _ARGUMENT.sub(r"\1", text)
