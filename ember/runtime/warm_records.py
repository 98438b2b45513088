"""A warm-start record on disk: written whole beside its digest, read back only once the
digest and the versions it was made by check (warm_cache's graphs, warm_entries' function
entries). Plain data is pickled and read by an unpickler that names no class; a record that
holds tensors is torch.save's, read weights-only."""

from __future__ import annotations

import builtins
import io
import pickle
from pathlib import Path
from typing import Any

import torch

from ember.runtime import disk_cache
from ember.runtime.warm_values import NotKept


class Rejected(Exception):
    """An entry that fails its check: cut short, overwritten, made by other versions."""


def read_record(path: Path, key: str, expected: dict[str, str]) -> Any:
    """The record kept at `path` under `key`, once its digest and its versions (`expected`)
    check; FileNotFoundError when none is kept, Rejected when it fails a check."""
    try:
        data = path.read_bytes()
    except OSError:
        raise FileNotFoundError(path) from None
    try:
        recorded = path.with_suffix(".digest").read_text().strip()
    except OSError as error:
        raise Rejected(f"its digest cannot be read ({error})") from None
    if recorded != disk_cache.digest(key, data):
        raise Rejected("its contents do not match the digest written when it was kept (cut "
                       "short, overwritten, or kept under another key)")
    try:
        record = loads(data)
    except Exception as error:  # noqa: BLE001 (a digest-valid entry torch cannot read)
        raise Rejected(f"it cannot be read ({type(error).__name__}: {str(error)[:200]})") \
            from None
    if not isinstance(record, dict) or record.get("versions") != expected:
        found = record.get("versions") if isinstance(record, dict) else type(record).__name__
        raise Rejected(f"it was made by {found}, not {expected}")
    return record


def write_record(kind: str, key: str, record: dict) -> None:
    """Keep `record` (plain data, versions included) under `key`: its digest first, then the
    record, each written whole and renamed into place."""
    data = dumps(record)
    try:
        with disk_cache.building(kind, key, ".pt") as path:
            disk_cache.write_whole(path, key, data)
    except disk_cache.CacheUnusable as error:
        raise NotKept(str(error)) from None
    disk_cache.enforce_cap(keep=path)


# A record of plain data alone (lists, dicts, strings, numbers: a function's entry, most
# graphs') is pickled as it is and read back by an unpickler that refuses every class and
# function a pickle could name: torch.load's weights-only unpickler, written in Python, read
# MobileNetV3's 1.2 MB entry in 447 ms against 125 for pickle's (2026-12-04). One that
# holds tensors (a graph's constants) is written by torch.save and read weights-only.
PLAIN = b"ember plain record\n"
_PLAIN_TYPES = frozenset({complex, bytearray, slice, range, set, frozenset})


class _NotPlain(Exception):
    pass


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # (called for what is not a list, dict, tuple, set, str, bytes, int, float or None;
        # a complex is written as its type and its parts)
        if type(obj) in _PLAIN_TYPES or (type(obj) is type and obj in _PLAIN_TYPES):
            return NotImplemented
        raise _NotPlain


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = getattr(builtins, name, None) if module == "builtins" else None
        if found in _PLAIN_TYPES:
            return found
        raise pickle.UnpicklingError(f"a plain record names {module}.{name}")


def dumps(record: dict) -> bytes:
    buffer = io.BytesIO()
    try:
        buffer.write(PLAIN)
        _PlainPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(record)
    except _NotPlain:
        buffer = io.BytesIO()
        torch.save(record, buffer)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    if data.startswith(PLAIN):
        return _PlainUnpickler(io.BytesIO(data[len(PLAIN):])).load()
    return torch.load(io.BytesIO(data), weights_only=True)


def remove(path: Path) -> None:
    for stale in (path, path.with_suffix(".digest")):
        try:
            stale.unlink()
        except OSError:
            pass
