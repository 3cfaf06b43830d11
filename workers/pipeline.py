"""The indexing stages, independent of faust: chunker, A_ext, A_det, A_res, each handling its
messages through the shared envelope (workers.envelope: decode, retry, dead-letter, once-marks).
"""

from __future__ import annotations

from dataclasses import replace

from store import Hit, Memory
from store.facts import Fact, Lifecycle
from store.keys import entity_node, passage_node
from topics import CandidateFact, Chunk, ConflictSet, Document
from workers.algorithms.chunking import chunk_text
from workers.models.extraction import Entity, drop_unnamed
from workers.models.llm import LLMError, MalformedOutput
from workers.algorithms.normalize import content_hash, entity_id, fact_id, relation_name, schema_id
from workers.algorithms.policy import MIN_MULTI_HEADS, MULTI_HEAD_SHARE, SYMMETRIC_RELATIONS
from workers.envelope import Emit, Envelope, Handler, PermanentError, Send, event_message, spawned_work_ids
from workers.stages.context import StageContext
from workers.stages.resolver import ResolverStage, adjudication, containment_changed, duplicate
from workers.settings import Settings

MULTI_RULE = (MIN_MULTI_HEADS, MULTI_HEAD_SHARE)  # decided in Redis with the group join (Memory.join_group)


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
            "candidate-facts": self.on_candidate,
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

    # ---- A_det ---------------------------------------------------------------------------------
    async def on_candidate(self, cand: CandidateFact) -> None:
        tenant, fid = cand.tenant, fact_id(cand.head_id, cand.fact.relation, cand.tail_id)
        mark = _detection_mark(cand, fid)

        async def decide(pipe):
            fact = await self.memory.fact(tenant, fid)
            if fact is None:
                raise PermanentError(f"candidate fact {fid} has no extracted record in memory (publish documents, not candidate facts)")
            if cand.activation:  # a promoted pending fact
                outbox = await self._admit(pipe, cand, fact) if fact.status == "pending" else []
                return self._finish(pipe, cand, cand.work_id, outbox)
            if cand.passage_id in fact.passage_ids and fact.status != "new":
                return self._finish(pipe, cand, None, [])  # the same fact twice in one passage
            if fact.status in ("active", "invalid", "merged"):
                # a known fact gains support: merge the provenance (and re-adjudicate) in the resolver
                return self._finish(pipe, cand, None, [duplicate(cand, fact, "same fact")])
            schema = schema_id(cand.fact.head_type, cand.fact.relation, cand.fact.tail_type)
            if self.settings.on("schema_filter") and await self.memory.hold_pending(tenant, schema, fid, cand.passage_id):
                return self._finish(pipe, cand, None, [])  # candidate schema: pending, no event
            outbox = await self._promote_pending(pipe, cand)
            return self._finish(pipe, cand, None, outbox + await self._admit(pipe, cand, fact))

        await self._once(tenant, mark, decide, (cand.passage_id, cand.work_id, cand.chunk_fact_count) if cand.activation and cand.work_id else None)

    def _finish(self, pipe, cand: CandidateFact, finished_work: str | None, outbox: list[Emit]) -> list[Emit]:
        """Chunk progress: the work this message spawned is outstanding; its own fact (or its
        own work item) is done."""
        self.memory.stage_spawn(pipe, cand.tenant, cand.passage_id, spawned_work_ids(outbox))
        if finished_work is None:
            self.memory.stage_fact_done(pipe, cand.tenant, cand.passage_id, cand.fact_index, cand.chunk_fact_count)
        else:
            self.memory.stage_work_done(pipe, cand.tenant, cand.passage_id, finished_work, cand.chunk_fact_count)
        return outbox

    async def _promote_pending(self, pipe, cand: CandidateFact) -> list[Emit]:
        """The schema is stable: every fact parked under it goes back onto candidate-facts
        (keyed by its own head) to be activated."""
        schema = schema_id(cand.fact.head_type, cand.fact.relation, cand.fact.tail_type)
        parked = await self.memory.pending_facts(cand.tenant, schema)
        if not parked:
            return []
        self.memory.stage_unpend(pipe, cand.tenant, schema, parked)
        outbox = []
        for pid, fact in zip(parked, await self.memory.facts(cand.tenant, parked)):
            if fact is None or fact.status != "pending":
                continue
            promoted = CandidateFact(
                cand.tenant, cand.passage_id, cand.doc_id, fact.triple(), cand.fact_index, cand.chunk_fact_count,
                fact.head_id, fact.tail_id, "promotion", activation=True, work_id=f"act:{pid}",
            )
            outbox.append(Emit("candidate-facts", candidate_key(fact.head_id, fact.relation, fact.tail_id), promoted))
        return outbox

    async def _admit(self, pipe, cand: CandidateFact, fact: Fact) -> list[Emit]:
        """A fact passed the τ gate: detect conflicts, then activate it or hand it to A_res."""
        tenant, relation, fid = cand.tenant, fact.relation, fact.id
        if self.settings.on("type_bridging"):  # its schema is stable: its entities join their types
            version = await self.memory.bump_graph_version(tenant)
            self.memory.stage_type_member(pipe, tenant, version, entity_node(fact.head_id), fact.head_type)
            self.memory.stage_type_member(pipe, tenant, version, entity_node(fact.tail_id), fact.tail_type)
        support = None if cand.activation else cand.passage_id  # a promotion adds no passage
        if support:
            self.memory.stage_fact_passage(pipe, tenant, fid, support)
            fact.passage_ids = sorted(set(fact.passage_ids) | {support})
        if self.settings.on("conflicts"):
            taken_over = []
            twin = await self._active_twin(tenant, fact)
            if twin is not None:
                other, why = twin
                if other.id < fact.id:  # the canonical fact (smaller id) is in memory: merge into it
                    return [duplicate(cand, other, why)]
                # this fact is the canonical one: it takes the twin's place, so the memory ends the
                # same whichever of the two arrived first
                merged = self.lifecycle.merge(pipe, tenant, fact, set(other.passage_ids), await self.memory.bump_graph_version(tenant), why, source=other)
                taken_over = [event_message(merged)] if merged else []
                if await self.memory.group_size(tenant, other.head_id, other.relation) >= 2:  # its group lost a member
                    taken_over.append(adjudication(cand, other.head_id, other.relation, f"{other.id} merged into {fact.id}", f"merged-{other.id}"))
            joined = await self.memory.join_group(tenant, fact.head_id, relation, fact.tail_id, fid, _detection_mark(cand, fid), MULTI_RULE)
            outbox = []
            if joined.flipped:
                # the relation's cardinality flipped: every group with several tails is decided again
                for head in await self.memory.relation_multi_heads(tenant, relation):
                    if head != fact.head_id:
                        outbox.append(adjudication(cand, head, relation, f"relation '{relation}' is now {joined.verdict}-valued", "cardinality"))
            outbox = taken_over + outbox
            if joined.size >= 2 and joined.verdict == "single":
                return outbox + [adjudication(cand, fact.head_id, relation, f"single-valued relation '{relation}' with {joined.size} tails", "group")]
            return outbox + await self._activate(pipe, cand, fact)
        return await self._activate(pipe, cand, fact)

    async def _active_twin(self, tenant: str, fact: Fact) -> tuple[Fact, str] | None:
        """An active fact that is this one said otherwise — head and tail swapped under a
        symmetric relation, or a near-duplicate — and why."""
        if fact.relation in SYMMETRIC_RELATIONS:
            swapped = await self.memory.fact(tenant, fact_id(fact.tail_id, fact.relation, fact.head_id))
            if swapped and swapped.status == "active":
                return swapped, f"symmetric relation '{fact.relation}' with head and tail swapped"
        near = await self._near_duplicate(tenant, fact)
        if near:
            other = await self.memory.fact(tenant, near.id)
            if other and other.status == "active":
                return other, f"near-duplicate of {near.id} (cosine {near.score:.3f} > δ {self.settings.delta})"
        return None

    async def _near_duplicate(self, tenant: str, fact: Fact) -> Hit | None:
        """An active fact that says the same thing in other words: the same head and tail
        entities (after normalisation and aliases) with a relation whose fact embedding is
        within δ ("born in" / "native of"). Similarity only proposes: facts of different
        entities are never the same fact, whatever their cosine ("Bayezid I" / "Bayezid II",
        "1998" / "1999" — 56 of 63 similarity-only merges on a Wikipedia corpus were such)."""
        vector = await self.memory.fact_vector(tenant, fact.id)
        if vector is None:
            return None
        same_entities = {"status": "active", "head_id": fact.head_id, "tail_id": fact.tail_id}
        for hit in await self.memory.knn(tenant, "facts", vector, 4, ["head_id", "tail_id", "relation"], same_entities):
            if hit.id != fact.id and hit.score > self.settings.delta and (hit.fields["head_id"], hit.fields["tail_id"]) == (fact.head_id, fact.tail_id):
                return hit
        return None

    async def _activate(self, pipe, cand: CandidateFact, fact: Fact) -> list[Emit]:
        version = await self.memory.bump_graph_version(cand.tenant)
        activated = self.lifecycle.activate(pipe, cand.tenant, fact, version)
        return [event_message(activated)] + await containment_changed(self.settings, self.memory, cand, fact)


def candidate_key(head_id: str, relation: str, tail_id: str) -> str:
    """The partition key of a candidate fact: its head, so one head's facts are detected in
    order — but the smaller entity of a symmetric pair, so "A married B" and "B married A" are
    detected one after the other, never both activated at once on two partitions."""
    return min(head_id, tail_id) if relation in SYMMETRIC_RELATIONS else head_id


def _detection_mark(cand: CandidateFact, fid: str) -> str:
    return f"act:{fid}:{cand.passage_id}" if cand.activation else f"det:{cand.passage_id}:{cand.fact_index}"
