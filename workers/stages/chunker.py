"""The chunker: a document → its chunks on `chunks` (keyed by the document, so they stay in order).

A conversation turn (a document with `turn` set: topics.Document.is_turn) is one immutable passage: one chunk
holding its text verbatim whatever its length, with the turn's context line (speaker and time,
workers.algorithms.turns) beside it, never in it.

Versions: memory is a function of each document's current version — the latest published for
its (tenant, doc id); an older version arriving later is ignored. A new version, in one
commit with its record:
- retires the passages of the previous version it no longer holds (unless another document's
  current version holds the same text): out of retrieval and of every count (facts' support,
  schemas' frequency, entities' passages), kept for audit; a fact no current passage supports
  is retracted (a `retracted` event when subscribers knew it: active or invalid) and its group
  decided again; an active fact that only lost some support has its group decided again;
- restores the retired passages it holds again (a revert) under a new incarnation, so they are
  extracted and their facts decided again (topics.Chunk.incarnation);
- sends on only its chunks: the unchanged ones are already extracted (their done marks hold).
A deletion (a tombstone on `documents`: topics.DocumentDeletion) is a version that holds nothing.
Retiring first means no edit can count a text twice: a whitespace-only edit leaves its facts
with one supporting passage, as the text alone would."""

from __future__ import annotations

from dataclasses import dataclass

from store.facts import document_event
from store.lexical import passage_terms
from store.nodes import entity_node, passage_node
from store.records import DocumentRecord
from topics import Chunk, Document, DocumentDeletion
from workers.algorithms.chunking import TextChunk, chunk_text, turn_chunk_id
from workers.algorithms.normalize import content_hash
from workers.algorithms.policy import TRACE_CATEGORIES
from workers.algorithms.subjects import subject_name, titled_pieces
from workers.algorithms.turns import session_turn, turn_context, when_of
from workers.envelope import Emit, message_position
from workers.stages.context import Stage, StageContext
from workers.stages.erasure import Erasing
from workers.stages.handoffs import regroup


def chunking_mark(doc: Document, doc_hash: str, context: str = "", previous: DocumentRecord | None = None) -> str:
    """Done mark: one per document text and version, per context line of a turn (its passage
    id depends on it: a turn published again with its speaker corrected is chunked again), and
    per version it replaces — so publishing an earlier text again at the same version makes it
    current again, and a redelivery after the commit (which replaces itself) changes nothing."""
    mark = f"doc:{doc.doc_id}:{doc_hash[:32]}:{doc.version}"
    mark = f"{mark}:{content_hash(context)[:16]}" if context else mark
    return f"{mark}:{after(previous)}" if previous is not None else mark


def after(previous: DocumentRecord) -> str:
    """What a change's mark says of the record it changes: its text, version and how many
    changes it has seen (so no later change repeats an earlier one's mark: a text deleted and
    published again at the same version, a deletion of it again)."""
    return f"after:{previous.doc_hash[:16]}:{previous.version}:{previous.seq}"


TURN_FIELDS = ("session_id", "turn", "speaker", "ts")


def passage_metadata(doc: Document) -> dict:
    """What each passage of `doc` keeps of it: its metadata and the turn fields that are set.
    The turn fields' names are theirs: a metadata key of the same name is not kept (the
    extractor reads `ts` as the turn's time: only the Document's own, range-checked `ts`)."""
    turn = {name: getattr(doc, name) for name in TURN_FIELDS if getattr(doc, name) is not None}
    return {**{k: v for k, v in doc.metadata.items() if k not in TURN_FIELDS}, **turn}


def context_of(doc: Document) -> str:
    """A turn's context line: its speaker, and its session date as the source wrote it (LoCoMo
    metadata 'date') or else its timestamp; '' for other documents."""
    if not doc.is_turn:
        return ""
    date = doc.metadata.get("date")
    return turn_context(doc.speaker, when_of(date if isinstance(date, str) else "", doc.ts))


def pieces_of(doc: Document, context: str, window: int, overlap: int) -> list[TextChunk]:
    """A turn: one piece, its text verbatim, its id of (doc id, context, text). Other documents:
    token windows (ids: content hashes of their text, and of their subject when titled)."""
    if doc.is_turn:
        return [TextChunk(turn_chunk_id(doc.doc_id, context, doc.text), 0, doc.text)]
    return titled_pieces(subject_name(doc.title), chunk_text(doc.text, window, overlap))


class ChunkerStage(Stage):
    def __init__(self, context: StageContext):
        super().__init__(context)
        self.versions = Versions(context)
        self.erasing = Erasing(context)

    async def handle(self, doc: Document | DocumentDeletion) -> None:
        if isinstance(doc, DocumentDeletion):
            return await self.delete(doc)
        tenant, doc_hash = doc.tenant, content_hash(doc.text)
        context = context_of(doc)
        pieces = pieces_of(doc, context, self.settings.chunk_tokens, self.settings.chunk_overlap)
        chunk_ids = [p.chunk_id for p in pieces]
        previous, position = await self.memory.document_record(tenant, doc.doc_id), message_position()
        if previous is not None and (previous.supersedes(doc.version) or previous.recorded_after(position)):
            return  # an older version than the current (or deleted) one, or an older message: nothing of it enters memory
        if (
            previous is not None
            and previous.mark
            and (previous.version, previous.chunk_ids) == (doc.version, tuple(chunk_ids))
        ):
            # this version is current already (a redelivery, or the same text again): the message
            # that made it so is done, or its committed outbox is published now
            return await self.once(tenant, previous.mark, _nothing)
        mark = chunking_mark(doc, doc_hash, context, previous)

        async def decide(pipe) -> list[Emit]:
            current = await self.memory.document_record(tenant, doc.doc_id)
            if current is not None and (current.supersedes(doc.version) or current.recorded_after(position)):
                return []
            self.memory.expect_document(pipe, tenant, doc.doc_id, current)  # another version meanwhile: decide again
            self.memory.stage_document(pipe, tenant, doc.doc_id, doc_hash, doc.version, chunk_ids, mark, position)
            changes = await self.versions.replace(
                pipe, tenant, doc.doc_id, current, chunk_ids, f"{doc.doc_id} version {doc.version}"
            )
            return [
                Emit.of(  # keyed by its doc id (Chunk.key)
                    Chunk(
                        tenant=tenant,
                        chunk_id=p.chunk_id,
                        doc_id=doc.doc_id,
                        seq=p.seq,
                        n_chunks=len(pieces),
                        text=p.text,
                        doc_version=doc.version,
                        doc_hash=doc_hash,
                        context=context,
                        metadata=passage_metadata(doc),
                        incarnation=changes.incarnations.get(p.chunk_id, 0),
                        subject="" if doc.is_turn else subject_name(doc.title),
                    ),
                )
                for p in pieces
            ] + changes.outbox

        await self.once(tenant, mark, decide)

    async def delete(self, deletion: DocumentDeletion) -> None:
        """A tombstone: the document's current version holds nothing any more (its record stays,
        with no chunks, so only a publication of a newer version brings it back). Its passages
        retire and its facts are decided again as after an edit. An erasure (`purge`) deletes
        it so, then erases what of it is left (workers.stages.erasure) in a second commit."""
        tenant, doc_id = deletion.tenant, deletion.doc_id
        previous, position = await self.memory.document_record(tenant, doc_id), message_position()
        if previous is None:
            return  # never published
        if previous.deleted:  # deleted already (a redelivery: its outbox is published now)
            if previous.mark:
                await self.once(tenant, previous.mark, _nothing)
        elif previous.recorded_after(position):
            pass  # a tombstone older than the version recorded (delivered late): that version stands
        else:
            mark = f"del:{doc_id}:{after(previous)}"

            async def decide(pipe) -> list[Emit]:
                current = await self.memory.document_record(tenant, doc_id)
                if current is None or current.deleted or current.recorded_after(position):
                    return []
                self.memory.expect_document(pipe, tenant, doc_id, current)
                self.memory.stage_document(pipe, tenant, doc_id, "", current.version, [], mark, position)
                return (await self.versions.replace(pipe, tenant, doc_id, current, [], f"{doc_id} deleted")).outbox

            await self.once(tenant, mark, decide)
        if deletion.purge:
            deleted = await self.memory.document_record(tenant, doc_id)
            if (
                deleted is not None and deleted.deleted
            ):  # the erasure changes no record: a redelivery finds its mark done
                await self.once(
                    tenant, f"erase:{doc_id}:{after(deleted)}", lambda pipe: self.erasing.erase(pipe, tenant, doc_id)
                )


async def _nothing(pipe) -> list[Emit]:
    """The decision of a message whose effect is in memory already: none."""
    return []


@dataclass
class VersionChange:
    incarnations: dict[str, int]  # chunk id → the incarnation its chunk is sent with
    outbox: list[Emit]  # events and groups to decide again


class Versions(Stage):
    """What a document's new version (or its deletion: no chunks) changes in memory, staged on
    the chunker's transaction."""

    async def replace(
        self, pipe, tenant: str, doc_id: str, current: DocumentRecord | None, chunk_ids: list[str], why: str
    ) -> VersionChange:
        old = list(dict.fromkeys(current.chunk_ids)) if current is not None else []
        new = list(dict.fromkeys(chunk_ids))
        in_old, in_new = set(old), set(new)
        gone, joined = [c for c in old if c not in in_new], [c for c in new if c not in in_old]
        # read first, then fenced: another document taking or leaving the same text, or support
        # arriving for a passage about to retire, after this read makes the decision run again
        # (PassageState.revision); what is read below is read after it
        states = dict(zip(new + gone, await self.memory.passage_states(tenant, new + gone)))
        for chunk_id in new + gone:
            self.memory.expect_passage(pipe, tenant, chunk_id, states[chunk_id], counts=True)
        for chunk_id in joined:
            self.memory.stage_passage_documents(pipe, tenant, chunk_id, [doc_id], [])
        owners = await self.memory.passage_documents(tenant, gone)
        for chunk_id in gone:
            self.memory.stage_passage_documents(pipe, tenant, chunk_id, [], [doc_id])
        retiring = [c for c, held_by in zip(gone, owners) if not held_by - {doc_id}]  # no other document holds the text
        incarnations = {}
        for chunk_id in new:  # a revert: the passage comes back, to be extracted again
            state = states[chunk_id]
            incarnations[chunk_id] = state.incarnation + 1 if state.retired else state.incarnation
            if state.retired:
                self.memory.stage_restore_passage(pipe, tenant, chunk_id, state.incarnation + 1)
        retired = [c for c in retiring if not states[c].retired]
        return VersionChange(incarnations, await self._retire(pipe, tenant, doc_id, retired, why) if retired else [])

    async def _next_turns_alone(self, pipe, tenant: str, passage_ids: list[str]) -> None:
        """The next turn of each turn passage that leaves memory, embedded after it, gets the
        vector of its own text back (kept for this: no model runs here) and the cached vector of
        what it had embedded is forgotten: memory is a function of the current documents, and an
        erasure follows a retirement. A later passage of the turn before it embeds it after
        itself again when it is indexed. Fenced on the turns as read (expect_session_turns) and
        on each such passage's state."""
        embedder = await self.memory.recorded_embedder(tenant)
        cache = self.memory.embedding_cache(embedder.cache_name) if embedder is not None else None
        for pid, row in zip(passage_ids, await self.memory.passages(tenant, passage_ids)):
            moment = session_turn((row or {}).get("metadata") or {})
            if moment is None:
                continue
            near = await self.memory.session_turns_near(tenant, *moment)
            self.memory.expect_session_turns(pipe, tenant, moment[0], near.changes)
            after = [other for turn, other in near.passages if turn == moment[1] + 1]
            states = await self.memory.passage_states(tenant, after)
            made = await self.memory.turn_embeddings(tenant, after)
            owns = await self.memory.own_vectors(tenant, after)
            rows = await self.memory.passages(tenant, after)
            for other, state, embedding, own, own_row in zip(after, states, made, owns, rows):
                if state.retired or embedding.preceded_by != pid or own is None or own_row is None:
                    continue
                self.memory.expect_passage(pipe, tenant, other, state)
                forget = [cache.key_of_digest(embedding.embedded_sha)] if cache and embedding.embedded_sha else []
                terms = passage_terms(own_row["context"], own_row["text"])  # its own, as when said first
                self.memory.stage_turn_alone(pipe, tenant, other, own, terms, forget)

    async def _retire(self, pipe, tenant: str, doc_id: str, passage_ids: list[str], why: str) -> list[Emit]:
        """The passages leave memory (a `retired` event names them); each fact they supported
        is decided again."""
        lost: dict[str, set[str]] = {}  # fact id → the passages of its support that leave
        schemas: set[str] = set()  # the schemas whose frequency falls
        version = await self.memory.bump_graph_version(tenant)  # its passage edges leave the graph
        retired = Emit.of(
            document_event(tenant, "retired", doc_id, passage_ids, version, f"no current document holds them ({why})")
        )
        await self._next_turns_alone(pipe, tenant, passage_ids)
        for pid in passage_ids:
            self.memory.stage_retire_passage(pipe, tenant, pid)
            fact_ids, schema_ids = await self.memory.passage_support(tenant, pid)
            schemas.update(schema_ids)
            entity_ids = await self.memory.passage_entities(tenant, pid)
            self.memory.stage_drop_support(pipe, tenant, pid, fact_ids, schema_ids, entity_ids)
            for eid in entity_ids:
                self.memory.stage_edge_removed(pipe, tenant, version, entity_node(eid), passage_node(pid), "passage")
            for fid in fact_ids:
                lost.setdefault(fid, set()).add(pid)
        outbox: list[Emit] = []
        for fact in await self.memory.facts(tenant, sorted(lost)):
            if fact is None or fact.status in ("merged", "expired", "retracted"):
                continue  # out of memory already (a merged fact's support moved to its target)
            fact.passage_ids = sorted(set(fact.passage_ids) - lost[fact.id])
            was, leaving = fact.status, "-".join(sorted(lost[fact.id]))[:200]
            if fact.passage_ids:  # less support: its group may be decided otherwise now
                self.memory.expect_status(pipe, tenant, fact.id, was)
                if was == "active":
                    outbox += await regroup(
                        self.settings,
                        self.memory,
                        tenant,
                        fact,
                        "retirement",
                        f"{fact.id} lost support ({why})",
                        f"lost-{fact.id}-{leaving}",
                    )
                continue
            if was == "pending":
                self.memory.stage_unpend(pipe, tenant, fact.schema_id, [fact.id])
            retracted = self.lifecycle.retract(pipe, tenant, fact, version, f"no current passage says it ({why})")
            if was in ("active", "invalid"):  # subscribers knew it
                outbox.append(Emit.of(retracted))
            if was == "active":
                outbox += await regroup(
                    self.settings,
                    self.memory,
                    tenant,
                    fact,
                    "retirement",
                    f"{fact.id} retracted ({why})",
                    f"retracted-{fact.id}-{leaving}",
                )
        return [retired] + outbox + await self._demote(pipe, tenant, sorted(schemas), set(passage_ids), version, why)

    async def _demote(
        self, pipe, tenant: str, schema_ids: list[str], leaving: set[str], version: int, why: str
    ) -> list[Emit]:
        """A stable schema whose support falls below τ is a candidate again, and its facts in
        memory wait behind the τ gate (Lifecycle.park, a `pending` event), as they would had the
        current documents alone been indexed. Its facts are found through the passages that
        support it (each passage a fact of it came from counted the schema). Facts of the
        decision trace's categories are left alone: a stated one needs no τ, and which were
        stated is not recorded."""
        if not self.settings.schema_filter:
            return []
        outbox: list[Emit] = []
        for sid in schema_ids:
            status, passages, frequency = await self.memory.schema_support(tenant, sid)
            # fenced: an extractor counting another passage for it before the commit (the schema
            # stable again) makes the decision run again
            self.memory.expect_schema(pipe, tenant, sid, status, frequency)
            remaining = [p for p in passages if p not in leaving]
            if status != "stable" or len(remaining) >= self.settings.effective_tau:
                continue
            self.memory.stage_schema_status(pipe, tenant, sid, "candidate")
            fact_ids = sorted({fid for pid in remaining for fid in (await self.memory.passage_support(tenant, pid))[0]})
            for fact in await self.memory.facts(tenant, fact_ids):
                if (
                    fact is None
                    or fact.schema_id != sid
                    or fact.status not in ("active", "invalid")
                    or fact.category in TRACE_CATEGORIES
                ):
                    continue
                was_active = fact.status == "active"
                outbox.append(
                    Emit.of(
                        self.lifecycle.park(pipe, tenant, fact, version, f"its schema's support fell below τ ({why})")
                    )
                )
                if was_active:
                    outbox += await regroup(
                        self.settings,
                        self.memory,
                        tenant,
                        fact,
                        "retirement",
                        f"{fact.id} parked ({why})",
                        f"parked-{fact.id}-{version}",
                    )
        return outbox
