"""Whole layers (store.base.Export): a layer's ids and records (`memstream export`, and a
tenant's purge)."""

from __future__ import annotations

from store.records import RECORD_INTERNALS
from store.redis.base import RedisBase


class ExportOps(RedisBase):
    """store.base.Export on Redis."""

    # ---- export ------------------------------------------------------------------------------
    async def scan_ids(self, tenant: str, layer: str) -> list[str]:
        """Ids of every record of a layer (passages, facts, entities, schemas)."""
        return await self._scan_suffixes(self.shard(tenant), self.keys(tenant).prefix(layer))

    async def records(
        self, tenant: str, layer: str, skip: tuple[str, ...] = RECORD_INTERNALS
    ) -> list[tuple[str, dict[str, str]]]:
        """(id, fields) of every record of a layer, sorted by id, without the vector and the
        description rank (`skip`); 500 records per round trip."""
        keys = self.keys(tenant)
        ids, out = await self.scan_ids(tenant, layer), []
        for start in range(0, len(ids), 500):
            batch = ids[start : start + 500]
            pipe = self.shard(tenant).pipeline(transaction=False)
            for record_id in batch:
                pipe.hgetall(keys.prefix(layer) + record_id)
            for record_id, row in zip(batch, await pipe.execute()):
                out.append((record_id, {k.decode(): v.decode() for k, v in row.items() if k.decode() not in skip}))
        return out
