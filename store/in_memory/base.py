"""What every role of the in-memory store shares, as store/redis/base.py's RedisBase does on
Redis: the tenants' state (_Tenant: records as Redis hashes hand them back, Memory's counting
sets, the graph, the log, the marks), the staged writes a decision collects (StagedWrites, what
pipeline() returns), the lookups and writes of more than one role (_tenant, _set, _hset, _revise,
_vector, _stage), the lifetime and model caches (store.base.Lifetime, over a dict) and the
tenant's embedder record (Layers' recorded_embedder and claim_embedder, here as on Redis); how a
field is held (_stored, _text, _vec)."""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, overload

import numpy as np

from store.caches import EmbeddingCache, LLMCache
from store.graph_log import EdgeChange
from store.keys import LAYERS
from store.records import UNRECORDED_EMBEDDER, Committed, EmbedderId, vector_from_bytes
from topics import validate_tenant

if TYPE_CHECKING:
    from store.in_memory.lexical_index import _LexicalIndex


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
    session_turn_changes: dict[str, dict[int, int]] = field(
        default_factory=dict
    )  # session id → {turn: times a passage was indexed at it} (Memory's session_turn_changes hash)
    revisions: dict[str, int] = field(default_factory=dict)  # passage id → Memory's passage_revision
    said: dict[str, dict[str, float]] = field(default_factory=dict)  # fact id → Memory's fact_said (doc id → time)
    indexed: bool = False  # ensure_indexes ran: KNN finds the tenant's records (readers create nothing)
    embedder: EmbedderId | None = None  # the embedder its indexes were built with (claim_embedder)
    lexical: "_LexicalIndex | None" = None  # BM25 over the passages, rebuilt when they change (lexical)


class InMemoryBase:
    """The tenants and what every role reads them through: the base of every role's mixin
    (store.in_memory.InMemoryStore composes them, as store.memory.Memory does RedisBase's)."""

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

    def _revise(self, tenant: str, passage_id: str) -> None:
        """Memory's HINCRBY of passage_revision."""
        revisions = self._tenant(tenant).revisions
        revisions[passage_id] = revisions.get(passage_id, 0) + 1

    def _vector(self, tenant: str, layer: str, record_id: str, name: str = "vec") -> np.ndarray | None:
        raw = self._tenant(tenant).records[layer].get(record_id, {}).get(name)
        return None if raw is None else vector_from_bytes(_vec(raw))

    @staticmethod
    def _stage(pipe: StagedWrites, write: Callable[[], None]) -> None:
        pipe.writes.append(write)

    async def close(self) -> None:
        pass

    async def ping(self) -> None:
        pass

    def llm_cache(self, model: str) -> LLMCache:
        return _InMemoryLLMCache(self._cache, model)

    def embedding_cache(self, embedder: str) -> EmbeddingCache:
        return _InMemoryEmbeddingCache(self._cache, embedder)

    async def recorded_embedder(self, tenant: str) -> EmbedderId | None:
        return self._tenant(tenant).embedder

    async def claim_embedder(self, tenant: str, embedder: EmbedderId, create: bool) -> EmbedderId | None:
        """As store/redis/base.py's _CLAIM_EMBEDDER (the first claim wins); the store's indexes are of its `dims`."""
        t = self._tenant(tenant)
        if t.embedder is None:
            if t.indexed and self.dims != embedder.dims:
                return EmbedderId(UNRECORDED_EMBEDDER, self.dims)
            if not t.indexed and not create:
                return None
            t.embedder = embedder
        return t.embedder


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
