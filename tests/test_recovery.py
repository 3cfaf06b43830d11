"""Redis restarted empty, or a change stream trimmed under the query worker, on real Redis.
"Restarted empty" is simulated for one tenant — its keys deleted and its vector indexes dropped —
since the shared test Redis is never flushed."""

import asyncio
import uuid

import numpy as np
from redis.exceptions import ResponseError

from store import Memory
from store.keys import LAYERS
from topics import Chunk

DIMS = 8
VECTOR = np.eye(DIMS, dtype=np.float32)[0]


def _tenant(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def _lose(memory: Memory, tenant: str) -> None:
    """What Redis restarting empty does to one tenant: its keys and its indexes are gone."""
    keys = memory.keys(tenant)
    for layer in LAYERS:
        try:
            await memory.redis.execute_command("FT.DROPINDEX", keys.index_name(layer))
        except ResponseError:  # never created
            pass
    found = [key async for key in memory.redis.scan_iter(match=keys.base + ":*", count=1000)]
    if found:
        await memory.redis.delete(*found)


async def _write_passage(memory: Memory, tenant: str, chunk_id: str) -> None:
    pipe = memory.redis.pipeline(transaction=True)
    memory.stage_passage(pipe, tenant, Chunk(tenant, chunk_id, f"doc-{chunk_id}", 0, 1, f"text of {chunk_id}"), [], VECTOR)
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
