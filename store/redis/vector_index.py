"""A large tenant's vector indexes of its own (store.base.Layers' promote_vectors): KNN time that
stays flat as a tenant grows.

Each shared index is FLAT (store.indexes): a search computes the distance to every record of
the tenant (ad-hoc brute force over the tag's records), exact and cheap for a small tenant but
linear in a large one — 2.7-3.2 ms a search at 50,000 passages, ~12 ms at 200,000, and a graph
query sends three (passages, facts, schemas) and reconstruct one or two a step. Past
VECTOR_OWN_INDEX_AT passages (store.redis.base) a tenant gets an HNSW index per layer of
OWN_VECTOR_LAYERS, over its own records' prefix: 0.4-0.8 ms a search at 50,000 passages.

HNSW is approximate, FLAT exact; the own index is searched at OWN_VECTOR_EF_RUNTIME, where
word-hash vectors (`bench scale`'s) agree on ~95% of a top 10 with FLAT. Below the threshold —
every dataset `bench recall` and `bench conversation` measure — nothing changes. Each record's
vector is then held three times (its hash, the shared index, the own index): ~1 KB more a
record, measured in `bench scale`'s Redis bytes per passage.

Promotion, online and idempotent: each layer's index is created over the records already
there (a new index scans its prefix; a record written meanwhile is indexed again, which for a
vector replaces the first), then, once every scan is done, the state becomes 'ready' and readers
search the own indexes. Cut off anywhere — SIGKILL included — the next promotion finds the
indexes and waits for their scans again; one whose index goes from its server meanwhile (a
reshard moved the tenant's slot, Redis restarted empty) or whose scan stops moving fails, and
the next makes it again. A reader also goes back to the shared index (exact) while an own index
scans again, as after Redis reloaded its data (indexes are not persisted; every one rescans its
keys: a reader asks each index once per Redis run id) or when it is missing. No demotion;
`tenant delete --purge` drops them."""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import ResponseError
from redisvl.index import AsyncSearchIndex

from store.indexes import (
    OWN_ENTITY_TAG_SCHEMA,
    OWN_VECTOR_LAYERS,
    OWN_VECTOR_SCHEMA,
    OwnVectorIndex,
    TenantIndex,
    index_missing,
    own_vector_schema,
)
from store.records import ENTITIES_FIELD, entity_list
from store.redis.base import RedisBase, _scanning, _text

VECTOR_STATE_RECHECK_S = 5.0  # how long a reader trusts what it read of the state and the scans
# How long a promotion waits on a scan whose progress (FT.INFO's percent_indexed, num_docs) does
# not move: a scan advances every second while it runs; one stuck would hold the tenant's one
# promotion slot (store.redis.lexical_index's _promotions) for good.
SCAN_STALL_S = 120.0


class OwnIndexStuck(RuntimeError):
    """A promotion's index is gone from the server the promotion began on (Redis restarted empty,
    or it was dropped: a Redis Cluster slot moved meanwhile answers MOVED instead), or its scan
    made no progress in SCAN_STALL_S. The promotion fails, logged; the writer's next check makes
    the index again where the tenant's keys are now."""


class VectorIndexOps(RedisBase):
    """A large tenant's own vector indexes: promotion (a writer's, in the background:
    store.redis.lexical_index's size check), the index a KNN search goes to, and their drop."""

    async def vector_searchable(self, tenant: str, layer: str, dims: int) -> TenantIndex | None:
        """The index a KNN search of the tenant's `layer` with `dims`-sized vectors goes to: its
        own (ready, scanned, of that size) or else the shared one."""
        ready = await self._own_vectors_ready(tenant, dims)
        if ready and layer in OWN_VECTOR_LAYERS:
            schema = own_vector_schema(tenant, layer, dims, self.clustered)
            client = self.shard(tenant)
            return OwnVectorIndex(client, AsyncSearchIndex(schema, redis_client=client), tenant, layer, self.clustered)
        return await self.searchable(tenant, layer, dims=dims)

    async def _own_vectors_ready(self, tenant: str, dims: int) -> bool:
        """Whether the tenant's own vector indexes of `dims` answer: state 'ready' and no scan
        running (read once per VECTOR_STATE_RECHECK_S)."""
        return (await self._own_vectors_read_now(tenant, dims))[0]

    async def _own_entity_tags(self, tenant: str, dims: int) -> bool:
        """Whether the tenant's own passages index (ready) tags passages by entity: promoted under
        OWN_ENTITY_TAG_SCHEMA or later (OWN_PASSAGE_FIELDS); one promoted before has no tag."""
        return (await self._own_vectors_read_now(tenant, dims))[1]

    async def _own_vectors_read_now(self, tenant: str, dims: int) -> tuple[bool, bool, float]:
        """(ready, tagged, when read), read again after VECTOR_STATE_RECHECK_S: the state, and
        whether each index scanned its keys — asked of the index (FT.INFO: 18-54 ms of Redis's
        one thread for a 50,000-passage tenant's HNSW index, every 5 s a query process) once per
        index and Redis run only: an index scans again only when Redis restarts or it is made
        anew, and a promotion marks it ready after its scan."""
        now, known = time.monotonic(), self._own_vectors_read.get((tenant, dims))
        if known is None or now - known[2] >= VECTOR_STATE_RECHECK_S:
            state, of_dims, schema = await self.shard(tenant).hmget(
                self.keys(tenant).vector_index_state, "state", "dims", "schema"
            )
            ready = state == b"ready" and of_dims is not None and int(of_dims) == dims
            names = [self.keys(tenant).vector_index_name(layer, dims) for layer in OWN_VECTOR_LAYERS]
            if ready:  # (a small tenant, with no index of its own, pays the state's read alone)
                client = self.shard(tenant)
                run = await self._server_run(client)
                unseen = [name for name in names if self._scanned_under.get(name) != run]
                scanned = await asyncio.gather(*(self._scanned(client, name) for name in unseen))
                if len(self._scanned_under) >= 100_000:
                    self._scanned_under.clear()
                self._scanned_under.update((name, run) for name, done in zip(unseen, scanned) if done)
                ready = all(scanned)
            else:  # dropped, or being made anew: its next index is asked again
                for name in names:
                    self._scanned_under.pop(name, None)
            if len(self._own_vectors_read) >= 100_000:
                self._own_vectors_read.clear()
            known = (ready, ready and int(schema or 1) >= OWN_ENTITY_TAG_SCHEMA, now)
            self._own_vectors_read[(tenant, dims)] = known
        return known

    @staticmethod
    async def _server_run(client) -> str:
        """The Redis server's run id: another after a restart or a failover."""
        return str((await client.info("server")).get("run_id", ""))

    @staticmethod
    async def _scanned(client, name: str) -> bool:
        """Whether the index exists on the server of `client` and holds every key of its prefix
        (no scan running)."""
        try:
            info = await client.execute_command("FT.INFO", name)
        except ResponseError as exc:
            if index_missing(exc):
                return False
            raise
        return not _scanning(info if isinstance(info, dict) else dict(zip(info[::2], info[1::2])))

    async def _scan_over(self, client, name: str) -> int:
        """Wait for a new index's scan of its prefix to end; the records it holds. An index gone
        meanwhile, or a scan still for SCAN_STALL_S, raises OwnIndexStuck: asking the tenant's
        server again and again for an index it never had held a promotion cut by a reshard
        forever, and with it the writer's every later check of that tenant (one promotion a
        tenant at a time) — CI hung on it."""
        progress, moved = None, time.monotonic()
        while True:
            info = await self._index_info(client, name)
            if info is None:
                raise OwnIndexStuck(f"index {name} is gone from the server it was made on before its scan ended")
            if not _scanning(info):
                return int(_text(info["num_docs"]))
            now, seen = time.monotonic(), (str(info.get("percent_indexed")), str(info.get("num_docs")))
            if seen != progress:
                progress, moved = seen, now
            elif now - moved >= SCAN_STALL_S:
                raise OwnIndexStuck(f"index {name}: its scan made no progress in {SCAN_STALL_S:.0f} s ({seen})")
            await asyncio.sleep(0.1)

    def _own_vectors_lost(self, tenant: str, dims: int) -> None:
        """A search found an own index missing (dropped, or Redis restarted empty)."""
        self._own_vectors_read[(tenant, dims)] = (False, False, time.monotonic())

    async def promote_vectors(self, tenant: str) -> int:
        """Give the tenant an HNSW index of its own per layer of OWN_VECTOR_LAYERS, for its
        embedder's vectors, or finish a promotion cut off; idempotent. Returns the records the
        indexes hold."""
        keys = self.keys(tenant)
        dims = await self._tenant_dims(tenant)
        state = await self.shard(tenant).hmget(keys.vector_index_state, "state", "dims", "schema")
        if state[1] is not None and int(state[1]) != dims:  # indexes of another embedder's size
            await self.drop_own_vectors(tenant)
        elif state[0] is not None and int(state[2] or 1) != OWN_VECTOR_SCHEMA:  # an older schema's
            await self.drop_own_vectors(tenant)
        await self._comma_entities(tenant)
        held = 0
        client = self.shard(tenant)  # one server throughout: a slot moved meanwhile fails it (MOVED)
        for layer in OWN_VECTOR_LAYERS:
            index = AsyncSearchIndex(own_vector_schema(tenant, layer, dims, self.clustered), redis_client=client)
            if not await index.exists():
                await self._create_index(index)
            held += await self._scan_over(client, index.name)
        await client.hset(
            keys.vector_index_state, mapping={"state": "ready", "dims": dims, "schema": OWN_VECTOR_SCHEMA}
        )
        self._own_vectors_read[(tenant, dims)] = (True, True, time.monotonic())  # OWN_VECTOR_SCHEMA tags
        return held

    async def _comma_entities(self, tenant: str) -> None:
        """Each of the tenant's passages written before ENTITIES_FIELD was comma-joined (a JSON
        list) rewritten comma-joined, so its own passages index tags it by entity; idempotent,
        500 a round trip (a passage written meanwhile is written comma-joined already)."""
        prefix = self.keys(tenant).prefix("passages")
        keys = [prefix + pid for pid in await self._scan_suffixes(self.shard(tenant), prefix)]
        for start in range(0, len(keys), 500):
            batch = keys[start : start + 500]
            read = self.shard(tenant).pipeline(transaction=False)
            for key in batch:
                read.hget(key, ENTITIES_FIELD)
            write = self.shard(tenant).pipeline(transaction=False)
            for key, raw in zip(batch, await read.execute()):
                if raw and raw.startswith(b"["):
                    write.hset(key, ENTITIES_FIELD, ",".join(entity_list(raw)))
            await write.execute()

    async def drop_own_vectors(self, tenant: str) -> None:
        """The tenant's own vector indexes dropped (not their records), the state with them."""
        keys = self.keys(tenant)
        state = await self.shard(tenant).hget(keys.vector_index_state, "dims")
        await self.shard(tenant).delete(keys.vector_index_state)
        for dims in {self.dims, *([int(state)] if state is not None else [])}:
            for layer in OWN_VECTOR_LAYERS:
                try:
                    await self.shard(tenant).execute_command("FT.DROPINDEX", keys.vector_index_name(layer, dims))
                except ResponseError as exc:
                    if not index_missing(exc):
                        raise
            self._own_vectors_read.pop((tenant, dims), None)
