"""What the explorer reads besides the query and the drill-downs, over both stores (conftest's
redis_url: InMemoryStore, and the stack's Redis): a tenant's memory at a glance
(drilldown.overview: GET /v1/overview) and an entity's facts (drilldown.neighbourhood: GET
/v1/entities/{id}/facts)."""

from __future__ import annotations

import asyncio
import uuid

from store import Memory
from store.in_memory import InMemoryStore
from tests.test_query_server import DIMS, PASSAGES, stage_memory
from workers.algorithms.normalize import entity_id
from workers.query import drilldown


def test_overview_and_an_entity_s_facts(redis_url):
    tenant = f"overview-{uuid.uuid4().hex[:8]}"

    async def main():
        memory = Memory.from_url(redis_url) if redis_url else InMemoryStore(DIMS)
        try:
            written = await stage_memory(memory, tenant)
            overview = await drilldown.overview(memory, tenant)
            other = await drilldown.overview(memory, f"{tenant}-none")
            oskar = await drilldown.neighbourhood(memory, tenant, entity_id("Oskar Lind"))
            limited = await drilldown.neighbourhood(memory, tenant, entity_id("Tarn Mill"), limit=1)
            nobody = await drilldown.neighbourhood(memory, tenant, "nobody")
            return written, overview, other, oskar, limited, nobody
        finally:
            await memory.close()

    written, overview, other, oskar, limited, nobody = asyncio.run(main())
    n = len(PASSAGES)
    assert overview.tenant == tenant
    assert overview.layers == {"passages": n, "facts": n, "entities": 2 * n, "schemas": 0}
    assert overview.facts_by_status == {"active": n}
    assert other.layers == {"passages": 0, "facts": 0, "entities": 0, "schemas": 0} and other.facts_by_status == {}
    assert oskar is not None and oskar.entity.name == "Oskar Lind" and oskar.total == 1
    assert [f.id for f in oskar.facts] == [written["mill"]["fact"]] and oskar.facts[0].relation == "runs"
    assert oskar.to_json()["facts"][0]["passage_ids"] == [written["mill"]["passage"]]
    assert limited is not None and limited.total == 1 and len(limited.facts) == 1
    assert nobody is None
