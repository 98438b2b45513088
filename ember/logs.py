"""Named log channels (EMBER_LOGS=graph_breaks,recompiles,...) and the dump directory.

A channel is a `logging.Logger` named `ember.<channel>`; it prints to stderr when the channel is
listed in EMBER_LOGS. Warnings (a fallback to eager, a failed compile) always print.
"""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path

from ember import config

CHANNELS = ("graph_breaks", "recompiles", "guards", "ir", "kernels", "perf", "fallbacks")

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("[ember.%(channel)s] %(message)s"))


class _ChannelFilter(logging.Filter):
    def __init__(self, channel: str):
        super().__init__()
        self.channel = channel

    def filter(self, record: logging.LogRecord) -> bool:
        record.channel = self.channel
        return True


def channel(name: str) -> logging.Logger:
    assert name in CHANNELS, name
    logger = logging.getLogger(f"ember.{name}")
    if not logger.handlers:
        logger.addHandler(_handler)
        logger.addFilter(_ChannelFilter(name))
        logger.propagate = False
    enabled = name in config.settings.logs or "all" in config.settings.logs
    logger.setLevel(logging.DEBUG if enabled else logging.WARNING)
    return logger


def enabled(name: str) -> bool:
    return name in config.settings.logs or "all" in config.settings.logs


_dump_counter = itertools.count()


def dump_folder(label: str) -> Path | None:
    """A fresh folder under EMBER_DUMP for one compiled graph, or None when dumping is off."""
    root = config.settings.dump_dir
    if root is None:
        return None
    folder = root / f"{next(_dump_counter):03d}_{label}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def dump(folder: Path | None, name: str, text: str) -> None:
    if folder is not None:
        (folder / name).write_text(text)
