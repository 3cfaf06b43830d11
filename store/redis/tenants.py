"""Tenants as a whole (store.base.Tenants): listing, counting (and the metrics census), erasing
one, and the migrations of `memstream migrate` — off a tenant's own indexes and key layout
(_MOVE_RECORD), and from float32 to float16 vectors."""

from __future__ import annotations

import itertools

from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from store.indexes import index_missing, reply_rows
from store.keys import LAYERS, TENANTS_WITH_OUTBOXES, TenantKeys, layer_prefix, parse_index_name
from store.lexical import LEXICAL_FIELD, LEXICAL_LENGTH_FIELD, passage_terms, term_count
from store.records import OWN_VECTOR_FIELD, RETIRED_FIELDS, TENANT_FIELD, embedded_digests, float32_vector_bytes
from store.redis.base import _text
from store.redis.export import ExportOps
from store.redis.lexical_index import LexicalIndexOps

CENSUS_MAX_GROUPS = 1_000_000  # (tenant, value) groups one census reads of an index

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


class TenantsOps(ExportOps, LexicalIndexOps):
    """store.base.Tenants on Redis (a purged tenant's records read through ExportOps)."""

    async def tenants(self) -> list[str]:
        """Every tenant that committed a message (commit_once registers it): where to sweep."""
        registered = self.topology.for_key(TENANTS_WITH_OUTBOXES)
        return sorted(_text(raw) for raw in await registered.smembers(TENANTS_WITH_OUTBOXES))

    async def tenant_known(self, tenant: str) -> bool:
        """Whether anything was ever committed for the tenant (commit_once registers it)."""
        return bool(await self.topology.for_key(TENANTS_WITH_OUTBOXES).sismember(TENANTS_WITH_OUTBOXES, tenant))

    async def purge_tenant(self, tenant: str, llm_cache_keys, embedded_texts) -> dict[str, int]:
        """Erase a tenant: the model-cache entries of its texts (`llm_cache_keys(passages)`: the
        LLM cache keys of its extractions; `embedded_texts(passages, entities, facts, schemas)`:
        every text it embedded), its indexes, every key under its hash tag, and its place in
        the sweep's list. Returns what went, by kind. Run it with no worker writing the tenant."""
        keys = self.keys(tenant)
        layers = {
            layer: await self.records(tenant, layer, skip=("vec", "retired_vec", OWN_VECTOR_FIELD)) for layer in LAYERS
        }
        recorded = await self.recorded_embedder(tenant)
        cache = [*llm_cache_keys(layers["passages"])]
        if recorded is not None:
            cached_vectors = self.embedding_cache(recorded.cache_name)
            cache += [
                cached_vectors.key(text)
                for text in embedded_texts(layers["passages"], layers["entities"], layers["facts"], layers["schemas"])
            ]
            # a turn embedded with the turn before it: its text's cached vector, by the digest it recorded
            cache += [cached_vectors.key_of_digest(digest) for digest in embedded_digests(layers["passages"])]
        await self._delete_shared_keys(cache)
        await self.drop_own_lexical(tenant)  # a large tenant's own lexical index; its copies go below
        await self.drop_own_vectors(tenant)  # ... and its own vector indexes
        for layer in LAYERS:  # an index of its own from before shared indexes (not migrated); its keys go below
            try:
                await self.shard(tenant).execute_command("FT.DROPINDEX", keys.legacy_index_name(layer))
            except ResponseError:
                pass  # none
        deleted = 0
        for pattern in keys.patterns():
            deleted += await self._delete_matching(self.shard(tenant), pattern)
        await self.topology.for_key(TENANTS_WITH_OUTBOXES).srem(TENANTS_WITH_OUTBOXES, tenant)
        self._sweep_registered.pop(tenant, None)
        self._tenant_dims_read.pop(tenant, None)
        return {"keys": deleted, "cache entries": len(cache), **{layer: len(rows) for layer, rows in layers.items()}}

    async def tenant_counts(self) -> dict[str, dict[str, int]]:
        """Every tenant with records → how many of each layer it holds (passages retired by a
        later version included), in one SCAN over the keyspace (of each server)."""
        counts: dict[str, dict[str, int]] = {}
        for client, layer in itertools.product(self.topology.servers(), LAYERS):
            prefix = layer_prefix(layer)
            async for key in client.scan_iter(match=prefix + "{*}:*", count=1000):
                tenant = key.decode()[len(prefix) + 1 :].partition("}:")[0]
                counts.setdefault(tenant, dict.fromkeys(LAYERS, 0))[layer] += 1
        return dict(sorted(counts.items()))

    async def census(self, layer: str, by: str | None = None) -> dict[str, dict[str, int]]:
        """Tenant → value of the tag `by` (e.g. facts' status; None: all under "") → how many of
        its records of `layer` have it, over every shared index of the layer: one FT.AGGREGATE
        each, for metrics. Not a tenant's search, so not filtered on one: it answers no query."""
        out: dict[str, dict[str, int]] = {}
        groups = ["GROUPBY", 2, f"@{TENANT_FIELD}", f"@{by}"] if by else ["GROUPBY", 1, f"@{TENANT_FIELD}"]
        for client in self.topology.servers():
            out = _summed(out, await self._census_of(client, layer, groups, by))
        return out

    async def _census_of(self, client, layer: str, groups: list, by: str | None) -> dict[str, dict[str, int]]:
        """census over the shared indexes of the layer on the server of `client`."""
        out: dict[str, dict[str, int]] = {}
        counted: set[int] = set()  # vector sizes: two indexes of one size hold the same records
        for name in await self._index_names(client):
            parsed = parse_index_name(name)
            if parsed is None or parsed[0] != layer or not parsed[2] or parsed[1] in counted:
                continue
            counted.add(parsed[1])
            reply = await client.execute_command(
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

    # ---- moving a tenant off its own indexes (memstream migrate) --------------------------
    async def legacy_tenants(self) -> list[str]:
        """Tenants with an index of their own or records under the key layout from before shared
        indexes (`ms:{tenant}:pas:<id>`): what `migrate_tenant` has left to move."""
        found: set[str] = set()
        for client in self.topology.servers():
            for name in await self._index_names(client):
                for layer in LAYERS:
                    if name.startswith("ms_") and name.endswith(f"_{layer}"):
                        found.add(name[len("ms_") : -len(f"_{layer}")])
        short = {
            TenantKeys("x").legacy_prefix(layer).removeprefix("ms:{x}:") for layer in LAYERS
        }  # 'pas:', 'fact:', ...
        for client, kind in itertools.product(self.topology.servers(), short):
            async for key in client.scan_iter(match="ms:{*}:" + kind + "*", count=1000):
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
        keys, client = self.keys(tenant), self.shard(tenant)
        dims = await self._legacy_index_dims(tenant) or self.dims
        for layer in LAYERS:
            await self.index(client, layer, dims=dims)
        moved = dict.fromkeys(LAYERS, 0)
        for layer in LAYERS:
            old_prefix, new_prefix = keys.legacy_prefix(layer), keys.prefix(layer)
            pending: list[bytes] = []
            async for key in client.scan_iter(match=old_prefix + "*", count=1000):
                pending.append(key)
                if len(pending) >= batch:
                    moved[layer] += await self._move_records(tenant, layer, pending, old_prefix, new_prefix, dims)
                    pending = []
            moved[layer] += await self._move_records(tenant, layer, pending, old_prefix, new_prefix, dims)
        for layer in LAYERS:
            try:
                await client.execute_command("FT.DROPINDEX", keys.legacy_index_name(layer))
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
        client = self.shard(tenant)
        pipe = client.pipeline(transaction=False)
        for old, new in zip(old_keys, renamed):
            pipe.eval(_MOVE_RECORD, 2, old, new, TENANT_FIELD, tenant)
        await pipe.execute()
        await self._float16_vectors(client, renamed, dims, {})
        if layer == "passages":  # the lexical leg's fields, where missing
            pipe = client.pipeline(transaction=False)
            for key in renamed:
                pipe.hmget(key, ["context", "text", "retired", LEXICAL_FIELD, RETIRED_FIELDS[LEXICAL_FIELD]])
            writes = client.pipeline(transaction=False)
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
        return sorted(
            {
                name
                for client in self.topology.servers()
                for name in await self._index_names(client)
                if (parsed := parse_index_name(name)) is not None and not parsed[2]
            }
        )

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
        done = 0
        recorded: dict[str, int | None] = {}  # tenant → its recorded embedder's size (_float16_vectors)
        for client in self.topology.servers():
            await self.index(client, layer, dims=dims)
            pending: list[str] = []
            async for key in client.scan_iter(match=layer_prefix(layer) + "*", count=1000):
                pending.append(key.decode())
                if len(pending) >= batch:
                    done += await self._float16_vectors(client, pending, dims, recorded)
                    pending = []
            done += await self._float16_vectors(client, pending, dims, recorded)
            try:
                await client.execute_command("FT.DROPINDEX", name)
            except ResponseError as exc:
                if not index_missing(exc):
                    raise
        return done

    async def _float16_vectors(self, client, keys: list[str], dims: int, recorded: dict[str, int | None]) -> int:
        """Each record's float32 vectors of `dims` (its vector, and a retired passage's) held
        as vector_bytes holds them, on the server of `client` that holds `keys`; `recorded`
        caches tenant → its recorded embedder's size."""
        if not keys:
            return 0
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, [TENANT_FIELD, "vec", RETIRED_FIELDS["vec"]])
        rows = await pipe.execute()
        writes, done = client.pipeline(transaction=False), 0
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


def _summed(into: dict[str, dict[str, int]], more: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Two censuses as one (a tenant is on one server; summed all the same)."""
    for tenant, values in more.items():
        for value, n in values.items():
            into.setdefault(tenant, {}).setdefault(value, 0)
            into[tenant][value] += n
    return into
