"""The indexing stages, independent of faust: chunker, A_ext, A_det, A_res, each handling its
messages through the shared envelope (workers.envelope: decode, retry, dead-letter, once-marks).
"""

from __future__ import annotations

from store import Memory
from store.facts import Lifecycle
from topics import CandidateFact, Chunk, ConflictSet, Document
from workers.algorithms.chunking import chunk_text
from workers.algorithms.normalize import content_hash
from workers.envelope import Emit, Envelope, Handler, Send
from workers.stages.context import StageContext
from workers.stages.detector import DetectorStage
from workers.stages.extractor import ExtractorStage
from workers.stages.resolver import ResolverStage
from workers.settings import Settings


class Pipeline:
    RECORDS = {"documents": Document, "chunks": Chunk, "candidate-facts": CandidateFact, "conflict-sets": ConflictSet}

    def __init__(self, settings: Settings, memory: Memory, send: Send, embedder=None, extractor=None, resolver_llm=None):
        self.settings = settings
        self.memory = memory
        self.embedder = embedder
        self.extractor = extractor
        self.resolver_llm = resolver_llm  # None: the deterministic evidence policy
        self.lifecycle = Lifecycle(memory)
        self.handlers: dict[str, Handler] = {}  # filled below: the stages run through the envelope's `once`
        self.envelope = Envelope(settings=settings, memory=memory, send=send, records=self.RECORDS, handlers=self.handlers)
        context = StageContext(
            settings=settings, memory=memory, lifecycle=self.lifecycle, once=self.envelope.once,
            embedder=embedder, extractor=extractor, resolver_llm=resolver_llm,
        )
        self.handlers.update({
            "documents": self.on_document,
            "chunks": ExtractorStage(context).handle,
            "candidate-facts": DetectorStage(context).handle,
            "conflict-sets": ResolverStage(context).handle,
        })

    @property
    def send(self) -> Send:
        return self.envelope.send

    @send.setter
    def send(self, send: Send) -> None:  # tests swap the broker's send
        self.envelope.send = send

    async def process(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None, offset: int | None = None) -> None:
        await self.envelope.process(topic, key, value, partition, offset)

    async def publish_unsent_outboxes(self, grace_s: float = 30.0) -> int:
        return await self.envelope.publish_unsent_outboxes(grace_s)

    async def _once(self, tenant, mark, decide, finishes=None) -> None:
        await self.envelope.once(tenant, mark, decide, finishes)

    # ---- chunker -------------------------------------------------------------------------
    async def on_document(self, doc: Document) -> None:
        doc_hash = content_hash(doc.text)
        pieces = chunk_text(doc.text, self.settings.chunk_tokens, self.settings.chunk_overlap)
        # Outside the once-mark: publishing an earlier text again makes it current again.
        pipe = self.memory.pipeline()
        self.memory.stage_document(pipe, doc.tenant, doc.doc_id, doc_hash, doc.version, [p.chunk_id for p in pieces])
        await pipe.execute()

        async def decide(pipe):
            return [
                Emit("chunks", doc.doc_id, Chunk(doc.tenant, p.chunk_id, doc.doc_id, p.seq, len(pieces), p.text, doc.version, doc_hash))
                for p in pieces
            ]

        await self._once(doc.tenant, f"doc:{doc.doc_id}:{doc_hash[:32]}:{doc.version}", decide)
