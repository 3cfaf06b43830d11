"""The store's interface: what the indexing stages, the envelope and the query side ask of the
memory (store.memory.Memory is the Redis implementation). Written down so that a second
implementation — one in process memory for fast tests — can be checked against it. It is cut
into roles (Outbox, Layers, Gate, GraphReads, …), one Protocol each, so that a stage or a query
part names what it uses; MemoryStore is all of them. `isinstance(x, MemoryStore)` checks the
names (tests/test_store_interface.py), mypy the signatures (`store/__init__.py`).

Writes are staged: a stage takes `pipeline()`, stages every write of its decision on it, and
`commit_once` executes them with the message's outbox, all or nothing."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from store.caches import EmbeddingCache, LLMCache
from store.facts import Fact, FactRecordHit
from store.graph_log import READ_BATCH, EdgeChange
from store.records import (
    RECORD_INTERNALS,
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
    TurnEmbedding,
    TurnsNear,
)
from topics import BadInput


class StagedWrites(Protocol):
    """What pipeline() returns: the batch of writes one decision stages (on Redis a MULTI
    pipeline). Only the store writes on it; a caller passes it to `stage_*`/`expect_*` and hands
    it to `commit_once` (or executes it, for writes outside the envelope)."""

    async def execute(self) -> Any: ...


@runtime_checkable
class Lifetime(Protocol):
    """Lifetime, health and model caches: every role."""

    async def close(self) -> None: ...
    async def ping(self) -> None: ...
    def llm_cache(self, model: str) -> LLMCache: ...
    def embedding_cache(self, embedder: str) -> EmbeddingCache: ...


@runtime_checkable
class Outbox(Protocol):
    """Effectively once: the envelope's done marks and outbox (AlreadyDone, StaleDecision), and
    each committed decision's id, which the messages it sends name as their cause
    (CauseNotInMemory: a message whose cause memory does not hold)."""

    def pipeline(self, tenant: str) -> StagedWrites: ...
    async def pending_outbox(self, tenant: str, mark: str, cause: str = "") -> Committed | None: ...
    def stage_outbox(
        self, pipe: StagedWrites, tenant: str, mark: str, outbox: list[Outgoing], decision: str = ""
    ) -> None: ...
    def expect_status(self, pipe: StagedWrites, tenant: str, fact_id: str, status: str) -> None: ...
    def expect_field(
        self, pipe: StagedWrites, tenant: str, fact_id: str, name: str, value: str | float | None
    ) -> None: ...
    async def commit_once(self, pipe: StagedWrites, tenant: str, mark: str) -> Committed | None: ...
    async def finish(self, tenant: str, mark: str, decision: str = "") -> None: ...
    async def unsent_outboxes(self, committed_before: float, limit: int = 500) -> list[tuple[str, str, Committed]]: ...
    # memory = f(log): the last offset of each input partition whose effects the store holds,
    # recorded after them; a store that lost writes holds an older one (or none)
    async def record_applied(self, group: str, topic: str, partition: int, offset: int) -> None: ...
    async def applied_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]: ...


@runtime_checkable
class Progress(Protocol):
    """Document progress: the chunker and every stage after it; `publish --wait` reads it."""

    def stage_document(
        self,
        pipe: StagedWrites,
        tenant: str,
        doc_id: str,
        doc_hash: str,
        version: int,
        chunk_ids: list[str],
        mark: str = "",
        position: tuple[int, int] | None = None,
    ) -> None: ...
    def stage_chunk_done(self, pipe: StagedWrites, tenant: str, chunk_id: str) -> None: ...
    def stage_fact_done(
        self, pipe: StagedWrites, tenant: str, chunk_id: str, fact_index: int, chunk_fact_count: int
    ) -> None: ...
    def stage_spawn(self, pipe: StagedWrites, tenant: str, chunk_id: str, work_ids: list[str]) -> None: ...
    def stage_work_done(
        self, pipe: StagedWrites, tenant: str, chunk_id: str, work_id: str, chunk_fact_count: int
    ) -> None: ...
    async def chunk_done(self, tenant: str, chunk_id: str) -> bool: ...
    async def chunks_done_count(self, tenant: str) -> int: ...
    async def outstanding_work(self, tenant: str, chunk_id: str) -> list[str]: ...
    async def document_status(
        self, tenant: str, doc_id: str
    ) -> DocumentStatus | None: ...  # None: the chunker has not seen it
    # many documents of a tenant in one round trip, in their order (`publish --wait` polls it)
    async def document_statuses(self, tenant: str, doc_ids: list[str]) -> list[DocumentStatus | None]: ...
    async def document_ids(self, tenant: str) -> list[str]: ...  # every document recorded (`memstream status`)


@runtime_checkable
class Versions(Protocol):
    """Document versions: the chunker retires the passages a version no longer holds (out of retrieval and of every count, kept for audit) and restores those a revert brings back; the extractor and detector read a passage's state, fenced, before counting it."""

    async def document_record(self, tenant: str, doc_id: str) -> DocumentRecord | None: ...
    def expect_document(self, pipe: StagedWrites, tenant: str, doc_id: str, record: DocumentRecord | None) -> None: ...
    def stage_passage_documents(
        self, pipe: StagedWrites, tenant: str, passage_id: str, joined: list[str], left: list[str]
    ) -> None: ...
    async def passage_documents(self, tenant: str, passage_ids: list[str]) -> list[set[str]]: ...
    async def passage_states(self, tenant: str, passage_ids: list[str]) -> list[PassageState]: ...
    def expect_passage(
        self, pipe: StagedWrites, tenant: str, passage_id: str, state: PassageState, counts: bool = False
    ) -> None: ...
    def stage_retire_passage(self, pipe: StagedWrites, tenant: str, passage_id: str) -> None: ...
    def stage_restore_passage(self, pipe: StagedWrites, tenant: str, passage_id: str, incarnation: int) -> None: ...
    async def passage_support(
        self, tenant: str, passage_id: str
    ) -> tuple[list[str], list[str]]: ...  # (fact ids, schema ids)
    def stage_drop_support(
        self,
        pipe: StagedWrites,
        tenant: str,
        passage_id: str,
        fact_ids: list[str],
        schema_ids: list[str],
        entity_ids: list[str],
    ) -> None: ...


@runtime_checkable
class Erasing(Protocol):
    """Erasure (workers.stages.erasure): what a document's passages extracted, each fact's source passages and each entity's current passages with the write counter the decision is fenced on, and the removal itself (store.records.Erasure)."""

    async def document_passages(self, tenant: str, doc_id: str) -> list[str]: ...
    async def passage_extracted(self, tenant: str, passage_ids: list[str]) -> list[set[str]]: ...
    async def fact_sources(self, tenant: str, fact_ids: list[str]) -> list[tuple[set[str], str | None]]: ...
    async def entity_mentions(self, tenant: str, entity_ids: list[str]) -> list[tuple[set[str], str | None]]: ...
    async def facts_naming(self, tenant: str, entity_id: str) -> list[str]: ...
    def expect_entity(self, pipe: StagedWrites, tenant: str, entity_id: str, mentions: str | None) -> None: ...
    def stage_erase(self, pipe: StagedWrites, tenant: str, erasure: Erasure) -> None: ...


@runtime_checkable
class Layers(Protocol):
    """Memory layers: the extractor writes them, the detector, resolver and queries read."""

    async def ensure_indexes(self, tenant: str) -> None: ...
    # `turn`: what a turn's vector was embedded with (TurnEmbedding), in the same write; its
    # lexical terms follow `preceding_text` (the text of the turn before it) as its vector does
    def stage_passage(
        self,
        pipe: StagedWrites,
        tenant: str,
        chunk,
        entity_ids: list[str],
        vector,
        turn: TurnEmbedding | None = None,
        own_vector=None,
        preceding_text: str | None = None,
    ) -> None: ...
    async def recorded_embedder(self, tenant: str) -> EmbedderId | None: ...
    # the embedder the tenant's indexes were built with, recorded by the first writer (Memory's docstring)
    async def claim_embedder(self, tenant: str, embedder: EmbedderId, create: bool) -> EmbedderId | None: ...
    def stage_entity(
        self, pipe: StagedWrites, tenant: str, entity_id: str, name: str, type_: str, vector, passage_id: str
    ) -> None: ...
    def stage_schema(
        self,
        pipe: StagedWrites,
        tenant: str,
        schema_id: str,
        head_type: str,
        relation: str,
        tail_type: str,
        vector,
        passage_id: str,
    ) -> None: ...
    def stage_new_fact(
        self, pipe: StagedWrites, tenant: str, fact: Fact, vector, lapses_at: float | None = None, passage_id: str = ""
    ) -> None: ...
    def stage_fact_passage(self, pipe: StagedWrites, tenant: str, fact_id: str, passage_id: str) -> None: ...
    # when a document first said a fact (kept once set) and each fact's doc id → that time
    def stage_fact_said(self, pipe: StagedWrites, tenant: str, fact_id: str, doc_id: str, at: float) -> None: ...
    async def facts_said(self, tenant: str, fact_ids: list[str]) -> list[dict[str, float]]: ...
    def stage_unsupport(self, pipe: StagedWrites, tenant: str, fact_id: str, passage_ids: list[str]) -> None: ...
    # the passages the fact's last retraction set aside (stage_unsupport keeps them apart)
    async def set_aside_passages(self, tenant: str, fact_id: str) -> list[str]: ...
    def stage_fact_update(self, pipe: StagedWrites, tenant: str, fact_id: str, fields: dict[str, Any]) -> None: ...
    async def fact(self, tenant: str, fact_id: str) -> Fact | None: ...
    async def facts(self, tenant: str, fact_ids: list[str]) -> list[Fact | None]: ...
    # each as store.records.passage_json: id, text (as published), doc_id, seq, doc_version, metadata (dict), context
    async def passages(self, tenant: str, passage_ids: list[str]) -> list[dict | None]: ...
    async def entity_names(self, tenant: str, entity_ids: list[str]) -> dict[str, dict]: ...
    async def passage_entities(self, tenant: str, passage_id: str) -> list[str]: ...
    async def passages_entities(self, tenant: str, passage_ids: list[str]) -> list[list[str]]: ...  # one round trip
    # each passage's subject (a titled document's: its title's name), None for none or a retired
    # passage; one round trip
    async def passage_subjects(self, tenant: str, passage_ids: list[str]) -> list[str | None]: ...
    # passages, the entities they name with those entities' names, and the stored vectors of
    # `vectors` (("fact" | "passage", id)): a reconstruct step's reads, in one round trip
    async def read_passages(
        self, tenant: str, passage_ids: list[str], vectors: list[tuple[str, str]]
    ) -> PassagesRead: ...
    async def fact_vector(self, tenant: str, fact_id: str) -> np.ndarray | None: ...
    async def fact_vectors(self, tenant: str, fact_ids: list[str]) -> list[np.ndarray | None]: ...  # one round trip
    # text → the vector a record holds for that very text (entity id → name, fact id → its text,
    # schema id → "head_type relation tail_type"), in one round trip: what needs no embedding
    async def held_vectors(
        self, tenant: str, entities: dict[str, str], facts: dict[str, str], schemas: dict[str, str]
    ) -> dict[str, HeldVector]: ...
    # ensure_index: a writer deciding on the answer (a similarity bridge, a near-duplicate): an
    # index Redis lost is created again (and its scan of the records waited for) before the search
    # — found missing, a reader's search answers nothing, which a decision must not take for "none"
    async def knn(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
        ensure_index: bool = False,
    ) -> list[Hit]: ...
    async def knn_many(
        self,
        tenant: str,
        layer: str,
        vectors: list[np.ndarray],
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
        ensure_index: bool = False,
    ) -> list[list[Hit]]: ...

    # knn of one vector under each filter, in one round trip
    async def knn_each(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
    ) -> list[list[Hit]]: ...

    # knn_each over the facts, each hit with its Fact (and with `vectors` its vector): Redis reads
    # them in the searches' command (reconstruct's step: one round trip, not two)
    async def facts_near_each(
        self,
        tenant: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
        vectors: bool = False,
    ) -> list[list[FactRecordHit]]: ...

    # reconstruct's entity cues: each entity's k passages nearest a vector, each with its row and
    # vector, searched at once where the store's index tags passages by entity (Redis: a large
    # tenant's own index); None elsewhere
    async def entity_passages_near(
        self, tenant: str, vector: np.ndarray, entity_ids: list[str], k: int, vectors: bool = False
    ) -> list[list[PassageRecordHit]] | None: ...

    # the lexical leg: the k passages best matching a query by BM25 (store.lexical), best first
    async def lexical(self, tenant: str, query: str, k: int) -> list[Hit]: ...
    # a graph mode's first stage: the dense leg (knn of the passages, fields doc_id) and the
    # lexical leg, each hit with its row (PassageRecordHit.row, None: gone) and a lexical hit
    # with its vector, read in the search's command where the store can (Redis: a large tenant's
    # own lexical index for the lexical leg); None where it does not (the caller reads them)
    async def passages_near_read(self, tenant: str, vector: np.ndarray, k: int) -> list[PassageRecordHit] | None: ...
    async def lexical_read(self, tenant: str, query: str, k: int) -> list[PassageRecordHit] | None: ...
    # the lexical leg of a large tenant inside the store at any size (Redis: an index of its own,
    # store.redis.lexical_index; ensure_indexes starts it past a size); how many passages it holds
    async def promote_lexical(self, tenant: str, progress: Callable[[int, int], None] | None = None) -> int: ...
    # a writer's round over every large tenant's own lexical index: each whose statistics drifted
    # (Redis: after edits, or a restart that indexed its copies twice) built again; the tenants
    async def own_lexical_upkeep(self) -> list[str]: ...
    # a large tenant's KNN searches over indexes of its own (Redis: HNSW, store.redis.vector_index;
    # ensure_indexes starts it past a size); how many records they hold
    async def promote_vectors(self, tenant: str) -> int: ...


@runtime_checkable
class Episodes(Protocol):
    """What reconstruct (workers.query.reconstruct) walks: an entity's passages, sorted; passage
    vectors; and episodes — the extractor indexes each turn passage under its session, reconstruct
    reads a turn's neighbours (turn ± radius, the turn itself left out) as (turn, passage id), sorted."""

    async def entity_passages(self, tenant: str, entity_id: str, limit: int | None = None) -> list[str]: ...
    async def passage_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]: ...
    # each entity's first `limit` passages by id with their vectors, in one round trip
    async def entity_passage_vectors(
        self, tenant: str, entity_ids: list[str], limit: int
    ) -> list[list[tuple[str, np.ndarray]]]: ...

    def stage_session_turn(
        self, pipe: StagedWrites, tenant: str, session_id: str, turn: int, passage_id: str
    ) -> None: ...
    async def session_neighbours(
        self, tenant: str, session_id: str, turn: int, radius: int
    ) -> list[tuple[int, str]]: ...
    # a turn's passage embedded with the turn before it (workers.stages.extractor): the session's
    # passages at turn − 1, turn and turn + 1 with each turn's change count, read to decide; the
    # decision fails its commit if a passage was indexed at one of them meanwhile
    async def session_turns_near(self, tenant: str, session_id: str, turn: int) -> TurnsNear: ...
    def expect_session_turns(
        self, pipe: StagedWrites, tenant: str, session_id: str, changes: dict[int, int]
    ) -> None: ...
    # what each passage's vector was embedded with (a passage not embedded after a turn before it:
    # TurnEmbedding()), and a turn's vector and lexical terms (store.lexical.passage_terms, its
    # own then that turn's) made again after the turn before it, indexed since
    async def turn_embeddings(self, tenant: str, passage_ids: list[str]) -> list[TurnEmbedding]: ...
    def stage_turn_embedding(
        self,
        pipe: StagedWrites,
        tenant: str,
        passage_id: str,
        embedding: TurnEmbedding,
        vector,
        own_vector,
        terms: str,
    ) -> None: ...
    # a turn's vector of its own text alone (None: none kept), and the turn given it back with
    # its own lexical terms — the turn before it left memory — with the cached vectors of what it
    # had embedded forgotten
    async def own_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]: ...
    def stage_turn_alone(
        self, pipe: StagedWrites, tenant: str, passage_id: str, own_vector, terms: str, forget: list[str]
    ) -> None: ...


@runtime_checkable
class Aliases(Protocol):
    """Entity aliases: applied by the extractor, managed by `memstream alias`."""

    async def resolve_aliases(self, tenant: str, entity_ids: list[str]) -> dict[str, str]: ...
    # resolve_aliases, and the canonical ids' Layers.entity_names (those that exist), in one
    # round trip: a query's mentions
    async def canonical_names(self, tenant: str, entity_ids: list[str]) -> tuple[dict[str, str], dict[str, dict]]: ...
    async def add_alias(self, tenant: str, alias_id: str, canonical_id: str) -> None: ...
    async def alias_map(self, tenant: str) -> dict[str, str]: ...


@runtime_checkable
class Gate(Protocol):
    """The τ gate: the detector parks facts of unstable schemas, the promoting one drains them."""

    async def hold_pending(
        self, tenant: str, schema_id: str, fact_id: str, passage_id: str
    ) -> bool | None: ...  # None: passage retired
    async def pending_facts(self, tenant: str, schema_id: str) -> list[str]: ...
    def stage_unpend(self, pipe: StagedWrites, tenant: str, schema_id: str, fact_ids: list[str]) -> None: ...
    # a schema whose support a document version took below τ: back to a candidate, its facts parked
    def stage_pend(self, pipe: StagedWrites, tenant: str, schema_id: str, fact_ids: list[str]) -> None: ...
    async def schema_status(self, tenant: str, schema_id: str) -> str | None: ...
    async def schema_support(
        self, tenant: str, schema_id: str
    ) -> tuple[str | None, list[str], str | None]: ...  # (status, passages, frequency)
    def stage_schema_status(self, pipe: StagedWrites, tenant: str, schema_id: str, status: str) -> None: ...
    def expect_schema(
        self, pipe: StagedWrites, tenant: str, schema_id: str, status: str | None, frequency: str | None
    ) -> None: ...


@runtime_checkable
class ConflictGroups(Protocol):
    """Conflict groups and relation cardinality: the detector and the resolver."""

    async def join_group(
        self,
        tenant: str,
        head_id: str,
        relation: str,
        tail_id: str,
        fact_id: str,
        mark: str,
        multi_rule: tuple[int, float],
    ) -> GroupJoin: ...
    async def facts_with_tail(self, tenant: str, tail_id: str) -> list[str]: ...
    async def group(self, tenant: str, head_id: str, relation: str) -> list[str]: ...
    async def group_size(self, tenant: str, head_id: str, relation: str) -> int: ...
    async def relation_multi_heads(self, tenant: str, relation: str) -> list[str]: ...
    async def relation_counts(self, tenant: str, relation: str) -> tuple[int, int]: ...
    async def broader(self, tenant: str, a: str, b: str, containment: frozenset[str], max_depth: int = 4) -> bool: ...


@runtime_checkable
class GraphWrites(Protocol):
    """The graph, written: edges staged with the decision that made them, versioned."""

    async def bump_graph_version(self, tenant: str) -> int: ...
    async def graph_version(self, tenant: str) -> int: ...
    def stage_fact_edge(
        self, pipe: StagedWrites, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str
    ) -> None: ...
    def stage_fact_unlink(
        self, pipe: StagedWrites, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str
    ) -> None: ...
    def stage_edge(
        self, pipe: StagedWrites, tenant: str, version: int, a: str, b: str, weight: float, kind: str
    ) -> None: ...
    def stage_edge_removed(self, pipe: StagedWrites, tenant: str, version: int, a: str, b: str, kind: str) -> None: ...
    def stage_type_member(
        self, pipe: StagedWrites, tenant: str, version: int, entity_node: str, entity_type: str
    ) -> None: ...
    def stage_similarity_bridged(self, pipe: StagedWrites, tenant: str, entity_id: str) -> None: ...
    async def unbridged_entity_vectors(self, tenant: str, passage_id: str) -> dict[str, np.ndarray]: ...


@runtime_checkable
class GraphReads(Protocol):
    """The graph, read: the query worker's graph cache (store.graph_log says what None means)."""

    async def graph_log_exists(self, tenant: str) -> bool: ...
    async def graph_log_head(self, tenant: str) -> str: ...
    async def adjacency_nodes(self, tenant: str) -> list[str]: ...
    def adjacency(self, tenant: str, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]: ...
    async def changes_since(
        self, tenant: str, cursor: str, count: int = READ_BATCH
    ) -> list[tuple[str, EdgeChange]] | None: ...


@runtime_checkable
class StandingFacts(Protocol):
    """Standing facts: GET /v1/facts, the MCP tool standing_facts (workers.query.drilldown)."""

    async def active_facts(
        self, tenant: str, categories: tuple[str, ...], limit: int, now: float | None = None
    ) -> tuple[list[Fact], int]: ...
    # the newest `limit` facts of `statuses` (empty: any), created_at descending, then id (the explorer)
    async def recent_facts(self, tenant: str, statuses: tuple[str, ...], limit: int) -> list[Fact]: ...


@runtime_checkable
class Expiry(Protocol):
    """Time in memory: the extractor records TTLs, the expiry sweep reads and clears them."""

    async def lapsed_facts(self, tenant: str, now: float, limit: int = 500) -> list[tuple[str, float]]: ...
    def stage_expiry_done(self, pipe: StagedWrites, tenant: str, fact_id: str, expires_at: float) -> None: ...
    def stage_merged_lapse(self, pipe: StagedWrites, tenant: str, source_id: str, target_id: str) -> None: ...
    def stage_lapse_indexed(self, pipe: StagedWrites, tenant: str, fact_id: str) -> None: ...


@runtime_checkable
class Tenants(Protocol):
    """Tenants as a whole: listing, counting, erasing, migrating (`memstream tenants`, `purge`,
    `migrate`; the metrics census)."""

    async def tenants(self) -> list[str]: ...
    async def tenant_known(self, tenant: str) -> bool: ...  # anything ever committed for it
    # erase a tenant: its model-cache entries (keys of its extractions, texts it embedded), indexes and keys
    async def purge_tenant(self, tenant: str, llm_cache_keys: Callable, embedded_texts: Callable) -> dict[str, int]: ...
    async def tenant_counts(self) -> dict[str, dict[str, int]]: ...  # tenant → records per layer (memstream tenants)
    # every tenant's records of a layer by a tag's value (by None: all under ""), for metrics
    async def census(self, layer: str, by: str | None = None) -> dict[str, dict[str, int]]: ...
    # tenants from before shared indexes, and moving one onto them (memstream migrate)
    async def legacy_tenants(self) -> list[str]: ...
    async def migrate_tenant(self, tenant: str, batch: int = 500) -> dict[str, int]: ...
    # shared indexes from when vectors were float32, and re-encoding one's records (memstream migrate)
    async def float32_indexes(self) -> list[str]: ...
    async def migrate_vectors(self, name: str, batch: int = 500) -> int: ...


@runtime_checkable
class Export(Protocol):
    """Whole layers: `memstream export`."""

    async def scan_ids(self, tenant: str, layer: str) -> list[str]: ...
    async def records(
        self, tenant: str, layer: str, skip: tuple[str, ...] = RECORD_INTERNALS
    ) -> list[tuple[str, dict[str, str]]]: ...


@runtime_checkable
class MemoryStore(
    Lifetime,
    Outbox,
    Progress,
    Versions,
    Erasing,
    Layers,
    Episodes,
    Aliases,
    Gate,
    ConflictGroups,
    GraphWrites,
    GraphReads,
    StandingFacts,
    Expiry,
    Tenants,
    Export,
    Protocol,
):
    """Every role: what a memory is (store.memory.Memory on Redis, store.in_memory.InMemoryStore
    in process). A stage or query part names the roles it uses; a memory's configuration (vector
    dims, τ) is its constructor's business, not the interface's."""


async def broader_by_containment(
    self: MemoryStore, tenant: str, a: str, b: str, containment: frozenset[str], max_depth: int = 4
) -> bool:
    """MemoryStore.broader, written once over the interface (group() and fact()) and used as
    both stores' method: the memory holds a path of active containment facts (b part of /
    located in … a), at most `max_depth` facts long."""
    frontier, seen = {b}, {b}
    for _ in range(max_depth):
        next_frontier = set()
        for entity in frontier:
            for relation in containment:
                for fid in await self.group(tenant, entity, relation):
                    fact = await self.fact(tenant, fid)
                    if fact and fact.status == "active":
                        if fact.tail_id == a:
                            return True
                        if fact.tail_id not in seen:
                            seen.add(fact.tail_id)
                            next_frontier.add(fact.tail_id)
        if not next_frontier:
            return False
        frontier = next_frontier
    return False


async def alias_target(store: Aliases, tenant: str, alias_id: str, canonical_id: str) -> str:
    """The canonical entity `alias_id` is to point to (an alias of an alias points to the end of
    the chain); ValueError for an alias of itself or a cycle. Both stores' add_alias use it."""
    if alias_id == canonical_id:
        raise BadInput("an alias must differ from its canonical entity")
    canonical = (await store.resolve_aliases(tenant, [canonical_id]))[canonical_id]
    if canonical == alias_id:
        raise BadInput(f"{canonical_id!r} is already an alias of {alias_id!r}")
    return canonical
