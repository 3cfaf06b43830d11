"""The query worker's answer over one tenant's memory: memory-guided PPR (default) or dense.

PPR mode (DESIGN §5): KNN over stable schemas, active facts and passages in parallel with the
graph catch-up, the structure-aware reset vector (`workers.retrieval`), PPR over the cached
graph (`workers.graph_cache`), then passage texts. When no schema or fact passes τ_q the
answer falls back to dense ranking and says so (`"fallback": "dense"`). Answers are cached by
(tenant, query, parameters, graph state): a repeated query on an unchanged graph costs the
embedding lookup and one XREAD."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass

import numpy as np
from redisvl.query.filter import Tag

from store import Memory
from store.keys import entity_node, node_id, passage_node
from topics import ContractError, validate_tenant
from workers import metrics
from workers.graph_cache import GraphCache
from workers.retrieval import FactHit, RetrievalParams, SchemaHit, rank_passages, seed

MAX_QUERY_CHARS = 4096
MAX_TOP_K = 100
MODES = ("ppr", "dense")
TOP_ENTITIES = 10
RESULT_CACHE_SIZE = 2048
FACT_FIELDS = ["head", "relation", "tail", "head_id", "tail_id", "status", "category", "expired_at"]


@dataclass(frozen=True)
class QueryRequest:
    query: str
    tenant: str
    top_k: int
    mode: str = "ppr"
    params: RetrievalParams = RetrievalParams()
    answer: bool = False

    @classmethod
    def from_json(cls, body, default_tenant: str, default_top_k: int, defaults: RetrievalParams = RetrievalParams()) -> "QueryRequest":
        if not isinstance(body, dict):
            raise ContractError("request body must be a JSON object with 'query'")
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ContractError("'query' must be a non-empty string")
        if len(query) > MAX_QUERY_CHARS:
            raise ContractError(f"'query' is {len(query)} characters, over the limit of {MAX_QUERY_CHARS}")
        if "\x00" in query:
            raise ContractError("'query' must not contain NUL characters")
        tenant = validate_tenant(body.get("tenant") or default_tenant)
        top_k = body.get("top_k", default_top_k)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
            raise ContractError(f"'top_k' must be an integer from 1 to {MAX_TOP_K}")
        mode = body.get("mode", "ppr")
        if mode not in MODES:
            raise ContractError(f"'mode' must be one of {', '.join(MODES)}")
        generate = body.get("answer", False)
        if not isinstance(generate, bool):
            raise ContractError("'answer' must be true or false")
        try:
            overrides = body.get("params")
            if overrides is not None and not isinstance(overrides, dict):
                raise ValueError("'params' must be an object")
            params = RetrievalParams.from_json({**asdict(defaults), **overrides}) if overrides else defaults
        except ValueError as exc:
            raise ContractError(str(exc)) from None
        return cls(query, tenant, top_k, mode, params, generate)


class QueryEngine:
    def __init__(self, memory: Memory, embedder, graphs: GraphCache | None = None):
        self.memory = memory
        self.embedder = embedder
        self.graphs = graphs or GraphCache(memory)
        self._results: OrderedDict[tuple, dict] = OrderedDict()

    async def answer(self, request: QueryRequest) -> dict:
        timings = {}
        started = t = time.perf_counter()
        vector = (await self.embedder.embed([request.query]))[0]
        timings["embed"] = _ms(t)
        if request.mode == "dense":
            result = await self._dense(request, vector, timings)
        else:
            result = await self._ppr(request, vector, timings)
        timings["total"] = _ms(started)
        metrics.QUERY_SECONDS.labels(mode=request.mode).observe(timings["total"] / 1000)
        result["timings_ms"] = {k: round(v, 3) for k, v in timings.items()}
        return result

    async def _dense(self, request: QueryRequest, vector, timings: dict) -> dict:
        t = time.perf_counter()
        passages, facts, entities, version = await asyncio.gather(
            self.memory.knn(request.tenant, "passages", vector, request.top_k, ["doc_id", "text"]),
            self._facts(request.tenant, vector, request.params.layer_k),
            self.memory.knn(request.tenant, "entities", vector, TOP_ENTITIES, ["name", "type"]),
            self.memory.graph_version(request.tenant),
        )
        timings["retrieve"] = _ms(t)
        return {
            "query": request.query, "tenant": request.tenant, "mode": "dense",
            "passages": [{"id": h.id, "doc_id": h.fields["doc_id"], "text": h.fields["text"], "score": round(h.score, 6)} for h in passages],
            "entities": [{"id": h.id, "name": h.fields["name"], "type": h.fields["type"], "score": round(h.score, 6)} for h in entities],
            "facts": [_fact_json(h) for h in facts],
            "graph_version": version,
        }

    async def _ppr(self, request: QueryRequest, vector, timings: dict) -> dict:
        tenant, params = request.tenant, request.params
        t = time.perf_counter()
        graph, (schemas, facts, passages) = await asyncio.gather(
            self.graphs.current(tenant),
            asyncio.gather(
                self.memory.knn(tenant, "schemas", vector, params.layer_k, ["head_type", "tail_type"], Tag("status") == "stable"),
                self._facts(tenant, vector, params.layer_k),
                self.memory.knn(tenant, "passages", vector, params.layer_k, ["doc_id"]),
            ),
        )
        timings["retrieve"] = _ms(t)
        # the answer is a function of the graph state and what the three KNNs returned
        retrieved = tuple((h.id, h.score) for layer in (schemas, facts, passages) for h in layer)
        cache_key = (tenant, request.query, request.top_k, params, graph.cursor, retrieved)
        cached = self._results.get(cache_key)
        if cached is not None:
            self._results.move_to_end(cache_key)
            timings["cached"] = 1
            return dict(cached)
        t = time.perf_counter()
        fact_hits = [FactHit(h.id, entity_node(h.fields["head_id"]), entity_node(h.fields["tail_id"]), h.score, h.fields.get("category") or "DECLARATIVE")
                     for h in facts]
        schema_hits = [SchemaHit(h.id, h.fields["head_type"], h.fields["tail_type"], h.score) for h in schemas]
        passage_hits = [(passage_node(h.id), h.score) for h in passages]
        seeds = seed(graph.graph, graph.stats, graph.type_sizes(), len(graph.passage_index()), fact_hits, schema_hits, passage_hits, params)
        timings["seed"] = _ms(t)
        if seeds is None:  # nothing in memory is close enough to guide the walk
            result = await self._dense(request, vector, timings)
            result.update(mode="ppr", fallback="dense")
            return result
        t = time.perf_counter()
        scores = graph.graph.pagerank(seeds.reset, params.damping, params.tolerance, outside=list(seeds.outside.values()))
        timings["ppr"] = _ms(t)
        t = time.perf_counter()
        ranked = rank_passages(graph.graph, scores, graph.passage_index(), request.top_k, list(seeds.outside))
        entity_index = graph.entity_index()
        top_entities = entity_index[np.argsort(-scores[entity_index], kind="stable")[:TOP_ENTITIES]] if len(entity_index) else []
        entity_ids = [node_id(graph.graph.names[i]) for i in top_entities]
        seed_entity_ids = [node_id(node) for node in seeds.entities]
        texts, names, version = await asyncio.gather(
            self.memory.passages(tenant, [node_id(node) for node, _ in ranked]),
            self.memory.entity_names(tenant, entity_ids + seed_entity_ids),
            self.memory.graph_version(tenant),
        )
        by_id = {h.id: h for h in facts}
        result = {
            "query": request.query, "tenant": tenant, "mode": "ppr",
            "passages": [{"id": node_id(node), "doc_id": row["doc_id"], "text": row["text"], "score": round(score, 8)}
                         for (node, score), row in zip(ranked, texts) if row is not None],
            "entities": [{"id": eid, **names.get(eid, {}), "score": round(float(scores[i]), 8)} for eid, i in zip(entity_ids, top_entities)],
            "facts": [_fact_json(by_id[f.id]) for f in seeds.facts],
            "seeds": {
                "facts": [{"id": f.id, "score": round(f.score, 6)} for f in seeds.facts],
                "entities": [{"id": node_id(node), **names.get(node_id(node), {}), "score": round(w, 6)} for node, w in sorted(seeds.entities.items(), key=lambda x: -x[1])],
                "types": [{"type": node_id(node), "score": round(w, 6)} for node, w in sorted(seeds.types.items(), key=lambda x: -x[1])],
                "passages": [{"id": node_id(node), "score": round(w, 6)} for node, w in sorted(seeds.passages.items(), key=lambda x: -x[1])],
            },
            "graph_version": version,
            # how the cached matrix got here: one load, then stream changes folded in as deltas
            "graph": {"nodes": len(graph.graph), "edges": graph.graph.edges, "loads": graph.loads, "rebuilds": graph.graph.rebuilds,
                      "changes_applied": graph.changes_applied, "deltas_applied": graph.graph.deltas_applied},
        }
        timings["fetch"] = _ms(t)
        self._results[cache_key] = dict(result)
        while len(self._results) > RESULT_CACHE_SIZE:
            self._results.popitem(last=False)
        return result

    async def _facts(self, tenant: str, vector, k: int):
        """Active facts nearest the query; expired ones contribute nothing."""
        hits = await self.memory.knn(tenant, "facts", vector, k, FACT_FIELDS, Tag("status") == "active")
        now = time.time()
        return [h for h in hits if not (h.fields.get("expired_at") and float(h.fields["expired_at"]) <= now)]


def _fact_json(hit) -> dict:
    fields = {k: v for k, v in hit.fields.items() if v not in (None, "") and k != "expired_at"}
    return {"id": hit.id, **fields, "score": round(hit.score, 6)}


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
