"""The indexing stages in the test's own process, over any store (store.base.MemoryStore): the
real Redis of the test stack (store.memory.Memory) or the memory of this process
(store.in_memory.InMemoryStore, no stack needed), with Kafka replaced by an in-memory broker — a
test double, for tests of the stages' logic: no torch unless a test asks for the real embedder,
no worker processes, no Kafka round trips.

The broker routes every message a stage sends to the next stage's handler (`Pipeline.process`),
as the topics do. By default it delivers one message at a time, oldest first: the most
sequential order, and the one that does not depend on the store's round-trip times. `Delivery`
makes it behave like several partitions and consumers: a message's partition follows from its
key, each partition is delivered in order, up to `consumers` messages are in flight at once
(interleaving at every Redis round trip, as several extractors or detectors would), the next
partition is chosen by a seeded random generator, and a share of the messages can be delivered a
second time (what a crash before the ack or a rebalance does), possibly while the first delivery
is still running. It can also fail the first publish of a fact event after its commit (a broker
hiccup the envelope must retry from the committed outbox).

Reading the memory goes through the same code as the CLI: `export()` is `memstream export`'s
function, `events()` decodes the indexed-facts events like `memstream tail`, `query()` runs the
query worker's QueryEngine."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import random
import re
import uuid
from dataclasses import dataclass
from itertools import count

import numpy as np
import pytest

from ops.export import export_memory
from store import Memory, Outgoing
from store.base import MemoryStore
from store.in_memory import InMemoryStore
from topics import Document, DocumentDeletion, FactEvent, decode, document_key, encode
from topics.records import Triple
from workers.models.extraction import Entity, Extraction
from workers.pipeline import Pipeline
from workers.query.engine import QueryEngine, QueryRequest
from workers.settings import Settings

DIMS = 384


class DigitBlindEmbedder:
    """Test double: texts that differ only in their digits get the same vector (cosine 1), the
    worst case for near-duplicate detection ("Person2" / "Person3", "1998" / "1999");
    everything else gets a pseudo-random vector (cosine ≈ 0)."""

    dims = DIMS

    async def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(re.sub(r"\d", "#", text).encode()).digest()[:8], "little")
            vector = np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32)
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

    client = redis_sync.Redis.from_url(redis_url)
    try:
        found = []
        for key in client.scan_iter(count=1000):
            values = _values(client, key)
            if any(blob and any(n in blob for n in needles) for blob in [key, *values]):
                found.append(key.decode(errors="replace"))
        return found
    finally:
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


@dataclass(frozen=True)
class Delivery:
    """How the in-memory broker hands messages to the stages (see the module docstring).

    The default — one partition, one consumer, oldest first, no redelivery — is the most
    sequential order. `seed` None delivers the oldest waiting message first; a seed picks the
    next partition at random: reproducibly with one consumer, while with several the order
    also follows which delivery in flight finishes first (Redis round trips)."""

    partitions: int = 1  # per topic; a message's partition is a hash of its key
    consumers: int = 1  # messages in flight at once, each on its own partition
    seed: int | None = None
    # share of messages delivered a second time (1.0: every one), at a random later moment; without
    # a seed, once the messages queued before the copy are through (a consumer that crashed before its ack)
    redeliver: float = 0.0
    fail_first_event: bool = False  # the first publish of a fact event raises, after its decision committed

    def partition(self, key: str) -> int:
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") % self.partitions


class InProcess:
    """The four stages for one fresh tenant over `memory` — else Redis's Memory at `redis_url`,
    else a fresh InMemoryStore — with `settings` as Settings fields (the `MEMSTREAM_*`
    variables of a worker, as Python values: a switch is a bool); a store the test gives must have the settings' τ. The similarity
    bridge is off unless asked for (`sim_bridging=True`): with the digit-blind embedder it would
    only bridge digit variants."""

    def __init__(
        self,
        redis_url: str | None,
        extractor,
        embedder=None,
        *,
        memory: MemoryStore | None = None,
        delivery: Delivery = Delivery(),
        tenant: str | None = None,
        resolver_llm=None,
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
        self.delivery = delivery
        self.sent: list[Outgoing] = []  # everything the stages sent, in order: the topics' contents
        self.delivered: list[tuple[str, str]] = []  # (topic, key) of each delivery started, redeliveries included
        self.redeliveries = 0  # of those, second deliveries of a message
        self.failed_publishes = 0  # publishes the broker failed (Delivery.fail_first_event)
        self._rng = random.Random(delivery.seed)
        self._arrival = count()
        self._lanes: dict[tuple, list[tuple[int, str, bytes | None, bytes | None]]] = {}
        self._engine: QueryEngine | None = None
        self.pipeline = Pipeline(self.settings, self.memory, self._send, self.embedder, extractor, resolver_llm)

    # ---- the broker -------------------------------------------------------------------------
    async def _send(self, item: Outgoing) -> None:
        if self.delivery.fail_first_event and not self.failed_publishes and item.topic == "indexed-facts":
            self.failed_publishes += 1
            raise RuntimeError("broker hiccup after the commit")
        self.sent.append(item)
        if item.topic in Pipeline.RECORDS:
            self.put(item.topic, item.key.encode(), item.value)

    def put(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Queue a message on `topic` (delivered by the next drain). Its partition follows from
        its key without this harness's tenant (documents are keyed tenant/doc id), so a seed
        gives the same order whatever the test's tenant is called."""
        lane = (topic, self.delivery.partition((key or b"").decode(errors="replace").removeprefix(f"{self.tenant}/")))
        self._lanes.setdefault(lane, []).append((next(self._arrival), topic, key, value))

    @property
    def waiting(self) -> int:
        return sum(len(messages) for messages in self._lanes.values())

    async def publish(self, doc_id: str, text: str, *, wait: bool = True, **fields) -> None:
        """Publish a document as `memstream publish` does (key: tenant/doc id); with `wait`,
        return once everything it caused has been delivered (`publish --wait`)."""
        doc = Document(self.tenant, doc_id, text, **fields)
        self.put("documents", doc.key.encode(), encode(doc))
        if wait:
            await self.drain()

    async def delete(self, doc_id: str, *, wait: bool = True, purge: bool = False) -> None:
        """Delete a document as `memstream delete` does: a tombstone (no value) under its key —
        with `purge` (`delete --purge`), its erasure first."""
        key = document_key(self.tenant, doc_id).encode()
        if purge:
            self.put("documents", key, DocumentDeletion(self.tenant, doc_id, purge=True).erasure_value())
        self.put("documents", key, None)
        if wait:
            await self.drain()

    async def deliver(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Queue one raw message (bytes as a producer sends them) and drain."""
        self.put(topic, key, value)
        await self.drain()

    async def drain(self) -> None:
        """Deliver until no message waits and none is in flight."""
        running: dict[asyncio.Task, tuple] = {}
        try:
            while True:
                busy = set(running.values())
                ready = [lane for lane, messages in self._lanes.items() if messages and lane not in busy]
                while ready and len(running) < self.delivery.consumers:
                    if self.delivery.seed is None:
                        lane = min(ready, key=lambda lane: self._lanes[lane][0][0])
                    else:
                        lane = self._rng.choice(sorted(ready, key=repr))
                    ready.remove(lane)
                    _, topic, key, value = self._lanes[lane].pop(0)
                    if not self._lanes[lane]:
                        del self._lanes[lane]
                    if (
                        self.delivery.redeliver
                        and lane[0] != "redelivered"
                        and self._rng.random() < self.delivery.redeliver
                    ):
                        # a lane of its own: the copy does not wait behind its partition
                        self._lanes[("redelivered", next(self._arrival))] = [(next(self._arrival), topic, key, value)]
                        self.redeliveries += 1
                    self.delivered.append((topic, (key or b"").decode(errors="replace")))
                    running[asyncio.ensure_future(self.pipeline.process(topic, key, value))] = lane
                if not running:
                    return
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                    task.result()
        finally:
            for task in running:
                task.cancel()

    # ---- reading it back, as the CLI does ---------------------------------------------------
    def events(self) -> list[dict]:
        """The tenant's indexed-facts events in the order sent, as `memstream tail` prints them
        (each decoded against the FactEvent contract)."""
        return [decode(FactEvent, o.value).to_dict() for o in self.sent if o.topic == "indexed-facts"]

    def messages(self) -> list[tuple[str, str, dict]]:
        """Everything the stages sent, in order, as (topic, key, decoded value) without system time."""
        return [(o.topic, o.key, {k: v for k, v in json.loads(o.value).items() if k != "ts"}) for o in self.sent]

    def dead_letters(self) -> list[dict]:
        return [json.loads(o.value) for o in self.sent if o.topic == "dlq"]

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
