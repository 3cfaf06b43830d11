"""Standing facts (store.base.StandingFacts): a tenant's active facts of some categories that
hold now, by aggregates over the facts index (GET /v1/facts)."""

from __future__ import annotations

import time

from redis.commands.search import reducers
from redis.commands.search.aggregation import AggregateRequest, Asc, Desc

from store.facts import Fact
from store.indexes import TenantIndex, index_missing, reply_rows
from store.redis.layers import LayersOps


class StandingOps(LayersOps):
    """store.base.StandingFacts on Redis (the facts read through LayersOps)."""

    # ---- standing facts: a tenant's active facts of some categories (GET /v1/facts) -------------
    async def active_facts(
        self, tenant: str, categories: tuple[str, ...], limit: int, now: float | None = None
    ) -> tuple[list[Fact], int]:
        """At most `limit` of the tenant's facts of `categories` that hold at `now` (active, TTL
        not lapsed), filled one category at a time in the order given, within a category oldest
        first (created_at, then id), and how many hold: FT.AGGREGATE over the facts index's
        status and category tags, loading created_at / expires_at (RediSearch sorts only the top
        `limit` of a category; no vector read)."""
        searchable = await self.searchable(tenant, "facts")
        if searchable is None or not categories:
            return [], 0
        if self.clustered:
            return await self._active_facts_read(searchable, tenant, categories, limit, now)
        holds = f"!exists(@expires_at) || @expires_at > {float(time.time() if now is None else now)!r}"

        def active(of: tuple[str, ...]) -> str:
            return f"@status:{{active}} @category:{{{' | '.join(of)}}}"

        def loaded(request: AggregateRequest) -> AggregateRequest:
            return request.load("@__key", "@created_at", "@expires_at").filter(holds)

        ids: list[str] = []
        try:
            counted = await searchable.aggregate(
                active(categories), lambda r: loaded(r).group_by([], reducers.count().alias("n"))
            )
            total = int(dict(zip(counted.rows[0][::2], counted.rows[0][1::2]))[b"n"]) if counted.rows else 0
            for category in categories:
                if len(ids) >= limit or len(ids) >= total:
                    break
                left = limit - len(ids)
                page = await searchable.aggregate(
                    active((category,)),
                    # redis-py types sort_by's fields str; it takes Asc/Desc as well (its docstring and code)
                    lambda r, left=left: loaded(r).sort_by(
                        Asc("@created_at"),  # type: ignore[arg-type]
                        Asc("@__key"),  # type: ignore[arg-type]
                        max=left,
                    ),
                )
                ids += [searchable.record_id(dict(zip(row[::2], row[1::2]))[b"__key"]) for row in page.rows]
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._lost_indexes()
            return [], 0
        return [f for f in await self.facts(tenant, ids) if f is not None], total

    async def recent_facts(self, tenant: str, statuses: tuple[str, ...], limit: int) -> list[Fact]:
        """The tenant's newest `limit` facts of `statuses` (empty: any status), created_at
        descending, then id: one FT.AGGREGATE over the facts index's status tag (no vector read)."""
        searchable = await self.searchable(tenant, "facts")
        if searchable is None or limit <= 0:
            return []
        query = f"@status:{{{' | '.join(statuses)}}}" if statuses else ""
        if self.clustered:
            times = await _fact_times(searchable, query)
            newest = sorted(times, key=lambda row: (-row[1], row[0]))[:limit]
            return [f for f in await self.facts(tenant, [fid for fid, _, _ in newest]) if f is not None]
        try:
            page = await searchable.aggregate(
                query,
                lambda r: r.load("@__key", "@created_at").sort_by(
                    Desc("@created_at"),
                    Asc("@__key"),
                    max=limit,
                ),
            )
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._lost_indexes()
            return []
        ids = [searchable.record_id(dict(zip(row[::2], row[1::2]))[b"__key"]) for row in page.rows]
        return [f for f in await self.facts(tenant, ids) if f is not None]

    async def _active_facts_read(
        self, searchable: TenantIndex, tenant: str, categories: tuple[str, ...], limit: int, now: float | None
    ) -> tuple[list[Fact], int]:
        """active_facts on a Redis Cluster's shard, where an aggregate loads no field from the
        records (RediSearch #5034): every active fact of the categories with its times read from
        its record (_fact_times), ordered here as the aggregate orders them."""
        moment = time.time() if now is None else now
        ids: list[str] = []
        total = 0
        for category in categories:
            times = await _fact_times(searchable, f"@status:{{active}} @category:{{{category}}}")
            holding = sorted(((created, fid) for fid, created, expires in times if expires is None or expires > moment))
            total += len(holding)
            ids += [fid for _, fid in holding[: max(limit - len(ids), 0)]]
        return [f for f in await self.facts(tenant, ids) if f is not None], total


_TIMES_PAGE = 1000


async def _fact_times(searchable: TenantIndex, query: str) -> list[tuple[str, float, float | None]]:
    """(fact id, created_at, expires_at) of each of the tenant's facts matching `query`, read
    from the records a page at a time (search_with_fields)."""
    out: list[tuple[str, float, float | None]] = []
    while True:
        reply = await searchable.run(
            searchable.command(
                "FT.SEARCH", query, "RETURN", 2, "created_at", "expires_at", "LIMIT", len(out), _TIMES_PAGE
            )
        )
        total, rows = reply_rows(reply)
        for key, fields in rows:
            expires = fields.get("expires_at")
            out.append(
                (
                    searchable.record_id(key or ""),
                    float(fields.get("created_at") or 0),
                    float(expires) if expires else None,
                )
            )
        if not rows or len(out) >= total:
            return out
