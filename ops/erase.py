"""`memstream tenant delete T --purge`: a tenant erased from Redis — every key under its hash
tag, its indexes, and the shared model-cache entries of its texts (the LLM's answers for its
extractions, the vectors of everything it embedded), so a scan afterwards finds nothing of it.
What the store deletes is the store's (MemoryStore.purge_tenant); which cache entries are the
tenant's is worked out with the helpers a document's erasure uses (workers.stages.erasure)."""

from __future__ import annotations

import time

from store.facts import document_event
from topics import FactEvent
from workers.algorithms.normalize import short_hash
from workers.derived import extraction_cache_keys, texts_of_records
from workers.publisher import ClientPublisher
from workers.settings import Settings


def llm_cache_keys(settings: Settings):
    """The LLM cache keys of the extractions of a tenant's passages ((id, fields) records)."""
    return lambda passages: extraction_cache_keys(settings, passages)


def tenant_texts(
    passages: list[tuple[str, dict]],
    entities: list[tuple[str, dict]],
    facts: list[tuple[str, dict]],
    schemas: list[tuple[str, dict]],
) -> list[str]:
    """Every text the tenant's extraction embedded: each passage as indexed, entity names, and
    each fact and its schema (every schema came with a fact, and facts are kept)."""
    return texts_of_records(passages, entities, facts, with_schemas=True)


async def purge_tenant(settings: Settings, memory, tenant: str) -> dict[str, int]:
    """Erase the tenant (MemoryStore.purge_tenant) with its cache entries; what went, by kind."""
    return await memory.purge_tenant(tenant, llm_cache_keys(settings), tenant_texts)


def tenant_purged_event(tenant: str, gone: dict[str, int]) -> FactEvent:
    """The `purged` event of a tenant's erasure: no document, no ids (a tenant's may be
    millions), what went counted in its reason; its id is of this erasure (the time it ran)."""
    event = document_event(
        tenant, "purged", "", [], 0, "tenant erased: " + ", ".join(f"{n} {what}" for what, n in gone.items())
    )
    return FactEvent(**{**event.__dict__, "event_id": short_hash("event", tenant, "tenant-purge", repr(time.time()))})


def publish_event(settings: Settings, event: FactEvent, timeout_s: float = 30.0) -> None:
    """Publish one event on `memstream.indexed-facts` (PublishError when Kafka does not take it)."""
    publisher = ClientPublisher(settings, timeout_s=timeout_s)
    try:
        publisher.send([publisher.event_message(event)])
    finally:
        publisher.close()
