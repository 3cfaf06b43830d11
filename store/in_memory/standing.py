"""Standing facts in process (store.base.StandingFacts), as store/redis/standing.py: a
tenant's active facts of some categories (GET /v1/facts) and its newest facts (the explorer)."""

from __future__ import annotations

import time

from store.facts import Fact
from store.in_memory.base import _text
from store.in_memory.layers import LayersOps


class StandingOps(LayersOps):
    """store.base.StandingFacts in process (store.redis.standing.StandingOps on Redis); over
    LayersOps, the facts it reads."""

    async def active_facts(
        self, tenant: str, categories: tuple[str, ...], limit: int, now: float | None = None
    ) -> tuple[list[Fact], int]:
        """Memory.active_facts: at most `limit` of the facts of `categories` that hold at `now`,
        one category at a time in the order given, oldest first (created_at, then id), and how many hold."""
        now = time.time() if now is None else now

        def holds(row) -> bool:
            return _text(row.get("status")) == "active" and not float(_text(row.get("expires_at")) or "inf") <= now

        rows = self._tenant(tenant).records["facts"]
        ids = [
            fid
            for category in categories
            for fid in sorted(
                (fid for fid, row in rows.items() if _text(row.get("category")) == category and holds(row)),
                key=lambda fid: (float(_text(rows[fid].get("created_at")) or 0.0), fid),
            )
        ]
        return [f for f in await self.facts(tenant, ids[:limit]) if f is not None], len(ids)

    async def recent_facts(self, tenant: str, statuses: tuple[str, ...], limit: int) -> list[Fact]:
        """Memory.recent_facts: the newest `limit` facts of `statuses` (empty: any), created_at descending, then id."""
        rows = self._tenant(tenant).records["facts"]
        chosen = sorted(
            (fid for fid, row in rows.items() if not statuses or _text(row.get("status")) in statuses),
            key=lambda fid: (-float(_text(rows[fid].get("created_at")) or 0.0), fid),
        )
        return [f for f in await self.facts(tenant, chosen[: max(0, limit)]) if f is not None]
