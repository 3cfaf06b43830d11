"""Drill-down from a fact to its evidence and to a passage: the records GET /v1/facts/{id},
/v1/facts/{id}/evidence and /v1/passages/{id} answer, and `memstream fact` / `memstream passage`
print (one implementation for the HTTP API, the CLI and other callers). None: no such record in
the tenant."""

from __future__ import annotations

from store.base import MemoryStore


def missing(what: str, tenant: str) -> str:
    """The message for a record the tenant does not have (`what`: "fact 'f1'", "passage 'p9'"):
    the HTTP 404 body, the CLI's error and the MCP tool error say the same."""
    return f"no {what} in tenant {tenant!r}"


async def fact_record(memory: MemoryStore, tenant: str, fact_id: str) -> dict | None:
    """The fact (store.facts.Fact.to_json)."""
    fact = await memory.fact(tenant, fact_id)
    return None if fact is None else fact.to_json()


async def fact_evidence(memory: MemoryStore, tenant: str, fact_id: str) -> dict | None:
    """{"fact": the fact, "passages": the passages it was extracted from, as published}."""
    fact = await memory.fact(tenant, fact_id)
    if fact is None:
        return None
    passages = [p for p in await memory.passages(tenant, fact.passage_ids) if p is not None]
    return {"fact": fact.to_json(), "passages": passages}


async def passage_record(memory: MemoryStore, tenant: str, passage_id: str) -> dict | None:
    """The passage (store.records.passage_json): its text byte for byte as published, its
    document, metadata (turn_id, dia_id, session_id, speaker, ts, ...) and context line."""
    return (await memory.passages(tenant, [passage_id]))[0]
