"""store.base.MemoryStore is the interface a second store is written against: Redis's Memory
and the in-memory store (store.in_memory.InMemoryStore) must match it call for call (names,
parameters, defaults, async or not), and every method the workers and the operations tools
call on their memory must be in it."""

import inspect
import re
from pathlib import Path

import pytest

from store.base import MemoryStore
from store.in_memory import InMemoryStore
from store.memory import Memory

ROOT = Path(__file__).resolve().parent.parent


def _members(cls) -> list[str]:
    return sorted(name for name, value in vars(cls).items() if not name.startswith("_") and callable(value))


def _shape(function) -> tuple:
    parameters = [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]
    return parameters, inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


@pytest.mark.parametrize("store", [Memory, InMemoryStore])
def test_each_store_implements_every_member_of_the_interface_with_the_same_signature(store):
    for name in _members(MemoryStore):
        assert hasattr(store, name), name
        assert _shape(getattr(store, name)) == _shape(getattr(MemoryStore, name)), name


def test_every_memory_method_the_workers_and_ops_call_is_in_the_interface():
    called = set()
    for path in [*(ROOT / "workers").rglob("*.py"), *(ROOT / "ops").rglob("*.py")]:
        called |= set(re.findall(r"\bmemory\.([a-z_]+)\(", path.read_text()))
    assert called, "no call found: the pattern is stale"
    assert called <= set(_members(MemoryStore)), sorted(called - set(_members(MemoryStore)))
