"""The graph (store.base.GraphWrites and GraphReads): edges staged with the decision that made
them (a fact's through store.graph_log's LINK_FACT and UNLINK_FACT), each change in the tenant's
change stream; the entities already similarity-bridged; and the graph read back (store.graph_log:
the format, and why a reader reloads)."""

from __future__ import annotations

from typing import AsyncIterator

import numpy as np

import store.graph_log as graph_log
from store.graph_log import GRAPH_CHANGES_MAXLEN, LINK_FACT, READ_BATCH, UNLINK_FACT, EdgeChange, adjacency_field
from store.nodes import type_node
from store.records import vector_from_bytes
from store.redis.base import _eval, _text
from store.redis.layers import LayersOps


class GraphOps(LayersOps):
    """store.base.GraphWrites and GraphReads on Redis (a passage's entities read through LayersOps)."""

    # ---- graph -------------------------------------------------------------------------
    async def bump_graph_version(self, tenant: str) -> int:
        # A replayed message may bump it again: versions may skip, never go back.
        return int(await self.shard(tenant).incr(self.keys(tenant).graph_version))

    async def graph_version(self, tenant: str) -> int:
        return int(await self.shard(tenant).get(self.keys(tenant).graph_version) or 0)

    def stage_fact_edge(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            LINK_FACT,
            [
                keys.edge_facts(head_node, tail_node),
                keys.adjacency(head_node),
                keys.adjacency(tail_node),
                keys.graph_changes,
                keys.graph_nodes,
            ],
            [fact_id, head_node, tail_node, version, GRAPH_CHANGES_MAXLEN],
        )

    def stage_fact_unlink(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            UNLINK_FACT,
            [
                keys.edge_facts(head_node, tail_node),
                keys.adjacency(head_node),
                keys.adjacency(tail_node),
                keys.graph_changes,
            ],
            [fact_id, head_node, tail_node, version, GRAPH_CHANGES_MAXLEN],
        )

    def stage_edge(self, pipe, tenant: str, version: int, a: str, b: str, weight: float, kind: str) -> None:
        """An undirected edge of one kind (passage: entity–passage, weight 1; type: entity–type,
        weight 1 here, normalised by the type's size when the graph is read; similar: cosine)."""
        keys = self.keys(tenant)
        pipe.hset(keys.adjacency(a), adjacency_field(kind, b), weight)
        pipe.hset(keys.adjacency(b), adjacency_field(kind, a), weight)
        pipe.sadd(keys.graph_nodes, a, b)
        pipe.xadd(
            keys.graph_changes,
            EdgeChange(a, b, weight, kind).entry(version),
            maxlen=GRAPH_CHANGES_MAXLEN,
            approximate=True,
        )

    def stage_edge_removed(self, pipe, tenant: str, version: int, a: str, b: str, kind: str) -> None:
        """An edge of one kind gone (a retired passage's): off both adjacency hashes, weight 0 in the log."""
        keys = self.keys(tenant)
        pipe.hdel(keys.adjacency(a), adjacency_field(kind, b))
        pipe.hdel(keys.adjacency(b), adjacency_field(kind, a))
        pipe.xadd(
            keys.graph_changes,
            EdgeChange(a, b, 0.0, kind).entry(version),
            maxlen=GRAPH_CHANGES_MAXLEN,
            approximate=True,
        )

    # ---- bridging --------------------------------------------------------------------------
    def stage_type_member(self, pipe, tenant: str, version: int, entity_node: str, entity_type: str) -> None:
        self.stage_edge(pipe, tenant, version, entity_node, type_node(entity_type), 1.0, "type")

    def stage_similarity_bridged(self, pipe, tenant: str, entity_id: str) -> None:
        pipe.sadd(self.keys(tenant).similarity_bridged, entity_id)

    async def unbridged_entity_vectors(self, tenant: str, passage_id: str) -> dict[str, np.ndarray]:
        """The vectors of the passage's entities not yet similarity-bridged, in two round trips
        (per entity, a check and a read were two round trips each)."""
        keys = self.keys(tenant)
        entity_ids = await self.passage_entities(tenant, passage_id)
        if not entity_ids:
            return {}
        pipe = self.shard(tenant).pipeline(transaction=False)
        pipe.smismember(keys.similarity_bridged, entity_ids)
        for eid in entity_ids:
            pipe.hget(keys.entity(eid), "vec")
        bridged, *raw = await pipe.execute()
        return {
            eid: vector_from_bytes(vec)
            for eid, done, vec in zip(entity_ids, bridged, raw)
            if not done and vec is not None
        }

    # ---- reading the graph log (store.graph_log: the format, and why a reader reloads) --------
    async def graph_log_exists(self, tenant: str) -> bool:
        """Whether the tenant has a graph change stream (no stream: no graph yet)."""
        return await graph_log.exists(self.shard(tenant), self.keys(tenant))

    async def graph_log_head(self, tenant: str) -> str:
        """The cursor of the latest change (graph_log.NO_CHANGE when there is none): read it
        before loading the adjacency, then apply changes_since(it)."""
        return await graph_log.head(self.shard(tenant), self.keys(tenant))

    def adjacency(self, tenant: str, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]:
        """Every edge the adjacency hashes of `nodes` hold (each once), a list per round trip."""
        return graph_log.adjacency(self.shard(tenant), self.keys(tenant), nodes)

    async def changes_since(
        self, tenant: str, cursor: str, count: int = READ_BATCH
    ) -> list[tuple[str, EdgeChange]] | None:
        """The first `count` changes after `cursor`, each with its id (the cursor once it is applied);
        None when the log no longer holds the cursor's entry (trimmed, lost or begun again): load
        the graph again."""
        return await graph_log.changes_since(self.shard(tenant), self.keys(tenant), cursor, count)

    async def adjacency_nodes(self, tenant: str) -> list[str]:
        """The tenant's graph nodes from its node set — O(tenant). Nodes written before the set
        existed are found once by a keyspace scan and added to it; writers add to the set with
        every edge, so nothing written meanwhile is missed."""
        keys = self.keys(tenant)
        if not await self.shard(tenant).exists(keys.graph_nodes_complete):
            legacy = await self._scan_suffixes(self.shard(tenant), keys.adjacency(""))
            pipe = self.shard(tenant).pipeline(transaction=True)
            for start in range(0, len(legacy), 1000):
                pipe.sadd(keys.graph_nodes, *legacy[start : start + 1000])
            pipe.set(keys.graph_nodes_complete, 1)
            await pipe.execute()
        return sorted(_text(m) for m in await self.shard(tenant).smembers(keys.graph_nodes))
