"""Named log channels (EMBER_LOGS=graph_breaks,recompiles,...) and the dump directory.

A channel is a `logging.Logger` named `ember.<channel>`; it prints to stderr when the channel is
listed in EMBER_LOGS. Warnings (a fallback to eager, a failed compile) always print.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable
from pathlib import Path

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


_dump_counter = itertools.count()


_unwritable_dumps: set[Path] = set()


def dump_folder(label: str) -> Path | None:
    """A fresh folder under EMBER_DUMP for one compiled graph, or None when dumping is off (or
    EMBER_DUMP cannot be written: said once, and compiling goes on)."""
    root = config.settings.dump_dir
    if root is None or root in _unwritable_dumps:
        return None
    folder = root / f"{next(_dump_counter):03d}_{label}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _cannot_dump(root, error)
        return None
    return folder


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
