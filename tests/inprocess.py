"""The indexing stages in the test's own process, over the real Redis of the test stack, with
Kafka replaced by an in-memory queue — a test double of the broker, for tests of the stages'
logic (no torch, no worker processes, no partitions, no redelivery unless a test replays a
message itself). Extractor and embedder are the small doubles below."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections import deque

import numpy as np

from store import Memory, Outgoing
from topics import Document, encode
from topics.records import Triple
from workers.models.extraction import Entity, Extraction
from workers.pipeline import Pipeline
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

    def __init__(self, script: dict[str, list[tuple]]):
        self.script = script

    async def extract(self, text: str) -> Extraction:
        facts = [Triple(*fact[:3], *(fact[3:5] if len(fact) >= 5 else ("PERSON", "PLACE"))) for fact in self.script[text]]
        entities = {(t.head, t.head_type) for t in facts} | {(t.tail, t.tail_type) for t in facts}
        return Extraction([Entity(n, t) for n, t in sorted(entities)], facts)


class InProcess:
    def __init__(self, redis_url: str, extractor, embedder=None, **settings):
        self.settings = Settings.from_env({}, redis_url=redis_url, sim_bridging="off", **settings)
        self.memory = Memory.from_url(redis_url, tau=self.settings.effective_tau)
        self.tenant = f"ip-{uuid.uuid4().hex[:10]}"
        self.sent: list[Outgoing] = []
        self.queue: deque[Outgoing] = deque()
        self.pipeline = Pipeline(self.settings, self.memory, self._send, embedder or DigitBlindEmbedder(), extractor)

    async def _send(self, item: Outgoing) -> None:
        self.sent.append(item)
        self.queue.append(item)

    async def publish(self, doc_id: str, text: str, **fields) -> None:
        await self.deliver("documents", doc_id.encode(), encode(Document(self.tenant, doc_id, text, **fields)))

    async def deliver(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        await self.pipeline.process(topic, key, value)
        await self.drain()

    async def drain(self) -> None:
        while self.queue:
            item = self.queue.popleft()
            if item.topic in Pipeline.RECORDS:
                await self.pipeline.process(item.topic, item.key.encode(), item.value)

    def events(self) -> list[dict]:
        return [json.loads(o.value) for o in self.sent if o.topic == "indexed-facts"]

    def dead_letters(self) -> list[dict]:
        return [json.loads(o.value) for o in self.sent if o.topic == "dlq"]

    async def facts(self) -> dict[str, dict]:
        ids = await self.memory.scan_ids(self.tenant, "facts")
        return {fid: f for fid, f in zip(ids, await self.memory.facts(self.tenant, ids)) if f}

    async def close(self) -> None:
        await self.memory.close()
