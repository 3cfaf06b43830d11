"""Whole layers in process (store.base.Export: `memstream export`), as
store/redis/export.py."""

from __future__ import annotations

from store.in_memory.base import InMemoryBase, _text
from store.records import RECORD_INTERNALS


class ExportOps(InMemoryBase):
    """store.base.Export in process (store.redis.export.ExportOps on Redis)."""

    async def scan_ids(self, tenant: str, layer: str) -> list[str]:
        return sorted(self._tenant(tenant).records[layer])

    async def records(
        self, tenant: str, layer: str, skip: tuple[str, ...] = RECORD_INTERNALS
    ) -> list[tuple[str, dict[str, str]]]:
        records = self._tenant(tenant).records[layer]
        return [(rid, {k: _text(v) for k, v in records[rid].items() if k not in skip}) for rid in sorted(records)]
