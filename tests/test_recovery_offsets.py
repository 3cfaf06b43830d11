"""workers.recovery without Kafka: which partitions a worker reads again, and when a running
worker decides Redis lost writes under it — over the in-memory store's applied offsets."""

from __future__ import annotations

import asyncio

from store.in_memory import InMemoryStore
from workers.recovery import Recovery, behind

DOCS, CHUNKS = ("m.documents", 0), ("m.chunks", 1)


def test_a_partition_is_read_again_from_the_first_offset_redis_lacks():
    assert behind(9, 10) is None  # every handled message held
    assert behind(4, 10) == 5  # a backup from before offset 5
    assert behind(None, 10) == 0  # emptied: from the beginning
    assert behind(None, None) is None and behind(None, 0) is None  # nothing handled yet


def test_a_worker_rewinds_what_redis_lost_and_notices_a_loss_while_it_runs():
    async def scenario():
        memory = InMemoryStore(dims=8)
        recorded: dict = {}
        recovery = Recovery(memory, "m", recorded)
        await memory.record_applied("m", *DOCS, 9)
        await memory.record_applied("m", *CHUNKS, 3)
        assert await recovery.rewind({DOCS: 10, CHUNKS: 20}) == {CHUNKS: 4}
        # while the chunks are read again, Redis behind Kafka is the replay, not another loss
        assert await recovery.lost({DOCS: 10, CHUNKS: 20}) == []
        for offset in range(4, 20):  # the replay catches up (the envelope records as it goes)
            await memory.record_applied("m", *CHUNKS, offset)
            recorded[CHUNKS] = offset
        recorded[DOCS] = 9
        assert await recovery.lost({DOCS: 10, CHUNKS: 20}) == []
        assert recovery.replaying == {}
        # Redis emptied under the running worker: what it recorded is gone
        memory._applied.clear()
        assert await recovery.lost({DOCS: 10, CHUNKS: 20}) == [CHUNKS, DOCS]
        # the rejoin's assignment: both read again from their beginnings
        assert await recovery.rewind({DOCS: 10, CHUNKS: 20}) == {DOCS: 0, CHUNKS: 0}
        assert recorded == {}

    asyncio.run(scenario())


def test_partitions_assigned_since_the_last_rewind_are_not_judged_until_theirs_runs():
    """Mid-rebalance the consumer already holds its new partitions, with what Kafka committed
    for them, before their rewind runs: the timer judged them then — the survivor of
    tests/test_crash.py's SIGKILL declared a loss of a partition it had just taken over and
    asked for a rejoin inside the rebalance (CI; that run still passed). Only partitions rewound
    at the latest assignment count."""

    async def scenario():
        memory = InMemoryStore(dims=8)
        recovery = Recovery(memory, "m", {})
        await memory.record_applied("m", *DOCS, 9)
        assert await recovery.rewind({DOCS: 10}) == {}
        # a partition taken over mid-rebalance: its rewind has not run, nothing is judged of it
        assert await recovery.lost({DOCS: 10, CHUNKS: 20}) == []
        assert await recovery.rewind({DOCS: 10, CHUNKS: 20}) == {CHUNKS: 0}  # Redis holds none of it
        assert await recovery.lost({DOCS: 10, CHUNKS: 20}) == []  # its replay is running

    asyncio.run(scenario())
