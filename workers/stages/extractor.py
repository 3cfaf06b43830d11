"""A_ext: a chunk → its passage, entities, schemas and new facts in memory, and one candidate
fact per extracted fact on `candidate-facts` (keyed for the detector: CandidateFact.key)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from store.caches import text_sha256
from store.facts import Fact
from store.lexical import passage_terms
from store.nodes import entity_node, passage_node
from store.records import HeldVector, TurnEmbedding, is_current
from topics import CandidateFact, Chunk
from topics.records import VALUE_TYPES, indexed_text_of, passage_mark
from workers import metrics
from workers.algorithms import grounding
from workers.algorithms.expiry import lapse_time, passage_ttls, turn_time
from workers.algorithms.normalize import canonical_fact, entity_id, fact_id, has_entity_id, schema_id
from workers.algorithms.turns import preceding_passage, session_turn, turn_embedded_text
from workers.derived import embedded_texts, fact_text, schema_text
from workers.envelope import Emit, PermanentError
from workers.models.embedding import EmbedderMismatch, EmbedderRefused, TenantEmbedders
from workers.models.extraction import Entity, Extraction, drop_unnamed
from workers.models.llm import LLMError, MalformedOutput
from workers.models.mentions import type_of
from workers.models.protocols import Embedder, Extractor
from workers.stages.context import Stage, StageContext, current_passage, needed

log = logging.getLogger(__name__)


def extraction_mark(chunk: Chunk) -> str:
    """Done mark: one per chunk. A chunk's id is derived from its content (a document window's:
    its text; a turn's: its document, context line and text — workers.algorithms.chunking), so
    the same content is extracted once — and once more each time a revert brings it back
    (Chunk.incarnation)."""
    return f"ext:{passage_mark(chunk.chunk_id, chunk.incarnation)}"


def with_subject(extraction: Extraction, subject: str) -> Extraction:
    """The extraction with the passage's subject (its document's title: Chunk.subject) among its
    entities — said by the document, not by the text, so no grounding applies — typed by its
    name unless the extraction typed it already (workers.algorithms.subjects)."""
    if not subject or any(entity_id(e.name) == entity_id(subject) for e in extraction.entities):
        return extraction
    return Extraction([*extraction.entities, Entity(subject, type_of(subject))], extraction.facts)


# The most entities a new entity is similarity-bridged to. Every pair at cosine ≥ sim_edge is
# joined whichever arrives first only while no entity has more such neighbours than this: with the
# 10 nearest (before), which pairs were joined depended on the order chunks arrived in, so a memory
# rebuilt from the log could lack an edge of the original (CI, tests/test_rebuild_from_log.py).
SIMILAR_NEIGHBOURS_MAX = 64
MEMO_SIZE = 1024  # extractions started by prefetch and not yet taken by handle (far above any read-ahead window)


@dataclass(frozen=True)
class Follower:
    """A passage of the next turn, indexed before this one, to embed again after it: the text it
    embeds now, its own (indexed) text, whose vector it keeps, and its lexical terms after this
    one (store.lexical.passage_terms)."""

    passage_id: str
    text: str
    own_text: str
    terms: str


@dataclass(frozen=True)
class TurnText:
    """What a chunk's passage vector embeds (ExtractorStage._turn_embedding): its text, what that
    records (a turn's: the turn before it), its own indexed text where the vector embeds more
    (the vector it gets back should that turn leave memory: OWN_VECTOR_FIELD), and the passages
    of the next turn to embed again after this one; its lexical terms follow the same turn's
    text (`preceding_text`)."""

    text: str
    embedding: TurnEmbedding = TurnEmbedding()
    own_text: str | None = None
    followers: list[Follower] = field(default_factory=list)
    preceding_text: str | None = None

    def extra_texts(self) -> list[str]:
        """What is embedded beside the chunk's own texts: its own indexed text, then each
        follower's text and own text."""
        own = [self.own_text] if self.own_text is not None else []
        return own + [t for f in self.followers for t in (f.text, f.own_text)]


class ExtractorStage(Stage):
    def __init__(self, context: StageContext):
        super().__init__(context)
        self._embedder, self._extractor = context.embedder, context.extractor
        # (chunk id, context) → its extraction
        self._memo: OrderedDict[tuple[str, str], asyncio.Task[Extraction]] = OrderedDict()
        self._tenant_embedders = (
            TenantEmbedders(self.memory, context.embedder) if context.embedder is not None else None
        )

    @property
    def embedder(self) -> Embedder:
        return needed(self._embedder, "an embedder")

    @property
    def extractor(self) -> Extractor:
        return needed(self._extractor, "an extractor")

    @property
    def tenant_embedders(self) -> TenantEmbedders:
        return needed(self._tenant_embedders, "an embedder")

    # ---- read-ahead (workers/app.py): the model calls of a chunk, started before its turn ----
    async def prefetch(self, chunk: Chunk) -> None:
        """Extract the chunk (the task waits in the memo for `handle`, its LLM answer in the LLM
        cache) and embed the texts of the raw extraction, so the window's embeddings go out in
        few large batches and land in the embedding cache. Side-effect free otherwise: handle
        still grounds, resolves aliases and embeds what it decides (a text missed here is
        embedded then). Errors are left to handle, which meets them itself."""
        try:
            extraction = await asyncio.shield(
                self._started(chunk)
            )  # a cancelled prefetch leaves the extraction to handle
        except Exception:
            return
        facts = [canonical_fact(t) for t in extraction.facts]
        names = [e.name for e in extraction.entities] + [n for t in facts for n in (t.head, t.tail)]
        turn = await self._turn_embedding(chunk)  # a turn: after the turn before it, as handle will most likely decide
        texts = dict.fromkeys(embedded_texts(turn.text, names, facts) + turn.extra_texts())
        # what the tenant holds already needs no vector (handle reads it again, aliases resolved)
        held = await self.memory.held_vectors(
            chunk.tenant,
            {entity_id(n): n for n in names if has_entity_id(n)},
            {
                fact_id(entity_id(t.head), t.relation, entity_id(t.tail)): fact_text(t)
                for t in facts
                if has_entity_id(t.head) and has_entity_id(t.tail)
            },
            {schema_id(t.head_type, t.relation, t.tail_type): schema_text(t) for t in facts},
        )
        await self.embedder.embed([t for t in texts if t not in held])

    async def _turn_embedding(self, chunk: Chunk, pipe=None) -> TurnText:
        """What the chunk's passage vector embeds: a conversation turn's indexed text followed by
        the text of the turn before it in its session, where memory holds that turn
        (workers.algorithms.turns.turn_embedded_text) — and the passages of the turn after it,
        indexed already, to embed again after this one. Turns of a session arrive on any
        partition in any order; whichever of two neighbours is indexed second embeds the later
        one after the earlier, so the vectors come out the same in every order. The decision
        expects the three turns as it read them (expect_session_turns): two neighbours indexed at
        once, the second to commit decides again and sees the first. Without `pipe` (the
        read-ahead) it reads the same and stages no expectation."""
        episode = session_turn(chunk.metadata)
        if episode is None:
            return TurnText(chunk.indexed_text)
        tenant, (session, at) = chunk.tenant, episode
        near = await self.memory.session_turns_near(tenant, session, at)
        if pipe is not None:
            self.memory.expect_session_turns(pipe, tenant, session, near.changes)
        others = [pid for _, pid in near.passages if pid != chunk.chunk_id]
        # their states read before their rows: what the decision expects of those it uses is what
        # it decided on (a retirement or an erasure after this read fails the commit)
        states = dict(zip(others, await self.memory.passage_states(tenant, others)))
        rows = {
            pid: row
            for pid, row in zip(others, await self.memory.passages(tenant, others))
            if is_current(row) and not states[pid].retired
        }

        def current(turn: int) -> list[str]:
            return [pid for t, pid in near.passages if t == turn and pid in rows]

        before = preceding_passage(current(at - 1))
        if pipe is not None and before:
            self.memory.expect_passage(pipe, tenant, before, states[before])
        preceding = rows[before]["text"] if before else None
        text = turn_embedded_text(chunk.indexed_text, preceding)
        embedding = TurnEmbedding(before, text_sha256(text)) if before else TurnEmbedding()
        own = chunk.indexed_text if before else None
        if preceding_passage(current(at) + [chunk.chunk_id]) != chunk.chunk_id:
            # another passage of this turn comes before the next one
            return TurnText(text, embedding, own, preceding_text=preceding)
        after = current(at + 1)
        stale = [
            pid
            for pid, made in zip(after, await self.memory.turn_embeddings(tenant, after))
            if made.preceded_by != chunk.chunk_id
        ]
        if pipe is not None:
            for pid in stale:
                self.memory.expect_passage(pipe, tenant, pid, states[pid])
        owns = {pid: indexed_text_of(rows[pid]["context"], rows[pid]["text"]) for pid in stale}
        followers = [
            Follower(
                pid,
                turn_embedded_text(owns[pid], chunk.text),
                owns[pid],
                passage_terms(rows[pid]["context"], rows[pid]["text"], chunk.text),
            )
            for pid in stale
        ]
        return TurnText(text, embedding, own, followers, preceding)

    def _started(self, chunk: Chunk) -> asyncio.Task[Extraction]:
        """The chunk's extraction in the memo — started now unless it is there, running or done
        well (a failed or cancelled one is asked again)."""
        key = (chunk.chunk_id, chunk.context)
        task = self._memo.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._memo[key] = asyncio.ensure_future(self.extractor.extract(chunk.text, chunk.context))
            while len(self._memo) > MEMO_SIZE:  # dropped, not cancelled: its answer still reaches the LLM cache
                self._memo.popitem(last=False)
        return task

    async def _extraction(self, chunk: Chunk) -> Extraction:
        """The chunk's extraction: the one prefetch started, else one started now (in the memo
        while it runs, so a prefetch that starts late joins it instead of asking again)."""
        task = self._started(chunk)
        try:
            return await task
        finally:
            if self._memo.get((chunk.chunk_id, chunk.context)) is task:
                del self._memo[(chunk.chunk_id, chunk.context)]

    async def handle(self, chunk: Chunk) -> None:
        tenant = chunk.tenant
        try:  # vectors of another embedder than the tenant's indexes hold would be garbage to every query
            await self.tenant_embedders.check(tenant, writing=True)
        except EmbedderMismatch as exc:
            raise PermanentError(f"chunk {chunk.chunk_id}: {exc}") from None

        async def decide(pipe) -> list[Emit]:
            if not await current_passage(self.memory, pipe, tenant, chunk.chunk_id, chunk.incarnation):
                return []  # a version retired it (or brought it back again) after this chunk was sent
            try:
                # whatever the extractor, a name without letters or digits has no entity id
                extraction = drop_unnamed(await self._extraction(chunk), f"chunk {chunk.chunk_id}")
            except MalformedOutput as exc:
                raise PermanentError(f"{exc}; raw output: {exc.raw[:4000]}") from None
            except LLMError as exc:
                raise PermanentError(str(exc)) from None
            if not getattr(self.extractor, "grounded", False):  # a model's output: only what the passage says
                extraction = await self._grounded(chunk, extraction)
            extraction = with_subject(extraction, chunk.subject)
            lapse_of, said_at = self._time_of(chunk)
            names = [e.name for e in extraction.entities] + [n for t in extraction.facts for n in (t.head, t.tail)]
            canonical = await self.memory.resolve_aliases(tenant, sorted({entity_id(n) for n in names}))
            entities = {canonical[entity_id(e.name)]: e for e in extraction.entities}
            facts = []
            for triple in extraction.facts:
                triple = canonical_fact(triple)  # a new Triple: extractors may share their results (replay)
                head_id, tail_id = canonical[entity_id(triple.head)], canonical[entity_id(triple.tail)]
                if head_id == tail_id:
                    continue
                if said_at and not triple.valid_from and not triple.valid_to:  # a turn's fact holds from the turn on
                    triple = replace(triple, valid_from=said_at)
                facts.append((triple, head_id, tail_id))
                entities.setdefault(head_id, Entity(triple.head, triple.head_type))
                entities.setdefault(tail_id, Entity(triple.tail, triple.tail_type))
            # a text whose vector a record of the tenant holds is not embedded again: that vector is written
            held = await self.memory.held_vectors(
                tenant,
                {eid: e.name for eid, e in entities.items()},
                {fact_id(head_id, t.relation, tail_id): fact_text(t) for t, head_id, tail_id in facts},
                {schema_id(t.head_type, t.relation, t.tail_type): schema_text(t) for t, _, _ in facts},
            )
            turn = await self._turn_embedding(chunk, pipe)
            texts = embedded_texts(turn.text, [e.name for e in entities.values()], [t for t, _, _ in facts])
            try:
                vectors = await self._vectors(texts + turn.extra_texts(), held)
            except EmbedderRefused as exc:  # this chunk's text, refused as such: asking again cannot help
                raise PermanentError(f"chunk {chunk.chunk_id}: {exc}") from None
            vectors, extra = vectors[: len(texts)], list(vectors[len(texts) :])
            own_vec = extra.pop(0) if turn.own_text is not None else None
            ent_vecs = vectors[1 : 1 + len(entities)]
            fact_vecs = vectors[1 + len(entities) : 1 + len(entities) + len(facts)]
            schema_vecs = vectors[1 + len(entities) + len(facts) :]

            await self.memory.ensure_indexes(tenant)
            episode = session_turn(chunk.metadata)
            made = turn.embedding if episode is not None else None  # a turn records what its vector followed
            self.memory.stage_passage(
                pipe, tenant, chunk, sorted(entities), vectors[0], made, own_vec, turn.preceding_text
            )
            if episode is not None:  # the session's turns in order: reconstruct's contiguity cue
                self.memory.stage_session_turn(pipe, tenant, *episode, chunk.chunk_id)
            for i, follower in enumerate(turn.followers):  # the next turn, after this one now
                self.memory.stage_turn_embedding(
                    pipe,
                    tenant,
                    follower.passage_id,
                    TurnEmbedding(chunk.chunk_id, text_sha256(follower.text)),
                    extra[2 * i],
                    extra[2 * i + 1],
                    follower.terms,
                )
            version = await self.memory.bump_graph_version(tenant) if entities else 0
            for (eid, ent), vec in zip(entities.items(), ent_vecs):
                self.memory.stage_entity(pipe, tenant, eid, ent.name, ent.type, vec, chunk.chunk_id)
                if ent.type in VALUE_TYPES:  # a value: no node a walk passes through, nor bridged by similarity
                    self.memory.stage_similarity_bridged(pipe, tenant, eid)
                    continue
                self.memory.stage_edge(
                    pipe, tenant, version, entity_node(eid), passage_node(chunk.chunk_id), 1.0, "passage"
                )
            outbox = []
            for index, ((triple, head_id, tail_id), fvec, svec) in enumerate(zip(facts, fact_vecs, schema_vecs)):
                sid = schema_id(triple.head_type, triple.relation, triple.tail_type)
                fid = fact_id(head_id, triple.relation, tail_id)
                self.memory.stage_schema(
                    pipe, tenant, sid, triple.head_type, triple.relation, triple.tail_type, svec, chunk.chunk_id
                )
                self.memory.stage_new_fact(
                    pipe,
                    tenant,
                    Fact.extracted(fid, triple, head_id, tail_id, sid),
                    fvec,
                    lapse_of(triple.category),
                    chunk.chunk_id,
                )
                candidate = CandidateFact(
                    tenant=tenant,
                    passage_id=chunk.chunk_id,
                    doc_id=chunk.doc_id,
                    fact=triple,
                    fact_index=index,
                    chunk_fact_count=len(facts),
                    head_id=head_id,
                    tail_id=tail_id,
                    extractor=self.extractor.name,
                    incarnation=chunk.incarnation,
                )
                outbox.append(Emit.of(candidate))  # keyed by candidate_key(head_id, triple.relation, tail_id)
            if not facts:
                self.memory.stage_chunk_done(pipe, tenant, chunk.chunk_id)
            return outbox

        await self.once(tenant, extraction_mark(chunk), decide)
        if self.settings.sim_bridging and not (await self.memory.passage_states(tenant, [chunk.chunk_id]))[0].retired:
            await self._bridge_similar(tenant, chunk.chunk_id)  # (a retired passage's entities link nothing)

    async def _vectors(self, texts: list[str], held: dict[str, HeldVector]) -> list:
        """Each text's vector: the one a record holds for it (HeldVector, written as held), else
        the embedder's (its shared cache, else the model), each text not held asked once."""
        missing = [t for t in texts if t not in held]
        wanted = list(dict.fromkeys(missing))
        embedded = dict(zip(wanted, await self.embedder.embed(wanted))) if wanted else {}
        metrics.EXTRACTION_TEXTS.labels(source="held").inc(len(texts) - len(missing))
        metrics.EXTRACTION_TEXTS.labels(source="embedded").inc(len(missing))
        return [held[t] if t in held else embedded[t] for t in texts]

    async def _grounded(self, chunk: Chunk, extraction: Extraction) -> Extraction:
        """The extraction without the facts and entities the chunk's passage does not support,
        and with the trace facts whose category it does not state as DECLARATIVE
        (workers.algorithms.grounding); each drop and demotion counted and logged with the
        chunk id. The tenant's aliases are read only for a name that does not occur by itself."""
        passage = grounding.Passage.of(chunk.text, chunk.context)
        other_ids: dict[str, set[str]] = {}
        missing = grounding.unmentioned(extraction.facts, extraction.entities, passage)
        if missing:
            aliases = await self.memory.alias_map(chunk.tenant)  # alias id → canonical id
            if aliases:
                for name in filter(has_entity_id, missing):
                    canonical = aliases.get(entity_id(name), entity_id(name))
                    other_ids[name] = {canonical} | {alias for alias, target in aliases.items() if target == canonical}
        verdict = grounding.ground(extraction.facts, extraction.entities, passage, other_ids)
        for triple, reason in verdict.dropped:
            metrics.UNGROUNDED_FACTS.labels(reason=reason).inc()
            log.warning(
                "chunk %s: fact (%r, %r, %r) dropped: %s",
                chunk.chunk_id,
                triple.head[:80],
                triple.relation[:80],
                triple.tail[:80],
                reason,
            )
        for entity, reason in verdict.dropped_entities:
            metrics.UNGROUNDED_ENTITIES.labels(reason=reason).inc()
            log.warning("chunk %s: entity %r dropped: %s", chunk.chunk_id, entity.name[:80], reason)
        for triple in verdict.demoted:
            metrics.DEMOTED_FACTS.labels(category=triple.category).inc()
            log.warning(
                "chunk %s: fact (%r, %r, %r) admitted as DECLARATIVE: no sentence naming it states a %s",
                chunk.chunk_id,
                triple.head[:80],
                triple.relation[:80],
                triple.tail[:80],
                triple.category,
            )
        return Extraction(verdict.entities, verdict.facts)

    def _time_of(self, chunk: Chunk):
        """(category → when this passage's support lapses (None: never), the turn's time or '').
        TTLs, read once per chunk: the document's metadata.ttl_seconds, else MEMSTREAM_TTL_SECONDS."""
        try:
            ttls = passage_ttls(self.settings.category_ttls, chunk.metadata)
        except ValueError as exc:  # a chunk published on `chunks` directly, not through Document's contract
            raise PermanentError(f"chunk {chunk.chunk_id} of document {chunk.doc_id}: {exc}") from None
        extracted_at = time.time()
        return (lambda category: lapse_time(extracted_at, ttls.get(category, 0))), turn_time(chunk.metadata)

    async def _bridge_similar(self, tenant: str, chunk_id: str) -> None:
        """Each entity, once, links to the known entities it is close to (cosine ≥ sim_edge, at
        most SIMILAR_NEIGHBOURS_MAX). Run after the chunk's commit: of two chunks extracted
        concurrently, the later committer always sees the other's entities — so every pair
        within sim_edge is joined whichever arrives first. Also run on redelivery, so a crash
        loses no edge."""
        vectors = await self.memory.unbridged_entity_vectors(tenant, chunk_id)
        if not vectors:
            return
        found = await self.memory.knn_many(
            tenant, "entities", list(vectors.values()), SIMILAR_NEIGHBOURS_MAX + 1, ["name", "type"], ensure_index=True
        )
        similar = {  # a value (an amount, a date) is bridged to nothing
            eid: [
                h
                for h in hits
                if h.id != eid and h.score >= self.settings.sim_edge and h.fields.get("type") not in VALUE_TYPES
            ]
            for eid, hits in zip(vectors, found)
        }
        pipe = self.memory.pipeline(tenant)
        if any(similar.values()):
            version = await self.memory.bump_graph_version(tenant)
            for eid, hits in similar.items():
                for hit in hits:
                    self.memory.stage_edge(
                        pipe, tenant, version, entity_node(eid), entity_node(hit.id), round(hit.score, 4), "similar"
                    )
        for eid in vectors:
            self.memory.stage_similarity_bridged(pipe, tenant, eid)
        await pipe.execute()
