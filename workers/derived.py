"""What indexing derives from a passage, in one place for the extractor that derives it and for
those that undo it: the texts a chunk's extraction embeds (the extractor, workers.stages.
extractor) and the same texts found again from the records they made, the LLM cache keys of its
extraction, and the passages a document's erasure removes — read by the erasure stage
(workers.stages.erasure), the tenant-wide purge (`memstream tenant delete --purge`, ops/erase.py)
and `publish --wait` (ops/publish.py), none of which imports a stage for them."""

from __future__ import annotations

from store.caches import LLMCache
from topics.records import Triple, indexed_text_of
from workers.models.prompts import EXTRACTION_SCHEMA, extraction_messages
from workers.settings import Settings


def embedded_texts(indexed_text: str, entity_names: list[str], facts: list[Triple]) -> list[str]:
    """Everything a chunk's extraction embeds, in one embed call: its passage (a turn: with who
    said it and when), entity names, facts, then their schemas."""
    return [indexed_text] + entity_names + [fact_text(t) for t in facts] + [schema_text(t) for t in facts]


def fact_text(triple: Triple) -> str:
    """The text a fact is embedded by (its record's `text`: store.facts.Fact.extracted)."""
    return f"{triple.head} {triple.relation} {triple.tail}"


def schema_text(triple: Triple) -> str:
    """The text the schema of a fact is embedded by."""
    return f"{triple.head_type} {triple.relation} {triple.tail_type}"


def extraction_cache_keys(settings: Settings, passages: list[tuple[str, dict]]) -> list[str]:
    """The LLM cache keys of the extractions of passages ((id, fields) records), for the
    extraction model the settings name (none without one: no LLM extracted them)."""
    if not settings.llm_model:
        return []
    cache = LLMCache(None, settings.llm_model)
    return [
        cache.key(extraction_messages(row.get("text") or "", row.get("context") or ""), EXTRACTION_SCHEMA)
        for _, row in passages
        if row.get("text")
    ]


def texts_of_records(
    passages: list[tuple[str, dict]],
    entities: list[tuple[str, dict]],
    facts: list[tuple[str, dict]],
    with_schemas: bool = False,
) -> list[str]:
    """Every text the extraction embedded for these records (embedded_texts):
    each passage as indexed (topics.Chunk.indexed_text: context line, then text), entity names,
    each fact and, `with_schemas`, each fact's schema."""

    indexed = [indexed_text_of(row.get("context"), row["text"]) for _, row in passages if row.get("text")]
    triples = [
        Triple(
            row["head"],
            row["relation"],
            row["tail"],
            row.get("head_type") or "ENTITY",
            row.get("tail_type") or "ENTITY",
        )
        for _, row in facts
        if row.get("head") and row.get("relation") and row.get("tail")
    ]
    texts = embedded_texts("", [row["name"] for _, row in entities if row.get("name")], triples)[1:]
    if not with_schemas:  # a document's erasure: the schemas (types and a relation) stay, with their vectors
        texts = texts[: len(texts) - len(triples)]
    return list(dict.fromkeys(indexed + texts))


async def left_to_erase(memory, pipe, tenant: str, doc_id: str) -> list[str]:
    """The passages of the document's versions an erasure removes now: retired, and held by no
    document's current version. With `pipe`, the decision is fenced on what it read of each."""
    held = await memory.document_passages(tenant, doc_id)
    states, owners = await memory.passage_states(tenant, held), await memory.passage_documents(tenant, held)
    if pipe is not None:
        for pid, state in zip(held, states):
            memory.expect_passage(pipe, tenant, pid, state, counts=True)
    return [pid for pid, state, docs in zip(held, states, owners) if state.retired and not docs]
