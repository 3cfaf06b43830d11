"""Drill-down from an answer to its records: a fact, a fact with the passages it was extracted
from, a passage. One implementation for the HTTP routes (GET /v1/facts/{id},
/v1/facts/{id}/evidence, /v1/passages/{id}) and the MCP tools (workers.query.mcp_server), so
both answer the same records and the same "not found" message."""

from __future__ import annotations

from store.base import MemoryStore


class NotFound(LookupError):
    """A record the tenant does not have; the message names it ("no fact 'f1' in tenant 't'")."""

    def __init__(self, what: str, tenant: str):
        super().__init__(f"no {what} in tenant {tenant!r}")


async def fact(memory: MemoryStore, tenant: str, fact_id: str) -> dict:
    found = await memory.fact(tenant, fact_id)
    if found is None:
        raise NotFound(f"fact {fact_id!r}", tenant)
    return found.to_json()


async def fact_evidence(memory: MemoryStore, tenant: str, fact_id: str) -> dict:
    """{"fact": the fact, "passages": the passages it was extracted from, exactly as published}."""
    found = await memory.fact(tenant, fact_id)
    if found is None:
        raise NotFound(f"fact {fact_id!r}", tenant)
    passages = [p for p in await memory.passages(tenant, found.passage_ids) if p is not None]
    return {"fact": found.to_json(), "passages": passages}


async def passage(memory: MemoryStore, tenant: str, passage_id: str) -> dict:
    found = (await memory.passages(tenant, [passage_id]))[0]
    if found is None:
        raise NotFound(f"passage {passage_id!r}", tenant)
    return found
