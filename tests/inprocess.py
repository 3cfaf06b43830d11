"""The indexing stages in the test's own process, over any store (store.base.MemoryStore): the
real Redis of the test stack (store.memory.Memory) or the memory of this process
(store.in_memory.InMemoryStore, no stack needed), with Kafka replaced by the in-memory broker of
ops.testing (`InProcessBroker`) — a test double, for tests of the stages' logic: no torch
unless a test asks for the real embedder, no worker processes, no Kafka round trips.

`InProcess` is one fresh tenant's stages over that broker: it publishes and deletes as the CLI
does and keeps everything the stages sent (`sent`). By default the broker delivers one message
at a time, oldest first; `Delivery` (re-exported here) makes it behave like several partitions
and consumers, with seeded orders, redeliveries and a failed first publish of a fact event (see
ops/testing.py); its counters are the broker's (`InProcess.broker`).

Reading the memory goes through the same code as the CLI: `export()` is `memstream export`'s
function, `events()` decodes the indexed-facts events like `memstream tail`, `query()` runs the
query worker's QueryEngine."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import uuid

import numpy as np
import pytest

from ops.export import export_memory
from ops.testing import Delivery, InProcessBroker  # Delivery: the tests import it from here
from store import Memory, Outgoing
from store.base import MemoryStore
from store.in_memory import InMemoryStore
from topics import DeadLetter, Document, DocumentDeletion, FactEvent, decode, document_key, encode
from topics.records import Triple
from workers.models.extraction import Entity, Extraction, RulesExtractor
from workers.pipeline import Pipeline
from workers.query.engine import QueryEngine, QueryRequest
from workers.recovery import rewind_targets
from workers.settings import Settings

DIMS = 384


class DigitBlindEmbedder:
    """Test double: texts that differ only in their digits get the same vector (cosine 1), the
    worst case for near-duplicate detection ("Person2" / "Person3", "1998" / "1999");
    everything else gets a pseudo-random vector (cosine ≈ 0)."""

    dims = DIMS

    def __init__(self, dims: int = DIMS):
        self.dims = dims

    async def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(re.sub(r"\d", "#", text).encode()).digest()[:8], "little")
            vector = np.random.default_rng(seed).standard_normal(self.dims).astype(np.float32)
            rows.append(vector / np.linalg.norm(vector))
        return np.vstack(rows)


class ScriptedExtractor:
    """Test double: the facts of each text, given by the test as (head, relation, tail[, head
    type, tail type]) tuples."""

    name = "scripted"
    grounded = True  # the test's facts, admitted as given (grounding has its tests: tests/test_grounding.py)

    def __init__(self, script: dict[str, list[tuple]]):
        self.script = script

    async def extract(self, text: str, context: str = "") -> Extraction:
        facts = [
            Triple(*fact[:3], *(fact[3:5] if len(fact) >= 5 else ("PERSON", "PLACE"))) for fact in self.script[text]
        ]
        entities = {(t.head, t.head_type) for t in facts} | {(t.tail, t.tail_type) for t in facts}
        return Extraction([Entity(n, t) for n, t in sorted(entities)], facts)


class HashEmbedder:
    """Test double: a local model's interface (a synchronous `embed`, as BatchingEmbedder
    drives all-MiniLM-L6-v2), a pseudo-random unit vector per text."""

    name, dims = "hash-embedder", 384

    def embed(self, texts: list[str]):
        import hashlib

        import numpy as np

        rows = [
            np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")).standard_normal(
                self.dims
            )
            for t in texts
        ]
        return np.vstack([r / np.linalg.norm(r) for r in rows]).astype(np.float32)


def redis_keys_holding(redis_url: str, needles: list[bytes]) -> list[str]:
    """Every key of the Redis at `redis_url` whose name or value (of any type: string, hash,
    set, sorted set, list, stream) holds one of `needles` — what an erasure must leave none of."""
    import redis as redis_sync

    from store.redis.topology import cluster_seed, parse_cluster_slots

    seed = cluster_seed(redis_url)
    if seed is None:
        clients = [redis_sync.Redis.from_url(redis_url)]
    else:  # every primary of the cluster
        with redis_sync.Redis.from_url(seed) as node:
            ranges = parse_cluster_slots(node.execute_command("CLUSTER", "SLOTS"))
        clients = [redis_sync.Redis(host=host, port=port) for host, port in sorted({n for _, _, n in ranges})]
    found = []
    try:
        for client in clients:
            for key in client.scan_iter(count=1000):
                values = _values(client, key)
                if any(blob and any(n in blob for n in needles) for blob in [key, *values]):
                    found.append(key.decode(errors="replace"))
        return found
    finally:
        for client in clients:
            client.close()


def _values(client, key: bytes) -> list:
    """Every value a key holds, whatever its type (its fields and values for a hash or stream)."""
    kind = client.type(key)
    if kind == b"string":
        return [client.get(key)]
    if kind == b"hash":
        return [x for kv in client.hgetall(key).items() for x in kv]
    if kind == b"set":
        return list(client.smembers(key))
    if kind == b"zset":
        return client.zrange(key, 0, -1)
    if kind == b"list":
        return client.lrange(key, 0, -1)
    if kind == b"stream":
        return [x for _, fields in client.xrange(key) for kv in fields.items() for x in kv]
    return []


@functools.cache
def _local_model():
    from workers.models.embedding import LocalEmbedder

    return LocalEmbedder()


@pytest.fixture
def real_embedder():
    """The workers' embedder (all-MiniLM-L6-v2 behind BatchingEmbedder), for tests whose meaning
    depends on real semantic similarity (a similarity bridge, a query that must find the passage
    it asks about). The model loads once per test session (functools.cache, not the fixture's
    scope: a test module that imports this fixture registers a fixture of its own). Without the
    Redis embedding cache: the model's in-memory cache serves repeated texts."""
    from workers.models.embedding import BatchingEmbedder

    return BatchingEmbedder(_local_model())


class InProcess:
    """The four stages for one fresh tenant over `memory` — else Redis's Memory at `redis_url`,
    else a fresh InMemoryStore — with `settings` as Settings fields (the `MEMSTREAM_*`
    variables of a worker, as Python values: a switch is a bool); a store the test gives must have the settings' τ. The similarity
    bridge is off unless asked for (`sim_bridging=True`): with the digit-blind embedder it would
    only bridge digit variants. `delivery`: how the broker delivers (default: one message at a
    time, oldest first); `keep_log`: it keeps every message with its offset, so `recover` can
    read the topics again after the store lost writes (InMemoryStore.restore)."""

    def __init__(
        self,
        redis_url: str | None,
        extractor,
        embedder=None,
        *,
        memory: MemoryStore | None = None,
        delivery: Delivery | None = None,
        tenant: str | None = None,
        resolver_llm=None,
        keep_log: bool = False,
        **settings,
    ):
        self.settings = Settings.from_env(
            {}, **({"redis_url": redis_url} if redis_url else {}), **{"sim_bridging": False, **settings}
        )
        tau = self.settings.effective_tau
        if memory is None:
            memory = (
                Memory.from_url(redis_url, tau=tau, vector_index=self.settings.vector_index)
                if redis_url
                else InMemoryStore(DIMS, tau=tau)
            )
        elif getattr(memory, "tau", tau) != tau:
            raise ValueError(f"the store counts a schema stable at τ={memory.tau}, the settings at τ={tau}")
        self.memory: MemoryStore = memory
        self.tenant = tenant or f"ip-{uuid.uuid4().hex[:10]}"
        self.embedder = embedder or DigitBlindEmbedder()
        self._engine: QueryEngine | None = None
        # the pipeline's `process` looked up at each delivery: a test may wrap it
        self.broker = InProcessBroker(
            lambda *message: self.pipeline.process(*message),
            delivery or Delivery(),
            key_prefix=f"{self.tenant}/",
            keep_log=keep_log,
        )
        self.pipeline = Pipeline(self.settings, self.memory, self.broker.send, self.embedder, extractor, resolver_llm)

    # ---- the broker (ops.testing.InProcessBroker) -----------------------------------------
    @property
    def sent(self) -> list[Outgoing]:
        """Everything the stages sent, in order: the topics' contents."""
        return self.broker.sent

    def put(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Queue a message on `topic` (delivered by the next drain). Its partition follows from
        its key without this harness's tenant (documents are keyed tenant/doc id), so a seed
        gives the same order whatever the test's tenant is called."""
        self.broker.put(topic, key, value)

    async def deliver(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Queue one raw message (bytes as a producer sends them) and drain."""
        await self.broker.deliver(topic, key, value)

    async def drain(self) -> None:
        """Deliver until no message waits and none is in flight."""
        await self.broker.drain()

    async def recover(self) -> None:
        """What the workers do once Redis lost writes (workers.recovery): every partition read
        again from the first offset whose effects the store no longer holds — all of them were
        handled and committed — then drained."""
        if self.broker.log is None:
            raise RuntimeError("recover needs InProcess(keep_log=True)")
        name = self.pipeline.envelope.topic_name
        committed = {(name(topic), partition): len(log) for (topic, partition), log in self.broker.log.items()}
        targets = await rewind_targets(self.memory, self.settings.app_id, committed)
        suffix = {name(topic): topic for topic, _ in self.broker.log}
        self.broker.replay({(suffix[topic], partition): start for (topic, partition), start in targets.items()})
        await self.drain()

    # ---- publishing, as the CLI does ----------------------------------------------------------
    async def publish(self, doc_id: str, text: str, *, wait: bool = True, **fields) -> None:
        """Publish a document as `memstream publish` does (key: tenant/doc id); with `wait`,
        return once everything it caused has been delivered (`publish --wait`)."""
        doc = Document(self.tenant, doc_id, text, **fields)
        self.put(Document.TOPIC, doc.key.encode(), encode(doc))
        if wait:
            await self.drain()

    async def delete(self, doc_id: str, *, wait: bool = True, purge: bool = False) -> None:
        """Delete a document as `memstream delete` does: a tombstone (no value) under its key —
        with `purge` (`delete --purge`), its erasure first."""
        key = document_key(self.tenant, doc_id).encode()
        if purge:
            self.put(Document.TOPIC, key, DocumentDeletion(self.tenant, doc_id, purge=True).erasure_value())
        self.put(Document.TOPIC, key, None)
        if wait:
            await self.drain()

    # ---- reading it back, as the CLI does ---------------------------------------------------
    def events(self) -> list[dict]:
        """The tenant's indexed-facts events in the order sent, as `memstream tail` prints them
        (each decoded against the FactEvent contract)."""
        return [decode(FactEvent, o.value).to_dict() for o in self.sent if o.topic == FactEvent.TOPIC]

    def messages(self) -> list[tuple[str, str, dict]]:
        """Everything the stages sent, in order, as (topic, key, decoded value) without system time."""
        return [(o.topic, o.key, {k: v for k, v in json.loads(o.value).items() if k != "ts"}) for o in self.sent]

    def dead_letters(self) -> list[dict]:
        return [json.loads(o.value) for o in self.sent if o.topic == DeadLetter.TOPIC]

    async def export(self) -> dict:
        """`memstream export --tenant T`: its function, over this harness's store."""
        return await export_memory(self.memory, self.tenant)

    async def facts(self) -> dict[str, dict]:
        ids = await self.memory.scan_ids(self.tenant, "facts")
        return {fid: f for fid, f in zip(ids, await self.memory.facts(self.tenant, ids)) if f}

    async def query(self, text: str, top_k: int = 5, **body) -> dict:
        """What `POST /v1/query` answers (without the answer generation): the query worker's
        QueryEngine over this memory, with this harness's embedder."""
        request = QueryRequest.from_json(
            {"query": text, "tenant": self.tenant, "top_k": top_k, **body}, self.tenant, top_k
        )
        return (await self.query_engine().answer(request)).to_json()

    def query_engine(self) -> QueryEngine:
        """The query worker's QueryEngine over this memory, with this harness's embedder (made once)."""
        if self._engine is None:
            self._engine = QueryEngine(self.memory, self.embedder)
        return self._engine

    async def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        await self.memory.close()


def answers_to(
    redis_url: str | None,
    embedder,
    documents: list[tuple[str, str | None, str]],
    question: str,
    runs: list[tuple[str, str, dict]],
    top_k: int = 3,
) -> dict[str, dict]:
    """`documents` ((doc id, title or None, text)) indexed by the rules extractor (τ = 1) into a
    fresh tenant of the store at `redis_url` (None: in memory), then `question` asked once a run
    ((name, mode, retrieval params)): the run's name → its answer (as `POST /v1/query`'s)."""

    async def scenario() -> dict[str, dict]:
        stages = InProcess(redis_url, RulesExtractor(), embedder, tau=1)
        try:
            for doc_id, title, text in documents:
                await stages.publish(doc_id, text, **({"title": title} if title else {}))
            return {
                name: await stages.query(question, top_k=top_k, mode=mode, params=params) for name, mode, params in runs
            }
        finally:
            await stages.close()

    return asyncio.run(scenario())


def doc_ids(answer: dict) -> list[str]:
    """The doc ids of an answer's passages, best first."""
    return [p["doc_id"] for p in answer["passages"]]
