"""The memory in Redis: M_pas, M_ont, M_fac, entities, graph adjacency, vector search, document
progress and the effectively-once machinery (done marks + outbox).

Writes are staged on a MULTI pipeline by the worker that decides them and executed together
with the message's outbox, so a crash leaves either all of a message's effects or none.
Every write is idempotent: ids are content hashes and counts are set sizes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Mapping, cast

import numpy as np
import redis.asyncio as aioredis
from redis.commands.search import reducers
from redis.commands.search.aggregation import AggregateRequest, Asc
from redis.commands.search.query import Query
from redis.exceptions import ResponseError, WatchError
from redis.typing import EncodableT, FieldT
from redisvl.index import AsyncSearchIndex
from redisvl.query.filter import Tag

import store.graph_log as graph_log
from store.base import alias_target, broader_by_containment
from store.caches import EmbeddingCache, LLMCache
from store.facts import Fact
from store.graph_log import GRAPH_CHANGES_MAXLEN, LINK_FACT, READ_BATCH, UNLINK_FACT, EdgeChange, adjacency_field
from store.indexes import INDEX_RECHECK_S, TenantIndex, index_missing, layer_schema, reply_rows, tenant_filter
from store.keys import (
    LAYERS,
    TENANTS_WITH_OUTBOXES,
    TenantKeys,
    entity_node,
    layer_prefix,
    parse_index_name,
    passage_node,
    type_node,
)
from store.lexical import (
    K1,
    LEXICAL_FIELD,
    LEXICAL_LENGTH_FIELD,
    bm25,
    bm25_idf,
    document_frequency,
    passage_terms,
    redis_query,
    search_terms,
    term_count,
)
from store.records import (
    ENTITY_MENTIONS,
    FACT_EXTRACTIONS,
    OUTBOX_SWEEP_LOCK_S,
    PASSAGE_EXTRAS,
    RECORD_INTERNALS,
    RETIRED_FIELDS,
    TENANT_FIELD,
    UNRECORDED_EMBEDDER,
    AlreadyDone,
    DocumentRecord,
    DocumentStatus,
    EmbedderId,
    Erasure,
    GroupJoin,
    Hit,
    Outgoing,
    PassageState,
    StaleDecision,
    float32_vector_bytes,
    passage_extras,
    passage_json,
    similarity,
    vector_bytes,
    vector_from_bytes,
)

# The most passages a lexical search scores (Memory.lexical): every one of a tenant's passages
# holding a query term up to here, the index's BM25STD best beyond. 200 changed the top 10 of a
# third of the LoCoMo dev questions (400-660 turns a conversation; the shared BM25STD's best 200
# miss passages the tenant's own statistics rank high) and cost 4.6 points of R@5; 1,000 keeps
# every conversation exact. A 5,000-passage tenant pays for it: ~60 ms p50 (14 ms at 200).
LEXICAL_CANDIDATES = 1000
LEXICAL_READ_ALL = 64  # a tenant of at most this many passages is read whole for BM25 (one search)
LEXICAL_MAX_READ = 10_000  # RediSearch's MAXSEARCHRESULTS: no search pages past it


def _lexical_page(searchable: TenantIndex, terms: list[str], offset: int, limit: int) -> list:
    """The search of the tenant's passages holding any of `terms`: their doc ids and terms, a
    page of them in the index's BM25STD order."""
    return searchable.command(
        "FT.SEARCH",
        redis_query(terms),
        "SCORER",
        "BM25STD",
        "RETURN",
        2,
        "doc_id",
        LEXICAL_FIELD,
        "LIMIT",
        offset,
        limit,
    )


def _lexical_rows(searchable: TenantIndex, rows) -> tuple[dict[str, list[str]], dict[str, str | None]]:
    """A lexical search's rows as passage id → its terms, and passage id → its doc id."""
    documents = {searchable.record_id(key): fields.get(LEXICAL_FIELD, "").split() for key, fields in rows}
    return documents, {searchable.record_id(key): fields.get("doc_id") for key, fields in rows}


CENSUS_MAX_GROUPS = 1_000_000  # (tenant, value) groups one census reads of an index
TENANT_DIMS_RECHECK_S = 30.0  # as workers.models.embedding.EMBEDDER_RECHECK_S
INITIAL_SCAN_WAIT_S = 30.0  # how long a writer waits for a new index's initial scan (Memory._initial_scan_done)
DONE_MARK_TTL_S = 8 * 24 * 3600  # longer than Kafka's default 7-day retention
SWEEP_REGISTRATION_S = 60

# The status field of each fact hash in KEYS (one round trip for a decision's checks).
# KEYS: fact hashes; ARGV: the field of each to read
_FIELDS = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HGET', key, ARGV[i]) or false end  -- false: nil, keeps the list whole
return out
"""

# Count a schema's distinct supporting passages and promote it at tau.
_SUPPORT_SCHEMA = """
redis.call('SADD', KEYS[1], ARGV[1])
local n = redis.call('SCARD', KEYS[1])
redis.call('HSET', KEYS[2], 'frequency', n)
if n >= tonumber(ARGV[2]) then redis.call('HSET', KEYS[2], 'status', 'stable') end
return n
"""

# The document record follows the latest publication, never an older version.
_RECORD_DOCUMENT = """
local current = redis.call('HGET', KEYS[1], 'version')
if current and tonumber(current) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'doc_hash', ARGV[1], 'version', ARGV[2], 'chunk_ids', ARGV[3], 'ts', ARGV[4], 'mark', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'seq', 1)
return 1
"""

# The τ gate: park a fact as pending unless its schema is stable — checked and parked at once.
_HOLD_PENDING = """
if redis.call('HGET', KEYS[7], 'retired') == '1' then return -1 end
if redis.call('HGET', KEYS[1], 'status') == 'stable' then return 0 end
redis.call('HINCRBY', KEYS[6], 'n', 1)
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[5], ARGV[1])
local status = redis.call('HGET', KEYS[3], 'status')
if status == 'new' or status == 'retracted' then redis.call('HSET', KEYS[3], 'status', 'pending') end
return 1
"""

# A passage out of memory: its vector and terms moved aside (out of the KNN and full-text
# indexes), kept for audit. KEYS[1]: the passage hash; ARGV: stored name, name while retired, ...
_RETIRE_PASSAGE = """
if redis.call('HGET', KEYS[1], 'retired') == '1' then return 0 end
for i = 1, #ARGV, 2 do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  if value then redis.call('HSET', KEYS[1], ARGV[i + 1], value); redis.call('HDEL', KEYS[1], ARGV[i]) end
end
redis.call('HSET', KEYS[1], 'retired', '1')
return 1
"""

# And back. ARGV[1]: its incarnation; then stored name, name while retired, ...
_RESTORE_PASSAGE = """
for i = 2, #ARGV, 2 do
  local value = redis.call('HGET', KEYS[1], ARGV[i + 1])
  if value then redis.call('HSET', KEYS[1], ARGV[i], value); redis.call('HDEL', KEYS[1], ARGV[i + 1]) end
end
redis.call('HSET', KEYS[1], 'retired', '', 'incarnation', ARGV[1])
redis.call('HDEL', KEYS[1], 'purged')  -- erased meanwhile: its extraction writes it again
return 1
"""

# A passage erased: nothing of it but what fences a chunk of it still in flight (retired, and
# its incarnation), still its tenant's. KEYS[1]: the passage hash; ARGV: TENANT_FIELD, the tenant.
_ERASE_PASSAGE = """
local incarnation = redis.call('HGET', KEYS[1], 'incarnation')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'retired', '1', 'purged', '1', ARGV[1], ARGV[2])
if incarnation then redis.call('HSET', KEYS[1], 'incarnation', incarnation) end
return 1
"""

# A record moved off the key layout from before shared indexes. KEYS: its old key, its new key;
# ARGV: the tenant field, the tenant. Where the new key exists (written since), it keeps its
# fields and gains those it lacks.
_MOVE_RECORD = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('RENAME', KEYS[1], KEYS[2])
else
  local old = redis.call('HGETALL', KEYS[1])
  for i = 1, #old, 2 do redis.call('HSETNX', KEYS[2], old[i], old[i + 1]) end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# A graph node erased: each of its edges off the other end's adjacency hash, then its own hash.
# KEYS[1]: its adjacency hash; ARGV: the node, the adjacency key prefix (the other ends' keys
# are built here, under the same tenant hash tag, as they are only known at commit).
_ERASE_NODE = """
local fields = redis.call('HKEYS', KEYS[1])
for _, name in ipairs(fields) do
  local sep = string.find(name, '|', 1, true)
  if sep then redis.call('HDEL', ARGV[2] .. string.sub(name, sep + 1), string.sub(name, 1, sep) .. ARGV[1]) end
end
redis.call('DEL', KEYS[1])
return #fields
"""

# A schema's frequency after passages left its support set. KEYS: schema_passages, schema hash.
_RECOUNT_SCHEMA = """
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'frequency', redis.call('SCARD', KEYS[1])) end
return 1
"""

# A fact joins its (head, relation) group; relation cardinality is counted over heads, and the
# relation's verdict (workers.algorithms.policy.is_multi_valued: at least ARGV[4] heads, and a share ARGV[5]
# of the heads seen, with two or more tails) is decided and written in the same step, so two
# detectors on two partitions cannot both see the old verdict. The message that flipped it is
# remembered (KEYS[6]), so its redelivery spawns the same re-adjudications.
# KEYS: group, relation heads, relation multi-heads, facts with tail, cardinality hash, flip mark.
# ARGV: fact id, head id, relation, min multi heads, multi head share, ttl.
_JOIN_GROUP = """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
local size = redis.call('SCARD', KEYS[1])
if size >= 2 then redis.call('SADD', KEYS[3], ARGV[2]) end
local heads, multi = redis.call('SCARD', KEYS[2]), redis.call('SCARD', KEYS[3])
local verdict = 'single'
if multi >= tonumber(ARGV[4]) and multi >= tonumber(ARGV[5]) * heads then verdict = 'multi' end
local flipped = 0
if redis.call('HGET', KEYS[5], ARGV[3]) ~= verdict then
  redis.call('HSET', KEYS[5], ARGV[3], verdict)
  redis.call('SET', KEYS[6], verdict, 'EX', ARGV[6])
  flipped = 1
elseif redis.call('GET', KEYS[6]) == verdict then
  flipped = 1
end
return {heads, multi, size, verdict, flipped}
"""

# Keep the smallest of competing descriptions of one record (surface forms and types seen in
# different passages), so the record does not depend on the order passages arrive in.
# KEYS[1]: hash. ARGV: rank, then field/value pairs.
_SET_IF_SMALLER = """
local current = redis.call('HGET', KEYS[1], '_rank')
if current and current <= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], '_rank', ARGV[1], unpack(ARGV, 2))
return 1
"""

# Chunk progress: a chunk is through the pipeline when every one of its facts has been
# detected and no work it spawned (conflict sets, promoted activations) is outstanding.
# KEYS: facts-done set, outstanding-work set, chunks-done set.
# ARGV: chunk id, fact count, ttl, fact index to add ('' for none), work id to finish ('' for none)
_CHUNK_PROGRESS = """
if ARGV[4] ~= '' then redis.call('SADD', KEYS[1], ARGV[4]) end
if ARGV[5] ~= '' then redis.call('SREM', KEYS[2], ARGV[5]) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) and redis.call('SCARD', KEYS[2]) == 0 then
  redis.call('SADD', KEYS[3], ARGV[1])
  return 1
end
return 0
"""

# A passage's support for a fact lapses at ARGV[2] ('' never); the fact holds until the latest
# lapse of its passages, for ever once one never lapses. Only a fact some TTL applies to is
# written: `expires_at` absent on an existing fact = for ever (a passage without TTL supported
# it; none is ever taken back); the latest lapse is a running maximum, so no per-passage record.
# Staged before the fact's creation, to tell its first passage from later ones.
_RAISE_LAPSE = """
local function raise_lapse(fact, index, id, at, first)  -- at: false = never
  local current = redis.call('HGET', fact, 'expires_at')
  if current == '' then current = false end  -- written by older versions: never
  if not at then
    if current then
      redis.call('HDEL', fact, 'expires_at')
      redis.call('ZREM', index, id)
    end
  elseif first or (current and tonumber(at) > tonumber(current)) then
    redis.call('HSET', fact, 'expires_at', at)
    redis.call('ZADD', index, at, id)
  end
end
"""
# KEYS: the fact, the expiry index. ARGV: fact id, lapse.
_RECORD_LAPSE = (
    _RAISE_LAPSE
    + """
raise_lapse(KEYS[1], KEYS[2], ARGV[1], ARGV[2] ~= '' and ARGV[2], redis.call('EXISTS', KEYS[1]) == 0)
return 1
"""
)

# The sweep saw a lapse through: out of the expiry index, if the fact still lapses then.
# KEYS: the expiry index. ARGV: fact id, the lapse the sweep read.
_EXPIRY_DONE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 1
"""

# A fact merged into another: its passages' support goes with them, so the target's lapse is
# raised to the source's as a passage's would be (the source's absent = for ever); the source,
# out of memory, leaves the expiry index (a passage that says it later puts it back: the sweep
# drops it, the resolver merges that support on).
# KEYS: the source fact, the target fact, the expiry index. ARGV: source id, target id.
_MERGE_LAPSE = (
    _RAISE_LAPSE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local at = redis.call('HGET', KEYS[1], 'expires_at')
raise_lapse(KEYS[2], KEYS[3], ARGV[2], at ~= '' and at, false)
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
)

# The tenant's embedder, recorded unless one is: the first claim wins. KEYS: the record. ARGV: name, dims.
_CLAIM_EMBEDDER = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], 'name', ARGV[1], 'dims', ARGV[2]) end
return redis.call('HMGET', KEYS[1], 'name', 'dims')
"""

# A fact (back) in memory is in the expiry index at its lapse, if it has one: a sweep that passed
# that lapse while the fact was out of memory dropped its entry.
# KEYS: the fact, the expiry index. ARGV: fact id.
_INDEX_LAPSE = """
local at = redis.call('HGET', KEYS[1], 'expires_at')
if at and at ~= '' then redis.call('ZADD', KEYS[2], at, ARGV[1]) end
return 1
"""


# ---- document progress, many at once (`publish --wait`) ----
# Per document of KEYS[2..], [doc_hash, version, chunks, chunks done] (false: the chunker has not
# seen it), as one JSON text: a reply of one string is parsed at C speed by json.loads, where
# redis-py's pure-Python parser took ~17 µs per document's nested reply (measured on 5,000).
# KEYS[1]: the tenant's chunks-done set.
_DOCUMENT_STATUSES = """
local out = {}
for i = 2, #KEYS do
  local doc = redis.call('HMGET', KEYS[i], 'doc_hash', 'version', 'chunk_ids')
  if doc[1] then
    local ids, done = cjson.decode(doc[3]), 0
    for first = 1, #ids, 1000 do  -- unpack's limit on arguments is ~8,000
      for _, member in ipairs(redis.call('SMISMEMBER', KEYS[1], unpack(ids, first, math.min(first + 999, #ids)))) do
        done = done + member
      end
    end
    out[i - 1] = {doc[1], tonumber(doc[2]), #ids, done}
  else
    out[i - 1] = false  -- keeps the list whole
  end
end
return cjson.encode(out)
"""
# Documents per script call: the calls of one request go in one round trip, and Redis serves
# other clients between them instead of being held by one long script (250 documents of two
# chunks each: ~1.3 ms of Redis; measured 5.2 µs per such document, 1.4 µs per unseen one).
DOCUMENT_STATUS_BATCH = 250


def _eval(pipe, script: str, keys: list, args: list) -> None:
    # EVAL (not EVALSHA) inside MULTI: a missing script cache cannot fail the transaction
    pipe.eval(script, len(keys), *keys, *args)


def _expected(pipe) -> dict[tuple[str, str], str | None]:
    """The (key, hash field) → value a decision staged on `pipe` read; commit_once checks them."""
    return pipe.__dict__.setdefault("memstream_expected", {})


def _text(value: bytes | str) -> str:
    """A reply value as text. redis-py types replies bytes | str whatever the client; Memory's
    are bytes (decode_responses=False: from_url)."""
    return value.decode() if isinstance(value, bytes) else value


class Memory:
    def __init__(self, client: aioredis.Redis, dims: int = 384, tau: int = 2, vector_index: str = "flat"):
        self.redis = client
        self.dims = dims
        self.tau = tau
        self.vector_index = vector_index
        self._indexes: dict[tuple[str, int], AsyncSearchIndex] = {}  # (layer, dims) → its shared index
        self._tenant_dims_read: dict[str, tuple[int, float]] = {}  # tenant → (its vectors' size, when read)
        self._tenant_large: dict[str, float] = {}  # tenant → when it had over LEXICAL_READ_ALL passages
        self.index_recheck_s = INDEX_RECHECK_S
        self._indexes_checked: float | None = None  # when a writer last checked them
        self._sweep_registered: dict[str, float] = {}  # tenant → when it was last registered for the sweep

    @classmethod
    def from_url(cls, url: str, max_connections: int = 64, pool_timeout: float = 20.0, **kwargs) -> "Memory":
        """A client whose pool holds at most `max_connections`; a command finding them all busy
        waits up to `pool_timeout` seconds for one (then redis ConnectionError) instead of
        failing at once with "Too many connections" as redis-py's default pool does."""
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=pool_timeout, decode_responses=False
        )
        return cls(aioredis.Redis.from_pool(pool), **kwargs)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> None:
        """Raises when Redis cannot be reached (health checks)."""
        await self.redis.ping()

    def llm_cache(self, model: str) -> LLMCache:
        return LLMCache(self.redis, model)

    def embedding_cache(self, embedder: str) -> EmbeddingCache:
        return EmbeddingCache(self.redis, embedder)

    @staticmethod
    def keys(tenant: str) -> TenantKeys:
        return TenantKeys(tenant)

    # ---- vector indexes: one per layer, shared by every tenant (store.indexes) ---------------
    async def index(self, layer: str, create: bool = True, dims: int | None = None) -> AsyncSearchIndex | None:
        """The shared index of a layer for vectors of `dims` (default: this store's embedder's);
        created on first write. Readers pass create=False: a query creates nothing."""
        dims = dims or self.dims
        found = self._indexes.get((layer, dims))
        if found is None:
            found = AsyncSearchIndex(layer_schema(layer, dims, self.vector_index), redis_client=self.redis)
            if not await found.exists():
                if not create:
                    return None
                try:
                    await found.create(overwrite=False)
                except Exception as exc:  # another worker created it first
                    if "already exists" not in str(exc).lower():
                        raise
                await self._initial_scan_done(found.name)
            self._indexes[(layer, dims)] = found
        return found

    async def searchable(self, tenant: str, layer: str, dims: int | None = None) -> TenantIndex | None:
        """The layer's index as the tenant sees it (every query filtered on the tenant); None
        when there is no index yet. Every search of the store goes through it. The index is the
        one of `dims` (a query vector's size), else of the tenant's recorded embedder: a process
        that embeds nothing (a detector, an ops command) reads a tenant of any embedder."""
        index = await self.index(layer, create=False, dims=dims or await self._tenant_dims(tenant))
        return None if index is None else TenantIndex(self.redis, index, tenant, layer)

    async def _tenant_dims(self, tenant: str) -> int:
        """The vector size of the tenant's recorded embedder (this store's when none is), read
        once per TENANT_DIMS_RECHECK_S (a tenant erased and indexed anew by another embedder)."""
        now, known = time.monotonic(), self._tenant_dims_read.get(tenant)
        if known is None or now - known[1] >= TENANT_DIMS_RECHECK_S:
            recorded = await self.redis.hget(self.keys(tenant).embedder, "dims")
            known = (int(recorded) if recorded else self.dims, now)
            if len(self._tenant_dims_read) >= 100_000:
                self._tenant_dims_read.clear()
            self._tenant_dims_read[tenant] = known
        return known[0]

    async def _initial_scan_done(self, name: str) -> None:
        """Wait (at most INITIAL_SCAN_WAIT_S) for a new index's scan of the keys it covers: a key
        written while that scan runs is indexed twice — measured: every term's document
        frequency and the average length doubled for good (FT.DEBUG GC_FORCEINVOKE leaves them),
        so BM25's idf halved and its ranks drifted. Over an empty keyspace the scan takes
        milliseconds; a writer waits for it once per index."""
        deadline = time.monotonic() + INITIAL_SCAN_WAIT_S
        while time.monotonic() < deadline:
            info = await self.redis.ft(name).info()
            indexing = info.get("indexing", info.get(b"indexing", 0))
            if float(indexing.decode() if isinstance(indexing, bytes) else indexing) == 0:
                return
            await asyncio.sleep(0.01)

    def _lost_indexes(self) -> None:
        """A search found no index (Redis restarted empty, or it was dropped): forget them, and
        let the next write check and create them again (readers create nothing)."""
        self._indexes.clear()
        self._indexes_checked = None

    async def ensure_indexes(self, tenant: str) -> None:
        """Every layer's shared index, created where missing. Known indexes cost no round trip;
        every index_recheck_s they are checked again, since Redis may have restarted empty under
        a writer that never queries (its records are indexed when the index is created)."""
        now = time.monotonic()
        if self._indexes_checked is None or now - self._indexes_checked >= self.index_recheck_s:
            self._indexes.clear()
            self._indexes_checked = now
        for layer in LAYERS:
            await self.index(layer)

    # ---- the embedder a tenant's indexes were built with -------------------------------------
    async def recorded_embedder(self, tenant: str) -> EmbedderId | None:
        """The embedder recorded for the tenant's indexes (None: none recorded)."""
        name, dims = await self.redis.hmget(self.keys(tenant).embedder, "name", "dims")
        if name is None:
            return None
        assert dims is not None  # _CLAIM_EMBEDDER records name and dims together
        return EmbedderId(_text(name), int(dims))

    async def claim_embedder(self, tenant: str, embedder: EmbedderId, create: bool) -> EmbedderId | None:
        """The embedder the tenant's indexes were built with. None recorded: a tenant with
        indexes (built before records were kept) adopts `embedder` when they are of its dims,
        else is EmbedderId(UNRECORDED_EMBEDDER, their dims); a tenant without indexes adopts it
        when `create` (a writer, about to create them), else None (a reader records nothing).
        Adopting is one atomic claim: of two writers, the first wins and both get its record."""
        key = self.keys(tenant).embedder
        recorded = await self.redis.hmget(key, "name", "dims")
        if recorded[0] is None:
            dims = await self._indexed_dims(tenant)
            if dims is not None and dims != embedder.dims:
                return EmbedderId(UNRECORDED_EMBEDDER, dims)
            if dims is None and not create:
                return None
            recorded = await self.redis.eval(_CLAIM_EMBEDDER, 1, key, embedder.name, embedder.dims)
        name, size = recorded[0], recorded[1]
        assert name is not None and size is not None  # recorded before, or by the claim: both fields at once
        return EmbedderId(_text(name), int(size))

    async def _indexed_dims(self, tenant: str) -> int | None:
        """The vector size the tenant's passages are indexed with, None when none are: its own
        index's from before shared indexes, else that of the shared passages index holding any
        of its passages (one count per vector size in use)."""
        legacy = await self._legacy_index_dims(tenant)
        if legacy is not None:
            return legacy
        for name in await self._index_names():
            parsed = parse_index_name(name)
            if parsed is not None and parsed[0] == "passages":
                found = await self.redis.ft(name).search(
                    Query(str(tenant_filter(tenant))).no_content().paging(0, 0).dialect(2)
                )
                if found.total:
                    return parsed[1]
        return None

    async def _index_names(self) -> list[str]:
        return sorted(n.decode() if isinstance(n, bytes) else n for n in await self.redis.execute_command("FT._LIST"))

    async def _legacy_index_dims(self, tenant: str) -> int | None:
        """The vector size of the tenant's own passages index from before shared indexes
        (FT.INFO), None when it has none (never had, or migrated)."""
        try:
            info = await self.redis.ft(self.keys(tenant).legacy_index_name("passages")).info()
        except Exception as exc:
            if index_missing(exc):
                return None
            raise
        for attribute in info.get("attributes") or info.get(b"attributes") or []:
            words = [w.decode() if isinstance(w, bytes) else str(w) for w in attribute]
            lowered = [w.lower() for w in words]
            if "VECTOR" in words and "dim" in lowered:
                return int(words[lowered.index("dim") + 1])
        return None

    # ---- moving a tenant off its own indexes (memstream migrate) --------------------------
    async def legacy_tenants(self) -> list[str]:
        """Tenants with an index of their own or records under the key layout from before shared
        indexes (`ms:{tenant}:pas:<id>`): what `migrate_tenant` has left to move."""
        found: set[str] = set()
        for name in await self._index_names():
            for layer in LAYERS:
                if name.startswith("ms_") and name.endswith(f"_{layer}"):
                    found.add(name[len("ms_") : -len(f"_{layer}")])
        short = {
            TenantKeys("x").legacy_prefix(layer).removeprefix("ms:{x}:") for layer in LAYERS
        }  # 'pas:', 'fact:', ...
        for kind in short:
            async for key in self.redis.scan_iter(match="ms:{*}:" + kind + "*", count=1000):
                tenant, _, rest = key.decode()[len("ms:{") :].partition("}:")
                if rest.startswith(kind) and not tenant.startswith("_"):
                    found.add(tenant)
        return sorted(found)

    async def migrate_tenant(self, tenant: str, batch: int = 500) -> dict[str, int]:
        """Moves the tenant's records onto the shared indexes: each renamed to its layer's shared
        prefix (the same Redis Cluster slot: the hash tag stays) and tagged with the tenant; a
        passage gains its term count (and its terms, when written before the lexical leg); then
        its own indexes are dropped (their keys already moved). The shared index is the one of the
        size of the tenant's vectors. Idempotent, and safe to run again after a crash: a record
        already moved by a writer of this version keeps its fields, those it lacks are copied.
        Returns how many records of each layer moved. Run it with the workers stopped."""
        keys = self.keys(tenant)
        dims = await self._legacy_index_dims(tenant) or self.dims
        for layer in LAYERS:
            await self.index(layer, dims=dims)
        moved = dict.fromkeys(LAYERS, 0)
        for layer in LAYERS:
            old_prefix, new_prefix = keys.legacy_prefix(layer), keys.prefix(layer)
            pending: list[bytes] = []
            async for key in self.redis.scan_iter(match=old_prefix + "*", count=1000):
                pending.append(key)
                if len(pending) >= batch:
                    moved[layer] += await self._move_records(tenant, layer, pending, old_prefix, new_prefix, dims)
                    pending = []
            moved[layer] += await self._move_records(tenant, layer, pending, old_prefix, new_prefix, dims)
        for layer in LAYERS:
            try:
                await self.redis.execute_command("FT.DROPINDEX", keys.legacy_index_name(layer))
            except ResponseError as exc:
                if not index_missing(exc):
                    raise
        return moved

    async def _move_records(
        self, tenant: str, layer: str, old_keys: list[bytes], old_prefix: str, new_prefix: str, dims: int
    ) -> int:
        if not old_keys:
            return 0
        renamed = [new_prefix + key.decode().removeprefix(old_prefix) for key in old_keys]
        pipe = self.redis.pipeline(transaction=False)
        for old, new in zip(old_keys, renamed):
            pipe.eval(_MOVE_RECORD, 2, old, new, TENANT_FIELD, tenant)
        await pipe.execute()
        await self._float16_vectors(renamed, dims, {})
        if layer == "passages":  # the lexical leg's fields, where missing
            pipe = self.redis.pipeline(transaction=False)
            for key in renamed:
                pipe.hmget(key, ["context", "text", "retired", LEXICAL_FIELD, RETIRED_FIELDS[LEXICAL_FIELD]])
            writes = self.redis.pipeline(transaction=False)
            for key, (context, text, retired, terms, retired_terms) in zip(renamed, await pipe.execute()):
                if text is None:
                    continue  # an erased passage's skeleton
                was_retired = retired == b"1"
                held = retired_terms if was_retired else terms
                if held is None:  # written before the lexical leg
                    held = passage_terms((context or b"").decode(), text.decode()).encode()
                    writes.hset(key, RETIRED_FIELDS[LEXICAL_FIELD] if was_retired else LEXICAL_FIELD, held)
                writes.hset(
                    key,
                    RETIRED_FIELDS[LEXICAL_LENGTH_FIELD] if was_retired else LEXICAL_LENGTH_FIELD,
                    term_count(held.decode()),
                )
            await writes.execute()
        return len(old_keys)

    async def float32_indexes(self) -> list[str]:
        """The shared indexes from when vectors were held as float32: what `migrate_vectors` has
        left to do."""
        return [
            name
            for name in await self._index_names()
            if (parsed := parse_index_name(name)) is not None and not parsed[2]
        ]

    async def migrate_vectors(self, name: str, batch: int = 500) -> int:
        """Re-encodes the records of a float32 shared index (`float32_indexes`) as float16 under
        this version's index of the layer and size (created first: it indexes each record as it
        is re-encoded), then drops the old index. A record whose tenant records an embedder of
        another size is left: its bytes only look like float32 of this size. Idempotent (a
        re-encoded vector no longer has the float32 size). Returns how many were re-encoded."""
        parsed = parse_index_name(name)
        if parsed is None or parsed[2]:
            raise ValueError(f"{name!r} is not a float32 shared index")
        layer, dims, _ = parsed
        await self.index(layer, dims=dims)
        done, pending = 0, []
        recorded: dict[str, int | None] = {}  # tenant → its recorded embedder's size (_float16_vectors)
        async for key in self.redis.scan_iter(match=layer_prefix(layer) + "*", count=1000):
            pending.append(key.decode())
            if len(pending) >= batch:
                done += await self._float16_vectors(pending, dims, recorded)
                pending = []
        done += await self._float16_vectors(pending, dims, recorded)
        try:
            await self.redis.execute_command("FT.DROPINDEX", name)
        except ResponseError as exc:
            if not index_missing(exc):
                raise
        return done

    async def _float16_vectors(self, keys: list[str], dims: int, recorded: dict[str, int | None]) -> int:
        """Each record's float32 vectors of `dims` (its vector, and a retired passage's) held
        as vector_bytes holds them; `recorded` caches tenant → its recorded embedder's size."""
        if not keys:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, [TENANT_FIELD, "vec", RETIRED_FIELDS["vec"]])
        rows = await pipe.execute()
        writes, done = self.redis.pipeline(transaction=False), 0
        for key, (tenant, *vectors) in zip(keys, rows):
            name = tenant.decode() if tenant is not None else None
            if name is not None and name not in recorded:
                embedder = await self.recorded_embedder(name)
                recorded[name] = embedder.dims if embedder is not None else None
            if name is not None and recorded[name] not in (None, dims):
                continue  # another embedder's float16 vectors, as long as float32 ones of `dims`
            fields: dict[FieldT, EncodableT] = {  # hset's own types: its mapping's keys are invariant
                field: float32_vector_bytes(raw)
                for field, raw in zip(("vec", RETIRED_FIELDS["vec"]), vectors)
                if raw is not None and len(raw) == 4 * dims
            }
            if fields:
                writes.hset(key, mapping=fields)
                done += 1
        await writes.execute()
        return done

    async def knn(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
    ) -> list[Hit]:
        """The `k` records of `layer` nearest `vector` (cosine similarity in `Hit.score`), among
        those whose tag fields equal every value in `where` (e.g. {"status": "active"})."""
        return (await self.knn_many(tenant, layer, [vector], k, return_fields, where))[0]

    async def knn_many(
        self,
        tenant: str,
        layer: str,
        vectors: list[np.ndarray],
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
    ) -> list[list[Hit]]:
        """`knn` for each of `vectors`, all searches sent in one round trip."""
        if not vectors:
            return []
        searchable = await self.searchable(tenant, layer, dims=len(vectors[0]))
        if searchable is None:
            return [[] for _ in vectors]
        try:
            results = await searchable.knn([vector_bytes(v) for v in vectors], k, return_fields, where)
        except Exception as exc:
            if not index_missing(exc):
                raise
            # Redis restarted empty or the index was dropped: nothing to find; the next write
            # creates the indexes again (readers create nothing)
            self._lost_indexes()
            return [[] for _ in vectors]
        # equally near records by id, as in the in-memory store: the first stage fuses ranks, so
        # RediSearch's arbitrary order of ties would otherwise change a fused answer run to run
        return [
            sorted(
                (
                    Hit(rid, similarity(distance), {f: fields.get(f) for f in return_fields})
                    for rid, distance, fields in rows
                ),
                key=lambda h: (-h.score, h.id),
            )
            for rows in results
        ]

    async def lexical(self, tenant: str, query: str, k: int) -> list[Hit]:
        """The `k` passages of the tenant best matching `query` by BM25 over the passages' terms
        (store.lexical), any of its terms matching, best first; `Hit.score` is the BM25 score
        and `fields` hold doc_id. The statistics are the tenant's own — its passage count, their
        average length, each term's document frequency among them — so one tenant's texts never
        move another's scores (the shared index's BM25STD would count every tenant's). The
        index finds the tenant's passages holding a query term, and they are scored here: all
        of them in one search up to LEXICAL_CANDIDATES, past that as many as make the top k
        exact (_lexical_past_the_cap)."""
        terms = search_terms(query)
        if not terms or k < 1:
            return []
        searchable = await self.searchable(tenant, "passages")
        if searchable is None:
            return []
        try:
            read = await self._lexical_small_tenant(tenant, searchable)
            if read is not None:  # every passage of the tenant, in one search
                count, passages, doc_ids = read
                average = sum(len(held) for held in passages.values()) / count if count else 0.0
                scores = bm25(terms, passages, document_frequency(terms, passages), count, average)
            else:
                scores, doc_ids = await self._lexical_candidates(searchable, terms, k)
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._lost_indexes()
            return []
        # equal scores by id, as in the in-memory store
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]
        return [Hit(pid, score, {"doc_id": doc_ids[pid]}) for pid, score in ranked]

    async def _lexical_small_tenant(
        self, tenant: str, searchable: TenantIndex
    ) -> tuple[int, dict[str, list[str]], dict[str, str | None]] | None:
        """Every passage of a tenant of at most LEXICAL_READ_ALL (its count, terms and doc
        ids), read in one search: its statistics come with them, where a larger tenant needs an
        aggregate beside its search (measured, 300 tenants of 20 passages: 0.44 ms against
        0.74 ms p50). None for a larger tenant, which is remembered (and asked again every
        TENANT_DIMS_RECHECK_S: it may have shrunk)."""
        now, known = time.monotonic(), self._tenant_large.get(tenant)
        if known is not None and now - known < TENANT_DIMS_RECHECK_S:
            return None
        reply = await self.redis.execute_command(
            *searchable.command("FT.SEARCH", "", "RETURN", 2, "doc_id", LEXICAL_FIELD, "LIMIT", 0, LEXICAL_READ_ALL)
        )
        count, rows = reply_rows(reply)
        if count > LEXICAL_READ_ALL:
            if len(self._tenant_large) >= 100_000:
                self._tenant_large.clear()
            self._tenant_large[tenant] = now
            return None
        self._tenant_large.pop(tenant, None)
        passages, doc_ids = _lexical_rows(searchable, rows)
        return count, passages, doc_ids

    async def _lexical_candidates(
        self, searchable: TenantIndex, terms: list[str], k: int
    ) -> tuple[dict[str, float], dict[str, str | None]]:
        """A larger tenant's statistics (its passage count and average length: one aggregate)
        beside the passages holding a query term, as many as make its top k exact: their BM25
        scores, and their doc ids."""
        # two commands sent at once cost less than a pipeline of two (1.1 -> 0.8 ms p50)
        statistics = searchable.command(
            "FT.AGGREGATE",
            "",
            "GROUPBY",
            0,
            "REDUCE",
            "COUNT",
            0,
            "AS",
            "n",
            "REDUCE",
            "SUM",
            1,
            f"@{LEXICAL_LENGTH_FIELD}",
            "AS",
            "length",
        )
        matching = _lexical_page(searchable, terms, 0, LEXICAL_CANDIDATES)
        stats, found = await asyncio.gather(
            self.redis.execute_command(*statistics), self.redis.execute_command(*matching)
        )
        row = (reply_rows(stats)[1] or [(None, {})])[0][1]
        count, length = int(row.get("n", 0)), float(row.get("length", 0) or 0)
        average = length / count if count else 0.0
        total, rows = reply_rows(found)
        documents, doc_ids = _lexical_rows(searchable, rows)
        if total <= len(documents):  # every matching passage is here: count the terms in them
            return bm25(terms, documents, document_frequency(terms, documents), count, average), doc_ids
        frequency = await self._term_counts(searchable, terms)
        scores = await self._lexical_past_the_cap(searchable, terms, frequency, count, average, k, documents, doc_ids)
        return scores, doc_ids

    async def _term_counts(self, searchable: TenantIndex, terms: list[str]) -> dict[str, int]:
        """How many of the tenant's passages hold each term (one count each, sent at once)."""
        counted = await asyncio.gather(
            *(
                self.redis.execute_command(
                    *searchable.command("FT.SEARCH", redis_query([t]), "NOCONTENT", "LIMIT", 0, 0)
                )
                for t in terms
            )
        )
        return {t: reply_rows(reply)[0] for t, reply in zip(terms, counted)}

    async def _lexical_past_the_cap(
        self,
        searchable: TenantIndex,
        terms: list[str],
        frequency: dict[str, int],
        count: int,
        average: float,
        k: int,
        documents: dict[str, list[str]],
        doc_ids: dict[str, str | None],
    ) -> dict[str, float]:
        """More passages match than one search returns: add to `documents` (the index's BM25STD
        best, already read) enough of them that the top k by the tenant's own BM25 is exact, and
        give their scores.
        Every passage holding one of the rarest terms (as many terms as fit LEXICAL_CANDIDATES
        passages) is read; a passage holding none of them scores below what the other terms
        can give at most (idf × (k1 + 1) each), so when the k-th score read reaches that bound
        nothing unread can enter the top k. Otherwise every matching passage is read, a page of
        LEXICAL_CANDIDATES at a time, up to LEXICAL_MAX_READ. (MuSiQue-100: 19 of 100 questions match over 1,000 of its
        1,890 passages; choosing them by the shared index's BM25STD, whose statistics count
        every tenant, moved lexical R@2 by 0.3.)"""
        idf = bm25_idf(terms, frequency, count)
        rarest, held = [], 0
        for term in sorted(idf, key=lambda t: (frequency[t], t)):
            if held + frequency[term] > LEXICAL_CANDIDATES:
                break
            rarest.append(term)
            held += frequency[term]
        bound = sum(idf[t] * (K1 + 1.0) for t in idf if t not in rarest)
        if rarest:
            await self._read_lexical(searchable, rarest, 0, held, documents, doc_ids)
            scores = bm25(terms, documents, frequency, count, average)
            best = sorted(scores.values(), reverse=True)
            if len(best) >= k and best[k - 1] >= bound:
                return scores
        # an upper bound on the passages matching any term; a search pages up to the query
        # engine's MAXSEARCHRESULTS (10,000 by default): past it, its BM25STD best are scored
        total = min(sum(frequency.values()), LEXICAL_MAX_READ)
        for offset in range(0, total, LEXICAL_CANDIDATES):
            if not await self._read_lexical(searchable, terms, offset, LEXICAL_CANDIDATES, documents, doc_ids):
                break
        return bm25(terms, documents, frequency, count, average)

    async def _read_lexical(
        self,
        searchable: TenantIndex,
        terms: list[str],
        offset: int,
        limit: int,
        documents: dict[str, list[str]],
        doc_ids: dict[str, str | None],
    ) -> int:
        """The terms and doc ids of the tenant's passages holding any of `terms`, a page of them
        in the index's BM25STD order (the same order every page, the index unchanged between
        them), added to `documents` and `doc_ids`; how many came."""
        reply = await self.redis.execute_command(*_lexical_page(searchable, terms, offset, limit))
        read, ids = _lexical_rows(searchable, reply_rows(reply)[1])
        documents.update(read)
        doc_ids.update(ids)
        return len(read)

    # ---- effectively once: done marks and outbox ---------------------------------------
    async def pending_outbox(self, tenant: str, mark: str) -> list[Outgoing] | None:
        """None: the message was never committed. A list: its committed, maybe unsent output.
        Raises AlreadyDone when the message was fully processed before."""
        keys = self.keys(tenant)
        done, outbox = await self.redis.mget(keys.done_mark(mark), keys.outbox(mark))
        if done is not None:
            raise AlreadyDone(mark)
        if outbox is None:
            return None
        return [Outgoing.from_json(item) for item in json.loads(outbox)]

    def pipeline(self):
        return self.redis.pipeline(transaction=True)

    def stage_outbox(self, pipe, tenant: str, mark: str, outbox: list[Outgoing]) -> None:
        """The message's outbox, published after the commit and then `finish`ed. An empty one
        has nothing to publish: the message is done with its commit (its done mark staged here),
        which saves the finish round trip of most detections (a fact parked as pending)."""
        keys = self.keys(tenant)
        if not outbox:
            pipe.set(keys.done_mark(mark), b"1", ex=DONE_MARK_TTL_S)
            return
        pipe.set(keys.outbox(mark), json.dumps([o.to_json() for o in outbox]), ex=DONE_MARK_TTL_S)
        pipe.zadd(keys.outboxes, {mark: time.time()})

    def expect_status(self, pipe, tenant: str, fact_id: str, status: str) -> None:
        """The decision staged on `pipe` read this fact with this status: its commit fails with
        StaleDecision if the status changed meanwhile (another stage decided about the fact)."""
        self.expect_field(pipe, tenant, fact_id, "status", status)

    def expect_field(self, pipe, tenant: str, fact_id: str, name: str, value: str | float | None) -> None:
        """Likewise for any field of the fact as the decision read it (None: absent)."""
        stored = None if value in (None, "") else value if isinstance(value, str) else repr(float(value))
        _expected(pipe).setdefault((self.keys(tenant).fact(fact_id), name), stored)

    async def commit_once(self, pipe, tenant: str, mark: str) -> list[Outgoing] | None:
        """Execute a message's staged writes and outbox, fenced on two sides:
        - another delivery of the same message (a partition's old and new owner in a rebalance,
          a worker thought dead) committed first: our writes are discarded and we get the
          outbox that did commit (AlreadyDone if that was finished);
        - a fact the decision read (Memory.expect_status) changed status before our EXEC:
          StaleDecision, decide again.
        WATCH makes both checks hold until EXEC. None: ours committed."""
        keys = self.keys(tenant)
        now = time.monotonic()
        if self._sweep_registered.get(tenant, 0.0) < now - SWEEP_REGISTRATION_S:  # where the sweep looks
            await self.redis.sadd(TENANTS_WITH_OUTBOXES, tenant)  # again now and then: Redis may have restarted empty
            self._sweep_registered[tenant] = now
        expected = pipe.__dict__.get("memstream_expected", {})
        try:
            await pipe.watch(keys.done_mark(mark), keys.outbox(mark), *{key for key, _ in expected})
            done, committed = await pipe.mget(keys.done_mark(mark), keys.outbox(mark))
            if done is None and committed is None:
                if expected:
                    found = await pipe.eval(
                        _FIELDS, len(expected), *[key for key, _ in expected], *[name for _, name in expected]
                    )
                    if [v.decode() if v else None for v in found] != list(expected.values()):
                        raise StaleDecision(mark)
                await pipe.execute()
                return None
        except WatchError:  # committed by the other delivery, or a fact changed, between check and EXEC
            pass
        finally:
            await pipe.reset()  # idempotent; returns the watched connection to the pool on every path
        found = await self.pending_outbox(tenant, mark)
        if found is None:
            raise StaleDecision(mark)
        return found

    async def finish(self, tenant: str, mark: str) -> None:
        keys = self.keys(tenant)
        pipe = self.pipeline()
        pipe.set(keys.done_mark(mark), b"1", ex=DONE_MARK_TTL_S)
        pipe.delete(keys.outbox(mark))
        pipe.zrem(keys.outboxes, mark)
        await pipe.execute()

    async def unsent_outboxes(self, committed_before: float, limit: int = 500) -> list[tuple[str, str, list[Outgoing]]]:
        """(tenant, mark, outbox) of outboxes committed before the given time and still not
        published, oldest first per tenant — for the sweep. A tenant is skipped while another
        worker sweeps it (a lock that expires, so a dead sweeper holds nothing for long)."""
        found = []
        for raw in sorted(await self.redis.smembers(TENANTS_WITH_OUTBOXES)):
            tenant = _text(raw)
            keys = self.keys(tenant)
            marks = cast(  # without WITHSCORES: the members alone
                list[bytes], await self.redis.zrangebyscore(keys.outboxes, "-inf", committed_before, start=0, num=limit)
            )
            if not marks or not await self.redis.set(keys.outbox_sweep_lock, b"1", nx=True, ex=OUTBOX_SWEEP_LOCK_S):
                continue
            for mark in (m.decode() for m in marks):
                try:
                    outbox = await self.pending_outbox(tenant, mark)
                except AlreadyDone:
                    outbox = None
                if outbox is None:  # finished meanwhile (or expired): nothing to send
                    await self.redis.zrem(keys.outboxes, mark)
                else:
                    found.append((tenant, mark, outbox))
        return found

    # ---- document progress -----------------------------------------------------------
    def stage_document(
        self, pipe, tenant: str, doc_id: str, doc_hash: str, version: int, chunk_ids: list[str], mark: str = ""
    ) -> None:
        """The document's current version (`mark`: the done mark of the message that made it so)."""
        _eval(
            pipe,
            _RECORD_DOCUMENT,
            [self.keys(tenant).document(doc_id)],
            [doc_hash, version, json.dumps(chunk_ids), time.time(), mark],
        )

    def stage_chunk_done(self, pipe, tenant: str, chunk_id: str) -> None:
        pipe.sadd(self.keys(tenant).chunks_done, chunk_id)

    def _stage_progress(
        self, pipe, tenant: str, chunk_id: str, chunk_fact_count: int, fact_index="", work_id=""
    ) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            _CHUNK_PROGRESS,
            [keys.chunk_facts_done(chunk_id), keys.chunk_outstanding(chunk_id), keys.chunks_done],
            [chunk_id, chunk_fact_count, DONE_MARK_TTL_S, fact_index, work_id],
        )

    def stage_fact_done(self, pipe, tenant: str, chunk_id: str, fact_index: int, chunk_fact_count: int) -> None:
        self._stage_progress(pipe, tenant, chunk_id, chunk_fact_count, fact_index=str(fact_index))

    def stage_spawn(self, pipe, tenant: str, chunk_id: str, work_ids: list[str]) -> None:
        """Work a chunk's fact spawned downstream; the chunk is not done until it finishes.
        Stage before the fact's stage_fact_done."""
        if work_ids:
            keys = self.keys(tenant)
            pipe.sadd(keys.chunk_outstanding(chunk_id), *work_ids)
            pipe.expire(keys.chunk_outstanding(chunk_id), DONE_MARK_TTL_S)

    def stage_work_done(self, pipe, tenant: str, chunk_id: str, work_id: str, chunk_fact_count: int) -> None:
        self._stage_progress(pipe, tenant, chunk_id, chunk_fact_count, work_id=work_id)

    async def chunk_done(self, tenant: str, chunk_id: str) -> bool:
        """Whether the chunk is through the pipeline (its facts detected, its spawned work done)."""
        return bool(await self.redis.sismember(self.keys(tenant).chunks_done, chunk_id))

    async def chunks_done_count(self, tenant: str) -> int:
        return await self.redis.scard(self.keys(tenant).chunks_done)

    async def outstanding_work(self, tenant: str, chunk_id: str) -> list[str]:
        """Ids of the work a chunk's facts spawned that has not finished yet."""
        return sorted(_text(m) for m in await self.redis.smembers(self.keys(tenant).chunk_outstanding(chunk_id)))

    async def document_status(self, tenant: str, doc_id: str) -> DocumentStatus | None:
        """None if the chunker has not seen the document."""
        return (await self.document_statuses(tenant, [doc_id]))[0]

    async def document_statuses(self, tenant: str, doc_ids: list[str]) -> list[DocumentStatus | None]:
        """Each document's status (None: not seen by the chunker) in one round trip, counted in
        Redis: nothing but four values per document crosses the wire."""
        keys = self.keys(tenant)
        pipe = self.redis.pipeline(transaction=False)
        for start in range(0, len(doc_ids), DOCUMENT_STATUS_BATCH):
            batch = [keys.document(doc_id) for doc_id in doc_ids[start : start + DOCUMENT_STATUS_BATCH]]
            _eval(pipe, _DOCUMENT_STATUSES, [keys.chunks_done, *batch], [])
        statuses: list[DocumentStatus | None] = []
        for reply in await pipe.execute() if doc_ids else []:
            statuses += [DocumentStatus(*s) if s else None for s in json.loads(reply)]
        return statuses

    # ---- document versions: what a new version retires, and what a revert brings back -------
    async def document_record(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        """The document's current version as the chunker recorded it (None: never seen)."""
        doc_hash, version, chunk_ids, mark, seq = await self.redis.hmget(
            self.keys(tenant).document(doc_id), ["doc_hash", "version", "chunk_ids", "mark", "seq"]
        )
        if version is None:
            return None
        return DocumentRecord(
            _text(doc_hash or b""),
            int(version),
            tuple(json.loads(chunk_ids or b"[]")),
            _text(mark or b""),
            int(seq or 0),
        )

    def expect_document(self, pipe, tenant: str, doc_id: str, record: DocumentRecord | None) -> None:
        """The decision read the document's record so: its commit fails (StaleDecision) if
        another version was recorded meanwhile."""
        key = self.keys(tenant).document(doc_id)
        expected = _expected(pipe)
        expected.setdefault((key, "version"), None if record is None else str(record.version))
        expected.setdefault((key, "doc_hash"), None if record is None else record.doc_hash or None)

    def stage_passage_documents(self, pipe, tenant: str, passage_id: str, joined: list[str], left: list[str]) -> None:
        """Documents whose current version now holds the passage (`joined`) or no longer does (`left`)."""
        keys = self.keys(tenant)
        key = keys.passage_documents(passage_id)
        if joined:
            pipe.sadd(key, *joined)
        for doc_id in joined + left:  # (left too: a passage recorded before documents kept their passages)
            pipe.sadd(keys.document_passages(doc_id), passage_id)
        if left:
            pipe.srem(key, *left)
        pipe.hincrby(keys.passage_revision(passage_id), "n", 1)

    async def passage_documents(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        keys = self.keys(tenant)
        return await self._set_members([keys.passage_documents(pid) for pid in passage_ids])

    async def _set_members(self, set_keys: list[str]) -> list[set[str]]:
        """Each set's members, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for key in set_keys:
            pipe.smembers(key)
        return [{m.decode() for m in members} for members in (await pipe.execute() if set_keys else [])]

    async def passage_states(self, tenant: str, passage_ids: list[str]) -> list[PassageState]:
        """Each passage's state (a passage never written: in memory, incarnation 0)."""
        keys = self.keys(tenant)
        pipe = self.redis.pipeline(transaction=False)
        for pid in passage_ids:
            pipe.hmget(keys.passage(pid), ["retired", "incarnation"])
            pipe.hget(keys.passage_revision(pid), "n")
        replies = await pipe.execute() if passage_ids else []
        return [
            PassageState(retired == b"1", int(incarnation or 0), int(revision or 0))
            for (retired, incarnation), revision in zip(replies[0::2], replies[1::2])
        ]

    def expect_passage(self, pipe, tenant: str, passage_id: str, state: PassageState, counts: bool = False) -> None:
        """The decision read the passage in this state: its commit fails if a version retired
        or restored it meanwhile — and with `counts`, if its counting sets changed
        (PassageState.revision: support or documents arrived after the read)."""
        keys = self.keys(tenant)
        key = keys.passage(passage_id)
        expected = _expected(pipe)
        expected.setdefault((key, "retired"), "1" if state.retired else None)
        expected.setdefault((key, "incarnation"), str(state.incarnation) if state.incarnation else None)
        if counts:  # the chunker: not the detectors, which would fail each other's commits on every fact
            expected.setdefault(
                (keys.passage_revision(passage_id), "n"), str(state.revision) if state.revision else None
            )

    def stage_retire_passage(self, pipe, tenant: str, passage_id: str) -> None:
        _eval(
            pipe,
            _RETIRE_PASSAGE,
            [self.keys(tenant).passage(passage_id)],
            [x for pair in RETIRED_FIELDS.items() for x in pair],
        )

    def stage_restore_passage(self, pipe, tenant: str, passage_id: str, incarnation: int) -> None:
        _eval(
            pipe,
            _RESTORE_PASSAGE,
            [self.keys(tenant).passage(passage_id)],
            [incarnation, *(x for pair in RETIRED_FIELDS.items() for x in pair)],
        )

    async def passage_support(self, tenant: str, passage_id: str) -> tuple[list[str], list[str]]:
        """(fact ids, schema ids) whose support counts the passage."""
        keys = self.keys(tenant)
        facts, schemas = await asyncio.gather(
            self.redis.smembers(keys.passage_facts(passage_id)), self.redis.smembers(keys.passage_schemas(passage_id))
        )
        return sorted(_text(m) for m in facts), sorted(_text(m) for m in schemas)

    def stage_drop_support(
        self, pipe, tenant: str, passage_id: str, fact_ids: list[str], schema_ids: list[str], entity_ids: list[str]
    ) -> None:
        """The passage leaves every count it was in: its facts' support, its schemas'
        frequency, its entities' passages, and its chunk progress (extracted again on return)."""
        keys = self.keys(tenant)
        for fid in fact_ids:
            pipe.srem(keys.fact_passages(fid), passage_id)
        for sid in schema_ids:
            pipe.srem(keys.schema_passages(sid), passage_id)
            _eval(pipe, _RECOUNT_SCHEMA, [keys.schema_passages(sid), keys.schema(sid)], [])
        for eid in entity_ids:
            pipe.srem(keys.entity_passages(eid), passage_id)
        pipe.delete(
            keys.passage_facts(passage_id),
            keys.passage_schemas(passage_id),
            keys.chunk_facts_done(passage_id),
            keys.chunk_outstanding(passage_id),
        )
        pipe.srem(keys.chunks_done, passage_id)

    # ---- erasure: a document's passages and what only they said, gone (workers.stages.erasure) --
    async def document_passages(self, tenant: str, doc_id: str) -> list[str]:
        return sorted(_text(m) for m in await self.redis.smembers(self.keys(tenant).document_passages(doc_id)))

    async def passage_extracted(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        keys = self.keys(tenant)
        return await self._set_members([keys.passage_extracted(pid) for pid in passage_ids])

    async def fact_sources(self, tenant: str, fact_ids: list[str]) -> list[tuple[set[str], str | None]]:
        """Each fact's source passages and its extraction count (what expect_field fences on)."""
        keys = self.keys(tenant)
        return await self._set_and_counter(
            [(keys.fact_sources(fid), keys.fact(fid)) for fid in fact_ids], FACT_EXTRACTIONS
        )

    async def entity_mentions(self, tenant: str, entity_ids: list[str]) -> list[tuple[set[str], str | None]]:
        """Each entity's current passages and its mention count (what expect_entity fences on)."""
        keys = self.keys(tenant)
        return await self._set_and_counter(
            [(keys.entity_passages(eid), keys.entity(eid)) for eid in entity_ids], ENTITY_MENTIONS
        )

    async def _set_and_counter(self, keys: list[tuple[str, str]], counter: str) -> list[tuple[set[str], str | None]]:
        """For each (set key, hash key): the set's members and the hash's `counter`, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for set_key, hash_key in keys:
            pipe.smembers(set_key)
            pipe.hget(hash_key, counter)
        replies = await pipe.execute() if keys else []
        return [
            ({m.decode() for m in members}, None if count is None else count.decode())
            for members, count in zip(replies[0::2], replies[1::2])
        ]

    async def facts_naming(self, tenant: str, entity_id: str) -> list[str]:
        """Ids of every fact with the entity as head or tail (any status), from the facts index."""
        searchable = await self.searchable(tenant, "facts")
        if searchable is None:
            return []
        result = await searchable.search(
            str((Tag("head_id") == entity_id) | (Tag("tail_id") == entity_id)),
            lambda q: q.no_content().paging(0, 10_000),
        )
        return sorted(searchable.record_id(doc.id) for doc in result.docs)

    def expect_entity(self, pipe, tenant: str, entity_id: str, mentions: str | None) -> None:
        """The decision read the entity after this many mentions: its commit fails if a passage
        mentioned it meanwhile."""
        _expected(pipe).setdefault((self.keys(tenant).entity(entity_id), ENTITY_MENTIONS), mentions)

    def stage_erase(self, pipe, tenant: str, erasure: Erasure) -> None:
        keys = self.keys(tenant)
        for pid in erasure.passage_ids:
            _eval(pipe, _ERASE_PASSAGE, [keys.passage(pid)], [TENANT_FIELD, tenant])
            pipe.delete(keys.passage_extracted(pid), keys.passage_documents(pid))
            pipe.srem(keys.document_passages(erasure.doc_id), pid)
            pipe.srem(keys.graph_nodes, passage_node(pid))
        for fact in erasure.facts:
            pipe.delete(keys.fact(fact.id), keys.fact_passages(fact.id), keys.fact_sources(fact.id))
            pipe.srem(keys.group(fact.head_id, fact.relation), fact.id)
            pipe.srem(keys.facts_with_tail(fact.tail_id), fact.id)
            pipe.srem(keys.schema_pending(fact.schema_id), fact.id)
            pipe.zrem(keys.expiry, fact.id)
        for eid in erasure.entity_ids:
            node = entity_node(eid)
            pipe.delete(keys.entity(eid), keys.entity_passages(eid))
            _eval(pipe, _ERASE_NODE, [keys.adjacency(node)], [node, keys.adjacency("")])
            pipe.srem(keys.graph_nodes, node)
            pipe.srem(keys.similarity_bridged, eid)
        for relation, head in erasure.relation_heads:
            pipe.srem(keys.relation_heads(relation), head)
            pipe.srem(keys.relation_multi_heads(relation), head)
        if erasure.aliases:
            pipe.hdel(keys.aliases, *erasure.aliases)
        if erasure.entity_ids:
            # the change stream names the erased nodes: gone, so every reader loads the graph again
            # (graph_log.changes_since: its cursor is no longer in the stream)
            pipe.delete(keys.graph_changes)
        for start in range(0, len(erasure.cache_keys), 1000):
            pipe.delete(*erasure.cache_keys[start : start + 1000])

    # ---- memory layers -------------------------------------------------------------------
    def stage_passage(self, pipe, tenant: str, chunk, entity_ids: list[str], vector) -> None:
        pipe.hset(
            self.keys(tenant).passage(chunk.chunk_id),
            mapping={
                TENANT_FIELD: tenant,
                "text": chunk.text,
                "doc_id": chunk.doc_id,
                "seq": chunk.seq,
                "doc_version": chunk.doc_version,
                "entities": json.dumps(entity_ids),
                "vec": vector_bytes(vector),
                **passage_extras(chunk),
            },
        )

    def stage_entity(self, pipe, tenant: str, entity_id: str, name: str, type_: str, vector, passage_id: str) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            _SET_IF_SMALLER,
            [keys.entity(entity_id)],
            [f"{name}\x1f{type_}", TENANT_FIELD, tenant, "name", name, "type", type_, "vec", vector_bytes(vector)],
        )
        pipe.sadd(keys.entity_passages(entity_id), passage_id)
        pipe.hincrby(keys.entity(entity_id), ENTITY_MENTIONS, 1)

    def stage_schema(
        self, pipe, tenant: str, schema_id: str, head_type: str, relation: str, tail_type: str, vector, passage_id: str
    ) -> None:
        keys = self.keys(tenant)
        schema_key = keys.schema(schema_id)
        pipe.hsetnx(schema_key, TENANT_FIELD, tenant)
        pipe.hsetnx(schema_key, "head_type", head_type)
        pipe.hsetnx(schema_key, "relation", relation)
        pipe.hsetnx(schema_key, "tail_type", tail_type)
        pipe.hsetnx(schema_key, "status", "candidate")
        pipe.hsetnx(schema_key, "vec", vector_bytes(vector))
        _eval(pipe, _SUPPORT_SCHEMA, [keys.schema_passages(schema_id), schema_key], [passage_id, self.tau])
        pipe.sadd(keys.passage_schemas(passage_id), schema_id)

    def stage_new_fact(
        self, pipe, tenant: str, fact: Fact, vector, lapses_at: float | None = None, passage_id: str = ""
    ) -> None:
        """An extracted fact, status 'new' until the detector decides. Status and first-seen
        time are set once; the description is the one of the smallest Fact.description_rank
        seen: the most specific category, then the smallest (order-independent). The passage's
        support lapses at `lapses_at` (None: never): the fact's `expires_at` and its place in the
        expiry index follow (_RECORD_LAPSE)."""
        keys = self.keys(tenant)
        key = keys.fact(fact.id)
        _eval(pipe, _RECORD_LAPSE, [key, keys.expiry], [fact.id, "" if lapses_at is None else repr(float(lapses_at))])
        pairs = [x for kv in fact.description().items() for x in kv]
        _eval(
            pipe,
            _SET_IF_SMALLER,
            [key],
            [fact.description_rank(), TENANT_FIELD, tenant, *pairs, "vec", vector_bytes(vector)],
        )
        pipe.hsetnx(key, "status", "new")
        pipe.hsetnx(key, "created_at", time.time())
        if passage_id:  # its source, for an erasure
            pipe.sadd(keys.fact_sources(fact.id), passage_id)
            pipe.sadd(keys.passage_extracted(passage_id), fact.id)
            pipe.hincrby(key, FACT_EXTRACTIONS, 1)

    def stage_fact_passage(self, pipe, tenant: str, fact_id: str, passage_id: str) -> None:
        keys = self.keys(tenant)
        pipe.sadd(keys.fact_passages(fact_id), passage_id)
        pipe.sadd(keys.passage_facts(passage_id), fact_id)
        pipe.hincrby(keys.passage_revision(passage_id), "n", 1)

    async def fact(self, tenant: str, fact_id: str) -> Fact | None:
        return (await self.facts(tenant, [fact_id]))[0]

    async def facts(self, tenant: str, fact_ids: list[str]) -> list[Fact | None]:
        """The facts (with their passage ids) in one round trip; None for a missing id."""
        keys = self.keys(tenant)
        pipe = self.redis.pipeline(transaction=False)
        for fid in fact_ids:
            pipe.hgetall(keys.fact(fid))
            pipe.smembers(keys.fact_passages(fid))
        replies = await pipe.execute() if fact_ids else []
        out: list[Fact | None] = []
        for fid, row, passages in zip(fact_ids, replies[0::2], replies[1::2]):
            if not row:
                out.append(None)
                continue
            fields = {k.decode(): v.decode() for k, v in row.items() if k not in (b"vec", b"_rank")}
            out.append(Fact.from_hash(fid, fields, [p.decode() for p in passages]))
        return out

    async def passages(self, tenant: str, passage_ids: list[str]) -> list[dict | None]:
        keys = self.keys(tenant)
        pipe = self.redis.pipeline(transaction=False)
        for pid in passage_ids:
            pipe.hmget(keys.passage(pid), ["text", "doc_id", "seq", "doc_version", *PASSAGE_EXTRAS])
        out = []
        for pid, (text, doc_id, seq, version, *extras) in zip(passage_ids, await pipe.execute()):
            out.append(
                None
                if text is None
                else passage_json(
                    pid,
                    text.decode(),
                    doc_id.decode(),
                    seq,
                    version,
                    *(None if e is None else e.decode() for e in extras),
                )
            )
        return out

    async def entity_names(self, tenant: str, entity_ids: list[str]) -> dict[str, dict]:
        """entity id → {"name", "type"} for the ids that exist."""
        keys = self.keys(tenant)
        unique = list(dict.fromkeys(entity_ids))
        pipe = self.redis.pipeline(transaction=False)
        for eid in unique:
            pipe.hmget(keys.entity(eid), ["name", "type"])
        return {
            eid: {"name": name.decode(), "type": (type_ or b"").decode()}
            for eid, (name, type_) in zip(unique, await pipe.execute())
            if name is not None
        }

    async def passage_entities(self, tenant: str, passage_id: str) -> list[str]:
        raw = await self.redis.hget(self.keys(tenant).passage(passage_id), "entities")
        return json.loads(raw) if raw else []

    def stage_similarity_bridged(self, pipe, tenant: str, entity_id: str) -> None:
        pipe.sadd(self.keys(tenant).similarity_bridged, entity_id)

    async def unbridged_entity_vectors(self, tenant: str, passage_id: str) -> dict[str, np.ndarray]:
        """The vectors of the passage's entities not yet similarity-bridged, in two round trips
        (per entity, a check and a read were two round trips each)."""
        keys = self.keys(tenant)
        entity_ids = await self.passage_entities(tenant, passage_id)
        if not entity_ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        pipe.smismember(keys.similarity_bridged, entity_ids)
        for eid in entity_ids:
            pipe.hget(keys.entity(eid), "vec")
        bridged, *raw = await pipe.execute()
        return {
            eid: vector_from_bytes(vec)
            for eid, done, vec in zip(entity_ids, bridged, raw)
            if not done and vec is not None
        }

    async def fact_vector(self, tenant: str, fact_id: str) -> np.ndarray | None:
        raw = await self.redis.hget(self.keys(tenant).fact(fact_id), "vec")
        return None if raw is None else vector_from_bytes(cast(bytes, raw))  # this client replies bytes (_text)

    # ---- reconstruct: an entity's passages, passage vectors ------------------------------
    async def entity_passages(self, tenant: str, entity_id: str, limit: int | None = None) -> list[str]:
        """The ids of the passages the entity was extracted from, sorted; the first `limit` of
        them (SORT ... ALPHA LIMIT: a partial sort in Redis, only `limit` ids come back)."""
        key = self.keys(tenant).entity_passages(entity_id)
        if limit is None:
            return sorted(_text(p) for p in await self.redis.smembers(key))
        # without GET or groups: the members alone
        return [p.decode() for p in cast(list[bytes], await self.redis.sort(key, start=0, num=limit, alpha=True))]

    async def passage_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]:
        """Each passage's stored vector (of its indexed text), in one round trip; None for a missing id."""
        pipe = self.redis.pipeline(transaction=False)
        for pid in passage_ids:
            pipe.hget(self.keys(tenant).passage(pid), "vec")
        replies = await pipe.execute() if passage_ids else []
        return [None if raw is None else vector_from_bytes(raw) for raw in replies]

    # ---- episodes: a session's turns in order (reconstruct's temporal contiguity) -----------
    def stage_session_turn(self, pipe, tenant: str, session_id: str, turn: int, passage_id: str) -> None:
        """Index a turn's passage under its session, scored by its turn number: ZADD, so a
        redelivered chunk changes nothing (a turn published again with a corrected speaker is a
        new passage beside the first: both are that turn)."""
        pipe.zadd(self.keys(tenant).session_turns(session_id), {passage_id: turn})

    async def session_neighbours(self, tenant: str, session_id: str, turn: int, radius: int) -> list[tuple[int, str]]:
        """(turn, passage id) of the session's turns at most `radius` from `turn`, the turn
        itself left out; by turn, then passage id."""
        rows = cast(  # WITHSCORES: (member, score) pairs
            list[tuple[bytes, float]],
            await self.redis.zrangebyscore(
                self.keys(tenant).session_turns(session_id), turn - radius, turn + radius, withscores=True
            ),
        )
        return sorted((int(score), pid.decode()) for pid, score in rows if int(score) != turn)

    # ---- graph -------------------------------------------------------------------------
    async def bump_graph_version(self, tenant: str) -> int:
        # A replayed message may bump it again: versions may skip, never go back.
        return int(await self.redis.incr(self.keys(tenant).graph_version))

    async def graph_version(self, tenant: str) -> int:
        return int(await self.redis.get(self.keys(tenant).graph_version) or 0)

    def stage_fact_edge(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            LINK_FACT,
            [
                keys.edge_facts(head_node, tail_node),
                keys.adjacency(head_node),
                keys.adjacency(tail_node),
                keys.graph_changes,
                keys.graph_nodes,
            ],
            [fact_id, head_node, tail_node, version, GRAPH_CHANGES_MAXLEN],
        )

    def stage_fact_unlink(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            UNLINK_FACT,
            [
                keys.edge_facts(head_node, tail_node),
                keys.adjacency(head_node),
                keys.adjacency(tail_node),
                keys.graph_changes,
            ],
            [fact_id, head_node, tail_node, version, GRAPH_CHANGES_MAXLEN],
        )

    def stage_edge(self, pipe, tenant: str, version: int, a: str, b: str, weight: float, kind: str) -> None:
        """An undirected edge of one kind (passage: entity–passage, weight 1; type: entity–type,
        weight 1 here, normalised by the type's size when the graph is read; similar: cosine)."""
        keys = self.keys(tenant)
        pipe.hset(keys.adjacency(a), adjacency_field(kind, b), weight)
        pipe.hset(keys.adjacency(b), adjacency_field(kind, a), weight)
        pipe.sadd(keys.graph_nodes, a, b)
        pipe.xadd(
            keys.graph_changes,
            EdgeChange(a, b, weight, kind).entry(version),
            maxlen=GRAPH_CHANGES_MAXLEN,
            approximate=True,
        )

    def stage_edge_removed(self, pipe, tenant: str, version: int, a: str, b: str, kind: str) -> None:
        """An edge of one kind gone (a retired passage's): off both adjacency hashes, weight 0 in the log."""
        keys = self.keys(tenant)
        pipe.hdel(keys.adjacency(a), adjacency_field(kind, b))
        pipe.hdel(keys.adjacency(b), adjacency_field(kind, a))
        pipe.xadd(
            keys.graph_changes,
            EdgeChange(a, b, 0.0, kind).entry(version),
            maxlen=GRAPH_CHANGES_MAXLEN,
            approximate=True,
        )

    # ---- reading the graph log (store.graph_log: the format, and why a reader reloads) --------
    async def graph_log_exists(self, tenant: str) -> bool:
        """Whether the tenant has a graph change stream (no stream: no graph yet)."""
        return await graph_log.exists(self.redis, self.keys(tenant))

    async def graph_log_head(self, tenant: str) -> str:
        """The cursor of the latest change (graph_log.NO_CHANGE when there is none): read it
        before loading the adjacency, then apply changes_since(it)."""
        return await graph_log.head(self.redis, self.keys(tenant))

    def adjacency(self, tenant: str, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]:
        """Every edge the adjacency hashes of `nodes` hold (each once), a list per round trip."""
        return graph_log.adjacency(self.redis, self.keys(tenant), nodes)

    async def changes_since(
        self, tenant: str, cursor: str, count: int = READ_BATCH
    ) -> list[tuple[str, EdgeChange]] | None:
        """The first `count` changes after `cursor`, each with its id (the cursor once it is applied);
        None when the log no longer holds the cursor's entry (trimmed, lost or begun again): load
        the graph again."""
        return await graph_log.changes_since(self.redis, self.keys(tenant), cursor, count)

    # ---- entity aliases ----------------------------------------------------------------------
    async def resolve_aliases(self, tenant: str, entity_ids: list[str]) -> dict[str, str]:
        """entity id → its canonical id (itself when it is no alias)."""
        if not entity_ids:
            return {}
        found = await self.redis.hmget(self.keys(tenant).aliases, entity_ids)
        return {eid: (_text(c) if c else eid) for eid, c in zip(entity_ids, found)}

    async def add_alias(self, tenant: str, alias_id: str, canonical_id: str) -> None:
        await self.redis.hset(
            self.keys(tenant).aliases, alias_id, await alias_target(self, tenant, alias_id, canonical_id)
        )

    async def alias_map(self, tenant: str) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in (await self.redis.hgetall(self.keys(tenant).aliases)).items()}

    # ---- τ gate ------------------------------------------------------------------------
    async def hold_pending(self, tenant: str, schema_id: str, fact_id: str, passage_id: str) -> bool | None:
        """Atomically: if the schema is not stable, park the fact as pending (True); if it is,
        do nothing (False); if a version retired the passage meanwhile, nothing either (None). Checking and parking in one step is what lets the promoting
        detector's drain see every fact parked before the promotion."""
        keys = self.keys(tenant)
        held = await self.redis.eval(
            _HOLD_PENDING,
            7,
            keys.schema(schema_id),
            keys.schema_pending(schema_id),
            keys.fact(fact_id),
            keys.fact_passages(fact_id),
            keys.passage_facts(passage_id),
            keys.passage_revision(passage_id),
            keys.passage(passage_id),
            fact_id,
            passage_id,
        )
        return None if held == -1 else bool(held)

    async def pending_facts(self, tenant: str, schema_id: str) -> list[str]:
        return sorted(_text(m) for m in await self.redis.smembers(self.keys(tenant).schema_pending(schema_id)))

    def stage_unpend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        if fact_ids:
            pipe.srem(self.keys(tenant).schema_pending(schema_id), *fact_ids)

    def stage_pend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        """Park facts under their schema again (its support fell below τ: Lifecycle.park)."""
        if fact_ids:
            pipe.sadd(self.keys(tenant).schema_pending(schema_id), *fact_ids)

    async def schema_status(self, tenant: str, schema_id: str) -> str | None:
        """The schema's status alone (None: no such schema): one HGET, not its passage set."""
        status = await self.redis.hget(self.keys(tenant).schema(schema_id), "status")
        return _text(status) if status else None

    async def schema_support(self, tenant: str, schema_id: str) -> tuple[str | None, list[str], str | None]:
        """(the schema's status, None: no such schema; its supporting passages; its frequency as stored)."""
        keys = self.keys(tenant)
        (status, frequency), passages = await asyncio.gather(
            self.redis.hmget(keys.schema(schema_id), ["status", "frequency"]),
            self.redis.smembers(keys.schema_passages(schema_id)),
        )
        return (
            (_text(status) if status else None),
            sorted(_text(m) for m in passages),
            (_text(frequency) if frequency else None),
        )

    def expect_schema(self, pipe, tenant: str, schema_id: str, status: str | None, frequency: str | None) -> None:
        """The decision read the schema so (schema_support): its commit fails if its status or
        frequency changed (an extractor counting another passage for it)."""
        key = self.keys(tenant).schema(schema_id)
        expected = _expected(pipe)
        expected.setdefault((key, "status"), status or None)
        expected.setdefault((key, "frequency"), frequency or None)

    def stage_schema_status(self, pipe, tenant: str, schema_id: str, status: str) -> None:
        pipe.hset(self.keys(tenant).schema(schema_id), "status", status)

    # ---- conflict groups and relation cardinality -----------------------------------------------
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
        """Add a fact to its (head, relation) group and decide the relation's cardinality in
        the same atomic step; multi_rule = (min heads, share of heads) with several tails that
        make a relation multi-valued (workers.algorithms.policy). Idempotent; a redelivery of the message
        `mark` that flipped the verdict is told it flipped it."""
        keys = self.keys(tenant)
        heads, multi, size, verdict, flipped = await self.redis.eval(
            _JOIN_GROUP,
            6,
            keys.group(head_id, relation),
            keys.relation_heads(relation),
            keys.relation_multi_heads(relation),
            keys.facts_with_tail(tail_id),
            keys.relation_cardinality,
            keys.cardinality_flip(mark),
            fact_id,
            head_id,
            relation,
            multi_rule[0],
            multi_rule[1],
            DONE_MARK_TTL_S,
        )
        return GroupJoin(int(heads), int(multi), int(size), verdict.decode(), bool(flipped))

    async def facts_with_tail(self, tenant: str, tail_id: str) -> list[str]:
        return sorted(_text(m) for m in await self.redis.smembers(self.keys(tenant).facts_with_tail(tail_id)))

    async def group(self, tenant: str, head_id: str, relation: str) -> list[str]:
        return sorted(_text(m) for m in await self.redis.smembers(self.keys(tenant).group(head_id, relation)))

    async def group_size(self, tenant: str, head_id: str, relation: str) -> int:
        return await self.redis.scard(self.keys(tenant).group(head_id, relation))

    async def relation_multi_heads(self, tenant: str, relation: str) -> list[str]:
        return sorted(_text(m) for m in await self.redis.smembers(self.keys(tenant).relation_multi_heads(relation)))

    async def relation_counts(self, tenant: str, relation: str) -> tuple[int, int]:
        """(heads seen with the relation, heads with two or more tails)."""
        keys = self.keys(tenant)
        return await self.redis.scard(keys.relation_heads(relation)), await self.redis.scard(
            keys.relation_multi_heads(relation)
        )

    def stage_unsupport(self, pipe, tenant: str, fact_id: str, passage_ids: list[str]) -> None:
        """The fact's supporting passages set aside (a retraction on request): a passage that
        says it again, extracted later, supports it anew."""
        keys = self.keys(tenant)
        pipe.delete(keys.fact_passages(fact_id))
        for pid in passage_ids:
            pipe.srem(keys.passage_facts(pid), fact_id)

    def stage_fact_update(self, pipe, tenant: str, fact_id: str, fields: dict[str, Any]) -> None:
        pipe.hset(self.keys(tenant).fact(fact_id), mapping={k: ("" if v is None else v) for k, v in fields.items()})

    broader = broader_by_containment  # store.base: the walk over active containment facts, through group() and fact()

    # ---- bridging --------------------------------------------------------------------------
    def stage_type_member(self, pipe, tenant: str, version: int, entity_node: str, entity_type: str) -> None:
        self.stage_edge(pipe, tenant, version, entity_node, type_node(entity_type), 1.0, "type")

    # ---- export ------------------------------------------------------------------------------
    async def scan_ids(self, tenant: str, layer: str) -> list[str]:
        """Ids of every record of a layer (passages, facts, entities, schemas)."""
        return await self._scan_suffixes(self.keys(tenant).prefix(layer))

    async def records(
        self, tenant: str, layer: str, skip: tuple[str, ...] = RECORD_INTERNALS
    ) -> list[tuple[str, dict[str, str]]]:
        """(id, fields) of every record of a layer, sorted by id, without the vector and the
        description rank (`skip`); 500 records per round trip."""
        keys = self.keys(tenant)
        ids, out = await self.scan_ids(tenant, layer), []
        for start in range(0, len(ids), 500):
            batch = ids[start : start + 500]
            pipe = self.redis.pipeline(transaction=False)
            for record_id in batch:
                pipe.hgetall(keys.prefix(layer) + record_id)
            for record_id, row in zip(batch, await pipe.execute()):
                out.append((record_id, {k.decode(): v.decode() for k, v in row.items() if k.decode() not in skip}))
        return out

    async def adjacency_nodes(self, tenant: str) -> list[str]:
        """The tenant's graph nodes from its node set — O(tenant). Nodes written before the set
        existed are found once by a keyspace scan and added to it; writers add to the set with
        every edge, so nothing written meanwhile is missed."""
        keys = self.keys(tenant)
        if not await self.redis.exists(keys.graph_nodes_complete):
            legacy = await self._scan_suffixes(keys.adjacency(""))
            pipe = self.redis.pipeline(transaction=True)
            for start in range(0, len(legacy), 1000):
                pipe.sadd(keys.graph_nodes, *legacy[start : start + 1000])
            pipe.set(keys.graph_nodes_complete, 1)
            await pipe.execute()
        return sorted(_text(m) for m in await self.redis.smembers(keys.graph_nodes))

    # ---- standing facts: a tenant's active facts of some categories (GET /v1/facts) -------------
    async def active_facts(
        self, tenant: str, categories: tuple[str, ...], limit: int, now: float | None = None
    ) -> tuple[list[Fact], int]:
        """At most `limit` of the tenant's facts of `categories` that hold at `now` (active, TTL
        not lapsed), filled one category at a time in the order given, within a category oldest
        first (created_at, then id), and how many hold: FT.AGGREGATE over the facts index's
        status and category tags, loading created_at / expires_at (RediSearch sorts only the top
        `limit` of a category; no vector read)."""
        searchable = await self.searchable(tenant, "facts")
        if searchable is None or not categories:
            return [], 0
        holds = f"!exists(@expires_at) || @expires_at > {float(time.time() if now is None else now)!r}"

        def active(of: tuple[str, ...]) -> str:
            return f"@status:{{active}} @category:{{{' | '.join(of)}}}"

        def loaded(request: AggregateRequest) -> AggregateRequest:
            return request.load("@__key", "@created_at", "@expires_at").filter(holds)

        ids: list[str] = []
        try:
            counted = await searchable.aggregate(
                active(categories), lambda r: loaded(r).group_by([], reducers.count().alias("n"))
            )
            total = int(dict(zip(counted.rows[0][::2], counted.rows[0][1::2]))[b"n"]) if counted.rows else 0
            for category in categories:
                if len(ids) >= limit or len(ids) >= total:
                    break
                left = limit - len(ids)
                page = await searchable.aggregate(
                    active((category,)),
                    # redis-py types sort_by's fields str; it takes Asc/Desc as well (its docstring and code)
                    lambda r, left=left: loaded(r).sort_by(
                        Asc("@created_at"),  # type: ignore[arg-type]
                        Asc("@__key"),  # type: ignore[arg-type]
                        max=left,
                    ),
                )
                ids += [searchable.record_id(dict(zip(row[::2], row[1::2]))[b"__key"]) for row in page.rows]
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._lost_indexes()
            return [], 0
        return [f for f in await self.facts(tenant, ids) if f is not None], total

    # ---- time in memory: the expiry index (stage_new_fact fills it, workers.stages.expiry sweeps it) --
    async def lapsed_facts(self, tenant: str, now: float, limit: int = 500) -> list[tuple[str, float]]:
        """(fact id, expires_at) of the tenant's facts whose TTL lapsed by `now`, earliest first."""
        rows = cast(  # WITHSCORES: (member, score) pairs
            list[tuple[bytes, float]],
            await self.redis.zrangebyscore(self.keys(tenant).expiry, "-inf", now, start=0, num=limit, withscores=True),
        )
        return [(fid.decode(), float(at)) for fid, at in rows]

    def stage_expiry_done(self, pipe, tenant: str, fact_id: str, expires_at: float) -> None:
        """The sweep saw the fact's lapse at `expires_at` through: out of the expiry index, unless
        it lapses at another time now (a passage that supports it later puts it back)."""
        _eval(pipe, _EXPIRY_DONE, [self.keys(tenant).expiry], [fact_id, repr(float(expires_at))])

    def stage_merged_lapse(self, pipe, tenant: str, source_id: str, target_id: str) -> None:
        """`source_id` is merged into `target_id`: the target lapses no earlier than the source
        (never, if the source never does); the source leaves the expiry index (_MERGE_LAPSE)."""
        keys = self.keys(tenant)
        _eval(pipe, _MERGE_LAPSE, [keys.fact(source_id), keys.fact(target_id), keys.expiry], [source_id, target_id])

    def stage_lapse_indexed(self, pipe, tenant: str, fact_id: str) -> None:
        """The fact is in the expiry index at its `expires_at`, if it has one (_INDEX_LAPSE)."""
        keys = self.keys(tenant)
        _eval(pipe, _INDEX_LAPSE, [keys.fact(fact_id), keys.expiry], [fact_id])

    async def tenants(self) -> list[str]:
        """Every tenant that committed a message (commit_once registers it): where to sweep."""
        return sorted(_text(raw) for raw in await self.redis.smembers(TENANTS_WITH_OUTBOXES))

    async def purge_tenant(self, tenant: str, llm_cache_keys, embedded_texts) -> dict[str, int]:
        """Erase a tenant: the model-cache entries of its texts (`llm_cache_keys(passages)`: the
        LLM cache keys of its extractions; `embedded_texts(passages, entities, facts, schemas)`:
        every text it embedded), its indexes, every key under its hash tag, and its place in
        the sweep's list. Returns what went, by kind. Run it with no worker writing the tenant."""
        keys = self.keys(tenant)
        layers = {layer: await self.records(tenant, layer, skip=("vec", "retired_vec")) for layer in LAYERS}
        recorded = await self.recorded_embedder(tenant)
        cache = [*llm_cache_keys(layers["passages"])]
        if recorded is not None:
            cached_vectors = self.embedding_cache(recorded.cache_name)
            cache += [
                cached_vectors.key(text)
                for text in embedded_texts(layers["passages"], layers["entities"], layers["facts"], layers["schemas"])
            ]
        for start in range(0, len(cache), 1000):
            await self.redis.delete(*cache[start : start + 1000])
        for layer in LAYERS:  # an index of its own from before shared indexes (not migrated); its keys go below
            try:
                await self.redis.execute_command("FT.DROPINDEX", keys.legacy_index_name(layer))
            except ResponseError:
                pass  # none
        deleted, batch = 0, []
        for pattern in keys.patterns():
            async for key in self.redis.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += await self.redis.delete(*batch)
                    batch = []
        if batch:
            deleted += await self.redis.delete(*batch)
        await self.redis.srem(TENANTS_WITH_OUTBOXES, tenant)
        self._sweep_registered.pop(tenant, None)
        self._tenant_dims_read.pop(tenant, None)
        return {"keys": deleted, "cache entries": len(cache), **{layer: len(rows) for layer, rows in layers.items()}}

    async def document_ids(self, tenant: str) -> list[str]:
        """Every document the chunker recorded for the tenant (deleted ones too), by a SCAN."""
        return await self._scan_suffixes(self.keys(tenant).document(""))

    async def tenant_known(self, tenant: str) -> bool:
        """Whether anything was ever committed for the tenant (commit_once registers it)."""
        return bool(await self.redis.sismember(TENANTS_WITH_OUTBOXES, tenant))

    async def tenant_counts(self) -> dict[str, dict[str, int]]:
        """Every tenant with records → how many of each layer it holds (passages retired by a
        later version included), in one SCAN over the keyspace."""
        counts: dict[str, dict[str, int]] = {}
        for layer in LAYERS:
            prefix = layer_prefix(layer)
            async for key in self.redis.scan_iter(match=prefix + "{*}:*", count=1000):
                tenant = key.decode()[len(prefix) + 1 :].partition("}:")[0]
                counts.setdefault(tenant, dict.fromkeys(LAYERS, 0))[layer] += 1
        return dict(sorted(counts.items()))

    async def census(self, layer: str, by: str | None = None) -> dict[str, dict[str, int]]:
        """Tenant → value of the tag `by` (e.g. facts' status; None: all under "") → how many of
        its records of `layer` have it, over every shared index of the layer: one FT.AGGREGATE
        each, for metrics. Not a tenant's search, so not filtered on one: it answers no query."""
        out: dict[str, dict[str, int]] = {}
        groups = ["GROUPBY", 2, f"@{TENANT_FIELD}", f"@{by}"] if by else ["GROUPBY", 1, f"@{TENANT_FIELD}"]
        for name in await self._index_names():
            parsed = parse_index_name(name)
            if parsed is None or parsed[0] != layer or not parsed[2]:
                continue
            reply = await self.redis.execute_command(
                "FT.AGGREGATE",
                name,
                "*",
                *groups,
                "REDUCE",
                "COUNT",
                0,
                "AS",
                "n",
                "LIMIT",
                0,
                CENSUS_MAX_GROUPS,
                "DIALECT",
                2,
            )
            for _, row in reply_rows(reply)[1]:
                tenant = row.get(TENANT_FIELD)
                if tenant:  # an erased passage's skeleton from before it kept its tenant has none
                    value = row.get(by, "") if by else ""
                    out.setdefault(tenant, {}).setdefault(value, 0)
                    out[tenant][value] += int(row["n"])
        return out

    async def _scan_suffixes(self, prefix: str) -> list[str]:
        out = []
        async for key in self.redis.scan_iter(match=prefix + "*", count=1000):
            out.append(key.decode()[len(prefix) :])
        return sorted(out)
