"""Chunk progress when one work item is spawned twice: the second copy finds the work done and
must still finish it (seen on MuSiQue: 16 of 1890 passages never reported indexed)."""

import asyncio
import uuid

from store import Memory
from topics import CandidateFact, ConflictSet
from topics.records import Triple
from workers.envelope import Finishes
from workers.pipeline import Pipeline
from workers.settings import Settings


def test_a_work_item_spawned_again_after_it_finished_does_not_hold_its_chunk(stack_env):
    async def run():
        settings = Settings.from_env(stack_env)
        memory = Memory.from_url(settings.redis_url)
        tenant, chunk_id, work = f"wp-{uuid.uuid4().hex[:8]}", "c1", "adj:group:x|own:c1:0:1"
        pipeline = Pipeline(settings, memory, send=None)
        fact = Triple(head="X", relation="own", tail="Y", head_type="PERSON", tail_type="THING")
        cand = CandidateFact(tenant, chunk_id, "d1", fact, 0, 1, "x", "y", "rules", activation=1)
        conflict = ConflictSet(tenant, "adjudicate", cand, "", [], [chunk_id], work_id=work, reason="test")
        decided = []

        async def decide(pipe):
            decided.append(work)
            memory.stage_work_done(pipe, tenant, chunk_id, work, 1)
            return []

        try:
            pipe = memory.pipeline(tenant)
            memory.stage_spawn(pipe, tenant, chunk_id, [work])
            memory.stage_fact_done(pipe, tenant, chunk_id, 0, 1)
            await pipe.execute()
            await pipeline.envelope.once(tenant, work, decide, Finishes(chunk_id, work, 1))
            first = await memory.chunk_done(tenant, chunk_id)
            pipe = memory.pipeline(tenant)  # spawned again by another message, after it finished
            memory.stage_spawn(pipe, tenant, chunk_id, [work])
            await pipe.execute()
            await memory.redis.srem(memory.keys(tenant).chunks_done, chunk_id)  # as if not yet done
            await pipeline.envelope.once(tenant, work, decide, Finishes(chunk_id, conflict.work_id, 1))
            outstanding = await memory.outstanding_work(tenant, chunk_id)
            again = await memory.chunk_done(tenant, chunk_id)
            return decided, first, outstanding, again
        finally:
            await memory.close()

    decided, first, outstanding, again = asyncio.run(run())
    assert decided == ["adj:group:x|own:c1:0:1"]  # decided once
    assert first and again and not outstanding
