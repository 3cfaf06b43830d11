"""Redis round trips of the indexing stages that do not grow with the work in a chunk (before:
the rules pipeline made several round trips per entity and per fact). Commands are counted
through a wrapper of the Redis client: each command sent alone and each pipeline sent is one."""

from __future__ import annotations

import asyncio
import collections
import time

import numpy as np
import pytest
from redis.asyncio.client import Pipeline as RedisPipeline
from redis.asyncio.client import Redis

from ops.bench import rules as rules_bench
from store import AlreadyDone
from store.nodes import entity_node
from store.redis import base as redis_base
from store.redis import connection as redis_connection
from store.redis import lexical_index, outbox, search, vector_index
from tests.inprocess import DigitBlindEmbedder, InProcess
from workers.models import embedding
from workers.models.extraction import Entity, Extraction, RulesExtractor


class NamesOnly:
    """Test double: each text's entities are its comma-separated names; no facts."""

    name = "names-only"
    grounded = True

    async def extract(self, text: str, context: str = "") -> Extraction:
        return Extraction([Entity(name.strip(), "PERSON") for name in text.split(",")], [])


@pytest.fixture
def round_trips(monkeypatch):
    """Counts Redis round trips of this process, by command ('pipeline' for a pipeline sent).
    The store's timed rereads (an index's state every 5 s, a tenant's embedder every 30 s, …)
    are held while it counts: on a slow machine the warm-up and the first publish crossed the
    5 s window, and that publish counted one HMGET more than the next (CI, 18 == 19)."""
    for module, window in (
        (lexical_index, "LEXICAL_STATE_RECHECK_S"),
        (lexical_index, "LEXICAL_SIZE_RECHECK_S"),
        (vector_index, "VECTOR_STATE_RECHECK_S"),
        (redis_base, "TENANT_DIMS_RECHECK_S"),
        (redis_base, "INDEX_RECHECK_S"),  # a store's index_recheck_s, when it is made
        (search, "TENANT_DIMS_RECHECK_S"),
        (outbox, "SWEEP_REGISTRATION_S"),
        (embedding, "EMBEDDER_RECHECK_S"),
    ):
        monkeypatch.setattr(module, window, float("inf"))
    counts: collections.Counter = collections.Counter()
    command, pipeline, run_script = Redis.execute_command, RedisPipeline.execute, redis_connection.run_script

    async def counted_command(self, *args, **options):
        if not isinstance(self, RedisPipeline) or self.watching:  # a queued command is sent with the pipeline
            counts[str(args[0]).upper()] += 1
        return await command(self, *args, **options)

    async def counted_pipeline(self, *args, **options):
        counts["pipeline"] += 1
        return await pipeline(self, *args, **options)

    async def counted_script(script, keys, args):  # (the store sends its scripts on a connection of its own)
        counts["EVALSHA"] += 1
        return await run_script(script, keys, args)

    monkeypatch.setattr(Redis, "execute_command", counted_command)
    monkeypatch.setattr(RedisPipeline, "execute", counted_pipeline)
    monkeypatch.setattr(redis_connection, "run_script", counted_script)
    return counts


async def _round_trips_of(ip: InProcess, counts: collections.Counter, doc_id: str, text: str) -> int:
    counts.clear()
    await ip.publish(doc_id, text)
    return sum(counts.values())


def test_similarity_bridge_round_trips_do_not_grow_with_entities(stack_env, round_trips):
    """A chunk of 12 entities costs the same round trips as a chunk of 2: the bridge reads the
    unbridged entities' vectors in one pipeline, searches all their neighbours in one, and
    writes every edge and mark in one transaction (it was 4 round trips per entity)."""
    asyncio.run(_bridge_round_trips(stack_env["MEMSTREAM_REDIS_URL"], round_trips))


async def _bridge_round_trips(redis_url: str, round_trips: collections.Counter) -> None:
    ip = InProcess(redis_url, NamesOnly(), sim_bridging=True)
    try:
        await ip.publish("warm", "Warm Up One, Warm Up Two")  # the tenant's indexes exist
        # the warm-up's first write checks in the background whether the tenant is large enough
        # for indexes of its own (maybe_promote_lexical): on a slow machine its last read was
        # sent while "few" was counted (CI, 19 != 18)
        await asyncio.gather(*ip.memory._promotions.values())
        few = await _round_trips_of(ip, round_trips, "few", "Dag Person1, Dag Person2")
        many = await _round_trips_of(ip, round_trips, "many", ", ".join(f"Cora Person{i}" for i in range(10, 22)))
        assert many == few, dict(round_trips)
        memory = await ip.export()
        similar = {node for e in memory["edges"] if e["kind"] == "similar" for node in (e["source"], e["target"])}
        # the digit-blind embedder gives "Cora Person10" … "Cora Person21" one vector: each is bridged
        cora = [entity_node(e["id"]) for e in memory["entities"] if e["name"].startswith("Cora")]
        assert len(cora) == 12 and set(cora) <= similar
    finally:
        await ip.close()


def test_a_message_with_nothing_to_publish_is_done_with_its_commit(redis_url):
    """An empty outbox commits with the message's done mark: no finish round trip afterwards
    (most detections park a fact as pending and publish nothing); a redelivery is skipped."""
    asyncio.run(_empty_outbox(redis_url))


async def _empty_outbox(redis_url: str | None) -> None:
    ip = InProcess(redis_url, NamesOnly())
    try:
        pipe = ip.memory.pipeline(ip.tenant)
        ip.memory.stage_chunk_done(pipe, ip.tenant, "c1")
        ip.memory.stage_outbox(pipe, ip.tenant, "m-empty", [])
        assert await ip.memory.commit_once(pipe, ip.tenant, "m-empty") is None
        with pytest.raises(AlreadyDone):
            await ip.memory.pending_outbox(ip.tenant, "m-empty")
        assert await ip.memory.chunk_done(ip.tenant, "c1")
        assert "m-empty" not in {
            mark for _, mark, _ in await ip.memory.unsent_outboxes(time.time() + 60)
        }  # nothing for the sweep
    finally:
        await ip.close()


def test_forgotten_cached_vectors_are_embedded_again(redis_url):
    """EmbeddingCache.forget_many (bench index --rules starts each tree's run without the
    corpus's cached vectors): the forgotten texts are gone, the others stay."""
    asyncio.run(_forget(redis_url))


async def _forget(redis_url: str | None) -> None:
    ip = InProcess(redis_url, NamesOnly())
    try:
        cache = ip.memory.embedding_cache(f"test-{ip.tenant}")
        await cache.put_many({"kept": np.ones(4, dtype=np.float32), "forgotten": np.zeros(4, dtype=np.float32)})
        await cache.forget_many(["forgotten", "never cached"])
        assert set(await cache.get_many(["kept", "forgotten"])) == {"kept"}
        await cache.forget_many(["kept"])
    finally:
        await ip.close()


class RecordingEmbedder(DigitBlindEmbedder):
    """Test double: the digit-blind embedder, recording each call's texts."""

    def __init__(self):
        self.calls: list[list[str]] = []

    async def embed(self, texts: list[str]):
        self.calls.append(list(texts))
        return await super().embed(texts)


PASSAGES = [
    "Ada Lovelace was born in London. Ada Lovelace worked with Charles Babbage in London.",
    "The Eiffel Tower is located in Paris. Gustave Eiffel designed the Eiffel Tower in 1887.",
    "Charles Babbage was born in London. Charles Babbage worked with Ada Lovelace.",
]


def test_the_benchmark_embeds_what_the_extractor_embeds():
    """bench index --rules measures its embedding-bound limit on the texts the rules pipeline
    embeds, one call per chunk through one in-process cache: each distinct text encoded once.
    The extractor stage asks for the same texts, less those a record of the tenant already
    holds (written by an earlier chunk), each once: every distinct text is embedded once."""
    asyncio.run(_embeds())


async def _embeds() -> None:
    embedder = RecordingEmbedder()
    ip = InProcess(None, RulesExtractor(), embedder)
    try:
        for i, text in enumerate(PASSAGES):
            await ip.publish(f"d{i}", text)
        earlier: set[str] = set()
        for call, text in zip(embedder.calls, PASSAGES, strict=True):
            assert call == [t for t in dict.fromkeys(rules_bench.embedded_texts(text)) if t not in earlier]
            earlier |= set(call)
        assert len(embedder.calls[2]) < len(set(rules_bench.embedded_texts(PASSAGES[2])))  # London, Ada...: held
        assert all(len(call) > 3 for call in embedder.calls[:2])  # entities and facts, not the passage alone
    finally:
        await ip.close()


WALKED = [
    "Ada Quill works for Orsk Mills. Ada Quill lives in Brannoc.",
    "Bo Quill works for Orsk Mills. Bo Quill lives in Tallowmere.",
    "Cy Verne works for Brannoc Press. Cy Verne lives in Brannoc.",
    "Orsk Mills is located in Brannoc. Brannoc Press is located in Brannoc.",
    "Tallowmere is a town near Orsk. Dee Verne lives in Tallowmere.",
]


def _walk_counted(stack_env, round_trips, question: str) -> tuple[dict, dict]:
    """A reconstruct answer over WALKED, and the round trips it made (a first walk warms the
    tenant's checks and the graph)."""

    async def main():
        ip = InProcess(stack_env["MEMSTREAM_REDIS_URL"], RulesExtractor(), tau=1)
        try:
            for n, text in enumerate(WALKED):
                await ip.publish(f"doc{n}", text)
            await ip.query("Ada Quill", mode="reconstruct")
            round_trips.clear()
            answer = await ip.query(question, mode="reconstruct")
            return answer, dict(round_trips)
        finally:
            await ip.close()

    return asyncio.run(main())


def test_a_reconstruct_walk_searches_facts_and_reads_vectors_once_a_step(stack_env, round_trips):
    """Each step of a walk opens the branches of its new cues: their facts by head and by tail
    (a KNN each) and the vectors of their facts. Before, each was a command of its own — on a
    2,000-passage tenant 44 searches and 45 vector reads a query, 155 round trips in all (81
    then). A step's searches and vector reads go together (Memory.facts_near_each, read_passages):
    no search or vector read is sent alone whatever the cues."""
    answer, counts = _walk_counted(stack_env, round_trips, "Who works for Orsk Mills in Brannoc?")
    assert answer["passages"], answer
    assert counts.get("FT.SEARCH", 0) <= 3, counts  # the first stage's own searches (dense, entities, lexical)
    assert counts.get("HGET", 0) <= 4, counts  # a passage's entities as it is read; fact vectors in a pipeline


def test_a_writers_size_check_for_an_own_lexical_index_never_holds_its_write(stack_env, round_trips):
    """ensure_indexes (every chunk's write) looks at the tenant's size once per 30 s to give a
    large tenant its own lexical index (store.redis.lexical_index). Awaited, its reads made a new
    tenant's first write 0.07 -> 1.46 ms (`bench tenants`); in the background the write makes
    no round trip for it, and the check still runs."""
    import uuid

    from store import Memory

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=8)
        try:
            await memory.ensure_indexes(f"warm-{uuid.uuid4().hex[:6]}")  # the shared indexes known
            await asyncio.gather(*memory._promotions.values())  # the warm tenant's own check, not counted
            tenant = f"new-{uuid.uuid4().hex[:6]}"
            round_trips.clear()
            await memory.ensure_indexes(tenant)
            during = sum(round_trips.values())
            await asyncio.sleep(0.2)  # the check, in the background
            return during, sum(round_trips.values())
        finally:
            await memory.close()

    during, after = asyncio.run(main())
    assert during == 0
    assert after >= 1


def test_a_reconstruct_step_reads_in_at_most_four_round_trips(stack_env, round_trips):
    """A step of the walk takes a branch and opens its new cues' branches: the passages it
    reads with the entities they name, those entities' names and the chain's vectors are one
    command (Memory.read_passages); the cues' facts come with their records from their searches
    (facts_near_each), their passages in one more command, and what those lack in one more.
    Before, a step sent ~8: rows, entities, names, vectors, searches, facts, rows, vectors (46
    round trips for this walk of 5 steps, 24 now)."""
    answer, counts = _walk_counted(stack_env, round_trips, "Where does Bo Quill live?")
    steps = len(answer["path"])
    assert steps >= 3, answer["path"]
    # the first stage and the query's cues: at most 10 (its searches, the cues' lookups)
    assert sum(counts.values()) <= 10 + 4 * steps, (steps, counts)
