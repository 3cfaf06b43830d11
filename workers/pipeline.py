"""The indexing stages, independent of faust: chunker, A_ext, A_det, A_res, each handling its
messages through the shared envelope (workers.envelope: decode, retry, dead-letter, once-marks).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from store import Hit, Memory
from store.facts import Fact, Lifecycle
from store.keys import entity_node, passage_node
from topics import CandidateFact, Chunk, ConflictSet, Document
from workers.algorithms.chunking import chunk_text
from workers.models.extraction import Entity, drop_unnamed
from workers.models.llm import LLMError, MalformedOutput
from workers.models.resolution import RESOLUTION_SCHEMA, parse_resolution, resolution_messages
from workers.algorithms.normalize import content_hash, entity_id, fact_id, relation_name, schema_id
from workers.algorithms.policy import CONTAINMENT_RELATIONS, MIN_MULTI_HEADS, MULTI_HEAD_SHARE, SYMMETRIC_RELATIONS, Decision, GroupFact, adjudicate, is_multi_valued
from workers.envelope import Emit, Envelope, PermanentError, Send, event_message, spawned_work_ids
from workers.settings import Settings

log = logging.getLogger(__name__)

MULTI_RULE = (MIN_MULTI_HEADS, MULTI_HEAD_SHARE)  # decided in Redis with the group join (Memory.join_group)


class Pipeline:
    RECORDS = {"documents": Document, "chunks": Chunk, "candidate-facts": CandidateFact, "conflict-sets": ConflictSet}

    def __init__(self, settings: Settings, memory: Memory, send: Send, embedder=None, extractor=None, resolver_llm=None):
        self.settings = settings
        self.memory = memory
        self.envelope = Envelope(settings=settings, memory=memory, send=send, records=self.RECORDS, handlers={})
        self.embedder = embedder
        self.extractor = extractor
        self.resolver_llm = resolver_llm  # None: the deterministic evidence policy
        self.lifecycle = Lifecycle(memory)
        self.handlers = self.envelope.handlers = {
            "documents": self.on_document,
            "chunks": self.on_chunk,
            "candidate-facts": self.on_candidate,
            "conflict-sets": self.on_conflict_set,
        }

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
                return self._finish(pipe, cand, None, [self._conflict_set(cand, "duplicate", fact, "same fact")])
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
                    return [self._conflict_set(cand, "duplicate", other, why)]
                # this fact is the canonical one: it takes the twin's place, so the memory ends the
                # same whichever of the two arrived first
                merged = self.lifecycle.merge(pipe, tenant, fact, set(other.passage_ids), await self.memory.bump_graph_version(tenant), why, source=other)
                taken_over = [event_message(merged)] if merged else []
                if await self.memory.group_size(tenant, other.head_id, other.relation) >= 2:  # its group lost a member
                    taken_over.append(self._adjudication(cand, other.head_id, other.relation, f"{other.id} merged into {fact.id}", f"merged-{other.id}"))
            joined = await self.memory.join_group(tenant, fact.head_id, relation, fact.tail_id, fid, _detection_mark(cand, fid), MULTI_RULE)
            outbox = []
            if joined.flipped:
                # the relation's cardinality flipped: every group with several tails is decided again
                for head in await self.memory.relation_multi_heads(tenant, relation):
                    if head != fact.head_id:
                        outbox.append(self._adjudication(cand, head, relation, f"relation '{relation}' is now {joined.verdict}-valued", "cardinality"))
            outbox = taken_over + outbox
            if joined.size >= 2 and joined.verdict == "single":
                return outbox + [self._adjudication(cand, fact.head_id, relation, f"single-valued relation '{relation}' with {joined.size} tails", "group")]
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

    def _conflict_set(self, cand: CandidateFact, kind: str, target: Fact, reason: str) -> Emit:
        # keyed by the target's head: the resolver decides the target's group, and one head's
        # groups are decided on one partition (a symmetric twin's head is the candidate's tail)
        work = f"res:{kind}:{target.id}:{cand.passage_id}:{cand.fact_index}:{int(cand.activation)}"
        record = ConflictSet(cand.tenant, kind, cand, target.id, [target.id], [cand.passage_id], work_id=work, reason=reason)
        return Emit("conflict-sets", target.head_id, record)

    def _adjudication(self, cand: CandidateFact, head_id: str, relation: str, reason: str, cause: str) -> Emit:
        # the cause keeps work ids apart when one fact triggers a group for several reasons
        work = f"adj:{cause}:{head_id}|{relation}:{cand.passage_id}:{cand.fact_index}:{int(cand.activation)}"
        probe = replace(cand, head_id=head_id, fact=replace(cand.fact, relation=relation))
        record = ConflictSet(cand.tenant, "adjudicate", probe, "", [], [cand.passage_id], work_id=work, reason=reason)
        return Emit("conflict-sets", head_id, record)

    async def _activate(self, pipe, cand: CandidateFact, fact: Fact) -> list[Emit]:
        version = await self.memory.bump_graph_version(cand.tenant)
        activated = self.lifecycle.activate(pipe, cand.tenant, fact, version)
        return [event_message(activated)] + await self._containment_changed(cand, fact)

    async def _containment_changed(self, cand: CandidateFact, fact: Fact) -> list[Emit]:
        """A new containment fact (X located in Y) can turn a mutual exclusion between tails X
        and Y into a granularity qualification: decide the groups with those tails again."""
        if not self.settings.on("conflicts") or fact.relation not in CONTAINMENT_RELATIONS:
            return []
        outbox, seen = [], set()
        for entity in (fact.head_id, fact.tail_id):
            for other in await self.memory.facts(cand.tenant, await self.memory.facts_with_tail(cand.tenant, entity)):
                group = (other.head_id, other.relation) if other else None
                if group and group not in seen and await self.memory.group_size(cand.tenant, *group) >= 2:
                    seen.add(group)
                    outbox.append(self._adjudication(cand, *group, f"containment {fact.head_id} {fact.relation} {fact.tail_id} is active", f"containment-{fact.head_id}"))
        return outbox

    # ---- A_res -----------------------------------------------------------------------------------
    async def on_conflict_set(self, conflict: ConflictSet) -> None:
        cand, tenant = conflict.candidate, conflict.tenant

        async def decide(pipe):
            if conflict.kind == "duplicate":
                outbox = await self._merge(pipe, conflict)
            else:
                outbox = await self._adjudicate(pipe, cand, cand.head_id, cand.fact.relation, conflict.reason)
            self.memory.stage_spawn(pipe, tenant, cand.passage_id, spawned_work_ids(outbox))
            self.memory.stage_work_done(pipe, tenant, cand.passage_id, conflict.work_id, cand.chunk_fact_count)
            return outbox

        finishes = (cand.passage_id, conflict.work_id, cand.chunk_fact_count) if conflict.work_id else None
        await self._once(tenant, conflict.work_id or f"res:{cand.passage_id}:{cand.fact_index}", decide, finishes)

    async def _merge(self, pipe, conflict: ConflictSet) -> list[Emit]:
        cand, tenant, target_id = conflict.candidate, conflict.tenant, conflict.fact_id
        target = await self.memory.fact(tenant, target_id)
        while target is not None and target.status == "merged":  # follow it to the surviving fact
            target = await self.memory.fact(tenant, target.merged_into)
        if target is None:
            raise PermanentError(f"conflict set names fact {conflict.fact_id}, which is not in memory")
        source_id = fact_id(cand.head_id, cand.fact.relation, cand.tail_id)
        source = None if source_id == target.id else await self.memory.fact(tenant, source_id)
        own = set() if cand.activation else {cand.passage_id}  # a promotion's passage_id is the promoting chunk
        gained = (own | set(source.passage_ids if source else ())) - set(target.passage_ids)
        merged = self.lifecycle.merge(pipe, tenant, target, gained, await self.memory.graph_version(tenant), conflict.reason, source)
        if merged is None:
            return []
        outbox = [event_message(merged)]
        # more support can change how the target's group is decided
        if self.settings.on("conflicts") and await self.memory.group_size(tenant, target.head_id, target.relation) >= 2:
            outbox += await self._adjudicate(pipe, cand, target.head_id, target.relation, f"{target.id} gained support", extra={target.id: gained})
        return outbox

    async def _adjudicate(self, pipe, cand: CandidateFact, head_id: str, relation: str, why: str, extra: dict | None = None) -> list[Emit]:
        """Decide a (head, relation) group from its content and apply the difference."""
        tenant = cand.tenant
        members = await self.memory.group(tenant, head_id, relation)
        facts = {fid: f for fid, f in zip(members, await self.memory.facts(tenant, members)) if f and f.status != "merged"}
        if not facts:
            return []
        for fact in facts.values():  # the decision rests on every member's status, not only the ones it changes
            self.memory.expect_status(pipe, tenant, fact.id, fact.status)
        for fid, pids in (extra or {}).items():  # support staged in this transaction, not yet visible
            if fid in facts:
                facts[fid].passage_ids = sorted(set(facts[fid].passage_ids) | pids)
        heads, multi = await self.memory.relation_counts(tenant, relation)
        if is_multi_valued(heads, multi) or len(facts) < 2:  # decided without reading any evidence
            decisions = {fid: Decision("active", "", "multi-valued relation" if len(facts) > 1 else "no conflict") for fid in facts}
            return await self._apply(pipe, cand, facts, decisions, why)
        group = [await self._group_fact(tenant, fid, f) for fid, f in facts.items()]
        if self.resolver_llm is not None:
            decisions = await self._llm_decisions(tenant, group, facts)
        else:
            decisions = await self._rules_decisions(tenant, group)
        return await self._apply(pipe, cand, facts, decisions, why)

    async def _rules_decisions(self, tenant: str, group: list[GroupFact]) -> dict:
        tails = {g.tail_id for g in group}
        contains = {(a, b): await self.memory.broader(tenant, a, b, CONTAINMENT_RELATIONS) for a in tails for b in tails if a != b}
        return adjudicate(group, lambda a, b: contains.get((a, b), False))

    async def _llm_decisions(self, tenant: str, group: list[GroupFact], facts: dict) -> dict:
        """The LLM reads every fact's evidence passages and names an action per fact. If it
        keeps failing, the deterministic policy decides (logged), so no group stays open."""
        passage_ids = sorted({pid for g in group for pid in g.passage_ids})
        passages = {p["id"]: p["text"] for p in await self.memory.passages(tenant, passage_ids) if p}
        some = facts[group[0].id]
        messages = resolution_messages(some.head, some.relation, [(g, facts[g.id].text or f"{facts[g.id].head} {facts[g.id].relation} {facts[g.id].tail}") for g in group], passages)
        try:
            return await self.resolver_llm.structured("resolve", messages, "resolution", RESOLUTION_SCHEMA, lambda data: parse_resolution(data, group, set(passages)))
        except (MalformedOutput, LLMError) as exc:
            log.error("resolve: LLM resolver failed (%s); the evidence policy decides this group", exc)
            return await self._rules_decisions(tenant, group)

    async def _group_fact(self, tenant: str, fid: str, fact: Fact) -> GroupFact:
        passages = [p for p in await self.memory.passages(tenant, fact.passage_ids) if p]
        return GroupFact(
            fid, fact.tail_id, len(fact.passage_ids), max((p["doc_version"] for p in passages), default=1),
            fact.created_at or 0.0, fact.valid_from, fact.valid_to, tuple(fact.passage_ids),
        )

    async def _apply(self, pipe, cand: CandidateFact, facts: dict[str, Fact], decisions: dict, why: str) -> list[Emit]:
        """Stage the transitions that take each fact of a group to its decision."""
        tenant, outbox, version = cand.tenant, [], None
        for fid in sorted(decisions):
            fact, decision = facts[fid], decisions[fid]
            if fact.status == decision.status and fact.qualifiers == decision.qualifiers:
                continue
            version = version or await self.memory.bump_graph_version(tenant)
            reason, told = f"{decision.reason}; {why}", f"{decision.kind or 'no conflict'}: {decision.reason}"
            if decision.status == "active":
                was_active, old_qualifiers = fact.status == "active", fact.qualifiers
                if not was_active:
                    outbox.append(event_message(self.lifecycle.activate(pipe, tenant, fact, version, decision.qualifiers, reason, decision.evidence, told)))
                    outbox += await self._containment_changed(cand, fact)
                if decision.qualifiers != old_qualifiers:
                    outbox.append(event_message(self.lifecycle.qualify(pipe, tenant, fact, version, decision.qualifiers, reason, decision.evidence, told)))
            elif decision.status == "invalid" and fact.status != "invalid":
                outbox.append(event_message(self.lifecycle.invalidate(pipe, tenant, fact, version, decision.qualifiers, reason, decision.evidence, told)))
            else:
                self.lifecycle.requalify_silently(pipe, tenant, fact, decision.qualifiers, reason)
        return outbox


def candidate_key(head_id: str, relation: str, tail_id: str) -> str:
    """The partition key of a candidate fact: its head, so one head's facts are detected in
    order — but the smaller entity of a symmetric pair, so "A married B" and "B married A" are
    detected one after the other, never both activated at once on two partitions."""
    return min(head_id, tail_id) if relation in SYMMETRIC_RELATIONS else head_id


def _detection_mark(cand: CandidateFact, fid: str) -> str:
    return f"act:{fid}:{cand.passage_id}" if cand.activation else f"det:{cand.passage_id}:{cand.fact_index}"
