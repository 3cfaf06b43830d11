"""The indexing pipeline in this process, for the benchmarks (`bench memory-tax`, `bench
conversation`, over InMemoryStore or with --redis-url over Redis): the four stages (workers.pipeline.Pipeline) over any store,
with Kafka replaced by a queue that delivers every message oldest first. The stages, the
envelope, the store and the query engine are the production code; only the broker is not, so
runs are deterministic and need no services (with store.in_memory.InMemoryStore).

tests/inprocess.py is the tests' richer double (partitions, concurrent consumers,
redeliveries); this one is the plain FIFO a benchmark wants."""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from store import Outgoing
from store.base import MemoryStore
from topics import Document, FactEvent, decode, encode
from workers.models.protocols import ChatModel, Embedder, Extractor
from workers.pipeline import Pipeline
from workers.settings import Settings


class LocalIndexer:
    def __init__(
        self,
        settings: Settings,
        memory: MemoryStore,
        embedder: Embedder,
        extractor: Extractor,
        resolver_llm: ChatModel | None = None,
    ):
        self.memory = memory
        self.queue: deque[Outgoing] = deque()
        self.events: list[FactEvent] = []
        self.dead_letters: list[bytes] = []

        async def send(item: Outgoing) -> None:
            if item.topic in Pipeline.RECORDS:
                self.queue.append(item)
            elif item.topic == "indexed-facts":
                self.events.append(decode(FactEvent, item.value))
            elif item.topic == "dlq":
                self.dead_letters.append(item.value)

        self.pipeline = Pipeline(settings, memory, send, embedder, extractor, resolver_llm)

    async def index(self, documents: Iterable[Document], progress: Callable[[int], None] | None = None) -> int:
        """Publish `documents` and deliver until nothing waits; returns the messages handled.
        `progress(documents done)` is called after each document's own message."""
        for doc in documents:
            self.queue.append(Outgoing("documents", doc.key, encode(doc)))
        handled = done = 0
        while self.queue:
            item = self.queue.popleft()
            await self.pipeline.process(item.topic, item.key.encode("utf-8"), item.value)
            handled += 1
            if item.topic == "documents":
                done += 1
                if progress:
                    progress(done)
        return handled
