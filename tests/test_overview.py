"""What the explorer reads besides the query and the drill-downs, over both stores (conftest's
redis_url: InMemoryStore, and the stack's Redis): a tenant's memory at a glance
(drilldown.overview: GET /v1/overview), an entity's facts (drilldown.neighbourhood: GET
/v1/entities/{id}/facts) and the newest facts (drilldown.recent_facts: GET /v1/recent-facts)."""

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
            pipe = memory.pipeline(tenant)
            memory.stage_fact_update(pipe, tenant, written["ferry"]["fact"], {"status": "invalid", "reason": "lost"})
            await pipe.execute()
            newest = await drilldown.recent_facts(memory, tenant, (), 10)
            two = await drilldown.recent_facts(memory, tenant, (), 2)
            invalid = await drilldown.recent_facts(memory, tenant, ("invalid",), 10)
            return written, overview, other, oskar, limited, nobody, newest, two, invalid
        finally:
            await memory.close()

    written, overview, other, oskar, limited, nobody, newest, two, invalid = asyncio.run(main())
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
    # the newest facts first (created_at descending), any status or of some
    assert {f.id for f in newest.facts} == {w["fact"] for w in written.values()}
    created = [f.created_at or 0.0 for f in newest.facts]
    assert created == sorted(created, reverse=True)
    assert [f.id for f in two.facts] == [f.id for f in newest.facts[:2]]
    assert [f.id for f in invalid.facts] == [written["ferry"]["fact"]] and invalid.facts[0].status == "invalid"
    assert invalid.to_json()["statuses"] == ["invalid"] and invalid.facts[0].reason == "lost"
