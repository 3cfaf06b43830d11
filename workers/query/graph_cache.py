"""The query worker's per-tenant graph: loaded from the tenant's graph log once, then kept
current by applying each change since as an edge delta (store.graph_log holds the format).
Several query-worker replicas read the same log and converge on the same matrix; none rebuilds
it per query or per document. A log that no longer holds the last change applied (trimmed past
it, or lost when Redis restarted empty) makes the graph load again."""

from __future__ import annotations

import asyncio
import logging
import math
from array import array
from collections import OrderedDict, defaultdict

import numpy as np

from store.base import GraphReads
from store.graph_log import NO_CHANGE, READ_BATCH, EdgeChange
from store.nodes import ENTITY_NODE, PASSAGE_NODE, TYPE_NODE, node_id
from workers.algorithms.ppr import SparseGraph
from workers.algorithms.retrieval import PassageStats

log = logging.getLogger(__name__)

LOAD_ATTEMPTS = 3  # loads in a row whose changes were trimmed away before one is served anyway


class GraphPassageStats(PassageStats):
    """What information density needs (PassageStats), read from the graph itself instead of a
    set of names per passage and per entity (those took ~1.4 KB a passage): a passage's entities
    are its neighbours over passage edges, an entity's document frequency a count per node kept
    as passage edges come and go."""

    def __init__(self, graph: SparseGraph):
        super().__init__(entities_of=_EntitiesOf(graph), passages_of=_PassagesOf(self))
        self.graph = graph
        self.passage_counts = np.zeros(0, dtype=np.int32)  # node index → passages linked to it

    def link(self, entity: str, passage: str, present: bool) -> None:
        """Counted only: the graph holds the edge itself."""
        index = self.graph.index[entity]
        if index >= len(self.passage_counts):
            self.passage_counts = np.concatenate(
                [
                    self.passage_counts,
                    np.zeros(max(index + 1, 2 * len(self.passage_counts)) - len(self.passage_counts), np.int32),
                ]
            )
        self.passage_counts[index] += 1 if present else -1

    def count(self, entity: str) -> int:
        index = self.graph.index.get(entity)
        return int(self.passage_counts[index]) if index is not None and index < len(self.passage_counts) else 0

    def density(self, passage: str, total_passages: int) -> float:
        """PassageStats.density over the graph's passage edges."""
        entities = self.entities_of.get(passage) or ()
        if not entities:
            return 0.5
        n = max(total_passages, 1)
        idf = sum(math.log(n / max(self.count(e), 1)) for e in entities)
        return 1.0 / (1.0 + math.exp(-idf / math.log(len(entities) + 1)))


class _EntitiesOf(dict):
    """passage node → its entity nodes (those joined to it by a passage edge), read from the graph."""

    def __init__(self, graph: SparseGraph):
        super().__init__()
        self.graph = graph

    def get(self, passage, default=None):
        index = self.graph.index.get(passage)
        if index is None:
            return default
        names = self.graph.names
        found = {
            names[i]
            for i in self.graph.neighbours(index).tolist()
            if self.graph.weight(passage, names[i], "passage") > 0
        }
        return found or default


class _PassagesOf(dict):
    """entity node → its passages; only their number is kept (`get` answers a range of that length)."""

    def __init__(self, stats: GraphPassageStats):
        super().__init__()
        self.stats = stats

    def get(self, entity, default=()):
        count = self.stats.count(entity)
        return range(count) if count else default


class TenantGraph:
    def __init__(self, tenant: str):
        self.tenant = tenant
        self.graph = SparseGraph(leaf_prefixes=(PASSAGE_NODE, TYPE_NODE))  # each joins entities alone
        self.stats = GraphPassageStats(self.graph)
        self.type_members: dict[str, set[str]] = defaultdict(set)  # type node → entity nodes
        self.cursor = NO_CHANGE  # last change-stream id applied
        self.loads = 0  # full loads from the adjacency hashes (more when the stream was trimmed past us or lost)
        self.changes_applied = 0
        self._dirty_types: set[str] = set()
        # node indexes by kind; node names only ever append, so only new ones are sorted in
        self._sorted_nodes = 0
        self._by_kind: dict[str, np.ndarray] = {ENTITY_NODE: np.zeros(0, np.int64), PASSAGE_NODE: np.zeros(0, np.int64)}
        # a load's edges (kind code, node indexes, weight), added at once by finish_loading
        self._loading = (array("b"), array("q"), array("q"), array("d"))
        self._loading_kinds: dict[str, int] = {}
        self.lock = asyncio.Lock()

    # ---- applying changes (pure) --------------------------------------------------------
    def apply(self, a: str, b: str, weight: float, kind: str) -> None:
        if kind == "type":  # entity → type: weight 1/|members|, set for the whole type in flush()
            entity, type_node = (a, b) if b.startswith(TYPE_NODE) else (b, a)
            members = self.type_members[type_node]
            if weight > 0:
                members.add(self._interned(entity))
            else:
                members.discard(entity)
                self.graph.set_edge(entity, type_node, 0.0, "type")
            self._dirty_types.add(type_node)
            return
        if not weight and not self.graph.weight(a, b, kind):
            return  # the removal of an edge never made (a value's: store.facts): no node made for it
        entity, passage = (a, b) if b.startswith(PASSAGE_NODE) else (b, a)
        linked = kind == "passage" and self.graph.weight(entity, passage, kind) > 0
        self.graph.set_edge(a, b, weight, kind)
        if kind == "passage" and linked != (weight > 0):
            self.stats.link(entity, passage, weight > 0)

    def _interned(self, name: str) -> str:
        """The graph's own string for a node's name (one copy however often it is read)."""
        index = self.graph.index.get(name)
        return name if index is None else self.graph.names[index]

    def apply_loaded(self, edges: list[EdgeChange]) -> None:
        """Edges read from the adjacency hashes into an empty graph, each edge once: `apply` for
        each, but held (node indexes, weights) until `finish_loading` adds them all at once."""
        node, kinds = self.graph.node, self._loading_kinds
        codes, first, second, weights = self._loading
        for edge in edges:
            if edge.kind == "type":
                self.apply(edge.a, edge.b, edge.weight, edge.kind)
                continue
            if not edge.weight:
                continue
            code = kinds.get(edge.kind)
            if code is None:
                code = kinds[edge.kind] = len(kinds)
            codes.append(code)
            first.append(node(edge.a))
            second.append(node(edge.b))
            weights.append(edge.weight)

    def finish_loading(self) -> None:
        codes, first, second, weights = (np.frombuffer(part, dtype=part.typecode) for part in self._loading)
        kinds = list(self._loading_kinds)
        self._loading, self._loading_kinds = (array("b"), array("q"), array("q"), array("d")), {}
        self.graph.add_new_edges(kinds, codes, first, second, weights)
        if "passage" in kinds:
            links = codes == kinds.index("passage")
            a, b = first[links], second[links]
            is_passage = np.zeros(len(self.graph), dtype=bool)
            is_passage[self.passage_index()] = True
            counts = np.bincount(np.where(is_passage[b], a, b), minlength=len(self.graph))
            counts[: len(self.stats.passage_counts)] += self.stats.passage_counts
            self.stats.passage_counts = counts.astype(np.int32)

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
            new = range(self._sorted_nodes, len(names))
            for kind, found in self._by_kind.items():
                more = np.fromiter((i for i in new if names[i].startswith(kind)), np.int64)
                self._by_kind[kind] = np.concatenate([found, more]) if len(found) else more
            self._sorted_nodes = len(names)
        return self._by_kind[prefix]

    # ---- reading the graph log --------------------------------------------------------------
    async def load(self, memory: GraphReads) -> bool:
        """Every edge the adjacency holds, then the changes since (idempotent: changes carry
        absolute weights, applied in log order). The log's head is read first, so what is
        written during a long load is applied after it. False when the changes since were
        trimmed away or the log was lost during the load: load a fresh graph again."""
        cursor = await memory.graph_log_head(self.tenant)
        nodes = await memory.adjacency_nodes(self.tenant)
        async for edges in memory.adjacency(self.tenant, nodes):
            self.apply_loaded(edges)
        self.finish_loading()
        self.flush()
        self.graph.rebuilds += 1
        self.loads += 1
        self.cursor = cursor
        return await self.catch_up(memory)

    async def catch_up(self, memory: GraphReads) -> bool:
        """Apply the changes after the cursor, READ_BATCH per read. False when the log no longer
        holds the cursor's own entry — trimmed past it, deleted (Redis restarted empty), or
        begun again with other ids — and the caller reloads. One read when nothing changed."""
        applied = False
        while True:
            changes = await memory.changes_since(self.tenant, self.cursor, READ_BATCH)
            if changes is None:
                return False
            for entry_id, change in changes:
                self.apply(change.a, change.b, change.weight, change.kind)
                self.cursor = entry_id
                self.changes_applied += 1
                applied = True
            if len(changes) < READ_BATCH:
                break
        if applied:
            self.flush()
        return True


class GraphLogOvertaken(RuntimeError):
    """Every load of a tenant's graph was overtaken by writers trimming its changes away."""


async def _load_until_whole(
    memory: GraphReads, tenant: str, attempts: int, previous: TenantGraph | None = None
) -> tuple[TenantGraph, bool]:
    """Fresh graphs loaded one after another (never into an old one: that would keep edges
    deleted since) until one is whole — every change since its load applied — or `attempts`
    ran out: the last one, and whether it is whole. Each takes over its predecessor's lock and
    its load and rebuild counts (`previous`: the graph it replaces)."""
    for attempt in range(1, attempts + 1):
        fresh = TenantGraph(tenant)
        if previous is not None:
            fresh.lock, fresh.loads, fresh.graph.rebuilds = previous.lock, previous.loads, previous.graph.rebuilds
        if await fresh.load(memory):
            return fresh, True
        log.warning(
            "graph change stream of tenant %s was trimmed or lost during its load (attempt %d of %d)",
            tenant,
            attempt,
            attempts,
        )
        previous = fresh
    return fresh, False


async def load_whole(memory: GraphReads, tenant: str, attempts: int = LOAD_ATTEMPTS) -> TenantGraph:
    """A tenant's graph loaded with every change since its load applied, for a one-off reader
    (export, benchmarks): loaded again while writers trim the changes away during the load, and
    GraphLogOvertaken after `attempts` such loads rather than a graph missing changes (the
    query worker, which must answer, serves its last load instead: GraphCache._reload)."""
    graph, whole = await _load_until_whole(memory, tenant, attempts)
    if whole:
        return graph
    raise GraphLogOvertaken(
        f"the graph of tenant {tenant} changed faster than it could be loaded "
        f"({attempts} loads overtaken by trimmed changes): try again when indexing is quieter"
    )


class GraphCache:
    """tenant → TenantGraph, each kept current on every query (one read when nothing changed).
    Holds at most `max_edges` edges over all tenants: past that, the least recently queried
    tenants are dropped and load again from Redis on their next query."""

    def __init__(self, memory: GraphReads, max_edges: int = 5_000_000):
        self.memory = memory
        self.max_edges = max_edges
        self.tenants: OrderedDict[str, TenantGraph] = OrderedDict()
        self.evictions = 0

    async def current(self, tenant: str) -> TenantGraph:
        graph = self.tenants.get(tenant)
        if graph is None:
            if not await self.memory.graph_log_exists(tenant):
                return TenantGraph(tenant)  # no graph yet: nothing to keep (and no key scan)
            graph = self.tenants[tenant] = TenantGraph(tenant)
        self.tenants.move_to_end(tenant)
        async with graph.lock:
            replaced = self.tenants.get(tenant)
            if replaced is not None and replaced.lock is graph.lock:  # reloaded while we waited
                graph = replaced
            if graph.loads == 0 or not await graph.catch_up(self.memory):
                if graph.loads:
                    log.warning(
                        "graph change stream of tenant %s no longer holds this worker's cursor "
                        "(trimmed, or Redis lost it): reloading",
                        tenant,
                    )
                graph = await self._reload(graph)
        self._evict(keep=tenant)
        return graph

    async def _reload(self, stale: TenantGraph) -> TenantGraph:
        """A fresh graph in place of `stale`, under the same lock; loads and rebuilds counted over both."""
        tenant = stale.tenant
        # not whole after the last attempt: served anyway; its next catch-up fails and it loads again
        fresh, _ = await _load_until_whole(self.memory, tenant, LOAD_ATTEMPTS, stale)
        if tenant in self.tenants:  # (not when evicted meanwhile)
            self.tenants[tenant] = fresh
        return fresh

    def _evict(self, keep: str) -> None:
        held = sum(g.graph.edges for g in self.tenants.values())
        for name in list(self.tenants):
            if held <= self.max_edges or name == keep:
                break
            held -= self.tenants.pop(name).graph.edges
            self.evictions += 1
            log.info("graph cache over %d edges: dropped tenant %s (reloads on its next query)", self.max_edges, name)
