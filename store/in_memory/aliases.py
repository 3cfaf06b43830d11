"""Entity aliases in process (store.base.Aliases), as store/redis/aliases.py."""

from __future__ import annotations

from store.base import alias_target
from store.in_memory.base import InMemoryBase


class AliasesOps(InMemoryBase):
    """store.base.Aliases in process (store.redis.aliases.AliasesOps on Redis)."""

    async def resolve_aliases(self, tenant: str, entity_ids: list[str]) -> dict[str, str]:
        aliases = self._tenant(tenant).aliases
        return {eid: aliases.get(eid) or eid for eid in entity_ids}

    async def canonical_names(self, tenant: str, entity_ids: list[str]) -> tuple[dict[str, str], dict[str, dict]]:
        canonical = await self.resolve_aliases(tenant, entity_ids)
        records = self._tenant(tenant).records["entities"]
        named = (cid for cid in dict.fromkeys(canonical.values()) if records.get(cid, {}).get("name") is not None)
        return canonical, {cid: {"name": records[cid]["name"], "type": records[cid].get("type", "")} for cid in named}

    async def add_alias(self, tenant: str, alias_id: str, canonical_id: str) -> None:
        self._tenant(tenant).aliases[alias_id] = await alias_target(self, tenant, alias_id, canonical_id)

    async def alias_map(self, tenant: str) -> dict[str, str]:
        return dict(self._tenant(tenant).aliases)
