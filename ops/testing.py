"""memstream's public testing module (as `bytewax.testing` is bytewax's): the pipeline run in
one process, with no Kafka and, over store.in_memory.InMemoryStore, no Redis either. It offers
`InProcessBroker` and its `Delivery` (how messages are delivered), and `LocalIndexer` (the four
stages over a store and this broker). It is public: an application's tests may use it, as
memstream's own (tests/inprocess.py) and its benchmarks do.

Kafka in this process: `InProcessBroker` routes every message a stage sends on a topic some
stage consumes to that stage's handler (`Pipeline.process`), as the topics do, and keeps what
is read outside the pipeline (indexed-facts, dlq). The stages, the envelope, the store and the
query engine are the production code; only the broker is not, so runs need no services (with
store.in_memory.InMemoryStore) and, by default, are deterministic.

By default it delivers one message at a time, oldest first: the most sequential order, and the
one that does not depend on the store's round-trip times. `Delivery` makes it behave like several
partitions and consumers: a message's partition follows from its key, each partition is
delivered in order, up to `consumers` messages are in flight at once (interleaving at every Redis
round trip, as several extractors or detectors would), the next partition is chosen by a seeded
random generator, and a share of the messages can be delivered a second time (what a crash
before the ack or a rebalance does), possibly while the first delivery is still running. It can
also fail the first publish of a fact event after its commit (a broker hiccup the envelope must
retry from the committed outbox). With `keep_log` it keeps every partition's messages and hands
the stages their offsets, as Kafka does: `replay` then reads partitions again from given
offsets (a worker's recovery after Redis lost writes: workers.recovery).

`LocalIndexer` is the four stages (workers.pipeline.Pipeline) over any store and this broker
with the default delivery, for the benchmarks (`bench memory-tax`, `bench conversation`, the
round trips of `bench index --rules`); tests/inprocess.py is the tests' harness over it (one
tenant, publish and delete as the CLI does, the readers)."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import deque
from dataclasses import dataclass
from itertools import count
from typing import Awaitable, Callable, Collection, Iterable

from store import Outgoing
from store.base import MemoryStore
from topics import DeadLetter, Document, FactEvent, decode, encode
from topics.graph import CONSUMES, TOPIC_SUFFIXES
from workers.models.protocols import ChatModel, Embedder, Extractor
from workers.pipeline import Pipeline
from workers.settings import Settings

CONSUMED = frozenset(CONSUMES.values())  # the topics a stage consumes: delivered to the consumer
OUTPUTS = frozenset(TOPIC_SUFFIXES) - CONSUMED  # indexed-facts, dlq: read outside the pipeline (`memstream tail`)

# handles one message (topic, key, value, partition, offset) to the end, as Pipeline.process does
Consumer = Callable[[str, bytes | None, bytes | None, int | None, int | None], Awaitable[None]]
Lane = tuple[str, int]  # (topic, partition), or ("redelivered", n): a second delivery's own
# (arrival, topic, key, value, partition, offset): the last two None unless the broker keeps its log
Message = tuple[int, str, bytes | None, bytes | None, int | None, int | None]


@dataclass(frozen=True)
class Delivery:
    """How the broker hands messages to the stages (see the module docstring).

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
        if self.partitions == 1:
            return 0
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") % self.partitions


class InProcessBroker:
    """The topics in this process, delivering to `consumer` as `delivery` says. `logged`: the
    topics whose messages it keeps — those sent in `sent`, the deliveries of them in
    `delivered` (None: every topic; a long run keeps only what it reads). `key_prefix` is
    left out of a key before its partition is chosen (documents are keyed tenant/doc id: so a
    seed gives the same order whatever the tenant is called)."""

    def __init__(
        self,
        consumer: Consumer,
        delivery: Delivery = Delivery(),
        *,
        logged: Collection[str] | None = None,
        key_prefix: str = "",
        keep_log: bool = False,
    ):
        self.consumer = consumer
        self.delivery = delivery
        self.logged = None if logged is None else frozenset(logged)
        self.key_prefix = key_prefix
        self.sent: list[Outgoing] = []  # what the stages sent of the logged topics, in order: their contents
        self.delivered: list[
            tuple[str, str]
        ] = []  # (topic, key) of each delivery of them started, redeliveries included
        self.deliveries = 0  # deliveries started, of every topic
        self.redeliveries = 0  # of those, second deliveries of a message
        self.failed_publishes = 0  # publishes the broker failed (Delivery.fail_first_event)
        self._rng = random.Random(delivery.seed)
        self._arrival = count()
        self._lanes: dict[Lane, deque[Message]] = {}
        # (topic, partition) → its messages (key, value) in offset order, with keep_log
        self.log: dict[Lane, list[tuple[bytes | None, bytes | None]]] | None = {} if keep_log else None

    async def send(self, item: Outgoing) -> None:
        """A stage's send (the envelope's `send`): kept if its topic is logged, queued if a stage consumes it."""
        if self.delivery.fail_first_event and not self.failed_publishes and item.topic == FactEvent.TOPIC:
            self.failed_publishes += 1
            raise RuntimeError("broker hiccup after the commit")
        if self.logged is None or item.topic in self.logged:
            self.sent.append(item)
        if item.topic in CONSUMED:
            self.put(item.topic, item.key.encode(), item.value)

    def put(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Queue a message on `topic` (delivered by the next drain), on the partition of its key
        without `key_prefix`."""
        partition = self.delivery.partition((key or b"").decode(errors="replace").removeprefix(self.key_prefix))
        offset = None
        if self.log is not None:
            written = self.log.setdefault((topic, partition), [])
            offset = len(written)
            written.append((key, value))
        self._enqueue(topic, partition, key, value, offset)

    def _enqueue(self, topic: str, partition: int, key: bytes | None, value: bytes | None, offset: int | None) -> None:
        lane = self._lanes.setdefault((topic, partition), deque())
        lane.append((next(self._arrival), topic, key, value, partition if offset is not None else None, offset))

    def replay(self, starts: dict[Lane, int]) -> None:
        """Read each logged (topic, partition) in `starts` again from its offset (delivered by the
        next drain, after what waits there now), as a consumer sought back there does."""
        if self.log is None:
            raise RuntimeError("replay needs a broker that keeps its log (keep_log=True)")
        for (topic, partition), start in sorted(starts.items()):
            for offset, (key, value) in enumerate(self.log.get((topic, partition), [])[start:], start):
                self._enqueue(topic, partition, key, value, offset)

    @property
    def waiting(self) -> int:
        return sum(len(messages) for messages in self._lanes.values())

    async def deliver(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Queue one raw message (bytes as a producer sends them) and drain."""
        self.put(topic, key, value)
        await self.drain()

    async def drain(self) -> None:
        """Deliver until no message waits and none is in flight."""
        if self.delivery.consumers == 1:  # one at a time, awaited here: no task per message
            while self._lanes:
                _, message = self._take(list(self._lanes))
                await self.consumer(*message[1:])
            return
        running: dict[asyncio.Task, Lane] = {}
        try:
            while True:
                busy = set(running.values())
                ready = [lane for lane in self._lanes if lane not in busy]
                while ready and len(running) < self.delivery.consumers:
                    lane, message = self._take(ready)
                    running[asyncio.ensure_future(self.consumer(*message[1:]))] = lane
                if not running:
                    return
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                    task.result()
        finally:
            for task in running:
                task.cancel()

    def _take(self, ready: list[Lane]) -> tuple[Lane, Message]:
        """The next message of one of the `ready` lanes (that lane leaves `ready`): the oldest
        head without a seed, else a seeded choice; its redelivery queued if drawn."""
        if self.delivery.seed is None:
            lane = min(ready, key=lambda lane: self._lanes[lane][0][0])
        else:
            lane = self._rng.choice(sorted(ready, key=repr))
        ready.remove(lane)
        messages = self._lanes[lane]
        message = messages.popleft()
        _, topic, key, value, partition, offset = message
        if not messages:
            del self._lanes[lane]
        if self.delivery.redeliver and lane[0] != "redelivered" and self._rng.random() < self.delivery.redeliver:
            # a lane of its own: the copy does not wait behind its partition
            copy = (next(self._arrival), topic, key, value, partition, offset)
            self._lanes[("redelivered", next(self._arrival))] = deque([copy])
            self.redeliveries += 1
        self.deliveries += 1
        if self.logged is None or topic in self.logged:
            self.delivered.append((topic, (key or b"").decode(errors="replace")))
        return lane, message


class LocalIndexer:
    """The indexing pipeline in this process over `memory`, for the benchmarks: documents in,
    delivered oldest first until nothing waits. Of what the stages send it keeps only the fact
    events and the dead letters (a long run holds no other message)."""

    def __init__(
        self,
        settings: Settings,
        memory: MemoryStore,
        embedder: Embedder,
        extractor: Extractor,
        resolver_llm: ChatModel | None = None,
    ):
        self.memory = memory
        self.broker = InProcessBroker(
            lambda topic, key, value, partition, offset: self.pipeline.process(topic, key, value), logged=OUTPUTS
        )
        self.pipeline = Pipeline(settings, memory, self.broker.send, embedder, extractor, resolver_llm)

    @property
    def events(self) -> list[FactEvent]:
        return [decode(FactEvent, item.value) for item in self.broker.sent if item.topic == FactEvent.TOPIC]

    @property
    def dead_letters(self) -> list[bytes]:
        return [item.value for item in self.broker.sent if item.topic == DeadLetter.TOPIC]

    async def index(self, documents: Iterable[Document]) -> int:
        """Publish `documents` and deliver until nothing waits; returns the messages handled."""
        for doc in documents:
            self.broker.put(Document.TOPIC, doc.key.encode(), encode(doc))
        before = self.broker.deliveries
        await self.broker.drain()
        return self.broker.deliveries - before
