"""The query worker's answer over one tenant's memory, in one of its registered modes (workers.query.modes).

The first stage (modes hybrid, ppr, reconstruct; workers.query.first_stage): the passages
nearest the query vector (dense) and those best matching its words (lexical: the store's BM25,
store.lexical), fused by reciprocal rank. `dense` and `lexical` are each leg alone, `hybrid` the
first stage alone; reconstruct's walk is workers.query.reconstruct's.

PPR mode (docs/architecture.md §5): KNN over stable schemas and active facts, and the first stage, in
parallel with the graph catch-up, the structure-aware reset vector (`workers.algorithms.retrieval`),
PPR over the cached graph (`workers.query.graph_cache`), then the first stage's ranking fused with
the walk's (fuse_walk), so the walk re-ranks the first stage below its top passage (its top two
over conversation turns: `turn_first_kept`) and top_k is always filled; over titled documents
the pages a subject joins to the question and to that passage, and the first stage's best
passage sharing a bridge name with it, come right below the kept passages
(workers.query.links). When no schema or fact passes τ_q the answer is the first stage's, with
those links, and says so (`"fallback": "first_stage"`). Answers are cached by (tenant, query,
parameters, graph state): a repeated query on an unchanged graph costs the embedding lookup and
one XREAD.

A request's work is bounded: it is validated before anything runs (workers.query.request), and
PPR with the ranking over its scores runs on a thread of its own, off the event loop that serves
the other requests and the Kafka consumer's heartbeats."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from store.base import MemoryStore
from store.facts import FactRecordHit
from store.nodes import entity_node, node_id, passage_node
from store.records import Hit
from workers import metrics
from workers.algorithms.expiry import said_by, was_valid
from workers.algorithms.ppr_solver import PPR, LeafEliminated, Transition
from workers.algorithms.reconstruction import choose_mentions, mention_candidates, names_something
from workers.algorithms.retrieval import (
    FactHit,
    FirstStage,
    RetrievalParams,
    SchemaHit,
    Seeds,
    fuse_walk,
    kept_first,
    link_weight,
    linked_weights,
    rank_passages,
    seed,
    top_stable,
    walk_weight,
)
from workers.models.embedding import TenantEmbedders
from workers.query.answers import (
    EntityView,
    FactView,
    GraphStats,
    QueryResult,
    RankedPassage,
    Scored,
    TypeSeed,
    WalkSeeds,
    WalkStats,
    empty_tenant_warning,
)
from workers.query.first_stage import FirstStageSearch, ready
from workers.query.graph_cache import GraphCache, TenantGraph
from workers.query.links import with_links
from workers.query.modes import mode_of
from workers.query.reconstruct import Reconstructor
from workers.query.request import QueryRequest

TOP_ENTITIES = 10
RESULT_CACHE_SIZE = 2048
H = TypeVar("H", bound=Hit)  # a search hit, or one with its record read (FactRecordHit)

FACT_FIELDS = ["head", "relation", "tail", "head_id", "tail_id", "status", "category", "expired_at", "expires_at"]
AS_OF_OVERFETCH, MAX_AS_OF_CANDIDATES = 4, 400  # facts KNN reads for an as_of query, before the time filter
REDIS_CALLS_PER_QUERY = 4  # Redis commands one query has in flight at once (three KNNs and the graph catch-up)


class QueryEngine:
    def __init__(
        self,
        memory: MemoryStore,
        embedder,
        graphs: GraphCache | None = None,
        reconstructor: Reconstructor | None = None,
    ):
        self.memory = memory
        self.embedder = embedder
        self.first_stage = FirstStageSearch(memory)
        self.graphs = graphs or GraphCache(memory)
        self.reconstructor = reconstructor or Reconstructor(memory)
        self.tenant_embedders = TenantEmbedders(
            memory, embedder
        )  # answer() raises EmbedderMismatch for a tenant built with another
        self.clock = time.time  # the time a fact's TTL is compared with (tests set it)
        self._results: OrderedDict[tuple, QueryResult] = OrderedDict()
        # PPR and the ranking over its scores, off the event loop. One thread: a solve rescales
        # the graph's cached matrix in place (`Transition.scale`), and more threads would only
        # share the same cores.
        self._ranking = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-ppr")

    @classmethod
    def from_settings(cls, settings, memory: MemoryStore, embedder) -> "QueryEngine":
        """The query worker's engine as configured: its graph cache's size
        (MEMSTREAM_GRAPH_CACHE_EDGES) and mode reconstruct's router and budget
        (Reconstructor.from_settings). The one construction the HTTP API and `memstream mcp` share."""
        return cls(
            memory,
            embedder,
            GraphCache(memory, settings.graph_cache_edges),
            Reconstructor.from_settings(settings, memory),
        )

    def close(self) -> None:
        """Stop the ranking thread (the store is its owner's to close)."""
        self._ranking.shutdown(wait=False)

    async def aclose(self) -> None:
        """close(), and the LLM router's HTTP client (MEMSTREAM_ROUTER=llm)."""
        self.close()
        await self.reconstructor.aclose()

    async def answer(self, request: QueryRequest) -> QueryResult:
        timings: dict[str, float] = {}
        started = t = time.perf_counter()
        mode = mode_of(request.mode)
        if not mode.embeds:  # no model: the store's BM25 alone
            vector = None
        else:
            vector = (await self.embedder.embed([request.query]))[0]
            await self.tenant_embedders.check(
                request.tenant, writing=False
            )  # cached: a round trip per tenant every 30 s
        timings["embed"] = _ms(t)
        if mode.recipe == "dense":
            result = await self._dense(request, vector, timings)
        elif mode.recipe in ("lexical", "first_stage"):
            result = await self._first_stage_only(request, vector, timings)
        elif mode.recipe == "reconstruct":
            assert vector is not None  # every mode but lexical embeds the query
            first = self.first_stage.for_graph(request, vector)  # awaited beside the walk's cue lookup
            result = await self.reconstructor.answer(request, vector, self._fact_search(request), timings, first)
        else:
            result = await self._ppr(request, vector, timings)
        if not result.passages and not await self.memory.tenant_known(request.tenant):
            # an empty answer of a tenant nothing was indexed for: say so (a misspelt tenant
            # would otherwise look like an empty memory)
            result.warning = empty_tenant_warning(request.tenant)
        timings["total"] = _ms(started)
        metrics.QUERY_SECONDS.labels(mode=request.mode).observe(timings["total"] / 1000)
        result.timings_ms = {k: round(v, 3) for k, v in timings.items()}
        return result

    async def _first_stage_only(
        self, request: QueryRequest, vector, timings: dict[str, float], first: FirstStage | None = None
    ) -> QueryResult:
        """Modes lexical (BM25 alone) and hybrid (BM25 and dense, fused): the first stage as the
        answer; `first`: the one a graph mode found and answers with (with its episodes)."""
        t = time.perf_counter()
        facts: list[Hit] = []
        entities: list[Hit] = []
        known: dict[str, dict] = {}
        stage: FirstStage
        if mode_of(request.mode).recipe == "lexical":
            k = request.top_k * (AS_OF_OVERFETCH if request.as_of is not None else 1)
            lexical, version = await asyncio.gather(
                self.memory.lexical(request.tenant, request.query, k), self.memory.graph_version(request.tenant)
            )
            ranked = [(h.id, h.score) for h in lexical]
        else:
            stage, facts, entities, version = await asyncio.gather(
                ready(first) if first is not None else self.first_stage.search(request, vector, with_cosines=False),
                self._facts(request.tenant, vector, request.params.layer_k, as_of=request.as_of),
                self.memory.knn(request.tenant, "entities", vector, TOP_ENTITIES, ["name", "type"]),
                self.memory.graph_version(request.tenant),
            )
            ranked, known = stage.fused, stage.rows
        found = await self._ranked_rows(request, ranked, known)
        timings["retrieve"] = _ms(t)
        return QueryResult(
            query=request.query,
            tenant=request.tenant,
            mode=request.mode,
            passages=[RankedPassage.of(row, round(score, 6)) for row, score in found],
            entities=[EntityView.of_hit(h) for h in entities],
            facts=[FactView.of_hit(h) for h in facts],
            graph_version=version,
        )

    async def _dense(self, request: QueryRequest, vector, timings: dict[str, float]) -> QueryResult:
        t = time.perf_counter()
        k = request.top_k * (AS_OF_OVERFETCH if request.as_of is not None else 1)
        passages, facts, entities, version = await asyncio.gather(
            self.memory.knn(request.tenant, "passages", vector, k, ["doc_id"]),
            self._facts(request.tenant, vector, request.params.layer_k, as_of=request.as_of),
            self.memory.knn(request.tenant, "entities", vector, TOP_ENTITIES, ["name", "type"]),
            self.memory.graph_version(request.tenant),
        )
        found = await self._ranked_rows(request, [(h.id, h.score) for h in passages])  # with their metadata and context
        timings["retrieve"] = _ms(t)
        return QueryResult(
            query=request.query,
            tenant=request.tenant,
            mode=request.mode,
            passages=[RankedPassage.of(row, round(score, 6)) for row, score in found],
            entities=[EntityView.of_hit(h) for h in entities],
            facts=[FactView.of_hit(h) for h in facts],
            graph_version=version,
        )

    async def _ppr(self, request: QueryRequest, vector, timings: dict[str, float]) -> QueryResult:
        """The first stage re-ranked by the walk: PPR seeded by the facts and schemas near the
        query and the first stage's passages; the answer is the fusion of the first stage's
        ranking with the walk's (fuse), the first stage filling top_k, the top passage's links below
        it (workers.query.links). When nothing seeds the walk, the first stage's ranking with those links
        is the answer (`"fallback": "first_stage"`)."""
        tenant, params = request.tenant, request.params
        t = time.perf_counter()
        linking = params.entity_links or params.turn_link_weight > 0  # link_weight() may be 0 for documents
        mentions = mention_candidates(request.query) if linking else []
        graph, (schemas, facts, first, canonical) = await asyncio.gather(
            self.graphs.current(tenant),
            asyncio.gather(
                self.memory.knn(
                    tenant, "schemas", vector, params.layer_k, ["head_type", "tail_type"], {"status": "stable"}
                ),
                self._facts(tenant, vector, params.layer_k, as_of=request.as_of),
                self.first_stage.for_graph(request, vector),
                self.memory.resolve_aliases(tenant, sorted({m.entity_id for m in mentions})) if mentions else ready({}),
            ),
        )
        timings["retrieve"] = _ms(t)
        first_ids = [pid for pid, _ in first.fused]
        # the answer is a function of the graph state and what the searches returned
        retrieved = tuple((h.id, h.score) for layer in (schemas, facts) for h in layer) + tuple(first_ids)
        cache_key = (tenant, request.query, request.top_k, params, graph.cursor, retrieved)
        cached = self._results.get(cache_key)
        if cached is not None:
            self._results.move_to_end(cache_key)
            timings["cached"] = 1
            return cached.model_copy()
        t = time.perf_counter()
        fact_hits = [
            FactHit(
                h.id,
                entity_node(h.fields["head_id"]),
                entity_node(h.fields["tail_id"]),
                h.score,
                h.fields.get("category") or "DECLARATIVE",
            )
            for h in facts
        ]
        schema_hits = [SchemaHit(h.id, h.fields["head_type"], h.fields["tail_type"], h.score) for h in schemas]
        passage_hits = [
            (passage_node(pid), first.cosines[pid]) for pid in first_ids[: params.layer_k] if pid in first.cosines
        ]
        # The graph version this query walks: pending deltas are folded in here, on the loop
        # (the change stream adds deltas there); the thread reads only this snapshot, and node
        # names, which only append. No await until the thread has it.
        transition = graph.graph.transition()
        passage_index, entity_index = graph.passage_index(), graph.entity_index()
        # the entities the query names: spans matched to the tenant's entity ids (aliases
        # resolved), at the weight link_weight gives them (0 over documents by default)
        weight, linked = link_weight(params, first.turn_share), {}
        if weight > 0:
            in_graph = {
                cid: eid
                for cid, eid in canonical.items()
                if names_something(eid) and entity_node(eid) in graph.graph.index
            }
            named = [entity_node(eid) for _, eid in choose_mentions(mentions, in_graph)]
            linked = {node: w * weight for node, w in linked_weights(graph.stats, len(passage_index), named).items()}
        seeds = seed(
            graph.graph,
            graph.stats,
            graph.type_sizes(),
            len(passage_index),
            fact_hits,
            schema_hits,
            passage_hits,
            params,
            linked,
        )
        timings["seed"] = _ms(t)
        kept = kept_first(params, first.turn_share)
        if seeds is None:  # nothing in memory is close enough to guide the walk: the first stage answers,
            # with the top passage's links below it
            fused = await with_links(
                self.memory, request, first_ids, first.fused, first.rows, kept, functools.partial(_entities_in, graph)
            )
            result = await self._first_stage_only(request, vector, timings, dataclasses.replace(first, fused=fused))
            result.fallback = "first_stage"
            return result
        t = time.perf_counter()
        walk = await asyncio.get_running_loop().run_in_executor(
            self._ranking,
            _walk,
            graph.graph,
            transition,
            seeds,
            params,
            passage_index,
            entity_index,
            max(request.top_k, params.first_stage_k),
        )
        timings["ppr"] = _ms(t)
        t = time.perf_counter()
        walked = [node_id(node) for node, _ in walk.passages]
        ranked = fuse_walk(first_ids, walked, params, walk_weight(params, first.turn_share), kept)
        ranked = await with_links(
            self.memory, request, first_ids, ranked, first.rows, kept, functools.partial(_entities_in, graph)
        )
        scores, top_entities = walk.ppr.scores, walk.entities
        entity_ids = [node_id(graph.graph.names[i]) for i in top_entities]
        seed_entity_ids = [node_id(node) for node in seeds.entities]
        found, names, version = await asyncio.gather(
            self._ranked_rows(request, ranked, first.rows),
            self.memory.entity_names(tenant, entity_ids + seed_entity_ids),
            self.memory.graph_version(tenant),
        )
        by_id = {h.id: h for h in facts}
        result = QueryResult(
            query=request.query,
            tenant=tenant,
            mode=request.mode,
            passages=[RankedPassage.of(row, round(score, 8)) for row, score in found],
            entities=[
                EntityView(id=eid, **names.get(eid, {}), score=round(float(scores[i]), 8))
                for eid, i in zip(entity_ids, top_entities)
            ],
            facts=[FactView.of_hit(by_id[f.id]) for f in seeds.facts],
            seeds=WalkSeeds(
                facts=[Scored(id=f.id, score=round(f.score, 6)) for f in seeds.facts],
                entities=[
                    EntityView(id=node_id(node), **names.get(node_id(node), {}), score=round(w, 6))
                    for node, w in sorted(seeds.entities.items(), key=lambda x: -x[1])
                ],
                types=[
                    TypeSeed(type=node_id(node), score=round(w, 6))
                    for node, w in sorted(seeds.types.items(), key=lambda x: -x[1])
                ],
                passages=[
                    Scored(id=node_id(node), score=round(w, 6))
                    for node, w in sorted(seeds.passages.items(), key=lambda x: -x[1])
                ],
            ),
            graph_version=version,
            # converged: false only when the walk stopped at its pass cap (workers.algorithms.ppr_solver.MAX_PASSES)
            ppr=WalkStats(
                passes=walk.ppr.passes,
                converged=walk.ppr.converged,
                error_bound=float(f"{walk.ppr.error_bound:.3g}"),
            ),
            graph=GraphStats(
                nodes=len(graph.graph),
                edges=graph.graph.edges,
                loads=graph.loads,
                rebuilds=graph.graph.rebuilds,
                changes_applied=graph.changes_applied,
                deltas_applied=graph.graph.deltas_applied,
            ),
        )
        timings["fetch"] = _ms(t)
        self._results[cache_key] = result.model_copy()
        while len(self._results) > RESULT_CACHE_SIZE:
            self._results.popitem(last=False)
        return result

    async def _ranked_rows(
        self, request: QueryRequest, ranked: list[tuple[str, float]], known: dict[str, dict] | None = None
    ) -> list[tuple[dict, float]]:
        """The first top_k passages of `ranked` (id, score) that exist, as stored rows with their
        scores (`known`: rows read already), in memory (not retired) and, with as_of, said by
        then (said_by), read a batch at a time until top_k."""
        out: list[tuple[dict, float]] = []
        rows = known or {}
        batch = request.top_k if request.as_of is None else request.top_k * AS_OF_OVERFETCH
        for start in range(0, len(ranked), batch):
            part = ranked[start : start + batch]
            rows = await self.first_stage.read_rows(request.tenant, [pid for pid, _ in part], rows)
            out += [(rows[pid], score) for pid, score in part if pid in rows and said_by(rows[pid], request.as_of)]
            if len(out) >= request.top_k:
                break
        return out[: request.top_k]

    async def _facts(
        self, tenant: str, vector, k: int, where: dict[str, str] | None = None, as_of: float | None = None
    ):
        """The facts nearest the query (and matching `where`'s tags) that hold: active and their
        TTL not lapsed (before the expiry sweep gets to them); invalidated, merged and expired
        facts weigh nothing. With `as_of`: the facts valid then (_facts_as_of)."""
        if as_of is not None:
            return await self._facts_as_of(tenant, vector, k, as_of, where)
        return self._live(
            await self.memory.knn(tenant, "facts", vector, k, FACT_FIELDS, {**(where or {}), "status": "active"})
        )

    def _live(self, hits: list[H]) -> list[H]:
        """The hits whose TTL has not lapsed (before the expiry sweep gets to them)."""
        now = self.clock()
        return [h for h in hits if not (h.fields.get("expires_at") and float(h.fields["expires_at"]) <= now)]

    def _fact_search(self, request: QueryRequest):
        """The fact searches a reconstruct walk uses (one for each filter, at once): this
        engine's, at the request's as_of."""

        async def each(
            tenant: str, vector, k: int, wheres: list[dict[str, str] | None], vectors: bool
        ) -> list[list[FactRecordHit]]:
            if request.as_of is not None:  # the facts are read after (FactRecordHit.fact None)
                found = await asyncio.gather(*(self._facts(tenant, vector, k, w, request.as_of) for w in wheres))
                return [[FactRecordHit(h.id, h.score, h.fields) for h in hits] for hits in found]
            read = await self.memory.facts_near_each(
                tenant, vector, k, FACT_FIELDS, [{**(w or {}), "status": "active"} for w in wheres], vectors
            )
            return [self._live(hits) for hits in read]

        return each

    async def _facts_as_of(self, tenant: str, vector, k: int, as_of: float, where: dict[str, str] | None = None):
        """The `k` facts nearest the query among those valid at `as_of`, whatever their status
        now (a fact invalidated since was valid then). The rule (workers.algorithms.expiry
        .was_valid), per end of a fact's span: its event time when known — from `valid_at`
        (else `valid_from`, which for a conversation turn defaults to the turn's time) up to,
        not including, `invalid_at` (else `valid_to`) — else its transaction time, from
        `created_at` up to `expired_at` or its TTL's lapse (`expires_at`), the earlier; a fact
        never activated was never valid. An invalidated
        fact ends where the fact that excluded it begins. The walk runs over today's graph,
        seeded by these facts. Fact KNN is filtered after the search: it reads AS_OF_OVERFETCH×k
        candidates."""
        hits = await self.memory.knn(
            tenant, "facts", vector, min(k * AS_OF_OVERFETCH, MAX_AS_OF_CANDIDATES), FACT_FIELDS, where
        )
        facts = await self.memory.facts(tenant, [h.id for h in hits])
        valid = [
            h
            for h, f in zip(hits, facts)
            if f is not None
            and was_valid(
                as_of,
                event_start=f.event_start,
                event_end=f.event_end,
                created_at=f.created_at,
                expired_at=f.expired_at,
                expires_at=f.expires_at,
                activated_at=f.activated_at,
            )
        ]
        return valid[:k]


@dataclass(frozen=True)
class Walk:
    ppr: PPR
    passages: list[tuple[str, float]]  # (passage node, score), best first
    entities: np.ndarray  # graph indexes of the best-scored entities


def _walk(
    graph,
    transition: Transition | LeafEliminated,
    seeds: Seeds,
    params: RetrievalParams,
    passage_index: np.ndarray,
    entity_index: np.ndarray,
    top_k: int,
) -> Walk:
    """PPR from the seeds over one graph version and the rankings read from its scores (runs on
    the engine's ranking thread)."""
    ppr = transition.solve(
        seeds.reset, params.damping, params.tolerance, outside=np.fromiter(seeds.outside.values(), np.float64)
    )
    ranked = rank_passages(graph, ppr.scores, passage_index, top_k, list(seeds.outside))
    entities = (
        entity_index[top_stable(ppr.scores[entity_index], TOP_ENTITIES)]
        if len(entity_index)
        else np.zeros(0, dtype=np.int64)
    )
    return Walk(ppr, ranked, entities)


def _entities_in(graph: TenantGraph, passage_id: str) -> list[str] | None:
    """The entity ids the cached graph joins a passage to; None where it holds no node of it (the
    graph behind the store: the store is read instead)."""
    node = passage_node(passage_id)
    if node not in graph.graph.index:
        return None
    return [node_id(n) for n in graph.stats.entities_of.get(node) or ()]


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
