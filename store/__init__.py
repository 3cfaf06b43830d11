"""The memory: its interface (store.base.MemoryStore), Redis's implementation (store.memory.Memory)
and the in-memory one (store.in_memory.InMemoryStore); the layers, graph, vector indexes,
progress and idempotency marks.

`Memory` is imported on first use (PEP 562), so `import store.in_memory` loads neither redis nor
redisvl: the tests of the stages' logic run without the Redis client."""

from typing import TYPE_CHECKING

from store.graph_log import EdgeChange
from store.keys import LAYERS, TenantKeys
from store.records import AlreadyDone, CauseNotInMemory, Committed, DocumentStatus, Hit, Outgoing, StaleDecision

if TYPE_CHECKING:
    from store.memory import Memory

__all__ = [
    "LAYERS",
    "AlreadyDone",
    "CauseNotInMemory",
    "Committed",
    "DocumentStatus",
    "EdgeChange",
    "Hit",
    "Memory",
    "Outgoing",
    "StaleDecision",
    "TenantKeys",
]


def __getattr__(name: str):
    if name == "Memory":
        from store.memory import Memory

        return Memory
    raise AttributeError(f"module 'store' has no attribute {name!r}")


if TYPE_CHECKING:
    # mypy checks both stores against every role's signatures here (the suite's
    # tests/test_store_interface.py checks the names and parameters at run time).
    from store.base import MemoryStore
    from store.in_memory import InMemoryStore

    _redis_store: type[MemoryStore] = Memory
    _in_process_store: type[MemoryStore] = InMemoryStore
