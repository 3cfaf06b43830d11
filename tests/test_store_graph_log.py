"""The graph log's reading API (store.graph_log through Memory) on real Redis: what the writers
stage is read back as typed edge changes, and a log that lost the reader's cursor says so."""

import asyncio
import uuid

from store import Memory
from store.graph_log import NO_CHANGE, EdgeChange
from store.nodes import entity_node, passage_node, type_node

ADA, BOB, OSTRA = entity_node("ada"), entity_node("bob"), entity_node("ostra")
P1, P2 = passage_node("c1"), passage_node("c2")


def _tenant(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def _drop(memory: Memory, tenant: str) -> None:
    found = [key async for key in memory.redis.scan_iter(match=memory.keys(tenant).base + ":*", count=1000)]
    if found:
        await memory.redis.delete(*found)


async def _write(memory: Memory, tenant: str, stage) -> None:
    pipe = memory.pipeline(tenant)
    stage(pipe)
    await pipe.execute()


async def _load(memory: Memory, tenant: str) -> set[EdgeChange]:
    nodes = await memory.adjacency_nodes(tenant)
    return {edge async for batch in memory.adjacency(tenant, nodes) for edge in batch}


def test_the_writers_edges_are_read_back_once_each_and_as_changes_in_order(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = _tenant("graphlog")
        try:
            empty = (
                await memory.graph_log_exists(tenant),
                await memory.graph_log_head(tenant),
                await memory.changes_since(tenant, NO_CHANGE),
                await _load(memory, tenant),
            )
            await _write(
                memory,
                tenant,
                lambda pipe: (
                    memory.stage_edge(pipe, tenant, 1, ADA, P1, 1.0, "passage"),
                    memory.stage_fact_edge(pipe, tenant, 1, ADA, OSTRA, "f1"),
                    memory.stage_fact_edge(pipe, tenant, 1, ADA, OSTRA, "f2"),
                    memory.stage_type_member(pipe, tenant, 1, BOB, "PERSON"),
                ),
            )
            middle = await memory.graph_log_head(tenant)
            await _write(
                memory,
                tenant,
                lambda pipe: (
                    memory.stage_fact_unlink(pipe, tenant, 2, ADA, OSTRA, "f1"),
                    memory.stage_edge(pipe, tenant, 2, BOB, P2, 0.75, "similar"),
                ),
            )
            head = await memory.graph_log_head(tenant)
            everything = await memory.changes_since(tenant, NO_CHANGE)
            return (
                empty,
                await memory.graph_log_exists(tenant),
                await _load(memory, tenant),
                everything,
                await memory.changes_since(tenant, middle),
                await memory.changes_since(tenant, head),
                await memory.changes_since(tenant, NO_CHANGE, count=2),
                head,
            )
        finally:
            await _drop(memory, tenant)
            await memory.close()

    empty, exists, loaded, everything, since_middle, since_head, first_two, head = asyncio.run(run())
    assert empty == (False, NO_CHANGE, [], set())
    assert exists
    assert loaded == {
        EdgeChange(ADA, P1, 1.0, "passage"),
        EdgeChange(ADA, OSTRA, 1.0, "fact"),
        EdgeChange(BOB, type_node("PERSON"), 1.0, "type"),
        EdgeChange(BOB, P2, 0.75, "similar"),
    }
    assert [change for _, change in everything] == [
        EdgeChange(ADA, P1, 1.0, "passage"),
        EdgeChange(ADA, OSTRA, 1.0, "fact"),
        EdgeChange(ADA, OSTRA, 2.0, "fact"),
        EdgeChange(BOB, type_node("PERSON"), 1.0, "type"),
        EdgeChange(ADA, OSTRA, 1.0, "fact"),
        EdgeChange(BOB, P2, 0.75, "similar"),
    ]
    assert since_middle == everything[4:] and everything[-1][0] == head
    assert since_head == []
    assert first_two == everything[:2]


def test_a_log_that_lost_the_cursor_answers_none(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = _tenant("graphlog-lost")
        stream = memory.keys(tenant).graph_changes
        try:
            for i in range(3):
                await _write(
                    memory,
                    tenant,
                    lambda pipe, i=i: memory.stage_edge(pipe, tenant, 1, entity_node(f"x{i}"), P1, 1.0, "passage"),
                )
            cursor = (await memory.changes_since(tenant, NO_CHANGE))[0][0]  # the oldest entry
            await memory.redis.xtrim(stream, maxlen=1, approximate=False)
            trimmed = await memory.changes_since(tenant, cursor)
            # a reader that loaded before the log existed, while entries it never saw are gone
            trimmed_from_start = await memory.changes_since(tenant, NO_CHANGE)
            head = await memory.graph_log_head(tenant)
            kept = await memory.changes_since(tenant, head)
            await memory.redis.delete(stream)  # Redis restarted empty
            lost = await memory.changes_since(tenant, head), await memory.changes_since(tenant, NO_CHANGE)
            # begun again: the cursor is not among the new log's ids
            await memory.redis.xadd(stream, EdgeChange(entity_node("y"), P1, 1.0, "passage").entry(1), id="1-1")
            restarted = await memory.changes_since(tenant, head)
            return trimmed, trimmed_from_start, kept, lost, restarted
        finally:
            await _drop(memory, tenant)
            await memory.close()

    trimmed, trimmed_from_start, kept, lost, restarted = asyncio.run(run())
    assert trimmed is None and trimmed_from_start is None
    assert kept == []  # the cursor's own entry is still there: nothing missed
    assert lost == (None, [])  # no log at all from the start: nothing to apply
    assert restarted is None
