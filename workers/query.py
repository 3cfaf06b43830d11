"""The query worker's answer: dense ranking over the memory layers of one tenant.

(Memory-guided PPR replaces the passage ranking in issue 4; the response shape stays.)"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from redisvl.query.filter import Tag

from store import Memory
from topics import ContractError, validate_tenant
from workers import metrics

MAX_QUERY_CHARS = 4096
MAX_TOP_K = 100


@dataclass(frozen=True)
class QueryRequest:
    query: str
    tenant: str
    top_k: int

    @classmethod
    def from_json(cls, body, default_tenant: str, default_top_k: int) -> "QueryRequest":
        if not isinstance(body, dict):
            raise ContractError("request body must be a JSON object with 'query'")
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ContractError("'query' must be a non-empty string")
        if len(query) > MAX_QUERY_CHARS:
            raise ContractError(f"'query' is {len(query)} characters, over the limit of {MAX_QUERY_CHARS}")
        tenant = validate_tenant(body.get("tenant") or default_tenant)
        top_k = body.get("top_k", default_top_k)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
            raise ContractError(f"'top_k' must be an integer from 1 to {MAX_TOP_K}")
        return cls(query, tenant, top_k)


async def answer(memory: Memory, embedder, request: QueryRequest) -> dict:
    timings = {}
    started = t = time.perf_counter()
    vector = (await embedder.embed([request.query]))[0]
    timings["embed"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    passages, facts, entities = await asyncio.gather(
        memory.knn(request.tenant, "passages", vector, request.top_k, ["doc_id", "text", "seq"]),
        memory.knn(
            request.tenant, "facts", vector, request.top_k,
            ["head", "relation", "tail", "status", "category"], Tag("status") == "active",
        ),
        memory.knn(request.tenant, "entities", vector, 10, ["name", "type"]),
    )
    timings["retrieve"] = (time.perf_counter() - t) * 1000
    timings["total"] = (time.perf_counter() - started) * 1000
    metrics.QUERY_SECONDS.labels(mode="dense").observe(timings["total"] / 1000)
    return {
        "query": request.query,
        "tenant": request.tenant,
        "mode": "dense",
        "passages": [{"id": h.id, "doc_id": h.fields["doc_id"], "text": h.fields["text"], "score": round(h.score, 6)} for h in passages],
        "entities": [{"id": h.id, "name": h.fields["name"], "type": h.fields["type"], "score": round(h.score, 6)} for h in entities],
        "facts": [{"id": h.id, **h.fields, "score": round(h.score, 6)} for h in facts],
        "graph_version": await memory.graph_version(request.tenant),
        "timings_ms": {k: round(v, 3) for k, v in timings.items()},
    }
