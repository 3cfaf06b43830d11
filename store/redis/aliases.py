"""Entity aliases (store.base.Aliases): one hash per tenant, alias → canonical entity."""

from __future__ import annotations

from store.base import alias_target
from store.redis.base import RedisBase, _text


class AliasesOps(RedisBase):
    """store.base.Aliases on Redis."""

    # ---- entity aliases ----------------------------------------------------------------------
    async def resolve_aliases(self, tenant: str, entity_ids: list[str]) -> dict[str, str]:
        """entity id → its canonical id (itself when it is no alias)."""
        if not entity_ids:
            return {}
        found = await self.shard(tenant).hmget(self.keys(tenant).aliases, entity_ids)
        return {eid: (_text(c) if c else eid) for eid, c in zip(entity_ids, found)}

    async def add_alias(self, tenant: str, alias_id: str, canonical_id: str) -> None:
        await self.shard(tenant).hset(
            self.keys(tenant).aliases, alias_id, await alias_target(self, tenant, alias_id, canonical_id)
        )

    async def alias_map(self, tenant: str) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in (await self.shard(tenant).hgetall(self.keys(tenant).aliases)).items()}
