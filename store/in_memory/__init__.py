"""The memory in this process: a second implementation of store.base.MemoryStore, held in
Python dicts and sets, for tests of the stages' logic that need no Redis.

It mirrors store.memory.Memory write for write — the same statuses, counts, graph versions,
node names, edge weights, change log, done marks and outboxes, so the same messages give the
same export and the same events (tests/test_store_in_memory.py runs them on both stores). One
asyncio loop and no threads: a method runs to its end between two awaits, so each of Memory's
Lua scripts is one plain method here, and `commit_once` checks and applies with no await in
between, which is what WATCH … EXEC gives Memory. Records hold what Redis hands back: field
values as strings (numbers written as redis-py writes them, with repr), vectors as float16
bytes. What only Redis has — key TTLs, lost indexes after a restart, the legacy node scan —
has no counterpart here; each place says so in one line.

Cut by role as store/redis/ is, file for file: a role's rules live in the module of the same
name on each side (store/redis/gate.py's _HOLD_PENDING and store/in_memory/gate.py's
hold_pending), each mixin defines the interface methods its Redis namesake does
(tests/test_store_interface.py checks it), and a method restating a script or a transaction
names it. base.py holds what every role shares (InMemoryBase, as RedisBase); GraphOps, StandingOps
and SearchOps derive from LayersOps and TenantsOps from ExportOps, the role each reads through;
every other mixin from InMemoryBase alone. Importing this package loads neither redis nor
redisvl."""

from __future__ import annotations

from store.in_memory.aliases import AliasesOps
from store.in_memory.base import InMemoryBase, StagedWrites
from store.in_memory.episodes import EpisodesOps
from store.in_memory.erasing import ErasingOps
from store.in_memory.expiry import ExpiryOps
from store.in_memory.export import ExportOps
from store.in_memory.gate import GateOps
from store.in_memory.graph import GraphOps
from store.in_memory.groups import GroupsOps
from store.in_memory.layers import LayersOps
from store.in_memory.lexical_index import LexicalIndexOps
from store.in_memory.outbox import OutboxOps
from store.in_memory.progress import ProgressOps
from store.in_memory.search import SearchOps
from store.in_memory.standing import StandingOps
from store.in_memory.tenants import TenantsOps
from store.in_memory.vector_index import VectorIndexOps
from store.in_memory.versions import VersionsOps

__all__ = ["InMemoryStore", "StagedWrites"]


class InMemoryStore(
    OutboxOps,
    ProgressOps,
    VersionsOps,
    ErasingOps,
    StandingOps,
    GraphOps,
    SearchOps,
    LayersOps,
    LexicalIndexOps,
    VectorIndexOps,
    EpisodesOps,
    AliasesOps,
    GateOps,
    GroupsOps,
    ExpiryOps,
    TenantsOps,
    ExportOps,
    InMemoryBase,
):
    """Every role of store.base.MemoryStore in process: the mixins above, each method defined in
    one of them only (tests/test_store_interface.py checks it), composed over InMemoryBase."""
