"""The composition root of the indexing stages, independent of faust: the envelope
(workers.envelope: decode, retry, dead-letter, once-marks, outbox) wired to one stage per input
topic, each a module of workers/stages built from one StageContext. Which stage consumes which
topic, and what each produces, is the stage graph's (topics.graph.STAGE_GRAPH; tests/test_stage_graph.py
checks this module against it); with their done marks:

    topic in         stage module            done mark                             topics out
    ---------------  ----------------------  ------------------------------------  ----------------------------
    documents        stages/chunker.py       doc:{doc id}:{text hash}:{version}    chunks, indexed-facts (retired,
                                             del:{doc id}:… (a tombstone)          purged), conflict-sets
                                             erase:{doc id}:… (an erasure)
    chunks           stages/extractor.py     ext:{chunk id}                        candidate-facts
    candidate-facts  stages/detector.py      det:{chunk id}:{fact index}           indexed-facts, conflict-sets,
                                             act:{fact id}:{chunk id} (promoted)   candidate-facts (promotions)
    conflict-sets    stages/resolver.py      work:{hash of its work id}            indexed-facts, conflict-sets

Not fed by a topic: the expiry sweep (stages/expiry.py, mark exp:{fact id}:{expires_at}:{activated_at})
expires facts whose TTL lapsed — `expire_lapsed`, run on a timer by the resolver workers — with events on
indexed-facts and groups to decide again on conflict-sets.

Any stage: a message that cannot be decoded or keeps failing goes to `dlq` (the envelope).
workers/app.py runs each role's agents over `Pipeline.process`; ops/testing.py's
InProcessBroker (the benchmarks' and tests' broker) routes the outgoing messages to the next
stage itself.
"""

from __future__ import annotations

from typing import Any

from store.base import MemoryStore
from store.facts import Lifecycle
from topics import CandidateFact, Chunk, ConflictSet
from topics.graph import CONSUMES, STAGE_GRAPH
from topics.records import Record
from workers.envelope import Envelope, Route, Send, SendMany, decode_document, record_decoder
from workers.models.protocols import ChatModel, Embedder, Extractor
from workers.settings import Settings
from workers.stages.chunker import ChunkerStage
from workers.stages.context import StageContext
from workers.stages.detector import DetectorStage
from workers.stages.expiry import ExpirySweep
from workers.stages.extractor import ExtractorStage
from workers.stages.resolver import ResolverStage


class Pipeline:
    # the records of the topics a stage consumes
    RECORDS: dict[str, type[Record]] = {spec.topic: spec.record for spec in STAGE_GRAPH if spec.consumers}

    def __init__(
        self,
        settings: Settings,
        memory: MemoryStore,
        send: Send,
        embedder: Embedder | None = None,
        extractor: Extractor | None = None,
        resolver_llm: ChatModel | None = None,
        send_many: SendMany | None = None,
    ):
        self.settings = settings
        self.memory = memory
        self.embedder = embedder
        self.extractor = extractor
        self.resolver_llm = resolver_llm  # None: the deterministic evidence policy
        # filled below: the stages run through the envelope's `once`. Any: each Route is checked as it is built
        self.routes: dict[str, Route[Any]] = {}
        self.envelope = Envelope(settings=settings, memory=memory, send=send, routes=self.routes, send_many=send_many)
        context = StageContext(
            settings=settings,
            memory=memory,
            lifecycle=Lifecycle(memory),
            once=self.envelope.once,
            embedder=embedder,
            extractor=extractor,
            resolver_llm=resolver_llm,
        )
        self.expiry = ExpirySweep(context)
        extractor_stage, resolver_stage = ExtractorStage(context), ResolverStage(context)
        chunks, conflict_sets = record_decoder(Chunk), record_decoder(ConflictSet)
        stages: dict[str, Route[Any]] = {  # by stage: the topic each consumes is the stage graph's
            "chunker": Route(decode_document, ChunkerStage(context).handle),
            "extractor": Route(chunks, extractor_stage.handle),
            "detector": Route(record_decoder(CandidateFact), DetectorStage(context).handle),
            "resolver": Route(conflict_sets, resolver_stage.handle),
        }
        self.routes.update({CONSUMES[stage]: route for stage, route in stages.items()})
        # read-ahead (workers/app.py): the model calls a message will make, started early
        self.prefetchers: dict[str, Route[Any]] = {CONSUMES["extractor"]: Route(chunks, extractor_stage.prefetch)}
        if resolver_llm is not None:  # the evidence policy calls no model: nothing to read ahead
            self.prefetchers[CONSUMES["resolver"]] = Route(conflict_sets, resolver_stage.prefetch)

    async def process(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        """Handle one message to the end (Envelope.process); returns only then, so the caller may ack."""
        await self.envelope.process(topic, key, value, partition, offset)

    def read_ahead(self, topic: str) -> int:
        """How many messages of `topic` an agent may hold at once (workers/app.py, one lane per
        partition): the LLM's concurrency where a stage has model calls to start early, else
        the partition count (one message per partition in flight, as that many processes would)."""
        return max(1, self.settings.llm_concurrency if topic in self.prefetchers else self.settings.partitions)

    async def prefetch(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Start the model calls `process` will make for this message, so their answers wait in
        the models' caches (the LLM cache, the extractor's memo, the embedding cache); no other
        effect. A message that does not decode is left to `process`, which dead-letters it."""
        prefetch = self.prefetchers.get(topic)
        if prefetch is None:
            return
        try:
            record = prefetch.decode(value, None, self.settings.max_text_bytes)
        except Exception:
            return
        await prefetch.handle(record)

    async def expire_lapsed(self, now: float | None = None, tenants: list[str] | None = None) -> int:
        """Expire the facts whose TTL lapsed by `now` (workers.stages.expiry) in `tenants`
        (default: all); returns how many."""
        return await self.expiry.run(now, tenants)

    async def publish_unsent_outboxes(self, grace_s: float = 30.0) -> int:
        return await self.envelope.publish_unsent_outboxes(grace_s)
