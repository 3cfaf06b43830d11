"""The query worker's graph cache on real Redis: bounded by edges over all tenants, least
recently queried tenants dropped first and reloaded on their next query."""

import asyncio
import uuid

import pytest

from store import Memory
from store.graph_log import adjacency_field
from store.nodes import entity_node, passage_node
from workers.query.graph_cache import GraphCache


async def _write_graph(memory: Memory, tenant: str, edges: int) -> None:
    pipe = memory.pipeline(tenant)
    for i in range(edges):
        memory.stage_edge(
            pipe, tenant, 1, entity_node(f"{tenant}-{i}"), passage_node(f"{tenant}-{i % 3}"), 1.0, "passage"
        )
    await pipe.execute()


def test_cache_drops_least_recently_queried_tenants_past_its_edge_budget(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        run_id = uuid.uuid4().hex[:6]
        a, b, c = (f"lru-{name}-{run_id}" for name in "abc")
        try:
            for tenant in (a, b, c):
                await _write_graph(memory, tenant, 10)
            cache = GraphCache(memory, max_edges=25)
            first_a = await cache.current(a)
            await cache.current(b)
            await cache.current(a)  # a is now the most recently queried
            await cache.current(c)  # 30 edges held: b goes
            kept = list(cache.tenants)
            again_a = await cache.current(a)
            reloaded_b = await cache.current(b)  # loads again from Redis; c (least recent) goes
            return kept, first_a is again_a, reloaded_b.graph.edges, list(cache.tenants), cache.evictions
        finally:
            await memory.close()

    kept, same_a, b_edges, after, evictions = asyncio.run(run())
    assert [t.split("-")[1] for t in kept] == ["a", "c"]
    assert same_a  # a stayed loaded: no reload for it
    assert b_edges == 10  # b came back whole from Redis
    assert [t.split("-")[1] for t in after] == ["a", "b"] and evictions == 2


def test_one_tenant_larger_than_the_budget_is_still_served(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = f"lru-big-{uuid.uuid4().hex[:6]}"
        try:
            await _write_graph(memory, tenant, 12)
            cache = GraphCache(memory, max_edges=5)
            graph = await cache.current(tenant)
            return graph.graph.edges, list(cache.tenants)
        finally:
            await memory.close()

    edges, held = asyncio.run(run())
    assert edges == 12 and len(held) == 1


LEGACY, OLD = entity_node("legacy"), passage_node("old")


def test_graph_loads_from_the_node_set_and_older_tenants_are_backfilled_once(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = f"nodeset-{uuid.uuid4().hex[:6]}"
        keys = memory.keys(tenant)
        try:
            await _write_graph(memory, tenant, 4)  # 4 entities + 3 passages, through the writers
            written = sorted(m.decode() for m in await memory.redis.smembers(keys.graph_nodes))
            # a tenant from before the node set: adjacency hashes only
            await memory.redis.delete(keys.graph_nodes)
            await memory.redis.hset(keys.adjacency(LEGACY), adjacency_field("passage", OLD), 1.0)
            await memory.redis.hset(keys.adjacency(OLD), adjacency_field("passage", LEGACY), 1.0)
            backfilled = await memory.adjacency_nodes(tenant)
            complete = await memory.redis.exists(keys.graph_nodes_complete)
            graph = await GraphCache(memory).current(tenant)
            return written, backfilled, complete, graph.graph.edges
        finally:
            await memory.close()

    written, backfilled, complete, edges = asyncio.run(run())
    assert len(written) == 7
    assert backfilled == sorted(written + [LEGACY, OLD]) and complete
    assert edges == 5  # the four written edges and the legacy one


def test_a_one_off_load_overtaken_by_trimmed_changes_loads_again_then_refuses(monkeypatch):
    """export and bench ppr read a tenant's graph once (load_whole): a load whose changes were
    trimmed away while it ran is loaded again, and after LOAD_ATTEMPTS such loads it raises
    instead of returning a graph that misses changes (it used to be returned short)."""
    from workers.query import graph_cache

    outcomes = iter([False, True])
    loads = []

    async def load(self, memory):
        loads.append(self.tenant)
        return next(outcomes)

    monkeypatch.setattr(graph_cache.TenantGraph, "load", load)
    graph = asyncio.run(graph_cache.load_whole(None, "t"))
    assert isinstance(graph, graph_cache.TenantGraph) and loads == ["t", "t"]

    outcomes, loads[:] = iter([False] * graph_cache.LOAD_ATTEMPTS), []
    with pytest.raises(graph_cache.GraphLogOvertaken, match="changed faster than it could be loaded"):
        asyncio.run(graph_cache.load_whole(None, "t"))
    assert len(loads) == graph_cache.LOAD_ATTEMPTS


def test_the_removal_of_an_edge_never_made_adds_no_node():
    """A value's fact is never linked (store.facts), yet its retraction still logs the unlink
    (weight 0), as a retired passage logs its edges' removal: the cache must not make nodes for
    them — a long-running cache then differs from a fresh load, and a value named by a query
    would seed PPR on an isolated node."""
    from workers.query.graph_cache import TenantGraph

    graph = TenantGraph("t")
    graph.apply(entity_node("ana"), passage_node("p1"), 1.0, "passage")
    graph.apply(entity_node("ana"), entity_node("3-000-eur"), 0.0, "fact")
    graph.apply(entity_node("3-000-eur"), passage_node("p1"), 0.0, "passage")
    assert sorted(graph.graph.index) == [entity_node("ana"), passage_node("p1")]
    graph.apply(entity_node("ana"), passage_node("p1"), 0.0, "passage")  # a real removal still applies
    assert graph.graph.weight(entity_node("ana"), passage_node("p1"), "passage") == 0
