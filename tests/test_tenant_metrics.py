"""The per-tenant gauges (workers.tenant_metrics): top N tenants by passages named, the rest
summed under _other, totals over all; a tenant that leaves the top loses its labels."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import REGISTRY

from store.facts import Fact
from store.in_memory import InMemoryStore
from topics import Chunk
from workers.tenant_metrics import take_census


def gauge(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def _fill(store, tenant: str, passages: int, active: int) -> None:
    await store.ensure_indexes(tenant)
    pipe = store.pipeline(tenant)
    for i in range(passages):
        store.stage_passage(pipe, tenant, Chunk(tenant, f"c{i}", f"d{i}", 0, 1, f"passage {i}"), [], np.ones(8))
    for i in range(active + 1):
        fact = Fact(
            id=f"f{i}",
            head="a",
            relation="r",
            tail=f"b{i}",
            head_type="T",
            tail_type="T",
            head_id="a",
            tail_id=f"b{i}",
            schema_id="s",
        )
        store.stage_new_fact(pipe, tenant, fact, np.ones(8))
    await pipe.execute()
    for i in range(active):
        pipe = store.pipeline(tenant)
        store.stage_fact_update(pipe, tenant, f"f{i}", {"status": "active"})
        await pipe.execute()


def test_the_top_tenants_are_named_and_the_rest_summed():
    async def main():
        store = InMemoryStore(dims=8)
        await _fill(store, "big", passages=5, active=2)
        await _fill(store, "mid", passages=3, active=1)
        await _fill(store, "small", passages=1, active=0)
        await take_census(store, top=2)
        first = {
            "tenants": gauge("memstream_tenants"),
            "passages": gauge("memstream_records", layer="passages"),
            "active": gauge("memstream_facts", status="active"),
            "new": gauge("memstream_facts", status="new"),
            "big": gauge("memstream_tenant_records", tenant="big", layer="passages"),
            "mid": gauge("memstream_tenant_records", tenant="mid", layer="passages"),
            "other": gauge("memstream_tenant_records", tenant="_other", layer="passages"),
            "small": gauge("memstream_tenant_records", tenant="small", layer="passages"),
            "big active": gauge("memstream_tenant_facts", tenant="big", status="active"),
        }
        await _fill(store, "small", passages=9, active=0)  # now the largest: mid leaves the top two
        await take_census(store, top=2)
        second = {
            "small": gauge("memstream_tenant_records", tenant="small", layer="passages"),
            "mid": gauge("memstream_tenant_records", tenant="mid", layer="passages"),
            "other": gauge("memstream_tenant_records", tenant="_other", layer="passages"),
        }
        return first, second

    first, second = asyncio.run(main())
    assert first == {
        "tenants": 3,
        "passages": 9,
        "active": 3,
        "new": 3,
        "big": 5,
        "mid": 3,
        "other": 1,
        "small": None,
        "big active": 2,
    }
    assert second == {"small": 9, "mid": None, "other": 3}


@pytest.mark.stack
def test_the_query_app_stops_without_waiting_out_the_census_interval(stack_env):
    """The census runs in the query app; stopping the app stops it. A cancellation alone could be
    swallowed inside a Redis command, and the app's shutdown then waited out the interval (with
    600 s here: a hang the test's 60 s bound catches)."""
    from aiohttp.test_utils import TestClient, TestServer

    from workers.query.server import query_app
    from workers.settings import Settings

    class Embedder:
        dims, name = 8, "test-double"

        async def embed(self, texts):
            return [np.ones(8) for _ in texts]

    async def main():
        settings = Settings(
            redis_url=stack_env["MEMSTREAM_REDIS_URL"], tenant="census-stop", metrics_census_seconds=600
        )
        client = TestClient(TestServer(query_app(settings, Embedder())))
        await client.start_server()
        assert (await client.get("/healthz")).status == 200  # the first census is under way: it starts with the app
        await asyncio.wait_for(client.close(), 60)

    asyncio.run(main())
