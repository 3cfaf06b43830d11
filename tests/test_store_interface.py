"""store.base.MemoryStore is the interface a second store is written against: Redis's Memory
and the in-memory store (store.in_memory.InMemoryStore) must match it call for call (names,
parameters, defaults, async or not), and every method the workers and the operations tools
call on their memory must be in it."""

import inspect
import re
from pathlib import Path
from typing import Protocol

import pytest

from store.base import MemoryStore
from store.in_memory import InMemoryStore
from store.memory import Memory

ROOT = Path(__file__).resolve().parent.parent


def _members(cls) -> list[str]:
    """Every public method of a class and its bases (MemoryStore's are in its role Protocols)."""
    own = {
        name
        for klass in cls.__mro__
        if klass is not object
        for name, value in vars(klass).items()
        if not name.startswith("_") and callable(value)
    }
    return sorted(own)


def _shape(function) -> tuple:
    parameters = [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]
    return parameters, inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


@pytest.mark.parametrize("store", [Memory, InMemoryStore])
def test_each_store_implements_every_member_of_the_interface_with_the_same_signature(store):
    for name in _members(MemoryStore):
        assert hasattr(store, name), name
        assert _shape(getattr(store, name)) == _shape(getattr(MemoryStore, name)), name


def test_no_memory_mixin_defines_what_another_does():
    """Memory is one mixin per role over RedisBase (store/redis/): a name defined in two of its
    classes would be settled by the order of its bases, silently."""
    defined: dict[str, list[str]] = {}
    for klass in Memory.__mro__:
        for name in vars(klass) if klass is not object else ():
            if not (name.startswith("__") and name.endswith("__")) or name == "__init__":
                defined.setdefault(name, []).append(klass.__name__)
    assert len(Memory.__mro__) > 10, Memory.__mro__
    assert {name: classes for name, classes in defined.items() if len(classes) > 1} == {}
    assert set(_members(MemoryStore)) <= set(defined)


def test_every_role_is_part_of_the_interface_and_no_method_is_in_two_roles():
    roles = [
        klass for klass in MemoryStore.__mro__[1:] if getattr(klass, "_is_protocol", False) and klass is not Protocol
    ]
    assert len(roles) >= 10, roles
    seen: dict[str, str] = {}
    for role in roles:
        for name in (n for n, v in vars(role).items() if not n.startswith("_") and callable(v)):
            assert name not in seen, f"{name} is in {seen[name]} and {role.__name__}"
            seen[name] = role.__name__
    assert sorted(seen) == _members(MemoryStore)
    assert not [n for n, v in vars(MemoryStore).items() if not n.startswith("_") and callable(v)], (
        "MemoryStore adds no method of its own"
    )


def test_every_memory_method_the_workers_and_ops_call_is_in_the_interface():
    called = set()
    for path in [*(ROOT / "workers").rglob("*.py"), *(ROOT / "ops").rglob("*.py")]:
        called |= set(re.findall(r"\bmemory\.([a-z_]+)\(", path.read_text()))
    assert called, "no call found: the pattern is stale"
    assert called <= set(_members(MemoryStore)), sorted(called - set(_members(MemoryStore)))
