"""A large tenant's own vector indexes in process: Layers' promote_vectors, as
store/redis/vector_index.py holds it on Redis — nothing to build here, where every search is
exact over the tenant's own records."""

from __future__ import annotations

from store.in_memory.base import InMemoryBase


class VectorIndexOps(InMemoryBase):
    """Layers' promote_vectors in process (store.redis.vector_index.VectorIndexOps on Redis)."""

    async def promote_vectors(self, tenant: str) -> int:
        """Memory.promote_vectors: nothing to do here, where every search is exact over the
        tenant's own records; how many records of the promoted layers the tenant holds."""
        records = self._tenant(tenant).records
        return sum(len(records[layer]) for layer in ("passages", "facts", "entities"))
