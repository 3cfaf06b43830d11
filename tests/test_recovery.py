"""Redis restarted empty, or a change stream trimmed under the query worker, on real Redis.
"Restarted empty" is simulated for one tenant — its keys deleted and its vector indexes dropped —
since the shared test Redis is never flushed."""

import asyncio
import logging
import uuid

import numpy as np
from redis.exceptions import ResponseError

from store import Memory
from store.graph_log import NO_CHANGE, EdgeChange
from store.keys import LAYERS, shared_index_name
from store.nodes import entity_node, node_kind, passage_node
from tests.inprocess import DigitBlindEmbedder, InProcess, ScriptedExtractor
from topics import Chunk
from workers.query.graph_cache import GraphCache

DIMS = 8
VECTOR = np.eye(DIMS, dtype=np.float32)[0]


def _tenant(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def _lose(memory: Memory, tenant: str) -> None:
    """What Redis restarting empty does to one tenant: its keys and the indexes are gone."""
    keys = memory.keys(tenant)
    for layer in LAYERS:
        try:
            await memory.redis.execute_command("FT.DROPINDEX", shared_index_name(layer, memory.dims))
        except ResponseError:  # never created
            pass
    found = [key for pattern in keys.patterns() async for key in memory.redis.scan_iter(match=pattern, count=1000)]
    if found:
        await memory.redis.delete(*found)


async def _write_passage(memory: Memory, tenant: str, chunk_id: str) -> None:
    pipe = memory.pipeline(tenant)
    memory.stage_passage(
        pipe, tenant, Chunk(tenant, chunk_id, f"doc-{chunk_id}", 0, 1, f"text of {chunk_id}"), [], VECTOR
    )
    await pipe.execute()


async def _passage_ids(memory: Memory, tenant: str) -> list[str]:
    return sorted(hit.id for hit in await memory.knn(tenant, "passages", VECTOR, 5, ["doc_id"]))


def test_knn_returns_nothing_after_redis_lost_the_index_and_the_next_write_recreates_it(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=DIMS)
        tenant = _tenant("lost-index")
        try:
            await memory.ensure_indexes(tenant)
            await _write_passage(memory, tenant, "c1")
            before = await _passage_ids(memory, tenant)
            await _lose(memory, tenant)
            after_loss = await _passage_ids(memory, tenant)  # raised "no such index" before
            await memory.ensure_indexes(tenant)
            await _write_passage(memory, tenant, "c2")
            return before, after_loss, await _passage_ids(memory, tenant)
        finally:
            await _lose(memory, tenant)
            await memory.close()

    before, after_loss, again = asyncio.run(run())
    assert before == ["c1"]
    assert after_loss == []
    assert again == ["c2"]


def test_a_writer_that_never_queries_recreates_a_lost_index_when_it_checks_again(stack_env):
    async def run():
        url = stack_env["MEMSTREAM_REDIS_URL"]
        writer, reader = Memory.from_url(url, dims=DIMS), Memory.from_url(url, dims=DIMS)
        tenant = _tenant("lost-writer")
        sent = []
        send = writer.redis.execute_command
        writer.redis.execute_command = lambda *args, **kw: sent.append(args[0]) or send(*args, **kw)
        try:
            await writer.ensure_indexes(tenant)
            sent.clear()
            await writer.ensure_indexes(tenant)  # known indexes: no round trip until the recheck is due
            fast = list(sent)
            await _lose(writer, tenant)
            writer.index_recheck_s = 0  # the recheck is due (10 s in production)
            sent.clear()
            await writer.ensure_indexes(tenant)
            rechecked = list(sent)
            await _write_passage(writer, tenant, "c2")
            return fast, rechecked, await _passage_ids(reader, tenant)
        finally:
            await _lose(writer, tenant)
            await writer.close()
            await reader.close()

    fast, rechecked, found = asyncio.run(run())
    assert fast == []
    assert "FT.CREATE" in rechecked
    assert found == ["c2"]


def test_a_writer_that_knew_its_indexes_bridges_entities_written_after_redis_lost_them(stack_env, caplog):
    """Replaying the log into a Redis restarted empty (tests/test_rebuild_from_log.py, `emptied`:
    an edge missing ~1 run in 2): the extractor, which knew the indexes, wrote a chunk's
    entities with no index to find them and bridged them by a KNN search that found none — the
    entities marked bridged, their similarity edge lost for good. A writer's search creates
    the lost index first (store.base.Layers' ensure_index). The writer's size check, counting the
    tenant's passages meanwhile, finds no index: no passages, not an error."""

    async def run():
        url = stack_env["MEMSTREAM_REDIS_URL"]
        text = "Person2 met Person3."  # digit variants: cosine 1 under the digit-blind embedder
        stages = InProcess(
            None,
            ScriptedExtractor({text: [("Person2", "met", "Person3", "PERSON", "PERSON")]}),
            DigitBlindEmbedder(DIMS),
            memory=Memory.from_url(url, dims=DIMS, tau=1),
            tau=1,
            sim_bridging=True,
        )
        try:
            await stages.memory.ensure_indexes(stages.tenant)  # the worker knows its indexes
            await _lose(stages.memory, stages.tenant)  # then Redis restarts empty
            await stages.publish("d", text)
            export = await stages.export()
            return {(e["source"], e["target"]) for e in export["edges"] if e["kind"] == "similar"}
        finally:
            await _lose(stages.memory, stages.tenant)
            await stages.close()

    similar = asyncio.run(run())
    assert {tuple(sorted(edge)) for edge in similar} == {(entity_node("person2"), entity_node("person3"))}
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# ---- the query worker's graph ------------------------------------------------------------------


async def _write_edges(memory: Memory, tenant: str, edges: list[tuple[str, str]]) -> None:
    pipe = memory.pipeline(tenant)
    for entity, passage in edges:
        memory.stage_edge(pipe, tenant, 1, entity, passage, 1.0, "passage")
    await pipe.execute()


def _edges(prefix: str, n: int) -> list[tuple[str, str]]:
    return [(entity_node(f"{prefix}{i}"), passage_node(f"{prefix}{i % 2}")) for i in range(n)]


def _held(graph) -> set[tuple[str, str]]:
    """The passage edges a cached graph holds (weight > 0)."""
    names = graph.graph.names
    return {
        (a, b)
        for a in names
        if node_kind(a) == "entity"
        for b in names
        if node_kind(b) == "passage" and graph.graph.weight(a, b, "passage") > 0
    }


def test_graph_reloads_when_redis_lost_the_stream_and_writers_began_a_new_graph(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = _tenant("lost-graph")
        try:
            await _write_edges(memory, tenant, _edges("old", 4))
            cache = GraphCache(memory)
            first = _held(await cache.current(tenant))
            await _lose(memory, tenant)
            # a new stream, its ids after the cached cursor: read as "more changes" before
            await _write_edges(memory, tenant, _edges("new", 3))
            graph = await cache.current(tenant)
            return first, _held(graph), graph.loads, graph.graph.rebuilds
        finally:
            await _lose(memory, tenant)
            await memory.close()

    first, held, loads, rebuilds = asyncio.run(run())
    assert first == set(_edges("old", 4))
    assert held == set(_edges("new", 3))  # none of the lost graph's edges
    assert loads == 2 and rebuilds == 2


def test_graph_reloads_when_the_stream_is_gone_and_when_it_begins_again_below_the_cursor(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = _tenant("lost-stream")
        stream = memory.keys(tenant).graph_changes
        try:
            await _write_edges(memory, tenant, _edges("old", 4))
            cache = GraphCache(memory)
            await cache.current(tenant)
            await _lose(memory, tenant)
            gone = await cache.current(tenant)  # no stream: read as "no changes" before
            gone = (_held(gone), gone.loads)
            # the graph written again, its stream's ids below the cursor (read as "no changes" before)
            await _write_edges(memory, tenant, _edges("old", 4))
            cursor = (await cache.current(tenant)).cursor
            await _lose(memory, tenant)
            await _write_edges(memory, tenant, _edges("new", 3))
            await memory.redis.delete(stream)
            await memory.redis.xadd(stream, EdgeChange(*_edges("new", 1)[0], 1.0, "passage").entry(1), id="1-1")
            below = await cache.current(tenant)
            return gone, cursor, _held(below), below.loads
        finally:
            await _lose(memory, tenant)
            await memory.close()

    (gone_edges, gone_loads), cursor, below, loads = asyncio.run(run())
    assert gone_edges == set() and gone_loads == 2
    assert cursor != NO_CHANGE  # the second graph arrived as changes on the new stream
    assert below == set(_edges("new", 3)) and loads == 3


def test_a_stream_trimmed_past_the_cursor_forces_a_reload(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = _tenant("trimmed")
        try:
            await _write_edges(memory, tenant, _edges("a", 4))
            cache = GraphCache(memory)
            await cache.current(tenant)
            await _write_edges(memory, tenant, _edges("b", 3))
            await memory.redis.xtrim(
                memory.keys(tenant).graph_changes, maxlen=0, approximate=False
            )  # every change gone
            graph = await cache.current(tenant)
            return _held(graph), graph.loads
        finally:
            await _lose(memory, tenant)
            await memory.close()

    held, loads = asyncio.run(run())
    assert held == set(_edges("a", 4) + _edges("b", 3))
    assert loads == 2


def test_a_graph_loaded_before_its_stream_existed_reloads_when_the_new_stream_was_trimmed(stack_env):
    """Trimming leaves the stream's max-deleted-entry-id at 0-0: a graph whose cursor is
    NO_CHANGE applied what the trim left and missed the rest."""

    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenant = _tenant("trimmed-new")
        try:
            await _write_edges(memory, tenant, _edges("old", 2))
            cache = GraphCache(memory)
            await cache.current(tenant)
            await _lose(memory, tenant)
            empty = await cache.current(tenant)  # loaded again with no stream: cursor NO_CHANGE
            cursor = empty.cursor
            for edge in _edges("new", 3):
                await _write_edges(memory, tenant, [edge])
            await memory.redis.xtrim(memory.keys(tenant).graph_changes, maxlen=1, approximate=False)
            graph = await cache.current(tenant)
            return cursor, _held(graph), graph.loads
        finally:
            await _lose(memory, tenant)
            await memory.close()

    cursor, held, loads = asyncio.run(run())
    assert cursor == NO_CHANGE
    assert held == set(_edges("new", 3)) and loads == 3


def _during_load(memory: Memory, tenant: str, edges: list[tuple[str, str]], trim: bool):
    """memory.adjacency_nodes, with `edges` written (and the stream trimmed) once the first load
    has read the node list: a long load that writers overtake."""
    read_nodes = memory.adjacency_nodes

    async def adjacency_nodes(name: str) -> list[str]:
        nodes = await read_nodes(name)
        if edges:
            await _write_edges(memory, tenant, edges)
            if trim:
                await memory.redis.xtrim(memory.keys(tenant).graph_changes, maxlen=1, approximate=False)
            edges.clear()
        return nodes

    return adjacency_nodes


def test_changes_written_during_a_load_are_applied_and_a_trim_during_it_loads_again(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        tenants = _tenant("midload"), _tenant("midtrim")
        try:
            found = []
            for tenant, trim in zip(tenants, (False, True)):
                await _write_edges(memory, tenant, _edges("a", 4))
                memory.adjacency_nodes = _during_load(memory, tenant, _edges("b", 3), trim)
                graph = await GraphCache(memory).current(tenant)
                found.append((_held(graph), graph.loads))
            return found
        finally:
            for tenant in tenants:
                await _lose(memory, tenant)
            await memory.close()

    (written, written_loads), (trimmed, trimmed_loads) = asyncio.run(run())
    everything = set(_edges("a", 4) + _edges("b", 3))
    assert written == everything and written_loads == 1  # the changes after the cursor read first
    # the changes after that cursor were trimmed mid-load: kept only by loading again
    assert trimmed == everything and trimmed_loads == 2
