"""The graph in process (store.base.GraphWrites and GraphReads), as store/redis/graph.py:
undirected weighted edges on both their ends (a fact's edge weighs the facts between its nodes:
store.graph_log's LINK_FACT and UNLINK_FACT there), each change in the tenant's graph log, the
graph version, and the reads of the query worker's graph cache."""

from __future__ import annotations

from typing import AsyncIterator

import numpy as np

from store.graph_log import GRAPH_CHANGES_MAXLEN, LOAD_BATCH, NO_CHANGE, READ_BATCH, EdgeChange, adjacency_field
from store.in_memory.base import _stored, _Tenant
from store.in_memory.layers import LayersOps
from store.nodes import type_node


class GraphOps(LayersOps):
    """store.base.GraphWrites and GraphReads in process (store.redis.graph.GraphOps on Redis);
    over LayersOps, the passages' entities a similarity bridge reads."""

    async def bump_graph_version(self, tenant: str) -> int:
        t = self._tenant(tenant)
        t.graph_version += 1
        return t.graph_version

    async def graph_version(self, tenant: str) -> int:
        return self._tenant(tenant).graph_version

    def _log(self, tenant: str, version: int, change: EdgeChange) -> None:
        """Append to the graph log; past GRAPH_CHANGES_MAXLEN the oldest go (exactly here, in whole
        macro nodes in Redis: `MAXLEN ~`)."""
        t = self._tenant(tenant)
        t.changes_added += 1
        t.changes.append((f"{t.changes_added}-0", version, change))
        del t.changes[:-GRAPH_CHANGES_MAXLEN]

    def _set_weight(self, tenant: str, a: str, b: str, weight: float, kind: str) -> None:
        """An undirected edge on both of its ends (weight 0: gone)."""
        adjacency = self._tenant(tenant).adjacency
        for one, other in ((a, b), (b, a)):
            if weight:
                adjacency[one][adjacency_field(kind, other)] = weight
            else:
                adjacency[one].pop(adjacency_field(kind, other), None)

    def _link_fact(self, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str, linked: bool) -> None:
        """store.graph_log's LINK_FACT / UNLINK_FACT (store/redis/graph.py runs them): the edge's weight
        is the number of facts between the two."""
        between = self._set(tenant, "edge_facts", "|".join(sorted((head_node, tail_node))))
        between.add(fact_id) if linked else between.discard(fact_id)
        self._set_weight(tenant, head_node, tail_node, float(len(between)), "fact")
        self._log(tenant, version, EdgeChange(head_node, tail_node, float(len(between)), "fact"))
        if linked:
            self._set(tenant, "graph_nodes").update((head_node, tail_node))

    def stage_fact_edge(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        self._stage(pipe, lambda: self._link_fact(tenant, version, head_node, tail_node, fact_id, True))

    def stage_fact_unlink(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        self._stage(pipe, lambda: self._link_fact(tenant, version, head_node, tail_node, fact_id, False))

    def stage_edge(self, pipe, tenant: str, version: int, a: str, b: str, weight: float, kind: str) -> None:
        weight = float(_stored(weight))  # as Redis hands it back

        def write() -> None:
            adjacency = self._tenant(tenant).adjacency  # set even at weight 0, as Memory's HSET does
            adjacency[a][adjacency_field(kind, b)] = adjacency[b][adjacency_field(kind, a)] = weight
            self._set(tenant, "graph_nodes").update((a, b))
            self._log(tenant, version, EdgeChange(a, b, weight, kind))

        self._stage(pipe, write)

    def stage_edge_removed(self, pipe, tenant: str, version: int, a: str, b: str, kind: str) -> None:
        """As store/redis/graph.py's stage_edge_removed."""

        def write() -> None:
            adjacency = self._tenant(tenant).adjacency
            adjacency[a].pop(adjacency_field(kind, b), None)
            adjacency[b].pop(adjacency_field(kind, a), None)
            self._log(tenant, version, EdgeChange(a, b, 0.0, kind))

        self._stage(pipe, write)

    def stage_type_member(self, pipe, tenant: str, version: int, entity_node: str, entity_type: str) -> None:
        self.stage_edge(pipe, tenant, version, entity_node, type_node(entity_type), 1.0, "type")

    def stage_similarity_bridged(self, pipe, tenant: str, entity_id: str) -> None:
        self._stage(pipe, lambda: self._set(tenant, "similarity_bridged").add(entity_id))

    async def unbridged_entity_vectors(self, tenant: str, passage_id: str) -> dict[str, np.ndarray]:
        bridged = self._set(tenant, "similarity_bridged")
        vectors = {
            eid: self._vector(tenant, "entities", eid)
            for eid in await self.passage_entities(tenant, passage_id)
            if eid not in bridged
        }
        return {eid: vec for eid, vec in vectors.items() if vec is not None}

    async def graph_log_exists(self, tenant: str) -> bool:
        return self._tenant(tenant).changes_added > 0

    async def graph_log_head(self, tenant: str) -> str:
        changes = self._tenant(tenant).changes
        return changes[-1][0] if changes else NO_CHANGE

    async def adjacency_nodes(self, tenant: str) -> list[str]:
        return sorted(self._set(tenant, "graph_nodes"))  # (no nodes from before the node set: nothing to scan for)

    def adjacency(self, tenant: str, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]:
        return self._adjacency(self._tenant(tenant), nodes)

    @staticmethod
    async def _adjacency(t: _Tenant, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]:
        for start in range(0, len(nodes), LOAD_BATCH):
            edges = []
            for node in nodes[start : start + LOAD_BATCH]:
                for name, weight in t.adjacency.get(node, {}).items():
                    kind, other = name.split("|", 1)
                    if node < other:
                        edges.append(EdgeChange(node, other, weight, kind))
            yield edges

    async def changes_since(
        self, tenant: str, cursor: str, count: int = READ_BATCH
    ) -> list[tuple[str, EdgeChange]] | None:
        t = self._tenant(tenant)
        if cursor == NO_CHANGE:
            entries = t.changes[:count]
            if entries and t.changes_added > len(t.changes):
                return None  # entries made since the load are gone
        else:
            first = t.changes_added - len(t.changes) + 1  # the number in the id of the oldest entry kept
            try:
                position = int(cursor.split("-", 1)[0]) - first
            except ValueError:
                return None
            if not 0 <= position < len(t.changes) or t.changes[position][0] != cursor:
                return None
            entries = t.changes[position + 1 : position + 1 + count]
        return [(entry_id, change) for entry_id, _, change in entries]
