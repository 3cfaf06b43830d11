"""The indexing stages, independent of faust: chunker, A_ext, A_det, A_res, each handling its
messages through the shared envelope (workers.envelope: decode, retry, dead-letter, once-marks).
"""

from __future__ import annotations

from dataclasses import replace

from store import Memory
from store.facts import Fact, Lifecycle
from store.keys import entity_node, passage_node
from topics import CandidateFact, Chunk, ConflictSet, Document
from workers.algorithms.chunking import chunk_text
from workers.models.extraction import Entity, drop_unnamed
from workers.models.llm import LLMError, MalformedOutput
from workers.algorithms.normalize import content_hash, entity_id, fact_id, relation_name, schema_id
from workers.envelope import Emit, Envelope, Handler, PermanentError, Send
from workers.stages.context import StageContext
from workers.stages.detector import DetectorStage, candidate_key
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
            "chunks": self.on_chunk,
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

    # ---- A_ext ---------------------------------------------------------------------------
    async def on_chunk(self, chunk: Chunk) -> None:
        tenant = chunk.tenant

        async def decide(pipe):
            try:
                # whatever the extractor, a name without letters or digits has no entity id
                extraction = drop_unnamed(await self.extractor.extract(chunk.text), f"chunk {chunk.chunk_id}")
            except MalformedOutput as exc:
                raise PermanentError(f"{exc}; raw output: {exc.raw[:4000]}") from None
            except LLMError as exc:
                raise PermanentError(str(exc)) from None
            names = [e.name for e in extraction.entities] + [n for t in extraction.facts for n in (t.head, t.tail)]
            canonical = await self.memory.resolve_aliases(tenant, sorted({entity_id(n) for n in names}))
            entities = {canonical[entity_id(e.name)]: e for e in extraction.entities}
            facts = []
            for triple in extraction.facts:
                head_id, tail_id, relation = canonical[entity_id(triple.head)], canonical[entity_id(triple.tail)], relation_name(triple.relation)
                if head_id == tail_id:
                    continue
                triple = replace(triple, relation=relation)  # extractors may share their results (replay)
                facts.append((triple, head_id, tail_id))
                entities.setdefault(head_id, Entity(triple.head, triple.head_type))
                entities.setdefault(tail_id, Entity(triple.tail, triple.tail_type))
            texts = [chunk.text] + [e.name for e in entities.values()]
            texts += [f"{t.head} {t.relation} {t.tail}" for t, _, _ in facts]
            texts += [f"{t.head_type} {t.relation} {t.tail_type}" for t, _, _ in facts]
            vectors = await self.embedder.embed(texts)
            ent_vecs = vectors[1 : 1 + len(entities)]
            fact_vecs = vectors[1 + len(entities) : 1 + len(entities) + len(facts)]
            schema_vecs = vectors[1 + len(entities) + len(facts) :]

            await self.memory.ensure_indexes(tenant)
            self.memory.stage_passage(pipe, tenant, chunk, sorted(entities), vectors[0])
            version = await self.memory.bump_graph_version(tenant) if entities else 0
            for (eid, ent), vec in zip(entities.items(), ent_vecs):
                self.memory.stage_entity(pipe, tenant, eid, ent.name, ent.type, vec, chunk.chunk_id)
                self.memory.stage_edge(pipe, tenant, version, entity_node(eid), passage_node(chunk.chunk_id), 1.0, "passage")
            outbox = []
            for index, ((triple, head_id, tail_id), fvec, svec) in enumerate(zip(facts, fact_vecs, schema_vecs)):
                sid = schema_id(triple.head_type, triple.relation, triple.tail_type)
                fid = fact_id(head_id, triple.relation, tail_id)
                self.memory.stage_schema(pipe, tenant, sid, triple.head_type, triple.relation, triple.tail_type, svec, chunk.chunk_id)
                self.memory.stage_new_fact(pipe, tenant, Fact.extracted(fid, triple, head_id, tail_id, sid), fvec)
                candidate = CandidateFact(tenant, chunk.chunk_id, chunk.doc_id, triple, index, len(facts), head_id, tail_id, self.extractor.name)
                outbox.append(Emit("candidate-facts", candidate_key(head_id, triple.relation, tail_id), candidate))
            if not facts:
                self.memory.stage_chunk_done(pipe, tenant, chunk.chunk_id)
            return outbox

        await self._once(tenant, f"ext:{chunk.chunk_id}", decide)
        if self.settings.on("sim_bridging"):
            await self._bridge_similar(tenant, chunk.chunk_id)

    async def _bridge_similar(self, tenant: str, chunk_id: str) -> None:
        """Each entity, once, links to the known entities it is close to (cosine ≥ sim_edge).
        Run after the chunk's commit: of two chunks extracted concurrently, the later committer
        always sees the other's entities. Also run on redelivery, so a crash loses no edge."""
        for eid in await self.memory.passage_entities(tenant, chunk_id):
            if await self.memory.similarity_bridged(tenant, eid):
                continue
            vector = await self.memory.entity_vector(tenant, eid)
            hits = [h for h in await self.memory.knn(tenant, "entities", vector, 10, ["name"]) if h.id != eid and h.score >= self.settings.sim_edge]
            pipe = self.memory.pipeline()
            if hits:
                version = await self.memory.bump_graph_version(tenant)
                for hit in hits:
                    self.memory.stage_edge(pipe, tenant, version, entity_node(eid), entity_node(hit.id), round(hit.score, 4), "similar")
            self.memory.stage_similarity_bridged(pipe, tenant, eid)
            await pipe.execute()
