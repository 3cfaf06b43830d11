"""The plain values of the store's interface (store.base.MemoryStore), shared by both of its
implementations: what a stage hands the store and gets back, the two exceptions of a fenced
commit, and the stored form of a vector. Redis-free, so the in-memory store
(store.in_memory) loads neither redis nor redisvl."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, TypeGuard

import numpy as np

from store.lexical import LEXICAL_FIELD, LEXICAL_LENGTH_FIELD, passage_terms, term_count

OUTBOX_SWEEP_LOCK_S = 30  # how long one sweeper holds a tenant's committed, unsent outboxes


@dataclass(frozen=True)
class Outgoing:
    """A message a stage will publish once its Redis effects are committed."""

    topic: str  # topic suffix, e.g. "indexed-facts"
    key: str
    value: bytes

    def to_json(self) -> list:
        return [self.topic, self.key, self.value.decode("utf-8")]

    @classmethod
    def from_json(cls, item: list) -> "Outgoing":
        return cls(item[0], item[1], item[2].encode("utf-8"))


@dataclass(frozen=True)
class GroupJoin:
    heads: int  # heads seen with the relation
    multi_heads: int  # heads with two or more tails
    size: int  # facts in this (head, relation) group
    verdict: str  # the relation's cardinality now: "single" | "multi"
    flipped: bool  # this message changed the verdict


@dataclass(frozen=True)
class DocumentStatus:
    """How far a document the chunker has seen is through the pipeline (`publish --wait`)."""

    doc_hash: str  # content hash of the text of its latest publication
    version: int
    chunks: int
    chunks_done: int  # of its chunks, those through the resolver

    def indexed(self, doc_hash: str) -> bool:
        """This text (by content hash) is through the pipeline: every chunk of it is done."""
        return self.doc_hash == doc_hash and self.chunks_done == self.chunks


@dataclass(frozen=True)
class DocumentRecord:
    """A document's current version as the chunker recorded it: what a new version is
    compared with (the passages it no longer contains are retired)."""

    doc_hash: str
    version: int
    chunk_ids: tuple[str, ...]
    mark: str = ""  # the done mark of the message that recorded it (a redelivery finds it there)
    seq: int = 0  # how many times it was recorded: the marks of the next change name it, so none repeats
    position: tuple[int, int] | None = None  # (partition, offset) on `documents` of the message that recorded it

    def recorded_after(self, position: tuple[int, int] | None) -> bool:
        """Whether a later message of the same `documents` partition than the one at `position`
        made this record: that message is older, delivered late (an old owner's copy during a
        rebalance, a redelivery behind a replay) — a tombstone carries no version to tell."""
        return (
            position is not None
            and self.position is not None
            and self.position[0] == position[0]
            and self.position[1] > position[1]
        )

    @property
    def deleted(self) -> bool:
        """A tombstone made it hold nothing (a published version always holds a chunk)."""
        return not self.chunk_ids

    def supersedes(self, version: int) -> bool:
        """Whether a publication of `version` is too old to change the document: older than its
        version, or no newer than the version a deletion took out (a redelivered old version
        must not bring a deleted document back)."""
        return self.version > version or (self.deleted and self.version >= version)


@dataclass(frozen=True)
class PassageState:
    """Whether a passage is out of memory (a version that no longer contains it retired it;
    kept for audit) and how many times it came back (topics.Chunk.incarnation)."""

    retired: bool
    incarnation: int
    revision: int = 0  # writes to its counting sets so far (TenantKeys.passage_revision)


@dataclass(frozen=True)
class Erasure:
    """What erasing a document removes from the store (workers.stages.erasure decides it;
    Memory.stage_erase removes it): passages (left as a skeleton — retired, purged, its
    incarnation — so a chunk of it still in flight is not extracted again), the facts only they
    extracted, the entities no current passage or remaining fact names (with their graph
    edges and aliases), the relation-head counts of those entities, and model-cache keys."""

    doc_id: str
    passage_ids: tuple[str, ...]
    facts: tuple  # store.facts.Fact of each fact to erase
    entity_ids: tuple[str, ...]
    relation_heads: tuple[tuple[str, str], ...]  # (relation, head entity id) to forget
    aliases: tuple[str, ...]  # alias fields to drop (an erased entity's, or aliases to it)
    cache_keys: tuple[str, ...]


# A passage's fields its retirement moves aside (out of the vector and full-text indexes) and
# its return moves back: stored name → name while retired.
RETIRED_FIELDS = {
    "vec": "retired_vec",
    LEXICAL_FIELD: f"retired_{LEXICAL_FIELD}",
    LEXICAL_LENGTH_FIELD: f"retired_{LEXICAL_LENGTH_FIELD}",
}

# Every record of a vector-indexed layer names its tenant: the shared index's tag every search
# filters on (store.indexes.TenantIndex).
TENANT_FIELD = "tenant"


@dataclass(frozen=True)
class Hit:
    id: str  # id within its layer (key without prefix)
    score: float  # cosine similarity
    fields: dict[str, Any]


@dataclass(frozen=True)
class PassagesRead:
    """Passages read with what a reconstruct step needs of them, in one round trip
    (MemoryStore.read_passages)."""

    rows: list[dict | None]  # passage_json of each passage asked (None: none such)
    entities: list[list[str]]  # the entity ids each passage names
    names: dict[str, dict]  # entity id → {"name", "type"}, for those entities that exist
    vectors: dict[tuple[str, str], np.ndarray]  # ("fact" | "passage", id) → stored vector, of those asked that exist


@dataclass(frozen=True)
class PassageRecordHit(Hit):
    """A passage search's hit with what the same command read of it: its row (passage_json;
    None: gone since) and its stored vector."""

    row: dict | None = None
    vector: np.ndarray | None = None


class StaleDecision(Exception):
    """A fact a decision read changed before the decision committed: decide again."""


class AlreadyDone(Exception):
    """The message behind this mark was fully processed before (a redelivery)."""


class CauseNotInMemory(Exception):
    """The decision that sent this message is not the one memory holds: Redis lost it (the
    stage upstream, reading its input again, decides and sends again), or lost it and decided it
    again differently (this copy is of the lost decision). Deciding the message now would build
    memory from effects memory does not hold; marking it done would make the copy that is sent
    again find it done. It is passed over, with no mark (workers.recovery)."""


@dataclass(frozen=True)
class Committed:
    """A message's committed decision: the outbox to publish (then `finish`), and the decision's
    id, which each message of the outbox names as its cause (`cause`)."""

    outbox: list[Outgoing]
    decision: str = ""  # "" for one committed before decisions had ids


def cause(mark: str, decision: str) -> str:
    """What a message names as its cause: the mark of the message whose decision sent it, and
    that decision's id (a hex hash: no '@'; workers.envelope.decision_id)."""
    return f"{mark}@{decision}"


def parse_cause(text: str) -> tuple[str, str]:
    """(mark, decision id) of a cause."""
    mark, _, decision = text.rpartition("@")
    return mark, decision


def cause_held(text: str, held: str | None) -> None:
    """Raise CauseNotInMemory unless memory holds the decision `text` names (`held`: the id of the
    decision memory holds for its mark, "" for one older than ids, None for none)."""
    mark, decision = parse_cause(text)
    if held is None:
        raise CauseNotInMemory(f"the message that sent it ({mark}) is not decided in memory")
    if held and held != decision:
        raise CauseNotInMemory(f"the message that sent it ({mark}) was decided again since")


# Vectors are held as float16, scaled to length 1 first (every comparison is a cosine, so the
# length carries nothing; and a unit vector's parts fit float16's range). A vector is held twice,
# in its record and in the index's own copy, so float32 doubled the raw vector bytes: at 384
# dimensions float16 took a tenant of 20 passages from 267 to 162 KB (`memstream bench tenants`),
# at 1,536 dimensions from 978 to 514 KB (2.59x -> 1.36x the float32 vectors and texts).
VECTOR_TYPE = "float16"
VECTOR_DTYPE = np.float16
VECTOR_ITEM_BYTES = 2


class HeldVector(bytes):
    """A vector as a record holds it (vector_bytes), read back to be written again for the same
    text (Layers.held_vectors): vector_bytes passes it through as it is, never scaled again, so
    a record written from it holds the very bytes an embedding of that text would have given."""


def vector_bytes(vector: Iterable[float] | HeldVector) -> bytes:
    """A vector as both stores hold it and the indexes read it (a query's vector too): scaled
    to length 1 in float32, then float16, native byte order. A zero vector stays zero. A
    HeldVector is held already: its bytes as they are."""
    if isinstance(vector, HeldVector):
        return bytes(vector)
    vector = np.asarray(vector, dtype=np.float32)
    norm = np.float32(np.sqrt(np.dot(vector, vector)))
    return (vector / norm if norm else vector).astype(VECTOR_DTYPE).tobytes()


def vector_from_bytes(raw: bytes) -> np.ndarray:
    """A held vector (vector_bytes), as float32."""
    return np.frombuffer(raw, dtype=VECTOR_DTYPE).astype(np.float32)


def similarity(distance: float) -> float:
    """A cosine distance from an index as a similarity, at most 1: float16 parts of a unit vector
    square to a sum off 1 by up to ~1e-4, so a record's own vector comes back 0.99997–1.00006."""
    return min(1.0, 1.0 - distance)


def float32_vector_bytes(raw: bytes) -> bytes:
    """A vector held as float32 before float16 (memstream migrate), as vector_bytes holds it."""
    return vector_bytes(np.frombuffer(raw, dtype=np.float32))


@dataclass(frozen=True)
class TurnsNear:
    """A session's passages at a turn and the turns either side (store.base.Episodes'
    session_turns_near): (turn, passage id) by turn then id, and each of the three turns' change
    count — what a decision that read them expects still to hold when it commits."""

    passages: list[tuple[int, str]]
    changes: dict[int, int]


@dataclass(frozen=True)
class TurnEmbedding:
    """What a turn's passage vector was embedded with (workers.algorithms.turns.turn_embedded_text):
    the passage of the turn before it whose text followed its own ("" for none), and the SHA-256 of
    the exact text embedded — the key of its cached vector, which an erasure deletes."""

    preceded_by: str = ""
    embedded_sha: str = ""


TURN_EMBEDDING_FIELDS = ("preceded_by", "embedded_sha")  # a passage hash's fields of its TurnEmbedding
# A turn's vector of its own text alone, kept beside the one embedded after the turn before it: the
# vector it gets back when that turn leaves memory (no model in the stage that retires it)
OWN_VECTOR_FIELD = "own_vec"


def turn_embedding_fields(turn: TurnEmbedding) -> dict[str, str]:
    """A TurnEmbedding as its passage hash's fields (TURN_EMBEDDING_FIELDS)."""
    return dict(zip(TURN_EMBEDDING_FIELDS, (turn.preceded_by, turn.embedded_sha)))


def embedded_digests(passages: list[tuple[str, dict]]) -> list[str]:
    """The digests of the texts turn passages ((id, fields) records) were embedded as, where one
    was embedded with the turn before it (TurnEmbedding.embedded_sha): their cached vectors' keys."""
    return [str(row["embedded_sha"]) for _, row in passages if row.get("embedded_sha")]


# What `records` (memstream export) leaves out of every record: derived, or internal to a store.
# write counters an erasure's decision is fenced on (Memory.stage_new_fact, stage_entity)
FACT_EXTRACTIONS, ENTITY_MENTIONS = "extractions", "mentions"
RECORD_INTERNALS = (
    "vec",
    OWN_VECTOR_FIELD,
    *TURN_EMBEDDING_FIELDS,
    "_rank",
    TENANT_FIELD,
    LEXICAL_FIELD,
    LEXICAL_LENGTH_FIELD,
    *RETIRED_FIELDS.values(),
    FACT_EXTRACTIONS,
    ENTITY_MENTIONS,
)

# A passage's entity ids, comma-joined (entity ids hold no comma: workers.algorithms.normalize):
# a TAG field, so a large tenant's own passages index finds an entity's passages nearest a
# vector (store.indexes.own_vector_schema). Passages written before were JSON lists: read both.
ENTITIES_FIELD = "entities"


def entity_list(raw: bytes | str | None) -> list[str]:
    """A passage's ENTITIES_FIELD as entity ids (its JSON form from before, or comma-joined)."""
    if not raw:
        return []
    text = raw.decode() if isinstance(raw, bytes) else raw
    return json.loads(text) if text.startswith("[") else text.split(",")


# ---- passages: what both stores keep of a chunk besides its text, and give back -------------------
PASSAGE_EXTRAS = ("metadata", "context", "retired", "subject")  # stored fields, in passage_json's order


def passage_extras(chunk, preceding_text: str | None = None) -> dict[str, str]:
    """The stored form of a chunk's document metadata and turn fields (JSON: turn_id, dia_id,
    session_id, speaker, ts, ...), of its context line (who said it and when), of its lexical
    terms (store.lexical: what BM25 counts; a turn's after the text of the turn before it,
    `preceding_text`) and, for a titled document's passage, of its subject (the name its title
    gives: the page other passages link to, workers.query.links)."""
    return {
        "metadata": json.dumps(chunk.metadata, ensure_ascii=False, sort_keys=True),
        "context": chunk.context,
        **lexical_fields(passage_terms(chunk.context, chunk.text, preceding_text)),
        **({"subject": chunk.subject} if chunk.subject else {}),
    }


def lexical_fields(terms: str) -> dict[str, str]:
    """A passage's lexical terms (store.lexical.passage_terms) as stored: the terms and their count."""
    return {LEXICAL_FIELD: terms, LEXICAL_LENGTH_FIELD: str(term_count(terms))}


def passage_json(
    passage_id: str,
    text: str,
    doc_id: str,
    seq,
    doc_version,
    metadata: str | None,
    context: str | None,
    retired: str | None = None,
    subject: str | None = None,
) -> dict:
    """A passage as both stores give it back (and GET /v1/passages/{id} answers): the text as
    published, its document, `metadata` as a dict and `context` ({} and '' for a passage
    stored before they were), and whether a later version retired it (`retired`: out of
    retrieval and of every count, kept for audit) and, for a titled document's passage, its
    `subject` (None for any other)."""
    return {
        "id": passage_id,
        "text": text,
        "doc_id": doc_id,
        "seq": int(seq),
        "doc_version": int(doc_version or 1),
        "metadata": json.loads(metadata) if metadata else {},
        "context": context or "",
        "retired": retired == "1",
        "subject": subject or None,
    }


def is_current(row: dict | None) -> TypeGuard[dict]:
    """A passage (passage_json) that queries may answer with: stored, and not retired by a
    later version of its document (kept for audit and drill-down only)."""
    return row is not None and not row.get("retired")


# ---- the embedder a tenant's indexes were built with (workers.models.embedding.TenantEmbedders) ----
UNRECORDED_EMBEDDER = (
    "unrecorded"  # the name claim_embedder gives a tenant indexed before records, in vectors of another size
)


@dataclass(frozen=True)
class EmbedderId:
    """What a tenant's vectors are: the embedder's name ("local", "openai:text-embedding-3-small")
    and their dims."""

    name: str
    dims: int

    @property
    def cache_name(self) -> str:
        """The shared embedding cache's namespace (store.caches.EmbeddingCache): two models, or one
        model at two sizes, never share vectors."""
        return f"{self.name}:{self.dims}"
