"""The memory in this process: a second implementation of store.base.MemoryStore, held in
Python dicts and sets, for tests of the stages' logic that need no Redis.

It mirrors store.memory.Memory write for write — the same statuses, counts, graph versions,
node names, edge weights, change log, done marks and outboxes, so the same messages give the
same export and the same events (tests/test_store_in_memory.py runs them on both stores). One
asyncio loop and no threads: a method runs to its end between two awaits, so each of Memory's
Lua scripts is one plain method here, and `commit_once` checks and applies with no await in
between, which is what WATCH … EXEC gives Memory. Records hold what Redis hands back: field
values as strings (numbers written as redis-py writes them, with repr), vectors as float16
bytes. What only Redis has — key TTLs, lost indexes after a restart, the legacy node scan —
has no counterpart here; each place says so in one line."""

from __future__ import annotations

import copy
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Mapping, overload

import numpy as np

from store.base import alias_target, broader_by_containment
from store.caches import EmbeddingCache, LLMCache
from store.facts import Fact, FactRecordHit
from store.graph_log import GRAPH_CHANGES_MAXLEN, LOAD_BATCH, NO_CHANGE, READ_BATCH, EdgeChange, adjacency_field
from store.keys import LAYERS
from store.lexical import K1, LEXICAL_FIELD, B, search_terms
from store.nodes import entity_node, passage_node, type_node
from store.records import (
    ENTITY_MENTIONS,
    FACT_EXTRACTIONS,
    OUTBOX_SWEEP_LOCK_S,
    PASSAGE_EXTRAS,
    RECORD_INTERNALS,
    RETIRED_FIELDS,
    UNRECORDED_EMBEDDER,
    VECTOR_DTYPE,
    VECTOR_ITEM_BYTES,
    AlreadyDone,
    Committed,
    DocumentRecord,
    DocumentStatus,
    EmbedderId,
    Erasure,
    GroupJoin,
    HeldVector,
    Hit,
    Outgoing,
    PassageRecordHit,
    PassagesRead,
    PassageState,
    StaleDecision,
    cause_held,
    parse_cause,
    passage_extras,
    passage_json,
    similarity,
    vector_bytes,
    vector_from_bytes,
)
from topics import validate_tenant


class StagedWrites:
    """What `pipeline()` returns: the writes one decision stages, in order, as closures over the
    store, and the fact fields the decision read (`expect_status`, `expect_field`). `commit_once` applies them
    after its checks; `execute()` applies them at once (Memory's pipe.execute())."""

    def __init__(self):
        self.writes: list[Callable[[], None]] = []
        self.expected: dict[
            tuple[str, str, str, str], str | None
        ] = {}  # (tenant, layer, id, field) → value the decision read

    async def execute(self) -> None:
        writes, self.writes = self.writes, []
        for write in writes:
            write()

    async def reset(self) -> None:
        self.writes, self.expected = [], {}


@dataclass
class _Tenant:
    """One tenant's memory. `sets` are Memory's counting sets, keyed (what, of what): fact
    passages, groups, relation heads, chunk progress …"""

    records: dict[str, dict[str, dict[str, str | bytes]]] = field(
        default_factory=lambda: {layer: {} for layer in LAYERS}
    )
    sets: defaultdict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    cardinality: dict[str, str] = field(default_factory=dict)  # relation → "single" | "multi"
    flips: dict[str, str] = field(default_factory=dict)  # mark → the verdict its message flipped the relation to
    done: dict[str, str] = field(default_factory=dict)  # done marks → their decision ids
    outboxes: dict[str, Committed] = field(default_factory=dict)  # mark → committed, not yet finished
    committed_at: dict[str, float] = field(default_factory=dict)  # mark → commit time (the sweep's order)
    sweep_locked_until: float = 0.0  # monotonic
    adjacency: defaultdict[str, dict[str, float]] = field(
        default_factory=lambda: defaultdict(dict)
    )  # node → {kind|other: weight}
    changes: list[tuple[str, int, EdgeChange]] = field(
        default_factory=list
    )  # the graph log: (id, graph version, change)
    changes_added: int = 0
    graph_version: int = 0
    expiry: dict[str, float] = field(default_factory=dict)  # the expiry index: fact id → expires_at
    session_turns: dict[str, dict[str, int]] = field(
        default_factory=dict
    )  # session id → {passage id: turn} (Memory's sorted set)
    revisions: dict[str, int] = field(default_factory=dict)  # passage id → Memory's passage_revision
    said: dict[str, dict[str, float]] = field(default_factory=dict)  # fact id → Memory's fact_said (doc id → time)
    indexed: bool = False  # ensure_indexes ran: KNN finds the tenant's records (readers create nothing)
    embedder: EmbedderId | None = None  # the embedder its indexes were built with (claim_embedder)
    lexical: "_LexicalIndex | None" = None  # BM25 over the passages, rebuilt when they change (lexical)


class InMemoryStore:
    def __init__(self, dims: int = 384, tau: int = 2):
        self.dims = dims
        self.tau = tau
        self._tenants: dict[str, _Tenant] = {}
        self._tenants_with_outboxes: set[str] = set()
        self._cache: dict[str, str | bytes] = {}  # the model caches, shared by every model and tenant (no TTL)
        self._applied: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) → last applied offset

    def snapshot(self) -> object:
        """A copy of everything it holds: what a Redis backup is. `restore` brings it back,
        losing every write since (tests of workers.recovery)."""
        return copy.deepcopy((self._tenants, self._tenants_with_outboxes, self._cache, self._applied))

    def restore(self, snapshot: object) -> None:
        self._tenants, self._tenants_with_outboxes, self._cache, self._applied = copy.deepcopy(snapshot)  # type: ignore[misc]

    def _tenant(self, tenant: str) -> _Tenant:
        found = self._tenants.get(tenant)
        if found is None:
            validate_tenant(tenant)  # what building Memory's TenantKeys checks
            found = self._tenants[tenant] = _Tenant()
        return found

    def _set(self, tenant: str, what: str, of: str = "") -> set[str]:
        return self._tenant(tenant).sets[(what, of)]

    def _hset(self, tenant: str, layer: str, record_id: str, fields: Mapping[str, Any]) -> None:
        self._tenant(tenant).records[layer].setdefault(record_id, {}).update(
            {name: _stored(value) for name, value in fields.items()}
        )

    def _hsetnx(self, tenant: str, layer: str, record_id: str, name: str, value: Any) -> None:
        if name not in self._tenant(tenant).records[layer].get(record_id, {}):
            self._hset(tenant, layer, record_id, {name: value})

    def _set_if_smaller(self, tenant: str, layer: str, record_id: str, rank: str, fields: Mapping[str, Any]) -> None:
        """Memory's _SET_IF_SMALLER: the smallest description seen wins (Lua compares bytes, as str does)."""
        current = _text(self._tenant(tenant).records[layer].get(record_id, {}).get("_rank"))
        if current is None or rank < current:
            self._hset(tenant, layer, record_id, {"_rank": rank, **fields})

    @staticmethod
    def _stage(pipe: StagedWrites, write: Callable[[], None]) -> None:
        pipe.writes.append(write)

    # ---- lifetime, health, model caches ------------------------------------------------------
    async def close(self) -> None:
        pass

    async def ping(self) -> None:
        pass

    def llm_cache(self, model: str) -> LLMCache:
        return _InMemoryLLMCache(self._cache, model)

    def embedding_cache(self, embedder: str) -> EmbeddingCache:
        return _InMemoryEmbeddingCache(self._cache, embedder)

    # ---- effectively once: done marks and outbox (no TTLs: nothing expires) -----------------
    async def pending_outbox(self, tenant: str, mark: str, cause: str = "") -> Committed | None:
        t = self._tenant(tenant)
        if mark in t.done:
            raise AlreadyDone(mark)
        found = t.outboxes.get(mark)
        if found is not None:
            return Committed(list(found.outbox), found.decision)
        if cause:
            upstream = parse_cause(cause)[0]
            held = t.done.get(upstream)
            if held is None and upstream in t.outboxes:
                held = t.outboxes[upstream].decision
            cause_held(cause, held)
        return None

    def pipeline(self) -> StagedWrites:
        return StagedWrites()

    def stage_outbox(self, pipe, tenant: str, mark: str, outbox: list[Outgoing], decision: str = "") -> None:
        t, at = self._tenant(tenant), time.time()

        def write() -> None:
            if not outbox:  # done with its commit, as Memory.stage_outbox
                t.done[mark] = decision
                return
            t.outboxes[mark], t.committed_at[mark] = Committed(list(outbox), decision), at

        self._stage(pipe, write)

    def expect_status(self, pipe, tenant: str, fact_id: str, status: str) -> None:
        self.expect_field(pipe, tenant, fact_id, "status", status)

    def expect_field(self, pipe, tenant: str, fact_id: str, name: str, value: str | float | None) -> None:
        pipe.expected.setdefault((tenant, "facts", fact_id, name), None if value in (None, "") else _stored(value))

    def expect_document(self, pipe, tenant: str, doc_id: str, record: DocumentRecord | None) -> None:
        pipe.expected.setdefault(
            (tenant, "documents", doc_id, "version"), None if record is None else str(record.version)
        )
        pipe.expected.setdefault(
            (tenant, "documents", doc_id, "doc_hash"), None if record is None else record.doc_hash or None
        )

    def expect_passage(self, pipe, tenant: str, passage_id: str, state: PassageState, counts: bool = False) -> None:
        pipe.expected.setdefault((tenant, "passages", passage_id, "retired"), "1" if state.retired else None)
        pipe.expected.setdefault(
            (tenant, "passages", passage_id, "incarnation"), str(state.incarnation) if state.incarnation else None
        )
        if counts:
            pipe.expected.setdefault(
                (tenant, "passage_revisions", passage_id, "n"), str(state.revision) if state.revision else None
            )

    def _read_field(self, tenant: str, layer: str, record_id: str, name: str) -> str | None:
        t = self._tenant(tenant)
        if layer == "documents":
            value = (t.documents.get(record_id) or {}).get(name)
            return None if value in (None, "") else str(value)
        if layer == "passage_revisions":
            return str(t.revisions[record_id]) if record_id in t.revisions else None
        return _text(t.records[layer].get(record_id, {}).get(name)) or None

    async def commit_once(self, pipe, tenant: str, mark: str) -> Committed | None:
        """Memory.commit_once with nothing between its checks and its writes (no await), so no
        WatchError case: another delivery's commit is found, or ours applies."""
        t = self._tenant(tenant)
        self._tenants_with_outboxes.add(tenant)  # (Memory re-registers now and then: Redis may restart empty)
        if mark in t.done or mark in t.outboxes:
            await pipe.reset()
            return await self.pending_outbox(tenant, mark)
        for (read_tenant, layer, record_id, name), value in pipe.expected.items():
            if self._read_field(read_tenant, layer, record_id, name) != value:
                await pipe.reset()
                raise StaleDecision(mark)
        await pipe.execute()
        return None

    async def record_applied(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Memory.record_applied (raised only)."""
        key = (group, topic, partition)
        self._applied[key] = max(offset, self._applied.get(key, -1))

    async def applied_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        return {p: self._applied.get((group, topic, p)) for p in partitions}

    async def finish(self, tenant: str, mark: str, decision: str = "") -> None:
        t = self._tenant(tenant)
        t.done[mark] = decision
        t.outboxes.pop(mark, None)
        t.committed_at.pop(mark, None)

    async def unsent_outboxes(self, committed_before: float, limit: int = 500) -> list[tuple[str, str, Committed]]:
        found = []
        for tenant in sorted(self._tenants_with_outboxes):
            t = self._tenant(tenant)
            marks = [
                mark for at, mark in sorted((at, mark) for mark, at in t.committed_at.items()) if at <= committed_before
            ][:limit]
            if not marks or t.sweep_locked_until > time.monotonic():
                continue
            t.sweep_locked_until = time.monotonic() + OUTBOX_SWEEP_LOCK_S
            for mark in marks:
                try:
                    outbox = await self.pending_outbox(tenant, mark)
                except AlreadyDone:
                    outbox = None
                if outbox is None:
                    t.committed_at.pop(mark, None)
                else:
                    found.append((tenant, mark, outbox))
        return found

    # ---- document progress ---------------------------------------------------------------------
    def stage_document(
        self,
        pipe,
        tenant: str,
        doc_id: str,
        doc_hash: str,
        version: int,
        chunk_ids: list[str],
        mark: str = "",
        position: tuple[int, int] | None = None,
    ) -> None:
        t = self._tenant(tenant)
        record = {
            "doc_hash": doc_hash,
            "version": version,
            "chunk_ids": list(chunk_ids),
            "ts": time.time(),
            "mark": mark,
            "position": position,
        }

        def write() -> None:  # the record follows the latest publication, never an older version
            current = t.documents.get(doc_id)
            if current is None or current["version"] <= version:
                t.documents[doc_id] = {**record, "seq": (current or {}).get("seq", 0) + 1}

        self._stage(pipe, write)

    def stage_chunk_done(self, pipe, tenant: str, chunk_id: str) -> None:
        self._stage(pipe, lambda: self._set(tenant, "chunks_done").add(chunk_id))

    def _progress(
        self, tenant: str, chunk_id: str, chunk_fact_count: int, fact_index: str = "", work_id: str = ""
    ) -> None:
        """Memory's _CHUNK_PROGRESS: through when every fact is detected and no spawned work is outstanding."""
        facts_done, outstanding = (
            self._set(tenant, "chunk_facts_done", chunk_id),
            self._set(tenant, "chunk_outstanding", chunk_id),
        )
        if fact_index:
            facts_done.add(fact_index)
        if work_id:
            outstanding.discard(work_id)
        if len(facts_done) >= chunk_fact_count and not outstanding:
            self._set(tenant, "chunks_done").add(chunk_id)

    def stage_fact_done(self, pipe, tenant: str, chunk_id: str, fact_index: int, chunk_fact_count: int) -> None:
        self._stage(pipe, lambda: self._progress(tenant, chunk_id, chunk_fact_count, fact_index=str(fact_index)))

    def stage_spawn(self, pipe, tenant: str, chunk_id: str, work_ids: list[str]) -> None:
        if work_ids:
            spawned = list(work_ids)
            self._stage(pipe, lambda: self._set(tenant, "chunk_outstanding", chunk_id).update(spawned))

    def stage_work_done(self, pipe, tenant: str, chunk_id: str, work_id: str, chunk_fact_count: int) -> None:
        self._stage(pipe, lambda: self._progress(tenant, chunk_id, chunk_fact_count, work_id=work_id))

    async def chunk_done(self, tenant: str, chunk_id: str) -> bool:
        return chunk_id in self._set(tenant, "chunks_done")

    async def chunks_done_count(self, tenant: str) -> int:
        return len(self._set(tenant, "chunks_done"))

    async def outstanding_work(self, tenant: str, chunk_id: str) -> list[str]:
        return sorted(self._set(tenant, "chunk_outstanding", chunk_id))

    async def document_status(self, tenant: str, doc_id: str) -> DocumentStatus | None:
        return (await self.document_statuses(tenant, [doc_id]))[0]

    async def document_statuses(self, tenant: str, doc_ids: list[str]) -> list[DocumentStatus | None]:
        documents, done = self._tenant(tenant).documents, self._set(tenant, "chunks_done")

        def status(doc: dict | None) -> DocumentStatus | None:
            if doc is None:
                return None
            return DocumentStatus(
                doc["doc_hash"], doc["version"], len(doc["chunk_ids"]), sum(1 for c in doc["chunk_ids"] if c in done)
            )

        return [status(documents.get(doc_id)) for doc_id in doc_ids]

    # ---- document versions -------------------------------------------------------------------------
    async def document_record(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        doc = self._tenant(tenant).documents.get(doc_id)
        return (
            None
            if doc is None
            else DocumentRecord(
                doc["doc_hash"],
                int(doc["version"]),
                tuple(doc["chunk_ids"]),
                doc.get("mark", ""),
                doc.get("seq", 0),
                doc.get("position"),
            )
        )

    def stage_passage_documents(self, pipe, tenant: str, passage_id: str, joined: list[str], left: list[str]) -> None:
        def write() -> None:
            owners = self._set(tenant, "passage_documents", passage_id)
            owners.update(joined)
            for doc_id in joined + left:
                self._set(tenant, "document_passages", doc_id).add(passage_id)
            owners.difference_update(left)
            self._revise(tenant, passage_id)

        self._stage(pipe, write)

    async def passage_documents(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        return [set(self._tenant(tenant).sets.get(("passage_documents", pid), ())) for pid in passage_ids]

    async def passage_states(self, tenant: str, passage_ids: list[str]) -> list[PassageState]:
        t = self._tenant(tenant)
        return [
            PassageState(
                t.records["passages"].get(pid, {}).get("retired") == "1",
                int(t.records["passages"].get(pid, {}).get("incarnation") or 0),
                t.revisions.get(pid, 0),
            )
            for pid in passage_ids
        ]

    def _revise(self, tenant: str, passage_id: str) -> None:
        """Memory's HINCRBY of passage_revision."""
        revisions = self._tenant(tenant).revisions
        revisions[passage_id] = revisions.get(passage_id, 0) + 1

    def stage_retire_passage(self, pipe, tenant: str, passage_id: str) -> None:
        """Memory's _RETIRE_PASSAGE."""

        def write() -> None:
            t = self._tenant(tenant)
            row = t.records["passages"].setdefault(passage_id, {})
            if row.get("retired") == "1":
                return
            for name, aside in RETIRED_FIELDS.items():
                if name in row:
                    row[aside] = row.pop(name)
            row["retired"] = "1"
            t.lexical = None  # the BM25 index is rebuilt without it

        self._stage(pipe, write)

    def stage_restore_passage(self, pipe, tenant: str, passage_id: str, incarnation: int) -> None:
        """Memory's _RESTORE_PASSAGE."""

        def write() -> None:
            t = self._tenant(tenant)
            row = t.records["passages"].setdefault(passage_id, {})
            for name, aside in RETIRED_FIELDS.items():
                if aside in row:
                    row[name] = row.pop(aside)
            row.update(retired="", incarnation=_stored(incarnation))
            row.pop("purged", None)
            t.lexical = None

        self._stage(pipe, write)

    async def passage_support(self, tenant: str, passage_id: str) -> tuple[list[str], list[str]]:
        sets = self._tenant(tenant).sets
        return sorted(sets.get(("passage_facts", passage_id), ())), sorted(
            sets.get(("passage_schemas", passage_id), ())
        )

    def stage_drop_support(
        self, pipe, tenant: str, passage_id: str, fact_ids: list[str], schema_ids: list[str], entity_ids: list[str]
    ) -> None:
        """Memory.stage_drop_support."""

        def write() -> None:
            t = self._tenant(tenant)
            for fid in fact_ids:
                self._set(tenant, "fact_passages", fid).discard(passage_id)
            for sid in schema_ids:
                supporting = self._set(tenant, "schema_passages", sid)
                supporting.discard(passage_id)
                if sid in t.records["schemas"]:
                    self._hset(tenant, "schemas", sid, {"frequency": len(supporting)})
            for eid in entity_ids:
                self._set(tenant, "entity_passages", eid).discard(passage_id)
            for what in ("passage_facts", "passage_schemas", "chunk_facts_done", "chunk_outstanding"):
                t.sets.pop((what, passage_id), None)
            self._set(tenant, "chunks_done").discard(passage_id)

        self._stage(pipe, write)

    # ---- erasure -------------------------------------------------------------------------------------
    async def document_passages(self, tenant: str, doc_id: str) -> list[str]:
        return sorted(self._tenant(tenant).sets.get(("document_passages", doc_id), ()))

    async def passage_extracted(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        return [set(self._tenant(tenant).sets.get(("passage_extracted", pid), ())) for pid in passage_ids]

    def _counted(self, tenant: str, layer: str, what: str, record_id: str, counter: str) -> tuple[set[str], str | None]:
        t = self._tenant(tenant)
        count = t.records[layer].get(record_id, {}).get(counter)
        return set(t.sets.get((what, record_id), ())), None if count is None else str(count)

    async def fact_sources(self, tenant: str, fact_ids: list[str]) -> list[tuple[set[str], str | None]]:
        return [self._counted(tenant, "facts", "fact_sources", fid, FACT_EXTRACTIONS) for fid in fact_ids]

    async def entity_mentions(self, tenant: str, entity_ids: list[str]) -> list[tuple[set[str], str | None]]:
        return [self._counted(tenant, "entities", "entity_passages", eid, ENTITY_MENTIONS) for eid in entity_ids]

    async def facts_naming(self, tenant: str, entity_id: str) -> list[str]:
        rows = self._tenant(tenant).records["facts"]
        return sorted(fid for fid, row in rows.items() if entity_id in (row.get("head_id"), row.get("tail_id")))

    def expect_entity(self, pipe, tenant: str, entity_id: str, mentions: str | None) -> None:
        pipe.expected.setdefault((tenant, "entities", entity_id, ENTITY_MENTIONS), mentions)

    def stage_erase(self, pipe, tenant: str, erasure: Erasure) -> None:
        """Memory.stage_erase."""

        def write() -> None:
            t = self._tenant(tenant)
            for pid in erasure.passage_ids:
                row = t.records["passages"].pop(pid, {})
                t.records["passages"][pid] = {
                    "retired": "1",
                    "purged": "1",
                    **({"incarnation": row["incarnation"]} if row.get("incarnation") else {}),
                }
                for what in ("passage_extracted", "passage_documents"):
                    t.sets.pop((what, pid), None)
                self._set(tenant, "document_passages", erasure.doc_id).discard(pid)
                self._set(tenant, "graph_nodes").discard(passage_node(pid))
                t.lexical = None
            for fact in erasure.facts:
                t.records["facts"].pop(fact.id, None)
                for what in ("fact_passages", "fact_sources", "fact_set_aside"):
                    t.sets.pop((what, fact.id), None)
                t.said.pop(fact.id, None)
                self._set(tenant, "group", f"{fact.head_id}|{fact.relation}").discard(fact.id)
                self._set(tenant, "facts_with_tail", fact.tail_id).discard(fact.id)
                self._set(tenant, "schema_pending", fact.schema_id).discard(fact.id)
                t.expiry.pop(fact.id, None)
            for eid in erasure.entity_ids:
                node = entity_node(eid)
                t.records["entities"].pop(eid, None)
                t.sets.pop(("entity_passages", eid), None)
                for name in t.adjacency.pop(node, {}):
                    kind, other = name.split("|", 1)
                    t.adjacency.get(other, {}).pop(adjacency_field(kind, node), None)
                self._set(tenant, "graph_nodes").discard(node)
                self._set(tenant, "similarity_bridged").discard(eid)
            for relation, head in erasure.relation_heads:
                self._set(tenant, "relation_heads", relation).discard(head)
                self._set(tenant, "relation_multi_heads", relation).discard(head)
            for alias in erasure.aliases:
                t.aliases.pop(alias, None)
            if erasure.entity_ids:  # Memory deletes the change stream: every reader loads again
                t.changes.clear()
            for key in erasure.cache_keys:
                self._cache.pop(key, None)
            for sets in [k for k, v in t.sets.items() if not v]:  # Redis keeps no empty set
                del t.sets[sets]

        self._stage(pipe, write)

    # ---- memory layers ---------------------------------------------------------------------------
    async def ensure_indexes(self, tenant: str) -> None:
        self._tenant(tenant).indexed = True  # (no index to lose: Redis may restart empty, this store does not)

    async def recorded_embedder(self, tenant: str) -> EmbedderId | None:
        return self._tenant(tenant).embedder

    async def claim_embedder(self, tenant: str, embedder: EmbedderId, create: bool) -> EmbedderId | None:
        """Memory.claim_embedder; the store's indexes are of its `dims`."""
        t = self._tenant(tenant)
        if t.embedder is None:
            if t.indexed and self.dims != embedder.dims:
                return EmbedderId(UNRECORDED_EMBEDDER, self.dims)
            if not t.indexed and not create:
                return None
            t.embedder = embedder
        return t.embedder

    def stage_passage(self, pipe, tenant: str, chunk, entity_ids: list[str], vector) -> None:
        fields = {
            "text": chunk.text,
            "doc_id": chunk.doc_id,
            "seq": chunk.seq,
            "doc_version": chunk.doc_version,
            "entities": json.dumps(entity_ids),
            "vec": vector_bytes(vector),
            **passage_extras(chunk),
        }

        def write() -> None:
            self._hset(tenant, "passages", chunk.chunk_id, fields)
            self._revise(tenant, chunk.chunk_id)  # Memory.stage_passage: its counted sets change with it

        self._stage(pipe, write)

    def stage_entity(self, pipe, tenant: str, entity_id: str, name: str, type_: str, vector, passage_id: str) -> None:
        fields = {"name": name, "type": type_, "vec": vector_bytes(vector)}

        def write() -> None:
            self._set_if_smaller(tenant, "entities", entity_id, f"{name}\x1f{type_}", fields)
            self._set(tenant, "entity_passages", entity_id).add(passage_id)
            self._count(tenant, "entities", entity_id, ENTITY_MENTIONS)

        self._stage(pipe, write)

    def stage_schema(
        self, pipe, tenant: str, schema_id: str, head_type: str, relation: str, tail_type: str, vector, passage_id: str
    ) -> None:
        first = {
            "head_type": head_type,
            "relation": relation,
            "tail_type": tail_type,
            "status": "candidate",
            "vec": vector_bytes(vector),
        }

        def write() -> None:
            for name, value in first.items():
                self._hsetnx(tenant, "schemas", schema_id, name, value)
            # Memory's _SUPPORT_SCHEMA: distinct supporting passages; stable at τ
            supporting = self._set(tenant, "schema_passages", schema_id)
            supporting.add(passage_id)
            self._set(tenant, "passage_schemas", passage_id).add(schema_id)
            self._hset(tenant, "schemas", schema_id, {"frequency": len(supporting)})
            if len(supporting) >= self.tau:
                self._hset(tenant, "schemas", schema_id, {"status": "stable"})

        self._stage(pipe, write)

    def _count(self, tenant: str, layer: str, record_id: str, counter: str) -> None:
        """Memory's HINCRBY of a record's write counter."""
        row = self._tenant(tenant).records[layer].setdefault(record_id, {})
        row[counter] = str(int(row.get(counter) or 0) + 1)

    def stage_new_fact(
        self, pipe, tenant: str, fact: Fact, vector, lapses_at: float | None = None, passage_id: str = ""
    ) -> None:
        fid, rank, now = fact.id, fact.description_rank(), time.time()
        fields = {**fact.description(), "vec": vector_bytes(vector)}

        def write() -> None:
            self._record_lapse(tenant, fid, lapses_at)  # before the fact exists: tells its first passage
            self._set_if_smaller(tenant, "facts", fid, rank, fields)
            self._hsetnx(tenant, "facts", fid, "status", "new")
            self._hsetnx(tenant, "facts", fid, "created_at", now)
            if passage_id:
                self._set(tenant, "fact_sources", fid).add(passage_id)
                self._set(tenant, "passage_extracted", passage_id).add(fid)
                self._count(tenant, "facts", fid, FACT_EXTRACTIONS)

        self._stage(pipe, write)

    def stage_fact_passage(self, pipe, tenant: str, fact_id: str, passage_id: str) -> None:
        def write() -> None:
            self._set(tenant, "fact_passages", fact_id).add(passage_id)
            self._set(tenant, "passage_facts", passage_id).add(fact_id)
            self._revise(tenant, passage_id)

        self._stage(pipe, write)

    def stage_fact_said(self, pipe, tenant: str, fact_id: str, doc_id: str, at: float) -> None:
        def write() -> None:
            self._tenant(tenant).said.setdefault(fact_id, {}).setdefault(doc_id, float(at))  # Memory's HSETNX

        self._stage(pipe, write)

    async def set_aside_passages(self, tenant: str, fact_id: str) -> list[str]:
        return sorted(self._tenant(tenant).sets.get(("fact_set_aside", fact_id), ()))

    async def facts_said(self, tenant: str, fact_ids: list[str]) -> list[dict[str, float]]:
        said = self._tenant(tenant).said
        return [dict(said.get(fid, {})) for fid in fact_ids]

    def stage_unsupport(self, pipe, tenant: str, fact_id: str, passage_ids: list[str]) -> None:
        def write() -> None:
            self._tenant(tenant).sets.pop(("fact_passages", fact_id), None)
            self._tenant(tenant).sets.pop(("fact_set_aside", fact_id), None)
            if passage_ids:
                self._set(tenant, "fact_set_aside", fact_id).update(passage_ids)
            for pid in passage_ids:
                self._set(tenant, "passage_facts", pid).discard(fact_id)

        self._stage(pipe, write)

    def stage_fact_update(self, pipe, tenant: str, fact_id: str, fields: dict[str, Any]) -> None:
        stored = {k: ("" if v is None else v) for k, v in fields.items()}
        self._stage(pipe, lambda: self._hset(tenant, "facts", fact_id, stored))

    async def fact(self, tenant: str, fact_id: str) -> Fact | None:
        return (await self.facts(tenant, [fact_id]))[0]

    async def facts(self, tenant: str, fact_ids: list[str]) -> list[Fact | None]:
        records, out = self._tenant(tenant).records["facts"], []
        for fid in fact_ids:
            row = records.get(fid)
            out.append(
                None
                if not row
                else Fact.from_hash(
                    fid,
                    {k: _text(v) for k, v in row.items() if k not in ("vec", "_rank")},
                    list(self._set(tenant, "fact_passages", fid)),
                )
            )
        return out

    async def passages(self, tenant: str, passage_ids: list[str]) -> list[dict | None]:
        records, out = self._tenant(tenant).records["passages"], []
        for pid in passage_ids:
            row = records.get(pid, {})
            out.append(
                None
                if row.get("text") is None
                else passage_json(
                    pid,
                    _text(row["text"]),
                    _text(row["doc_id"]),
                    row["seq"],
                    row.get("doc_version"),
                    *(_text(row.get(f)) for f in PASSAGE_EXTRAS),
                )
            )
        return out

    async def entity_names(self, tenant: str, entity_ids: list[str]) -> dict[str, dict]:
        records = self._tenant(tenant).records["entities"]
        return {
            eid: {"name": records[eid]["name"], "type": records[eid].get("type", "")}
            for eid in dict.fromkeys(entity_ids)
            if records.get(eid, {}).get("name") is not None
        }

    async def passage_entities(self, tenant: str, passage_id: str) -> list[str]:
        raw = self._tenant(tenant).records["passages"].get(passage_id, {}).get("entities")
        return json.loads(raw) if raw else []

    async def passages_entities(self, tenant: str, passage_ids: list[str]) -> list[list[str]]:
        return [await self.passage_entities(tenant, pid) for pid in passage_ids]

    def _vector(self, tenant: str, layer: str, record_id: str) -> np.ndarray | None:
        raw = self._tenant(tenant).records[layer].get(record_id, {}).get("vec")
        return None if raw is None else vector_from_bytes(_vec(raw))

    async def fact_vector(self, tenant: str, fact_id: str) -> np.ndarray | None:
        return self._vector(tenant, "facts", fact_id)

    async def read_passages(self, tenant: str, passage_ids: list[str], vectors: list[tuple[str, str]]) -> PassagesRead:
        entities = await self.passages_entities(tenant, passage_ids)
        facts = [tid for kind, tid in vectors if kind == "fact"]
        passages = [tid for kind, tid in vectors if kind == "passage"]
        held = zip(
            [("fact", f) for f in facts] + [("passage", p) for p in passages],
            [*await self.fact_vectors(tenant, facts), *await self.passage_vectors(tenant, passages)],
        )
        return PassagesRead(
            await self.passages(tenant, passage_ids),
            entities,
            await self.entity_names(tenant, [eid for ids in entities for eid in ids]),
            {tag: vec for tag, vec in held if vec is not None},
        )

    async def fact_vectors(self, tenant: str, fact_ids: list[str]) -> list[np.ndarray | None]:
        return [self._vector(tenant, "facts", fid) for fid in fact_ids]

    async def held_vectors(
        self, tenant: str, entities: dict[str, str], facts: dict[str, str], schemas: dict[str, str]
    ) -> dict[str, HeldVector]:
        """Memory.held_vectors: text → the vector a record holds for that very text."""
        records = self._tenant(tenant).records
        asked = (
            [("entities", i, ["name"], text) for i, text in entities.items()]
            + [("facts", i, ["text"], text) for i, text in facts.items()]
            + [("schemas", i, ["head_type", "relation", "tail_type"], text) for i, text in schemas.items()]
        )
        held = {}
        for layer, record_id, fields, text in asked:
            row = records[layer].get(record_id, {})
            parts, vec = [row.get(f) for f in fields], row.get("vec")
            if vec is None or len(_vec(vec)) != VECTOR_ITEM_BYTES * self.dims or None in parts:
                continue
            if " ".join(_text(p) for p in parts if p is not None) == text:
                held[text] = HeldVector(_vec(vec))
        return held

    async def knn_many(
        self,
        tenant: str,
        layer: str,
        vectors: list[np.ndarray],
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
        ensure_index: bool = False,
    ) -> list[list[Hit]]:
        return [await self.knn(tenant, layer, vector, k, return_fields, where, ensure_index) for vector in vectors]

    async def knn_each(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
    ) -> list[list[Hit]]:
        return [await self.knn(tenant, layer, vector, k, return_fields, where) for where in wheres]

    async def knn(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
        ensure_index: bool = False,
    ) -> list[Hit]:
        """Memory.knn by brute force, as RediSearch's FLAT index computes it: cosine distance in
        float32 over unit vectors, given back to 12 significant digits; records without a vector
        of `dims` floats are not in the index; tag equality is case-insensitive and matches any
        of a comma-separated value's tags. Equal distances are ordered by id here; Memory gives
        them in no defined order (RediSearch's heap, over vectors indexed in the background: it
        varies from run to run), nor which of more than k equally near records it keeps."""
        if ensure_index:
            self._tenant(tenant).indexed = True
        t = self._tenants.get(tenant)
        if t is None or not t.indexed:
            return []
        rows = [
            (rid, row)
            for rid, row in t.records[layer].items()
            if len(row.get("vec", b"")) == VECTOR_ITEM_BYTES * self.dims
            and all(_tag_equals(row.get(f), v) for f, v in (where or {}).items())
        ]
        if not rows:
            return []
        matrix = np.vstack([_unit(vector_from_bytes(_vec(row["vec"]))) for _, row in rows])
        distances = np.float32(1.0) - matrix @ _unit(vector_from_bytes(vector_bytes(vector)))
        ranked = sorted(zip(distances.tolist(), rows), key=lambda x: (x[0], x[1][0]))[:k]
        return [
            Hit(rid, similarity(float(f"{distance:.12g}")), {f: _text(row.get(f)) for f in return_fields})
            for distance, (rid, row) in ranked
        ]

    async def lexical(self, tenant: str, query: str, k: int) -> list[Hit]:
        """Memory.lexical with bm25s (Lucene's BM25, RediSearch's k1 and b) over the passages'
        Snowball stems (store.lexical): the `k` passages matching any query term, best first,
        equal scores by id. The index is rebuilt on the first search after passages change
        (this store serves tests and in-process benchmarks; Redis maintains its own)."""
        t = self._tenants.get(tenant)
        terms = search_terms(query)
        if t is None or not t.indexed or not terms or k < 1:
            return []
        passages = t.records["passages"]
        if t.lexical is None or t.lexical.size != len(passages):
            t.lexical = _LexicalIndex(passages)
        return [
            Hit(pid, score, {"doc_id": _text(passages[pid].get("doc_id"))}) for pid, score in t.lexical.search(terms, k)
        ]

    async def promote_lexical(self, tenant: str, progress=None) -> int:
        """Memory.promote_lexical: nothing to do here, where bm25s scores a tenant of any size by
        its own statistics already; how many passages the tenant holds."""
        count = len(self._tenant(tenant).records["passages"])
        if progress is not None:
            progress(count, count)
        return count

    async def promote_vectors(self, tenant: str) -> int:
        """Memory.promote_vectors: nothing to do here, where every search is exact over the
        tenant's own records; how many records of the promoted layers the tenant holds."""
        records = self._tenant(tenant).records
        return sum(len(records[layer]) for layer in ("passages", "facts", "entities"))

    # ---- reconstruct: an entity's passages, passage vectors ---------------------------------------
    async def entity_passages(self, tenant: str, entity_id: str, limit: int | None = None) -> list[str]:
        return sorted(self._tenant(tenant).sets.get(("entity_passages", entity_id), ()))[
            :limit
        ]  # reading adds no empty set

    async def passage_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]:
        return [self._vector(tenant, "passages", pid) for pid in passage_ids]

    async def facts_near_each(
        self,
        tenant: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
        vectors: bool = False,
    ) -> list[list[FactRecordHit]]:
        out = []
        for hits in await self.knn_each(tenant, "facts", vector, k, return_fields, wheres):
            ids = [h.id for h in hits]
            records = await self.facts(tenant, ids)
            held = await self.fact_vectors(tenant, ids) if vectors else [None] * len(ids)
            out.append([FactRecordHit(h.id, h.score, h.fields, f, v) for h, f, v in zip(hits, records, held)])
        return out

    async def entity_passages_near(
        self, tenant: str, vector: np.ndarray, entity_ids: list[str], k: int, vectors: bool = False
    ) -> list[list[PassageRecordHit]] | None:
        return None  # no index tags its passages by entity: the walk reads and ranks them (entity_passage_vectors)

    async def entity_passage_vectors(
        self, tenant: str, entity_ids: list[str], limit: int
    ) -> list[list[tuple[str, np.ndarray]]]:
        out = []
        for eid in entity_ids:
            ids = await self.entity_passages(tenant, eid, limit)
            out.append(
                [(pid, vec) for pid, vec in zip(ids, await self.passage_vectors(tenant, ids)) if vec is not None]
            )
        return out

    # ---- episodes: a session's turns in order (reconstruct's temporal contiguity) ---------------
    def stage_session_turn(self, pipe, tenant: str, session_id: str, turn: int, passage_id: str) -> None:
        def write() -> None:
            self._tenant(tenant).session_turns.setdefault(session_id, {})[passage_id] = turn  # Memory's ZADD

        self._stage(pipe, write)

    async def session_neighbours(self, tenant: str, session_id: str, turn: int, radius: int) -> list[tuple[int, str]]:
        turns = self._tenant(tenant).session_turns.get(session_id, {})
        return sorted((t, pid) for pid, t in turns.items() if t != turn and abs(t - turn) <= radius)

    # ---- entity aliases --------------------------------------------------------------------------
    async def resolve_aliases(self, tenant: str, entity_ids: list[str]) -> dict[str, str]:
        aliases = self._tenant(tenant).aliases
        return {eid: aliases.get(eid) or eid for eid in entity_ids}

    async def add_alias(self, tenant: str, alias_id: str, canonical_id: str) -> None:
        self._tenant(tenant).aliases[alias_id] = await alias_target(self, tenant, alias_id, canonical_id)

    async def alias_map(self, tenant: str) -> dict[str, str]:
        return dict(self._tenant(tenant).aliases)

    # ---- τ gate ------------------------------------------------------------------------------------
    async def hold_pending(self, tenant: str, schema_id: str, fact_id: str, passage_id: str) -> bool | None:
        records = self._tenant(tenant).records
        if records["passages"].get(passage_id, {}).get("retired") == "1":
            return None
        if records["schemas"].get(schema_id, {}).get("status") == "stable":
            return False
        self._revise(tenant, passage_id)
        self._set(tenant, "schema_pending", schema_id).add(fact_id)
        self._set(tenant, "fact_passages", fact_id).add(passage_id)
        self._set(tenant, "passage_facts", passage_id).add(fact_id)
        if records["facts"].get(fact_id, {}).get("status") in ("new", "retracted"):
            self._hset(tenant, "facts", fact_id, {"status": "pending"})
        return True

    async def pending_facts(self, tenant: str, schema_id: str) -> list[str]:
        return sorted(self._set(tenant, "schema_pending", schema_id))

    def stage_unpend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        if fact_ids:
            unpended = list(fact_ids)
            self._stage(pipe, lambda: self._set(tenant, "schema_pending", schema_id).difference_update(unpended))

    def stage_pend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        if fact_ids:
            pended = list(fact_ids)
            self._stage(pipe, lambda: self._set(tenant, "schema_pending", schema_id).update(pended))

    async def schema_status(self, tenant: str, schema_id: str) -> str | None:
        return _text(self._tenant(tenant).records["schemas"].get(schema_id, {}).get("status"))

    async def schema_support(self, tenant: str, schema_id: str) -> tuple[str | None, list[str], str | None]:
        record = self._tenant(tenant).records["schemas"].get(schema_id, {})
        frequency = record.get("frequency")
        return (
            _text(record.get("status")),
            sorted(self._tenant(tenant).sets.get(("schema_passages", schema_id), ())),
            None if frequency in (None, "") else str(frequency),
        )

    def expect_schema(self, pipe, tenant: str, schema_id: str, status: str | None, frequency: str | None) -> None:
        pipe.expected.setdefault((tenant, "schemas", schema_id, "status"), status or None)
        pipe.expected.setdefault((tenant, "schemas", schema_id, "frequency"), frequency or None)

    def stage_schema_status(self, pipe, tenant: str, schema_id: str, status: str) -> None:
        self._stage(pipe, lambda: self._hset(tenant, "schemas", schema_id, {"status": status}))

    # ---- conflict groups and relation cardinality ---------------------------------------------------
    async def join_group(
        self,
        tenant: str,
        head_id: str,
        relation: str,
        tail_id: str,
        fact_id: str,
        mark: str,
        multi_rule: tuple[int, float],
    ) -> GroupJoin:
        """Memory's _JOIN_GROUP (the first join of a relation sets its verdict: a flip)."""
        t, group = self._tenant(tenant), self._set(tenant, "group", f"{head_id}|{relation}")
        group.add(fact_id)
        self._set(tenant, "facts_with_tail", tail_id).add(fact_id)
        self._set(tenant, "relation_heads", relation).add(head_id)
        if len(group) >= 2:
            self._set(tenant, "relation_multi_heads", relation).add(head_id)
        heads, multi = (
            len(self._set(tenant, "relation_heads", relation)),
            len(self._set(tenant, "relation_multi_heads", relation)),
        )
        verdict = "multi" if multi >= multi_rule[0] and multi >= multi_rule[1] * heads else "single"
        flipped = False
        if t.cardinality.get(relation) != verdict:
            t.cardinality[relation] = t.flips[mark] = verdict
            flipped = True
        elif t.flips.get(mark) == verdict:
            flipped = True
        return GroupJoin(heads, multi, len(group), verdict, flipped)

    async def facts_with_tail(self, tenant: str, tail_id: str) -> list[str]:
        return sorted(self._set(tenant, "facts_with_tail", tail_id))

    async def group(self, tenant: str, head_id: str, relation: str) -> list[str]:
        return sorted(self._set(tenant, "group", f"{head_id}|{relation}"))

    async def group_size(self, tenant: str, head_id: str, relation: str) -> int:
        return len(self._set(tenant, "group", f"{head_id}|{relation}"))

    async def relation_multi_heads(self, tenant: str, relation: str) -> list[str]:
        return sorted(self._set(tenant, "relation_multi_heads", relation))

    async def relation_counts(self, tenant: str, relation: str) -> tuple[int, int]:
        return len(self._set(tenant, "relation_heads", relation)), len(
            self._set(tenant, "relation_multi_heads", relation)
        )

    broader = broader_by_containment  # store.base: Memory's walk over active containment facts, through this store's group() and fact()

    # ---- the graph, written ----------------------------------------------------------------------------
    async def bump_graph_version(self, tenant: str) -> int:
        t = self._tenant(tenant)
        t.graph_version += 1
        return t.graph_version

    async def graph_version(self, tenant: str) -> int:
        return self._tenant(tenant).graph_version

    def _log(self, tenant: str, version: int, change: EdgeChange) -> None:
        """Append to the graph log; past GRAPH_CHANGES_MAXLEN the oldest go (exactly here, in whole
        macro nodes in Redis: `MAXLEN ~`)."""
        t = self._tenant(tenant)
        t.changes_added += 1
        t.changes.append((f"{t.changes_added}-0", version, change))
        del t.changes[:-GRAPH_CHANGES_MAXLEN]

    def _set_weight(self, tenant: str, a: str, b: str, weight: float, kind: str) -> None:
        """An undirected edge on both of its ends (weight 0: gone)."""
        adjacency = self._tenant(tenant).adjacency
        for one, other in ((a, b), (b, a)):
            if weight:
                adjacency[one][adjacency_field(kind, other)] = weight
            else:
                adjacency[one].pop(adjacency_field(kind, other), None)

    def _link_fact(self, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str, linked: bool) -> None:
        """Memory's LINK_FACT / UNLINK_FACT: the edge's weight is the number of facts between the two."""
        between = self._set(tenant, "edge_facts", "|".join(sorted((head_node, tail_node))))
        between.add(fact_id) if linked else between.discard(fact_id)
        self._set_weight(tenant, head_node, tail_node, float(len(between)), "fact")
        self._log(tenant, version, EdgeChange(head_node, tail_node, float(len(between)), "fact"))
        if linked:
            self._set(tenant, "graph_nodes").update((head_node, tail_node))

    def stage_fact_edge(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        self._stage(pipe, lambda: self._link_fact(tenant, version, head_node, tail_node, fact_id, True))

    def stage_fact_unlink(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        self._stage(pipe, lambda: self._link_fact(tenant, version, head_node, tail_node, fact_id, False))

    def stage_edge(self, pipe, tenant: str, version: int, a: str, b: str, weight: float, kind: str) -> None:
        weight = float(_stored(weight))  # as Redis hands it back

        def write() -> None:
            adjacency = self._tenant(tenant).adjacency  # set even at weight 0, as Memory's HSET does
            adjacency[a][adjacency_field(kind, b)] = adjacency[b][adjacency_field(kind, a)] = weight
            self._set(tenant, "graph_nodes").update((a, b))
            self._log(tenant, version, EdgeChange(a, b, weight, kind))

        self._stage(pipe, write)

    def stage_edge_removed(self, pipe, tenant: str, version: int, a: str, b: str, kind: str) -> None:
        """Memory.stage_edge_removed."""

        def write() -> None:
            adjacency = self._tenant(tenant).adjacency
            adjacency[a].pop(adjacency_field(kind, b), None)
            adjacency[b].pop(adjacency_field(kind, a), None)
            self._log(tenant, version, EdgeChange(a, b, 0.0, kind))

        self._stage(pipe, write)

    def stage_type_member(self, pipe, tenant: str, version: int, entity_node: str, entity_type: str) -> None:
        self.stage_edge(pipe, tenant, version, entity_node, type_node(entity_type), 1.0, "type")

    def stage_similarity_bridged(self, pipe, tenant: str, entity_id: str) -> None:
        self._stage(pipe, lambda: self._set(tenant, "similarity_bridged").add(entity_id))

    async def unbridged_entity_vectors(self, tenant: str, passage_id: str) -> dict[str, np.ndarray]:
        bridged = self._set(tenant, "similarity_bridged")
        vectors = {
            eid: self._vector(tenant, "entities", eid)
            for eid in await self.passage_entities(tenant, passage_id)
            if eid not in bridged
        }
        return {eid: vec for eid, vec in vectors.items() if vec is not None}

    # ---- the graph, read (store.graph_log says what None means) ----------------------------------------
    async def graph_log_exists(self, tenant: str) -> bool:
        return self._tenant(tenant).changes_added > 0

    async def graph_log_head(self, tenant: str) -> str:
        changes = self._tenant(tenant).changes
        return changes[-1][0] if changes else NO_CHANGE

    async def adjacency_nodes(self, tenant: str) -> list[str]:
        return sorted(self._set(tenant, "graph_nodes"))  # (no nodes from before the node set: nothing to scan for)

    def adjacency(self, tenant: str, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]:
        return self._adjacency(self._tenant(tenant), nodes)

    @staticmethod
    async def _adjacency(t: _Tenant, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]:
        for start in range(0, len(nodes), LOAD_BATCH):
            edges = []
            for node in nodes[start : start + LOAD_BATCH]:
                for name, weight in t.adjacency.get(node, {}).items():
                    kind, other = name.split("|", 1)
                    if node < other:
                        edges.append(EdgeChange(node, other, weight, kind))
            yield edges

    async def changes_since(
        self, tenant: str, cursor: str, count: int = READ_BATCH
    ) -> list[tuple[str, EdgeChange]] | None:
        t = self._tenant(tenant)
        if cursor == NO_CHANGE:
            entries = t.changes[:count]
            if entries and t.changes_added > len(t.changes):
                return None  # entries made since the load are gone
        else:
            first = t.changes_added - len(t.changes) + 1  # the number in the id of the oldest entry kept
            try:
                position = int(cursor.split("-", 1)[0]) - first
            except ValueError:
                return None
            if not 0 <= position < len(t.changes) or t.changes[position][0] != cursor:
                return None
            entries = t.changes[position + 1 : position + 1 + count]
        return [(entry_id, change) for entry_id, _, change in entries]

    # ---- standing facts: a tenant's active facts of some categories (GET /v1/facts) ---------------------
    async def active_facts(
        self, tenant: str, categories: tuple[str, ...], limit: int, now: float | None = None
    ) -> tuple[list[Fact], int]:
        """Memory.active_facts: at most `limit` of the facts of `categories` that hold at `now`,
        one category at a time in the order given, oldest first (created_at, then id), and how many hold."""
        now = time.time() if now is None else now

        def holds(row) -> bool:
            return _text(row.get("status")) == "active" and not float(_text(row.get("expires_at")) or "inf") <= now

        rows = self._tenant(tenant).records["facts"]
        ids = [
            fid
            for category in categories
            for fid in sorted(
                (fid for fid, row in rows.items() if _text(row.get("category")) == category and holds(row)),
                key=lambda fid: (float(_text(rows[fid].get("created_at")) or 0.0), fid),
            )
        ]
        return [f for f in await self.facts(tenant, ids[:limit]) if f is not None], len(ids)

    async def recent_facts(self, tenant: str, statuses: tuple[str, ...], limit: int) -> list[Fact]:
        """Memory.recent_facts: the newest `limit` facts of `statuses` (empty: any), created_at descending, then id."""
        rows = self._tenant(tenant).records["facts"]
        chosen = sorted(
            (fid for fid, row in rows.items() if not statuses or _text(row.get("status")) in statuses),
            key=lambda fid: (-float(_text(rows[fid].get("created_at")) or 0.0), fid),
        )
        return [f for f in await self.facts(tenant, chosen[: max(0, limit)]) if f is not None]

    # ---- time in memory: TTLs and the expiry index ------------------------------------------------------
    def _record_lapse(self, tenant: str, fact_id: str, lapses_at: float | None) -> None:
        """Memory's _RECORD_LAPSE: `expires_at` absent on an existing fact = for ever."""
        t = self._tenant(tenant)
        record = t.records["facts"].get(fact_id)
        current = (record or {}).get("expires_at") or None
        if lapses_at is None:
            if current is not None:
                assert record is not None  # current was read from it
                del record["expires_at"]
                t.expiry.pop(fact_id, None)
        elif record is None or (current is not None and lapses_at > float(current)):
            self._hset(tenant, "facts", fact_id, {"expires_at": repr(float(lapses_at))})
            t.expiry[fact_id] = float(lapses_at)

    async def lapsed_facts(self, tenant: str, now: float, limit: int = 500) -> list[tuple[str, float]]:
        expiry = self._tenant(tenant).expiry
        return sorted(((fid, at) for fid, at in expiry.items() if at <= now), key=lambda x: (x[1], x[0]))[:limit]

    def stage_expiry_done(self, pipe, tenant: str, fact_id: str, expires_at: float) -> None:
        expiry = self._tenant(tenant).expiry

        def write() -> None:
            if expiry.get(fact_id) == float(expires_at):
                del expiry[fact_id]

        self._stage(pipe, write)

    def stage_merged_lapse(self, pipe, tenant: str, source_id: str, target_id: str) -> None:
        t = self._tenant(tenant)

        def write() -> None:
            source = t.records["facts"].get(source_id)
            if source is not None:
                lapse = source.get("expires_at") or None
                self._record_lapse(
                    tenant, target_id, None if lapse is None else float(lapse)
                )  # the target exists: a later passage's rule
                t.expiry.pop(source_id, None)

        self._stage(pipe, write)

    def stage_lapse_indexed(self, pipe, tenant: str, fact_id: str) -> None:
        t = self._tenant(tenant)

        def write() -> None:
            lapse = t.records["facts"].get(fact_id, {}).get("expires_at") or None
            if lapse is not None:
                t.expiry[fact_id] = float(lapse)

        self._stage(pipe, write)

    async def tenants(self) -> list[str]:
        return sorted(self._tenants_with_outboxes)

    async def legacy_tenants(self) -> list[str]:
        return []  # this store never had per-tenant indexes

    async def migrate_tenant(self, tenant: str, batch: int = 500) -> dict[str, int]:
        return dict.fromkeys(LAYERS, 0)

    async def float32_indexes(self) -> list[str]:
        return []  # nor float32 vectors

    async def migrate_vectors(self, name: str, batch: int = 500) -> int:
        raise ValueError(f"{name!r} is not a float32 shared index")

    async def purge_tenant(self, tenant: str, llm_cache_keys, embedded_texts) -> dict[str, int]:
        """Memory.purge_tenant."""
        t = self._tenants.get(tenant)
        if t is None:
            return {"keys": 0, "cache entries": 0, **dict.fromkeys(LAYERS, 0)}
        layers = {layer: await self.records(tenant, layer, skip=("vec", "retired_vec")) for layer in LAYERS}
        cache = list(llm_cache_keys(layers["passages"]))
        if t.embedder is not None:
            cached_vectors = self.embedding_cache(t.embedder.cache_name)
            cache += [
                cached_vectors.key(text)
                for text in embedded_texts(layers["passages"], layers["entities"], layers["facts"], layers["schemas"])
            ]
        for key in cache:
            self._cache.pop(key, None)
        del self._tenants[tenant]
        self._tenants_with_outboxes.discard(tenant)
        return {
            "keys": sum(len(rows) for rows in layers.values()),
            "cache entries": len(cache),
            **{layer: len(rows) for layer, rows in layers.items()},
        }

    async def document_ids(self, tenant: str) -> list[str]:
        return sorted(self._tenant(tenant).documents)

    async def tenant_known(self, tenant: str) -> bool:
        return tenant in self._tenants_with_outboxes

    async def tenant_counts(self) -> dict[str, dict[str, int]]:
        return {
            name: {layer: len(t.records[layer]) for layer in LAYERS}
            for name, t in sorted(self._tenants.items())
            if any(t.records[layer] for layer in LAYERS)
        }

    async def census(self, layer: str, by: str | None = None) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for name, t in sorted(self._tenants.items()):
            for row in t.records[layer].values():
                value = "" if by is None else (_text(row.get(by)) or "")
                out.setdefault(name, {}).setdefault(value, 0)
                out[name][value] += 1
        return out

    # ---- whole layers ------------------------------------------------------------------------------------
    async def scan_ids(self, tenant: str, layer: str) -> list[str]:
        return sorted(self._tenant(tenant).records[layer])

    async def records(
        self, tenant: str, layer: str, skip: tuple[str, ...] = RECORD_INTERNALS
    ) -> list[tuple[str, dict[str, str]]]:
        records = self._tenant(tenant).records[layer]
        return [(rid, {k: _text(v) for k, v in records[rid].items() if k not in skip}) for rid in sorted(records)]


class _LexicalIndex:
    """bm25s over one snapshot of a tenant's passages (ids sorted, so ties order by id)."""

    def __init__(self, passages: dict[str, dict]):
        import bm25s  # only a lexical search needs it

        self.size = len(passages)
        self.ids = sorted(passages)
        corpus = [(_text(passages[pid].get(LEXICAL_FIELD)) or "").split() for pid in self.ids]
        self.model = bm25s.BM25(method="lucene", k1=K1, b=B) if self.ids else None
        if self.model is not None:
            self.model.index(corpus, show_progress=False)

    def search(self, terms: list[str], k: int) -> list[tuple[str, float]]:
        if self.model is None:
            return []
        known = [t for t in terms if t in self.model.vocab_dict]
        if not known:
            return []
        scores = self.model.get_scores(known)
        matching = np.flatnonzero(scores > 0)
        order = sorted(matching.tolist(), key=lambda i: (-float(scores[i]), self.ids[i]))[:k]
        # bm25s's Lucene form leaves out the constant (k1 + 1) of the numerator; BM25STD has it
        return [(self.ids[i], float(scores[i]) * (K1 + 1)) for i in order]


class _InMemoryLLMCache(LLMCache):
    """LLMCache's keys over a dict (no TTL)."""

    def __init__(self, values: dict, model: str):
        super().__init__(None, model)
        self.values = values

    async def get(self, messages: list[dict], schema: dict) -> str | None:
        return self.values.get(self.key(messages, schema))

    async def put(self, messages: list[dict], schema: dict, answer: str) -> None:
        self.values[self.key(messages, schema)] = answer


class _InMemoryEmbeddingCache(EmbeddingCache):
    """EmbeddingCache's keys over a dict (no TTL): float32 bytes in, float32 arrays out, as from Redis."""

    def __init__(self, values: dict, embedder: str):
        super().__init__(None, embedder)
        self.values = values

    async def get_many(self, texts: list[str]) -> dict[str, np.ndarray]:
        found = {t: self.values.get(self.key(t)) for t in texts}
        return {t: np.frombuffer(raw, dtype=np.float32) for t, raw in found.items() if raw is not None}

    async def put_many(self, vectors: dict[str, np.ndarray]) -> None:
        for text, vector in vectors.items():
            self.values[self.key(text)] = np.asarray(
                vector, dtype=np.float32
            ).tobytes()  # as EmbeddingCache: exact, not vector_bytes

    async def forget_many(self, texts: list[str]) -> None:
        for text in texts:
            self.values.pop(self.key(text), None)


def _stored(value: Any) -> str | bytes:
    """A field value as Redis stores it: text and bytes as they are, numbers as redis-py writes them."""
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    raise TypeError(f"invalid value for a Redis field: {value!r} ({type(value).__name__})")


@overload
def _text(value: str | bytes) -> str: ...
@overload
def _text(value: str | bytes | None) -> str | None: ...
def _text(value: str | bytes | None) -> str | None:
    """A field as text: every field but the vector is held as str, as Memory reads them decoded."""
    return value.decode() if isinstance(value, bytes) else value


def _vec(value: str | bytes) -> bytes:
    """A record's vector: the one field held as bytes (only vector_bytes writes it)."""
    assert isinstance(value, bytes)
    return value


def _unit(vector: np.ndarray) -> np.ndarray:
    """The vector as VecSim stores it for cosine distance: scaled to length 1 in float32, held
    in the index's type (distances are then summed in float32)."""
    norm = np.float32(np.sqrt(np.dot(vector, vector)))
    return (vector / norm if norm else vector).astype(VECTOR_DTYPE).astype(np.float32)


def _tag_equals(stored: str | bytes | None, wanted: str) -> bool:
    """RediSearch's tag match: any of the comma-separated tags, trimmed, case-insensitive."""
    return stored is not None and wanted.strip().lower() in {tag.strip().lower() for tag in _text(stored).split(",")}
