"""The indexing stages, independent of faust: chunker, A_ext, A_det, A_res.

Each stage handles one message effectively once (DESIGN §6): it decides its Redis writes and
its outgoing messages, commits both in one MULTI (writes + outbox), publishes the outbox, then
sets the message's done mark. A redelivery after a crash finds either nothing (decide again:
the writes are idempotent), a committed outbox (publish it again) or the done mark (skip).

Undecodable or invalid messages go to the dead-letter topic with the reason; transient errors
retry with capped exponential backoff and jitter, then go to the dead-letter topic too. Nothing
blocks a partition and nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Awaitable, Callable

from store import AlreadyDone, Memory, Outgoing
from topics import CandidateFact, Chunk, ConflictSet, ContractError, DeadLetter, Document, FactEvent, decode, encode
from workers import metrics
from workers.chunking import chunk_text
from workers.extraction import Entity
from workers.normalize import content_hash, entity_id, fact_id, relation_name, schema_id, short_hash
from workers.settings import Settings

log = logging.getLogger(__name__)

Send = Callable[[Outgoing], Awaitable[None]]
MAX_ATTEMPTS = 5
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.2, 5.0


class PermanentError(Exception):
    """Retrying cannot help: the message goes to the dead-letter topic at once."""


def entity_node(eid: str) -> str:
    return f"e:{eid}"


def passage_node(pid: str) -> str:
    return f"p:{pid}"


class Pipeline:
    RECORDS = {"documents": Document, "chunks": Chunk, "candidate-facts": CandidateFact, "conflict-sets": ConflictSet}

    def __init__(self, settings: Settings, memory: Memory, send: Send, embedder=None, extractor=None):
        self.settings = settings
        self.memory = memory
        self.send = send
        self.embedder = embedder
        self.extractor = extractor
        self.handlers = {
            "documents": self.on_document,
            "chunks": self.on_chunk,
            "candidate-facts": self.on_candidate,
            "conflict-sets": self.on_conflict_set,
        }

    # ---- the envelope: decode, retry, dead-letter -------------------------------------
    async def process(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None, offset: int | None = None) -> None:
        started = time.perf_counter()
        try:
            if value is None:
                raise ContractError(f"{topic}: empty message (no value)")
            record = decode(self.RECORDS[topic], value, max_text_bytes=self.settings.max_text_bytes)
        except ContractError as exc:
            await self.dead_letter(topic, key, value, str(exc), partition, offset, attempts=1)
            return
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                await self.handlers[topic](record)
                metrics.MESSAGES.labels(stage=topic).inc()
                metrics.STAGE_SECONDS.labels(stage=topic).observe(time.perf_counter() - started)
                return
            except PermanentError as exc:
                await self.dead_letter(topic, key, value, str(exc), partition, offset, attempt, getattr(record, "tenant", None))
                return
            except Exception as exc:  # transient: Redis, Kafka, model
                if attempt == MAX_ATTEMPTS:
                    await self.dead_letter(topic, key, value, f"{type(exc).__name__}: {exc}", partition, offset, attempt, getattr(record, "tenant", None))
                    return
                delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                log.warning("%s: attempt %d failed (%s: %s); retrying in %.2fs", topic, attempt, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)

    async def dead_letter(self, topic, key, value, error, partition, offset, attempts, tenant=None) -> None:
        log.error("%s: to dead-letter topic: %s", topic, error)
        metrics.DEAD_LETTERS.labels(topic=topic).inc()
        payload = "" if value is None else value.decode("utf-8", errors="backslashreplace")
        letter = DeadLetter(
            topic=f"{self.settings.topic_namespace}.{topic}",
            payload=payload,
            error=error,
            key=None if key is None else key.decode("utf-8", errors="backslashreplace"),
            partition=partition,
            offset=offset,
            attempts=attempts,
            tenant=tenant,
            ts=time.time(),
        )
        await self.send(Outgoing("dlq", letter.key or "", encode(letter)))

    async def _once(self, tenant: str, mark: str, decide) -> None:
        try:
            outbox = await self.memory.pending_outbox(tenant, mark)
        except AlreadyDone:
            return
        if outbox is None:
            pipe = self.memory.pipeline()
            outbox = await decide(pipe)
            self.memory.stage_outbox(pipe, tenant, mark, outbox)
            await pipe.execute()
        for item in outbox:
            await self.send(item)
        await self.memory.finish(tenant, mark)

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

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
                Outgoing("chunks", doc.doc_id, encode(Chunk(doc.tenant, p.chunk_id, doc.doc_id, p.seq, len(pieces), p.text, doc.version, doc_hash)))
                for p in pieces
            ]

        await self._once(doc.tenant, f"doc:{doc.doc_id}:{doc_hash[:32]}:{doc.version}", decide)

    # ---- A_ext ---------------------------------------------------------------------------
    async def on_chunk(self, chunk: Chunk) -> None:
        tenant = chunk.tenant

        async def decide(pipe):
            extraction = await self._off_loop(self.extractor.extract, chunk.text)
            entities = {entity_id(e.name): e for e in extraction.entities}
            facts = []
            for triple in extraction.facts:
                head_id, tail_id, relation = entity_id(triple.head), entity_id(triple.tail), relation_name(triple.relation)
                if head_id == tail_id:
                    continue
                triple.relation = relation
                facts.append((triple, head_id, tail_id))
                entities.setdefault(head_id, Entity(triple.head, triple.head_type))
                entities.setdefault(tail_id, Entity(triple.tail, triple.tail_type))
            texts = [chunk.text] + [e.name for e in entities.values()]
            texts += [f"{t.head} {t.relation} {t.tail}" for t, _, _ in facts]
            texts += [f"{t.head_type} {t.relation} {t.tail_type}" for t, _, _ in facts]
            vectors = await self._off_loop(self.embedder.embed, texts)
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
                self.memory.stage_new_fact(pipe, tenant, fid, _fact_fields(triple, head_id, tail_id, sid), fvec)
                candidate = CandidateFact(tenant, chunk.chunk_id, chunk.doc_id, triple, index, len(facts), head_id, tail_id, self.extractor.name)
                outbox.append(Outgoing("candidate-facts", head_id, encode(candidate)))
            if not facts:
                self.memory.stage_chunk_done(pipe, tenant, chunk.chunk_id)
            return outbox

        await self._once(tenant, f"ext:{chunk.chunk_id}", decide)

    # ---- A_det (first form: exact duplicates go to the resolver, the rest is activated) ---
    async def on_candidate(self, cand: CandidateFact) -> None:
        tenant, fid = cand.tenant, fact_id(cand.head_id, cand.fact.relation, cand.tail_id)

        async def decide(pipe):
            fact = await self.memory.fact(tenant, fid)
            if fact is None:
                raise PermanentError(f"candidate fact {fid} has no extracted record in memory (publish documents, not candidate facts)")
            if fact["status"] == "active":
                if cand.passage_id in fact["passage_ids"]:  # the same fact twice in one passage
                    self.memory.stage_fact_done(pipe, tenant, cand.passage_id, cand.fact_index, cand.chunk_fact_count)
                    return []
                conflict = ConflictSet(tenant, "duplicate", cand, fid, [fid], fact["passage_ids"])
                return [Outgoing("conflict-sets", cand.head_id, encode(conflict))]
            version = await self.memory.bump_graph_version(tenant)
            self.memory.stage_fact_status(pipe, tenant, fid, "active")
            self.memory.stage_fact_passage(pipe, tenant, fid, cand.passage_id)
            self.memory.stage_fact_edge(pipe, tenant, version, entity_node(cand.head_id), entity_node(cand.tail_id), fid)
            self.memory.stage_fact_done(pipe, tenant, cand.passage_id, cand.fact_index, cand.chunk_fact_count)
            fact.update(status="active", passage_ids=[cand.passage_id])
            return [self._event(tenant, "activated", fid, fact, version, cand.passage_id)]

        await self._once(tenant, f"det:{cand.passage_id}:{cand.fact_index}", decide)

    # ---- A_res (first form: merge exact duplicates) -------------------------------------------
    async def on_conflict_set(self, conflict: ConflictSet) -> None:
        cand, tenant = conflict.candidate, conflict.tenant
        if conflict.kind != "duplicate":
            raise PermanentError(f"conflict kind {conflict.kind!r} is not handled by this resolver yet")

        async def decide(pipe):
            fact = await self.memory.fact(tenant, conflict.fact_id)
            if fact is None:
                raise PermanentError(f"conflict set names fact {conflict.fact_id}, which is not in memory")
            self.memory.stage_fact_passage(pipe, tenant, conflict.fact_id, cand.passage_id)
            self.memory.stage_fact_done(pipe, tenant, cand.passage_id, cand.fact_index, cand.chunk_fact_count)
            fact["passage_ids"] = sorted(set(fact["passage_ids"]) | {cand.passage_id})
            version = await self.memory.graph_version(tenant)
            return [self._event(tenant, "merged", conflict.fact_id, fact, version, cand.passage_id, reason="exact duplicate")]

        await self._once(tenant, f"res:{cand.passage_id}:{cand.fact_index}", decide)

    def _event(self, tenant, event, fid, fact, version, passage_id, reason="") -> Outgoing:
        public = {k: fact.get(k) for k in _PUBLIC_FACT_FIELDS}
        record = FactEvent(
            tenant=tenant,
            event=event,
            event_id=short_hash(event, fid, passage_id),
            fact_id=fid,
            fact=public,
            passage_ids=fact["passage_ids"],
            graph_version=version,
            reason=reason,
            ts=time.time(),
        )
        return Outgoing("indexed-facts", fid, encode(record))


_PUBLIC_FACT_FIELDS = ("head", "relation", "tail", "head_type", "tail_type", "head_id", "tail_id", "schema_id", "category", "status", "valid_from", "valid_to")


def _fact_fields(triple, head_id: str, tail_id: str, sid: str) -> dict:
    return {
        "head": triple.head,
        "relation": triple.relation,
        "tail": triple.tail,
        "head_type": triple.head_type,
        "tail_type": triple.tail_type,
        "head_id": head_id,
        "tail_id": tail_id,
        "schema_id": sid,
        "category": triple.category,
        "valid_from": triple.valid_from,
        "valid_to": triple.valid_to,
        "text": f"{triple.head} {triple.relation} {triple.tail}",
    }
