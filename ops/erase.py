"""`memstream tenant delete T --purge`: a tenant erased from Redis — every key under its hash
tag, its indexes, and the shared model-cache entries of its texts (the LLM's answers for its
extractions, the vectors of everything it embedded), so a scan afterwards finds nothing of it.
What the store deletes is the store's (MemoryStore.purge_tenant); which cache entries are the
tenant's is worked out here, from the same prompt and text builders the workers use."""

from __future__ import annotations

from store.caches import LLMCache
from topics.records import Triple
from workers.models.prompts import EXTRACTION_SCHEMA, extraction_messages
from workers.settings import Settings
from workers.stages.extractor import embedded_texts


def llm_cache_keys(settings: Settings):
    """The LLM cache keys of the extractions of a tenant's passages ((id, fields) records), for
    the extraction model the settings name (none without one: no LLM extracted them)."""
    def keys(passages: list[tuple[str, dict]]) -> list[str]:
        if not settings.llm_model:
            return []
        cache = LLMCache(None, settings.llm_model)
        return [cache.key(extraction_messages(row.get("text", ""), row.get("context", "")), EXTRACTION_SCHEMA)
                for _, row in passages if row.get("text")]
    return keys


def tenant_texts(passages: list[tuple[str, dict]], entities: list[tuple[str, dict]], facts: list[tuple[str, dict]],
                 schemas: list[tuple[str, dict]]) -> list[str]:
    """Every text the tenant's extraction embedded (workers.stages.extractor.embedded_texts):
    each passage as indexed (topics.Chunk.indexed_text: context line, then text), entity names,
    and each fact and its schema (every schema came with a fact, and facts are kept)."""
    indexed = [f"{row['context']}\n{row['text']}" if row.get("context") else row["text"] for _, row in passages if row.get("text")]
    triples = [Triple(row["head"], row["relation"], row["tail"], row.get("head_type") or "ENTITY", row.get("tail_type") or "ENTITY")
               for _, row in facts if row.get("head") and row.get("relation") and row.get("tail")]
    texts = indexed + embedded_texts("", [row["name"] for _, row in entities if row.get("name")], triples)[1:]
    return list(dict.fromkeys(texts))


async def purge_tenant(settings: Settings, memory, tenant: str) -> dict[str, int]:
    """Erase the tenant (MemoryStore.purge_tenant) with its cache entries; what went, by kind."""
    return await memory.purge_tenant(tenant, llm_cache_keys(settings), tenant_texts)
