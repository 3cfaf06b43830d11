"""The first stage of the query engine (workers.query.engine): the passages nearest the query
vector (dense) and those best matching its words (lexical: the store's BM25, store.lexical),
fused by reciprocal rank — mode hybrid's answer, and what ppr and reconstruct start from, with
a conversation's episodes and the question's time cue (`for_graph`)."""

from __future__ import annotations

import asyncio
import dataclasses

from store.base import MemoryStore
from store.records import Hit, PassageRecordHit, is_current
from workers.algorithms.expiry import said_at, said_by
from workers.algorithms.retrieval import (
    EPISODE_RADIUS,
    FirstStage,
    RetrievalParams,
    cosines,
    episode_smoothing,
    first_stage_weights,
    fuse,
)
from workers.algorithms.time_cue import matches, time_boost, time_cue
from workers.algorithms.turns import session_turn
from workers.query.request import QueryRequest


class FirstStageSearch:
    """A tenant's first stage over `memory`: both legs at once, their fusion, and the rows and
    cosines the graph modes read from it."""

    def __init__(self, memory: MemoryStore):
        self.memory = memory

    async def search(
        self, request: QueryRequest, vector, with_cosines: bool = True, with_rows: bool = False
    ) -> FirstStage:
        """Both legs' candidates (first_stage_k each, at least top_k) and their fusion; with
        `with_cosines`, every fused candidate's cosine to the query (a lexical-only candidate's
        vector is read), which graph modes seed and score with; with `with_rows`, every fused
        candidate's row too (graph modes read them for their episodes and their answer). With
        both, each leg's hits come with their rows (and the lexical leg's with their vectors)
        where the store reads them in the search's command (_dense, _lexical); what they lack
        is read after the legs, vectors and rows in one round trip, before the fusion: over
        conversation turns the legs weigh apart (turn_dense_weight, _leg_weights)."""
        k = max(request.params.first_stage_k, request.top_k)
        tenant, reading = request.tenant, with_rows and with_cosines and vector is not None
        dense, lexical = await asyncio.gather(
            self._dense(tenant, vector, k, reading), self._lexical(tenant, request.query, k, reading)
        )
        # the hits read with their search: their rows (and a lexical hit's vector) need no read
        read = {h.id: h for h in lexical + dense if isinstance(h, PassageRecordHit)}
        rows = {pid: hit.row for pid, hit in read.items() if is_current(hit.row)}
        if request.as_of is not None:  # passages said after as_of are not yet in memory then
            rows = await self.read_rows(tenant, [h.id for h in dense + lexical if h.id not in read], rows)
            dense, lexical = (
                [h for h in dense if _said(rows, h.id, request.as_of)],
                [h for h in lexical if _said(rows, h.id, request.as_of)],
            )
        legs = [[h.id for h in dense], [h.id for h in lexical]]
        candidates = list(dict.fromkeys(legs[0] + legs[1]))  # the fused ones, at any weights
        similarity = {h.id: h.score for h in dense}
        vectors = {pid: hit.vector for pid, hit in read.items() if hit.vector is not None}
        _, rows = await asyncio.gather(
            self.add_cosines(tenant, candidates, vector, similarity, vectors) if with_cosines else ready(None),
            self.read_rows(tenant, [pid for pid in candidates if pid not in read], rows) if with_rows else ready(rows),
        )
        fused = fuse(legs, request.params.rrf_k)
        if request.params.turn_dense_weight != 1.0 and fused:
            # over conversation turns the legs weigh apart: the rows of the answer's top say
            # which it holds (hybrid reads them here, as its answer would; over documents
            # nothing changes and nothing more is read)
            top = [pid for pid, _ in fused[: request.top_k]]
            if not with_rows:
                rows = await self.read_rows(tenant, top, rows)
            weights = _leg_weights(request.params, top, rows)
            if weights != [1.0, 1.0]:
                fused = fuse(legs, request.params.rrf_k, weights)
        return FirstStage(dense, lexical, fused, similarity, rows=rows)

    async def _dense(self, tenant: str, vector, k: int, reading: bool) -> list[Hit]:
        """The dense leg; `reading` (a graph mode): each hit with its row where the store reads
        it with the search (store.base.Layers.passages_near_read)."""
        if vector is None:
            return []
        found = await self.memory.passages_near_read(tenant, vector, k) if reading else None
        return await self.memory.knn(tenant, "passages", vector, k, ["doc_id"]) if found is None else list(found)

    async def _lexical(self, tenant: str, query: str, k: int, reading: bool) -> list[Hit]:
        """The lexical leg; `reading`: each hit with its row and vector where the store reads
        them with the search (Layers.lexical_read: a large tenant's own index). They were a
        round trip after both legs: ~1-2 ms before a reconstruct walk's first step."""
        found = await self.memory.lexical_read(tenant, query, k) if reading else None
        return await self.memory.lexical(tenant, query, k) if found is None else list(found)

    async def add_cosines(
        self, tenant: str, passage_ids: list[str], vector, similarity: dict[str, float], known: dict | None = None
    ) -> None:
        """Each passage's cosine to the query, into `similarity`, for those not in it (their
        vectors from `known`, else read in one round trip)."""
        missing = [pid for pid in passage_ids if pid not in similarity]
        if vector is None or not missing:
            return
        known = known or {}
        unread = [pid for pid in missing if pid not in known]
        read = dict(zip(unread, await self.memory.passage_vectors(tenant, unread))) if unread else {}
        found = [(pid, vec) for pid in missing if (vec := known.get(pid, read.get(pid))) is not None]
        if found:
            similarity.update(zip([pid for pid, _ in found], cosines([vec for _, vec in found], vector)))

    async def read_rows(self, tenant: str, passage_ids: list[str], known: dict[str, dict]) -> dict[str, dict]:
        """`known` and the stored rows of the passages not in it (one round trip for those),
        leaving out those a later version retired (store.records.is_current)."""
        missing = [pid for pid in dict.fromkeys(passage_ids) if pid not in known]
        if not missing:
            return known
        return {
            **known,
            **{pid: row for pid, row in zip(missing, await self.memory.passages(tenant, missing)) if is_current(row)},
        }

    async def for_graph(self, request: QueryRequest, vector) -> FirstStage:
        """What the graph modes start from: the first stage, with episodes (_with_episodes) and
        the question's time cue (_with_time_cue)."""
        first = await self._with_episodes(request, vector, await self.search(request, vector, with_rows=True))
        return await self._with_time_cue(request, first)

    async def _with_time_cue(self, request: QueryRequest, first: FirstStage) -> FirstStage:
        """Graph modes: the turns that meet the question's time cue (workers.algorithms.time_cue)
        raised by time_weight; nothing changes for a question without one."""
        cue = time_cue(request.query)
        if not cue or request.params.time_weight <= 0 or not first.fused:
            return first
        rows = await self.read_rows(request.tenant, [pid for pid, _ in first.fused], first.rows)
        matched = {
            pid
            for pid, _ in first.fused
            if pid in rows and matches(cue, rows[pid].get("text") or "", said_at(rows[pid]))
        }
        return dataclasses.replace(first, fused=time_boost(first.fused, matched, request.params.time_weight), rows=rows)

    async def _with_episodes(self, request: QueryRequest, vector, first: FirstStage) -> FirstStage:
        """Graph modes: the first stage re-ranked by temporal contiguity (episode_smoothing): a
        conversation turn's score is raised by its session neighbours' (turn ± 1), and the
        neighbours of the candidates join them. Passages that are not turns are left as they are."""
        if not first.fused:
            return first
        ids = [pid for pid, _ in first.fused]
        rows = await self.read_rows(request.tenant, ids, first.rows)
        moments = {
            pid: moment
            for pid in ids
            if pid in rows and (moment := session_turn(rows[pid].get("metadata") or {})) is not None
        }
        weight, turn_share = request.params.episode_weight, len(moments) / len(ids)
        if weight <= 0 or not moments:
            return dataclasses.replace(first, turn_share=turn_share, rows=rows)
        found = await asyncio.gather(
            *(
                self.memory.session_neighbours(request.tenant, session, turn, EPISODE_RADIUS)
                for session, turn in moments.values()
            )
        )
        neighbours = {pid: [other for _, other in near] for pid, near in zip(moments, found)}
        smoothed = episode_smoothing(dict(first.fused), neighbours, weight)
        candidates = set(ids)
        new = [pid for pid, _ in smoothed if pid not in candidates]  # the neighbours that joined
        if request.as_of is not None and new:
            rows = await self.read_rows(request.tenant, new, rows)
            smoothed = [(pid, score) for pid, score in smoothed if pid not in new or _said(rows, pid, request.as_of)]
            new = [pid for pid in new if _said(rows, pid, request.as_of)]
        similarity = dict(first.cosines)
        await self.add_cosines(request.tenant, new, vector, similarity)
        return FirstStage(first.dense, first.lexical, smoothed, similarity, turn_share, rows)


def _leg_weights(params: RetrievalParams, top: list[str], rows: dict[str, dict]) -> list[float]:
    """The legs' fusion weights (first_stage_weights) by the share of conversation turns among
    the passages of `top` still in memory (their rows)."""
    held = [pid for pid in top if pid in rows]
    if not held:
        return [1.0, 1.0]
    turns = sum(1 for pid in held if session_turn(rows[pid].get("metadata") or {}) is not None)
    return first_stage_weights(params, turns / len(held))


async def ready(value):
    """`value`, awaitable: a search asyncio.gather may skip."""
    return value


def _said(rows: dict[str, dict], passage_id: str, as_of: float) -> bool:
    """A passage read (`rows`) was said by `as_of`; one not found stays (nothing says otherwise)."""
    row = rows.get(passage_id)
    return row is None or said_by(row, as_of)
