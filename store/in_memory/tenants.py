"""Tenants as a whole in process (store.base.Tenants), as store/redis/tenants.py: listing,
counting, purging; the migrations have nothing to move here (this store never had per-tenant
indexes nor float32 vectors)."""

from __future__ import annotations

from store.in_memory.base import _text
from store.in_memory.export import ExportOps
from store.keys import LAYERS
from store.records import OWN_VECTOR_FIELD, embedded_digests


class TenantsOps(ExportOps):
    """store.base.Tenants in process (store.redis.tenants.TenantsOps on Redis); over ExportOps,
    the records a purge counts."""

    async def tenants(self) -> list[str]:
        return sorted(self._tenants_with_outboxes)

    async def legacy_tenants(self) -> list[str]:
        return []  # this store never had per-tenant indexes

    async def migrate_tenant(self, tenant: str, batch: int = 500) -> dict[str, int]:
        return dict.fromkeys(LAYERS, 0)

    async def float32_indexes(self) -> list[str]:
        return []  # nor float32 vectors

    async def migrate_vectors(self, name: str, batch: int = 500) -> int:
        raise ValueError(f"{name!r} is not a float32 shared index")

    async def purge_tenant(self, tenant: str, llm_cache_keys, embedded_texts) -> dict[str, int]:
        """As store/redis/tenants.py's purge_tenant."""
        t = self._tenants.get(tenant)
        if t is None:
            return {"keys": 0, "cache entries": 0, **dict.fromkeys(LAYERS, 0)}
        layers = {
            layer: await self.records(tenant, layer, skip=("vec", "retired_vec", OWN_VECTOR_FIELD)) for layer in LAYERS
        }
        cache = list(llm_cache_keys(layers["passages"]))
        if t.embedder is not None:
            cached_vectors = self.embedding_cache(t.embedder.cache_name)
            cache += [
                cached_vectors.key(text)
                for text in embedded_texts(layers["passages"], layers["entities"], layers["facts"], layers["schemas"])
            ]
            # a turn embedded with the turn before it: its text's cached vector, by the digest it recorded
            cache += [cached_vectors.key_of_digest(digest) for digest in embedded_digests(layers["passages"])]
        for key in cache:
            self._cache.pop(key, None)
        del self._tenants[tenant]
        self._tenants_with_outboxes.discard(tenant)
        return {
            "keys": sum(len(rows) for rows in layers.values()),
            "cache entries": len(cache),
            **{layer: len(rows) for layer, rows in layers.items()},
        }

    async def tenant_known(self, tenant: str) -> bool:
        return tenant in self._tenants_with_outboxes

    async def tenant_counts(self) -> dict[str, dict[str, int]]:
        return {
            name: {layer: len(t.records[layer]) for layer in LAYERS}
            for name, t in sorted(self._tenants.items())
            if any(t.records[layer] for layer in LAYERS)
        }

    async def census(self, layer: str, by: str | None = None) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for name, t in sorted(self._tenants.items()):
            for row in t.records[layer].values():
                value = "" if by is None else (_text(row.get(by)) or "")
                out.setdefault(name, {}).setdefault(value, 0)
                out[name][value] += 1
        return out
