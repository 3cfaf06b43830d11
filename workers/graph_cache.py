"""The query worker's per-tenant graph: loaded from the adjacency hashes once, then kept current
by tailing the tenant's graph change stream (`ms:{t}:graph:changes`) and applying each change
as an edge delta. Several query-worker replicas tail the same stream and converge on the same
matrix; none rebuilds it per query or per document."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, defaultdict

import numpy as np

from store import Memory
from store.keys import ENTITY_NODE, PASSAGE_NODE, TYPE_NODE, node_id
from workers.ppr import SparseGraph
from workers.retrieval import PassageStats

log = logging.getLogger(__name__)

LOAD_BATCH = 500  # adjacency hashes read per round trip
READ_BATCH = 10_000  # change-stream entries per XREAD


class TenantGraph:
    def __init__(self, tenant: str):
        self.tenant = tenant
        self.graph = SparseGraph()
        self.stats = PassageStats()
        self.type_members: dict[str, set[str]] = defaultdict(set)  # type node → entity nodes
        self.cursor = "0-0"  # last change-stream id applied
        self.loads = 0  # full loads from the adjacency hashes (1 unless the stream was trimmed past us)
        self.changes_applied = 0
        self._dirty_types: set[str] = set()
        # node indexes by kind; node names only ever append, so only new ones are sorted in
        self._sorted_nodes = 0
        self._by_kind: dict[str, list[int]] = {ENTITY_NODE: [], PASSAGE_NODE: []}
        self._index_arrays = {kind: np.zeros(0, dtype=np.int64) for kind in self._by_kind}
        self.lock = asyncio.Lock()

    # ---- applying changes (pure) --------------------------------------------------------
    def apply(self, a: str, b: str, weight: float, kind: str) -> None:
        if kind == "type":  # entity → type: weight 1/|members|, set for the whole type in flush()
            entity, type_node = (a, b) if b.startswith(TYPE_NODE) else (b, a)
            members = self.type_members[type_node]
            if weight > 0:
                members.add(entity)
            else:
                members.discard(entity)
                self.graph.set_edge(entity, type_node, 0.0, "type")
            self._dirty_types.add(type_node)
            return
        self.graph.set_edge(a, b, weight, kind)
        if kind == "passage":
            entity, passage = (a, b) if b.startswith(PASSAGE_NODE) else (b, a)
            self.stats.link(entity, passage, weight > 0)

    def flush(self) -> None:
        for type_node in self._dirty_types:
            members = self.type_members[type_node]
            for entity in members:
                self.graph.set_edge(entity, type_node, 1.0 / len(members), "type")
        self._dirty_types.clear()

    def type_sizes(self) -> dict[str, int]:
        return {node_id(node): len(members) for node, members in self.type_members.items()}

    def entity_index(self) -> np.ndarray:
        """Graph indexes of the entity nodes, in node order."""
        return self._nodes_of_kind(ENTITY_NODE)

    def passage_index(self) -> np.ndarray:
        """Graph indexes of the passage nodes, in node order."""
        return self._nodes_of_kind(PASSAGE_NODE)

    def _nodes_of_kind(self, prefix: str) -> np.ndarray:
        names = self.graph.names
        if self._sorted_nodes < len(names):  # per query this is only the nodes added since
            for i in range(self._sorted_nodes, len(names)):
                for kind, found in self._by_kind.items():
                    if names[i].startswith(kind):
                        found.append(i)
            self._sorted_nodes = len(names)
            self._index_arrays = {kind: np.array(found, dtype=np.int64) for kind, found in self._by_kind.items()}
        return self._index_arrays[prefix]

    # ---- reading Redis -------------------------------------------------------------------
    async def load(self, memory: Memory) -> None:
        """Everything the adjacency hashes hold, then the changes since (idempotent: changes
        carry absolute weights, applied in stream order)."""
        keys = memory.keys(self.tenant)
        last = await memory.redis.xrevrange(keys.graph_changes, count=1)
        cursor = last[0][0].decode() if last else "0-0"
        nodes = await memory.adjacency_nodes(self.tenant)
        for start in range(0, len(nodes), LOAD_BATCH):
            batch = nodes[start : start + LOAD_BATCH]
            pipe = memory.redis.pipeline(transaction=False)
            for node in batch:
                pipe.hgetall(keys.adjacency(node))
            for node, row in zip(batch, await pipe.execute()):
                for field, value in row.items():
                    kind, other = field.decode().split("|", 1)
                    if node < other:
                        self.apply(node, other, float(value), kind)
        self.flush()
        self.graph.rebuilds += 1
        self.loads += 1
        self.cursor = cursor
        await self.catch_up(memory)

    async def catch_up(self, memory: Memory) -> bool:
        """Apply the changes after the cursor; False when the stream was trimmed past the
        cursor (the caller reloads)."""
        key = memory.keys(self.tenant).graph_changes
        applied = False
        while True:
            found = await memory.redis.xread({key: self.cursor}, count=READ_BATCH)
            if not found:
                break
            entries = found[0][1]
            if not applied and self.cursor != "0-0":
                info = await memory.redis.xinfo_stream(key)
                deleted = info.get("max-deleted-entry-id", b"0-0")
                deleted = deleted.decode() if isinstance(deleted, bytes) else str(deleted)
                if _stream_id(deleted) > _stream_id(self.cursor):
                    return False
            for entry_id, change in entries:
                self.apply(change[b"a"].decode(), change[b"b"].decode(), float(change[b"w"]), change[b"kind"].decode())
                self.cursor = entry_id.decode()
                self.changes_applied += 1
            applied = True
            if len(entries) < READ_BATCH:
                break
        if applied:
            self.flush()
        return True


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class GraphCache:
    """tenant → TenantGraph, each kept current on every query (one XREAD when nothing changed).
    Holds at most `max_edges` edges over all tenants: past that, the least recently queried
    tenants are dropped and load again from Redis on their next query."""

    def __init__(self, memory: Memory, max_edges: int = 5_000_000):
        self.memory = memory
        self.max_edges = max_edges
        self.tenants: OrderedDict[str, TenantGraph] = OrderedDict()
        self.evictions = 0

    async def current(self, tenant: str) -> TenantGraph:
        graph = self.tenants.get(tenant)
        if graph is None:
            if not await self.memory.redis.exists(self.memory.keys(tenant).graph_changes):
                return TenantGraph(tenant)  # no graph yet: nothing to keep (and no key scan)
            graph = self.tenants[tenant] = TenantGraph(tenant)
        self.tenants.move_to_end(tenant)
        async with graph.lock:
            if graph.loads == 0:
                await graph.load(self.memory)
            elif not await graph.catch_up(self.memory):
                log.warning("graph change stream of tenant %s was trimmed past this worker's cursor: reloading", tenant)
                fresh = TenantGraph(tenant)
                await fresh.load(self.memory)
                fresh.loads += graph.loads
                self.tenants[tenant] = graph = fresh
        self._evict(keep=tenant)
        return graph

    def _evict(self, keep: str) -> None:
        held = sum(g.graph.edges for g in self.tenants.values())
        for name in list(self.tenants):
            if held <= self.max_edges or name == keep:
                break
            held -= self.tenants.pop(name).graph.edges
            self.evictions += 1
            log.info("graph cache over %d edges: dropped tenant %s (reloads on its next query)", self.max_edges, name)
