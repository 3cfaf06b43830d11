"""What every role of Redis's store shares: the client and its lifetime (store.base.Lifetime),
the tenant's keys, the shared vector indexes (one per layer and vector size: a writer creates
them, a reader sees them through store.indexes.TenantIndex) and the embedder a tenant's indexes
were built with (_CLAIM_EMBEDDER) — store.base.Layers' recorded_embedder and claim_embedder,
here because every search and the migrations read them; the reads and deletes of more than one
role (_set_members, _index_names, _delete_matching, _scan_suffixes); and how every role stages a script
(_eval) and fences a decision on what it read (_expected: store.redis.outbox's commit_once
checks them)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.commands.search.query import Query
from redis.crc import key_slot
from redisvl.index import AsyncSearchIndex

from store.caches import EmbeddingCache, LLMCache
from store.indexes import INDEX_RECHECK_S, TenantIndex, index_missing, layer_schema, tenant_filter
from store.keys import TenantKeys, embedding_cache_key, index_name_tag, llm_cache_key, parse_index_name
from store.records import UNRECORDED_EMBEDDER, EmbedderId
from store.redis import connection as redis_connection
from store.redis.topology import OneServer, Topology

TENANT_DIMS_RECHECK_S = 30.0  # as workers.models.embedding.EMBEDDER_RECHECK_S
# A tenant with at least this many passages gets a lexical index of its own (store.redis.lexical_index).
# Below, the shared index answers in ~1 ms (a tenant of at most 64 is read whole in one search; up
# to 1,000 its candidates' terms are few); each own index costs a GC timer and a few KB.
LEXICAL_OWN_INDEX_AT = 1000
# ... and at least this many, HNSW indexes of its own (store.redis.vector_index): below, the shared
# FLAT index answers exactly in about 1 ms (2.7-3.2 ms at 50,000 passages); each own index holds
# another copy of the vectors. Every dataset of `bench recall` and `bench conversation` is smaller.
VECTOR_OWN_INDEX_AT = 20_000
INITIAL_SCAN_WAIT_S = 30.0  # how long a writer waits for a new index's initial scan (Memory._initial_scan_done)
DONE_MARK_TTL_S = 8 * 24 * 3600  # longer than Kafka's default 7-day retention

# The tenant's embedder, recorded unless one is: the first claim wins (in process:
# store/in_memory/base.py's claim_embedder). KEYS: the record. ARGV: name, dims.
_CLAIM_EMBEDDER = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], 'name', ARGV[1], 'dims', ARGV[2]) end
return redis.call('HMGET', KEYS[1], 'name', 'dims')
"""

# One read command applied to each key, the replies in KEYS' order: a query's reads of many records
# (reconstruct's passage vectors, an answer's rows) in one command. A pipeline of 1,240 HGET/HMGET
# cost reconstruct ~50 ms a query on a 50,000-passage tenant in the client's packing and parsing
# alone; the script costs Redis ~1 us a key. KEYS: the records. ARGV: the command (_READS), its
# arguments after the key. Read-only, so a replica may run it.
_EACH = """#!lua flags=no-writes
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call(ARGV[1], key, unpack(ARGV, 2)) end
return out
"""
_READS = frozenset({"HGET", "HMGET", "HGETALL", "SMEMBERS"})


def _eval(pipe, script: str, keys: list, args: list) -> None:
    # EVAL (not EVALSHA) inside MULTI: a missing script cache cannot fail the transaction
    pipe.eval(script, len(keys), *keys, *args)


def _expected(pipe) -> dict[tuple[str, str], str | None]:
    """The (key, hash field) → value a decision staged on `pipe` read; commit_once checks them."""
    return pipe.__dict__.setdefault("memstream_expected", {})


def _shared_deletes(pipe) -> list[str]:
    """Keys of memstream's own namespaces a decision staged on `pipe` deletes; commit_once
    deletes them before the tenant's transaction (they may live on another shard)."""
    return pipe.__dict__.setdefault("memstream_shared_deletes", [])


def _text(value: bytes | str) -> str:
    """A reply value as text. redis-py types replies bytes | str whatever the client; Memory's
    are bytes (decode_responses=False: from_url)."""
    return value.decode() if isinstance(value, bytes) else value


def _scanning(info: Mapping) -> bool:
    """Whether an index's FT.INFO (parsed, or its raw fields: names as str or bytes) says its
    scan of the keys it covers is running."""
    indexing = next((v for k, v in info.items() if _text(k) == "indexing"), 0)
    return float(indexing if isinstance(indexing, (int, float)) else _text(indexing)) != 0


async def create_unless_exists(creating: Awaitable) -> bool:
    """Await an index's FT.CREATE: an index of that name another process created first is as
    good (its schema is the same one, made by the same code). Whether this one created it."""
    try:
        await creating
    except Exception as exc:
        if "already exists" not in str(exc).lower():
            raise
        return False
    return True


class RedisBase:
    """The client, the keys and the shared indexes: the base of every role's mixin
    (store.memory.Memory composes them). A role reaches another's methods only through a base
    class it names: GraphOps and StandingOps read records through LayersOps, TenantsOps
    through ExportOps."""

    def __init__(self, client: aioredis.Redis | Topology, dims: int = 384, tau: int = 2, vector_index: str = "flat"):
        # where each key lives (store.redis.topology): every command goes to shard(tenant) or
        # to for_key(key) of memstream's own namespaces
        self.topology: Topology = OneServer(client) if isinstance(client, aioredis.Redis) else client
        self.dims = dims
        self.tau = tau
        self.vector_index = vector_index
        self._scripts: dict[tuple[int, str], AsyncScript] = {}  # (client, script) → registered there
        # (the server's client, layer, dims) → that server's shared index
        self._indexes: dict[tuple[int, str, int], AsyncSearchIndex] = {}
        self._applied_key_of: dict[tuple[int, str], str] = {}  # (server's client, group) → its applied offsets
        self._tenant_dims_read: dict[str, tuple[int, float]] = {}  # tenant → (its vectors' size, when read)
        self._tenant_large: dict[str, float] = {}  # tenant → when it had over LEXICAL_READ_ALL passages
        self.index_recheck_s = INDEX_RECHECK_S
        self._indexes_checked: float | None = None  # when a writer last checked them
        self._sweep_registered: dict[str, float] = {}  # tenant → when it was last registered for the sweep
        # a large tenant's own lexical index (store.redis.lexical_index)
        self._own_lexical_read: dict[str, tuple[bool, float]] = {}  # tenant → (ready, when read)
        self._lexical_size_checked: dict[str, float] = {}  # tenant → when a writer last counted it
        self._promotions: dict[str, asyncio.Task] = {}  # tenant → its promotion running in this process
        self.lexical_own_index_at = LEXICAL_OWN_INDEX_AT
        # a large tenant's own vector indexes (store.redis.vector_index)
        # (tenant, dims) → (ready, tags passages by entity, when read)
        self._own_vectors_read: dict[tuple[str, int], tuple[bool, bool, float]] = {}
        self._scanned_under: dict[str, str] = {}  # index name → the Redis run it was seen scanned in
        self.vector_own_index_at = VECTOR_OWN_INDEX_AT

    @property
    def redis(self) -> aioredis.Redis:
        """The client of a store on one Redis server (tests, and ops that read one server); the
        store's own code sends each command to shard(tenant) or topology.for_key(key)."""
        if not isinstance(self.topology, OneServer):
            raise TypeError("a store on a Redis Cluster has a client per shard: shard(tenant) or topology.for_key(key)")
        return self.topology.client

    def shard(self, tenant: str) -> aioredis.Redis:
        """The client of the Redis holding the tenant's keys, transactions and own indexes."""
        return self.topology.for_tenant(tenant)

    async def _run_script(self, tenant: str, source: str, keys: Sequence, args: Sequence):
        """A script over the tenant's keys, on its shard (EVALSHA; EVAL when not cached there)."""
        return await redis_connection.run_script(self.script(self.shard(tenant), source), keys, args)

    def script(self, client: aioredis.Redis, source: str) -> AsyncScript:
        """`source` registered with `client` (its SHA computed once; EVALSHA, EVAL on NOSCRIPT)."""
        key = (id(client), source)
        found = self._scripts.get(key)
        if found is None:
            found = self._scripts[key] = client.register_script(source)
        return found

    async def close(self) -> None:
        """Cancel this process's lexical promotions (each resumes at a writer's next check), then
        close the client."""
        tasks = [task for task in self._promotions.values() if not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._promotions.clear()
        await self.topology.close()

    async def ping(self) -> None:
        """Raises when Redis (any shard of it) cannot be reached (health checks)."""
        await asyncio.gather(*(client.ping() for client in self.topology.servers()))

    def llm_cache(self, model: str) -> LLMCache:
        return LLMCache(self.topology.for_key(llm_cache_key(model, "")), model)

    def embedding_cache(self, embedder: str) -> EmbeddingCache:
        return EmbeddingCache(self.topology.for_key(embedding_cache_key(embedder, "")), embedder)

    def keys(self, tenant: str) -> TenantKeys:
        return TenantKeys(tenant, self.clustered)

    @property
    def clustered(self) -> bool:
        """Whether the store is on a Redis Cluster's shards (not one server)."""
        return not isinstance(self.topology, OneServer)

    async def _read_each(self, tenant: str, keys: list[str], command: str, *arguments: str) -> list:
        """`command key *arguments` for each key, in one round trip and one command (_EACH); the
        replies in the keys' order. Every key of one call is one tenant's (one hash tag: one slot)."""
        if command not in _READS:
            raise ValueError(f"_read_each: {command!r} is not one of {sorted(_READS)}")
        if not keys:
            return []
        return list(await self._run_script(tenant, _EACH, keys, [command, *arguments]))

    # ---- vector indexes: one per layer, shared by every tenant (store.indexes) ---------------
    async def index(
        self, client: aioredis.Redis, layer: str, create: bool = True, dims: int | None = None
    ) -> AsyncSearchIndex | None:
        """The shared index of a layer for vectors of `dims` (default: this store's embedder's)
        on the server of `client`; created on first write. Readers pass create=False: a query
        creates nothing."""
        dims = dims or self.dims
        found = self._indexes.get((id(client), layer, dims))
        if found is not None and not self.topology.serves(client, found.name):
            found = None  # a reshard moved its name's slot away: out of reach (see _shard_index_tag)
        if found is None:
            schema = layer_schema(layer, dims, self.vector_index, await self._shard_index_tag(client, layer, dims))
            found = AsyncSearchIndex(schema, redis_client=client)
            if not await found.exists():
                if not create:
                    return None
                await self._create_index(found)
                await self._initial_scan_done(client, found.name)
            self._indexes[(id(client), layer, dims)] = found
        return found

    async def _shard_index_tag(self, client: aioredis.Redis, layer: str, dims: int) -> str | None:
        """The tag of the layer's shared index on a cluster shard: that of the one the shard has
        and can reach, else of a slot it serves now (Topology.shard_tag). An index is named in a
        slot (a name is a key to a cluster) but is not moved with it: naming a shard's index after
        its first slot of the day made a second one beside the first whenever a reshard gave the
        shard a lower slot, both indexing every record of the shard (CI: a census counted each
        twice). One whose slot moved away can be neither searched nor dropped; its shard gets
        another, and every read skips it (_index_names)."""
        if not self.clustered:
            return None
        names = await self._index_names(client)  # one FT._LIST for both questions
        for name in names:
            if parse_index_name(name) == (layer, dims, True):
                return index_name_tag(name)
        return self._tag_among(client, names)

    async def shard_tag(self, client: aioredis.Redis) -> str | None:
        """The tag a cluster shard's names are in (None on one server): that of a shared index
        it has and can reach, else of its first slot (Topology.shard_tag)."""
        return self._tag_among(client, await self._index_names(client))

    def _tag_among(self, client: aioredis.Redis, names: list[str]) -> str | None:
        """shard_tag, given the shard's reachable index names (_index_names)."""
        for name in names:
            if (tag := index_name_tag(name)) is not None:
                return tag
        return self.topology.shard_tag(client)

    async def searchable(self, tenant: str, layer: str, dims: int | None = None) -> TenantIndex | None:
        """The layer's index as the tenant sees it (every query filtered on the tenant); None
        when there is no index yet. Every search of the store goes through it. The index is the
        one of `dims` (a query vector's size), else of the tenant's recorded embedder: a process
        that embeds nothing (a detector, an ops command) reads a tenant of any embedder."""
        client = self.shard(tenant)
        index = await self.index(client, layer, create=False, dims=dims or await self._tenant_dims(tenant))
        return None if index is None else TenantIndex(client, index, tenant, layer, self.clustered)

    async def _tenant_dims(self, tenant: str) -> int:
        """The vector size of the tenant's recorded embedder (this store's when none is), read
        once per TENANT_DIMS_RECHECK_S (a tenant erased and indexed anew by another embedder)."""
        now, known = time.monotonic(), self._tenant_dims_read.get(tenant)
        if known is None or now - known[1] >= TENANT_DIMS_RECHECK_S:
            recorded = await self.shard(tenant).hget(self.keys(tenant).embedder, "dims")
            known = (int(recorded) if recorded else self.dims, now)
            if len(self._tenant_dims_read) >= 100_000:
                self._tenant_dims_read.clear()
            self._tenant_dims_read[tenant] = known
        return known[0]

    @staticmethod
    async def _create_index(index: AsyncSearchIndex) -> None:
        """Create the index; one another process created first is as good."""
        await create_unless_exists(index.create(overwrite=False))

    async def _index_info(self, client: aioredis.Redis, name: str) -> dict | None:
        """FT.INFO of an index (or of the index an alias names) on the server of `client`, None
        when there is none."""
        try:
            return await client.ft(name).info()
        except Exception as exc:
            if index_missing(exc):
                return None
            raise

    async def _initial_scan_done(self, client: aioredis.Redis, name: str) -> None:
        """Wait (at most INITIAL_SCAN_WAIT_S) for a new index's scan of the keys it covers: a key
        written while that scan runs is indexed twice — measured: every term's document
        frequency and the average length doubled for good (FT.DEBUG GC_FORCEINVOKE leaves them),
        so BM25's idf halved and its ranks drifted. Over an empty keyspace the scan takes
        milliseconds; a writer waits for it once per index."""
        deadline = time.monotonic() + INITIAL_SCAN_WAIT_S
        while time.monotonic() < deadline:
            if not _scanning(await client.ft(name).info()):
                return
            await asyncio.sleep(0.01)

    def _lost_indexes(self) -> None:
        """A search found no index (Redis restarted empty, or it was dropped): forget them, and
        let the next write check and create them again (readers create nothing)."""
        self._indexes.clear()
        self._indexes_checked = None

    # ---- the embedder a tenant's indexes were built with -------------------------------------
    async def recorded_embedder(self, tenant: str) -> EmbedderId | None:
        """The embedder recorded for the tenant's indexes (None: none recorded)."""
        name, dims = await self.shard(tenant).hmget(self.keys(tenant).embedder, "name", "dims")
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
        key, client = self.keys(tenant).embedder, self.shard(tenant)
        recorded = await client.hmget(key, "name", "dims")
        if recorded[0] is None:
            dims = await self._indexed_dims(tenant)
            if dims is not None and dims != embedder.dims:
                return EmbedderId(UNRECORDED_EMBEDDER, dims)
            if dims is None and not create:
                return None
            recorded = await client.eval(_CLAIM_EMBEDDER, 1, key, embedder.name, embedder.dims)
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
        client = self.shard(tenant)
        for name in await self._index_names(client):
            parsed = parse_index_name(name)
            if parsed is not None and parsed[0] == "passages":
                found = await client.ft(name).search(
                    Query(str(tenant_filter(tenant))).no_content().paging(0, 0).dialect(2)
                )
                if found.total:
                    return parsed[1]
        return None

    async def _index_names(self, client: aioredis.Redis) -> list[str]:
        """The indexes on the server of `client` it can reach (on a cluster, those named in a
        slot it serves: _shard_index_tag)."""
        names = (n.decode() if isinstance(n, bytes) else n for n in await client.execute_command("FT._LIST"))
        return sorted(n for n in names if self.topology.serves(client, n))

    async def _legacy_index_dims(self, tenant: str) -> int | None:
        """The vector size of the tenant's own passages index from before shared indexes
        (FT.INFO), None when it has none (never had, or migrated; on a cluster, never made)."""
        if self.clustered:
            return None
        info = await self._index_info(self.shard(tenant), self.keys(tenant).legacy_index_name("passages"))
        if info is None:
            return None
        for attribute in info.get("attributes") or info.get(b"attributes") or []:
            words = [w.decode() if isinstance(w, bytes) else str(w) for w in attribute]
            lowered = [w.lower() for w in words]
            if "VECTOR" in words and "dim" in lowered:
                return int(words[lowered.index("dim") + 1])
        return None

    # ---- reads of more than one role ------------------------------------------------------
    async def _set_members(self, tenant: str, set_keys: list[str]) -> list[set[str]]:
        """Each of the tenant's sets' members, in one round trip."""
        pipe = self.shard(tenant).pipeline(transaction=False)
        for key in set_keys:
            pipe.smembers(key)
        return [{m.decode() for m in members} for members in (await pipe.execute() if set_keys else [])]

    async def _delete_shared_keys(self, keys) -> None:
        """Delete keys of memstream's own namespaces (the model caches' entries), a thousand at a
        time, each DEL's keys of one hash slot (a cluster's rule), on the server of each."""
        by_slot: dict[int, list[str]] = {}
        for key in keys:
            by_slot.setdefault(key_slot(key.encode() if isinstance(key, str) else key), []).append(key)
        for held in by_slot.values():
            for start in range(0, len(held), 1000):
                batch = held[start : start + 1000]
                await self.topology.for_key(batch[0]).delete(*batch)

    @staticmethod
    async def _delete_matching(client: aioredis.Redis, pattern: str) -> int:
        """Delete every key matching the SCAN pattern on the server of `client`, a thousand at a
        time; how many went."""
        deleted, batch = 0, []
        async for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += await client.delete(*batch)
                batch = []
        if batch:
            deleted += await client.delete(*batch)
        return deleted

    @staticmethod
    async def _scan_suffixes(client: aioredis.Redis, prefix: str) -> list[str]:
        """What follows `prefix` in each key of the server of `client` that starts with it."""
        out = []
        async for key in client.scan_iter(match=prefix + "*", count=1000):
            out.append(key.decode()[len(prefix) :])
        return sorted(out)
