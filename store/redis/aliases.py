"""Entity aliases (store.base.Aliases): one hash per tenant, alias → canonical entity."""

from __future__ import annotations

from store.base import alias_target
from store.redis.base import RedisBase, _text

# Each id's canonical entity (itself where it is no alias) and that entity's name and type
# (false where there is none): a query's mention lookup, which was two dependent round trips.
# KEYS[1]: the tenant's aliases; ARGV[1]: the entity key prefix, then the ids.
_CANONICAL_NAMES = """#!lua flags=no-writes
local ids = {unpack(ARGV, 2)}
local canonical = redis.call('HMGET', KEYS[1], unpack(ids))
local out = {}
for i, id in ipairs(ids) do
  local target = canonical[i]
  if not target or target == '' then target = id end
  out[i] = {target, redis.call('HMGET', ARGV[1] .. target, 'name', 'type')}
end
return out
"""


class AliasesOps(RedisBase):
    """store.base.Aliases on Redis."""

    # ---- entity aliases ----------------------------------------------------------------------
    async def resolve_aliases(self, tenant: str, entity_ids: list[str]) -> dict[str, str]:
        """entity id → its canonical id (itself when it is no alias)."""
        if not entity_ids:
            return {}
        found = await self.shard(tenant).hmget(self.keys(tenant).aliases, entity_ids)
        return {eid: (_text(c) if c else eid) for eid, c in zip(entity_ids, found)}

    async def canonical_names(self, tenant: str, entity_ids: list[str]) -> tuple[dict[str, str], dict[str, dict]]:
        """resolve_aliases, and entity_names of the canonical ids, in one command (_CANONICAL_NAMES)."""
        if not entity_ids:
            return {}, {}
        keys = self.keys(tenant)
        found = await self._run_script(tenant, _CANONICAL_NAMES, [keys.aliases], [keys.entity(""), *entity_ids])
        canonical, names = {}, {}
        for eid, (target, (name, type_)) in zip(entity_ids, found):
            canonical[eid] = cid = _text(target)
            if name is not None:
                names[cid] = {"name": name.decode(), "type": (type_ or b"").decode()}
        return canonical, names

    async def add_alias(self, tenant: str, alias_id: str, canonical_id: str) -> None:
        await self.shard(tenant).hset(
            self.keys(tenant).aliases, alias_id, await alias_target(self, tenant, alias_id, canonical_id)
        )

    async def alias_map(self, tenant: str) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in (await self.shard(tenant).hgetall(self.keys(tenant).aliases)).items()}
