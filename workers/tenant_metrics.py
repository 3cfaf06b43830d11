"""Per-tenant gauges with a bounded label set: the memory's size by layer and its facts by status
for the MEMSTREAM_METRICS_TOP_TENANTS tenants with the most passages, everyone else summed under
tenant="_other" ('_' starts no tenant's name), and totals over all tenants. Read from the shared
indexes (store census: one aggregate per layer) every MEMSTREAM_METRICS_CENSUS_SECONDS by the query
worker, which serves /metrics; a census that fails leaves the last values and is logged. With the
tenant tag sortable, a census of 2,000 tenants (40,000 records per layer) took 0.1 s of Redis's
CPU (0.3 s with the tag read from each hash)."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Gauge

from store.keys import LAYERS

log = logging.getLogger("memstream.metrics")

OTHER = "_other"
TENANTS = Gauge("memstream_tenants", "Tenants with records in the shared indexes")
RECORDS = Gauge("memstream_records", "Records per layer, over every tenant", ["layer"])
FACTS = Gauge("memstream_facts", "Facts per status, over every tenant", ["status"])
TENANT_RECORDS = Gauge(
    "memstream_tenant_records",
    "Records per layer of the top tenants by passages (the rest under tenant=_other)",
    ["tenant", "layer"],
)
TENANT_FACTS = Gauge(
    "memstream_tenant_facts",
    "Facts per status of the top tenants by passages (the rest under tenant=_other)",
    ["tenant", "status"],
)


async def take_census(memory, top: int) -> None:
    """One census: every gauge above set anew (labels of tenants no longer in the top go)."""
    per_layer = {layer: await memory.census(layer) for layer in LAYERS}
    facts = await memory.census("facts", by="status")
    counts = {
        layer: {tenant: sum(values.values()) for tenant, values in rows.items()} for layer, rows in per_layer.items()
    }
    tenants = set().union(*(rows.keys() for rows in counts.values()))
    ranked = sorted(tenants, key=lambda t: (-counts["passages"].get(t, 0), t))
    shown = set(ranked[: max(0, top)])

    def label(tenant: str) -> str:
        return tenant if tenant in shown else OTHER

    records: dict[tuple[str, str], int] = {}
    for layer, rows in counts.items():
        RECORDS.labels(layer=layer).set(sum(rows.values()))
        for tenant, n in rows.items():
            records[(label(tenant), layer)] = records.get((label(tenant), layer), 0) + n
    by_status: dict[str, int] = {}
    statuses: dict[tuple[str, str], int] = {}
    for tenant, values in facts.items():
        for status, n in values.items():
            by_status[status] = by_status.get(status, 0) + n
            statuses[(label(tenant), status)] = statuses.get((label(tenant), status), 0) + n
    TENANTS.set(len(tenants))
    FACTS.clear()
    for status, n in by_status.items():
        FACTS.labels(status=status).set(n)
    TENANT_RECORDS.clear()
    for (tenant, layer), n in records.items():
        TENANT_RECORDS.labels(tenant=tenant, layer=layer).set(n)
    TENANT_FACTS.clear()
    for (tenant, status), n in statuses.items():
        TENANT_FACTS.labels(tenant=tenant, status=status).set(n)


async def census_loop(memory, top: int, every_s: float, stop: asyncio.Event) -> None:
    """A census every `every_s` until `stop` is set. The event, not only a cancellation, ends it:
    redis-py's pool can swallow a CancelledError that lands inside a command (measured: the query
    app's shutdown then waited out the next 60 s sleep)."""
    while not stop.is_set():
        try:
            await take_census(memory, top)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis away: the gauges keep their last values
            log.warning("tenant census failed (%s: %s); next in %g s", type(exc).__name__, exc, every_s)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass
