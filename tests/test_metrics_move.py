"""The indexing metrics move when the pipeline works (in process, the default Prometheus
registry): events committed by kind, conflict decisions by kind and status, the shared
embedding cache's hits and misses."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from store.in_memory import InMemoryStore
from tests.inprocess import DIMS, HashEmbedder, InProcess
from workers.models.embedding import BatchingEmbedder, embedder_id
from workers.models.extraction import RulesExtractor


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def conflict_decisions() -> float:
    return sum(
        s.value
        for m in REGISTRY.collect()
        if m.name == "memstream_conflict_decisions"
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_events_conflicts_and_cache_lookups_are_counted():
    async def scenario():
        memory = InMemoryStore(DIMS, tau=1)
        model = HashEmbedder()
        embedder = BatchingEmbedder(model, cache=memory.embedding_cache(embedder_id(model).cache_name))
        stages = InProcess(None, RulesExtractor(), embedder, memory=memory, tau=1)
        try:
            await stages.publish("a", "Ilse Marr was born in Kallmar.")
            await stages.publish(
                "b", "Ilse Marr was born in Brest. Records say Ilse Marr was born in Brest."
            )  # one birthplace, two cities
            await stages.delete("b")
            events = stages.events()
        finally:
            await stages.close()
        # the same text as a in another tenant: its vectors come from the shared cache (the first
        # tenant's own records hold them, so it asks no cache: tests/test_embed_only_new.py)
        other = InProcess(None, RulesExtractor(), embedder, memory=memory, tau=1, tenant="another")
        try:
            await other.publish("c", "Ilse Marr was born in Kallmar.")
            return events + other.events()
        finally:
            await other.close()

    activated, retired = (
        value("memstream_fact_events_total", event="activated"),
        value("memstream_fact_events_total", event="retired"),
    )
    hits, misses, decisions = (
        value("memstream_embedding_cache_total", result="hit"),
        value("memstream_embedding_cache_total", result="miss"),
        conflict_decisions(),
    )
    events = asyncio.run(scenario())
    assert (
        value("memstream_fact_events_total", event="activated") - activated
        == sum(e["event"] == "activated" for e in events)
        > 0
    )
    assert (
        value("memstream_fact_events_total", event="retired") - retired
        == sum(e["event"] == "retired" for e in events)
        == 1
    )
    assert conflict_decisions() > decisions
    assert (
        value("memstream_embedding_cache_total", result="miss") > misses
        and value("memstream_embedding_cache_total", result="hit") > hits
    )
