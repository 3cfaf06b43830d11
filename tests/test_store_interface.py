"""store.base.MemoryStore is the interface a second store is written against: Redis's Memory
and the in-memory store (store.in_memory.InMemoryStore) must match it call for call (names,
parameters, defaults, async or not), and every method the workers and the operations tools
call on their memory must be in it. Both stores are cut by role alike: each interface method is
defined in the module of the same name under store/redis/ and store/in_memory/."""

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


@pytest.mark.parametrize("store", [Memory, InMemoryStore])
def test_no_memory_mixin_defines_what_another_does(store):
    """Each store is one mixin per role over its base (store/redis/, store/in_memory/): a name
    defined in two of its classes would be settled by the order of its bases, silently."""
    defined: dict[str, list[str]] = {}
    for klass in store.__mro__:
        for name in vars(klass) if klass is not object else ():
            if not (name.startswith("__") and name.endswith("__")) or name == "__init__":
                defined.setdefault(name, []).append(klass.__name__)
    assert len(store.__mro__) > 10, store.__mro__
    assert {name: classes for name, classes in defined.items() if len(classes) > 1} == {}
    assert set(_members(MemoryStore)) <= set(defined)


def _role_modules(store) -> dict[str, str]:
    """Each interface method → the module (its file name in the store's package) of the class
    of `store` that defines it."""
    interface = set(_members(MemoryStore))
    return {
        name: klass.__module__.rpartition(".")[2]
        for klass in reversed(store.__mro__)
        for name in vars(klass)
        if name in interface
    }


def _misplaced(redis_store, in_memory_store) -> dict[str, tuple[str, str]]:
    """The interface methods the two stores define in modules of different names:
    method → (its module in store/redis/, in store/in_memory/)."""
    on_redis, in_memory = _role_modules(redis_store), _role_modules(in_memory_store)
    return {
        name: (on_redis.get(name, "?"), in_memory.get(name, "?"))
        for name in sorted(set(on_redis) | set(in_memory))
        if on_redis.get(name) != in_memory.get(name)
    }


def test_each_in_memory_role_module_defines_the_methods_of_its_redis_namesake():
    """store/in_memory/<role>.py defines the interface methods store/redis/<role>.py does, no
    more and no fewer (the same file names, module for module): whoever changes a rule in one
    store finds its twin in the other's module of the same name."""
    assert _misplaced(Memory, InMemoryStore) == {}
    redis_modules = {p.stem for p in (ROOT / "store" / "redis").glob("*.py")}
    in_memory_modules = {p.stem for p in (ROOT / "store" / "in_memory").glob("*.py")} - {"__init__"}
    assert len(in_memory_modules) > 10 and in_memory_modules <= redis_modules, in_memory_modules - redis_modules
    assert {klass.__module__ for klass in InMemoryStore.__mro__[1:-1]} == {
        f"store.in_memory.{name}" for name in in_memory_modules
    }, "every in-memory role module holds a mixin of InMemoryStore"


def test_a_method_in_a_module_of_another_role_is_found():
    """The check above, on an InMemoryStore whose hold_pending (the gate's) is defined in a mixin of
    store/in_memory/groups.py."""
    misplaced = type("GroupsHoldPending", (), {"hold_pending": InMemoryStore.hold_pending})
    misplaced.__module__ = "store.in_memory.groups"
    store = type("Misplaced", (misplaced, InMemoryStore), {})
    assert _misplaced(Memory, store) == {"hold_pending": ("gate", "groups")}


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


def test_every_redis_command_of_the_store_goes_to_the_server_its_key_lives_on():
    """On a Redis Cluster a tenant's keys and indexes live on its slot's shard (store.redis.topology):
    no role of the Redis store sends a command through one client for all (self.redis, which only
    a store on one server has); each goes to shard(tenant), topology.for_key(key), or each of
    topology.servers() — and a store module other than topology.py and connection.py makes no
    client of its own."""
    offenders = []
    for path in sorted((ROOT / "store" / "redis").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\bself\.redis\b", code) or (
                path.name not in ("topology.py", "connection.py") and re.search(r"\b(from_url|from_pool)\(", code)
            ):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == [], offenders
