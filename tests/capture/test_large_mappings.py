"""A large dict from outside (sys.modules, a registry of thousands of entries) read by key:
each key read is guarded alone, so a call checks a few guards and a change elsewhere in the
dict (an import) does not recompile; a change of a key that was read recompiles, and a read
of the whole dict (its length, a loop) guards all of it as before. A recompile says which
keys came rather than listing them all."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from checks import same

import ember
from ember.capture import session as capture_session

REGISTRY = {f"op{i}": i for i in range(2 * capture_session.LARGE_MAPPING)}


@pytest.fixture(autouse=True)
def on_the_cpu():
    with torch.device("cpu"):
        yield


def test_sys_modules_read_by_name_is_not_recompiled_by_an_import(recompiles):
    def fn(x):
        return x * sys.modules["math"].pi

    compiled = ember.compile(fn)
    x = torch.ones(3)
    same(compiled(x), fn(x))
    sys.modules["ember_test_imported_later"] = types.ModuleType("ember_test_imported_later")
    try:
        same(compiled(x), fn(x))
    finally:
        del sys.modules["ember_test_imported_later"]
    assert len(compiled.entries) == 1 and not recompiles.text


def test_a_registry_read_by_key_answers_as_eager_and_recompiles_only_for_its_keys(recompiles):
    registry = dict(REGISTRY)

    def fn(x, table):
        scale = table["op3"] + table.get("op5", 0) + table.get("absent", 10)
        return x * scale if "op7" in table else -x

    compiled = ember.compile(fn)
    x = torch.ones(2)
    same(compiled(x, registry), fn(x, registry))
    registry["op100"] = -1  # (a key the function does not read)
    registry["new"] = 4
    same(compiled(x, registry), fn(x, registry))
    assert len(compiled.entries) == 1 and not recompiles.text
    del registry["op7"]  # (a key it read: another version, eager's answer)
    same(compiled(x, registry), fn(x, registry))
    assert "'op7'" in recompiles.text
    registry["absent"] = 1
    same(compiled(x, registry), fn(x, registry))
    del registry["op3"]
    with pytest.raises(KeyError, match="op3"):
        compiled(x, registry)


def test_a_registry_read_whole_or_changed_inside_is_eager_s():
    def fn(x, table):
        first = table["op1"]
        table["added"] = first + 1
        return x * len(table) + sum(v for k, v in table.items() if k.startswith("op2"))

    ours, theirs = dict(REGISTRY), dict(REGISTRY)
    compiled = ember.compile(fn)
    x = torch.ones(2)
    for _ in range(2):
        same(compiled(x, ours), fn(x, theirs))
        assert ours == theirs
        ours["op2"] = theirs["op2"] = 50


def test_a_recompile_names_the_keys_that_came(recompiles):
    table = {f"k{i}": i for i in range(20)}

    def fn(x):
        return x * len(table)

    compiled = ember.compile(fn)
    compiled(torch.ones(1))
    table["fresh"] = 0
    same(compiled(torch.ones(1)), fn(torch.ones(1)))
    assert "keys() changed: added 'fresh'." in recompiles.text
