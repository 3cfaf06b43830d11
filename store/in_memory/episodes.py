"""What reconstruct walks, in process (store.base.Episodes), as store/redis/episodes.py: an
entity's passages, passage vectors (_ENTITY_PASSAGE_VECTORS there) and a session's turns in
order."""

from __future__ import annotations

import numpy as np

from store.in_memory.base import InMemoryBase, _text
from store.records import (
    OWN_VECTOR_FIELD,
    TURN_EMBEDDING_FIELDS,
    TurnEmbedding,
    TurnsNear,
    lexical_fields,
    turn_embedding_fields,
    vector_bytes,
)


class EpisodesOps(InMemoryBase):
    """store.base.Episodes in process (store.redis.episodes.EpisodesOps on Redis)."""

    async def entity_passages(self, tenant: str, entity_id: str, limit: int | None = None) -> list[str]:
        return sorted(self._tenant(tenant).sets.get(("entity_passages", entity_id), ()))[
            :limit
        ]  # reading adds no empty set

    async def passage_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]:
        return [self._vector(tenant, "passages", pid) for pid in passage_ids]

    async def entity_passage_vectors(
        self, tenant: str, entity_ids: list[str], limit: int
    ) -> list[list[tuple[str, np.ndarray]]]:
        out = []
        for eid in entity_ids:
            ids = await self.entity_passages(tenant, eid, limit)
            out.append(
                [(pid, vec) for pid, vec in zip(ids, await self.passage_vectors(tenant, ids)) if vec is not None]
            )
        return out

    def stage_session_turn(self, pipe, tenant: str, session_id: str, turn: int, passage_id: str) -> None:
        def write() -> None:
            t = self._tenant(tenant)
            t.session_turns.setdefault(session_id, {})[passage_id] = turn  # Memory's ZADD
            changes = t.session_turn_changes.setdefault(session_id, {})
            changes[turn] = changes.get(turn, 0) + 1  # and HINCRBY

        self._stage(pipe, write)

    async def session_turns_near(self, tenant: str, session_id: str, turn: int) -> TurnsNear:
        t = self._tenant(tenant)
        turns, changes = t.session_turns.get(session_id, {}), t.session_turn_changes.get(session_id, {})
        return TurnsNear(
            sorted((at, pid) for pid, at in turns.items() if abs(at - turn) <= 1),
            {at: changes.get(at, 0) for at in (turn - 1, turn, turn + 1)},
        )

    def expect_session_turns(self, pipe, tenant: str, session_id: str, changes: dict[int, int]) -> None:
        for turn, count in changes.items():
            pipe.expected.setdefault(
                (tenant, "session_turn_changes", f"{session_id}\x1f{turn}", "n"), str(count) if count else None
            )

    async def turn_embeddings(self, tenant: str, passage_ids: list[str]) -> list[TurnEmbedding]:
        rows = self._tenant(tenant).records["passages"]
        return [
            TurnEmbedding(*(_text(rows.get(pid, {}).get(name)) or "" for name in TURN_EMBEDDING_FIELDS))
            for pid in passage_ids
        ]

    def stage_turn_embedding(
        self, pipe, tenant: str, passage_id: str, embedding: TurnEmbedding, vector, own_vector, terms: str
    ) -> None:
        fields = {
            **turn_embedding_fields(embedding),
            "vec": vector_bytes(vector),
            OWN_VECTOR_FIELD: vector_bytes(own_vector),
            **lexical_fields(terms),
        }

        def write() -> None:
            self._hset(tenant, "passages", passage_id, fields)
            self._tenant(tenant).lexical = None  # the BM25 index is rebuilt with its terms

        self._stage(pipe, write)

    async def own_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]:
        return [self._vector(tenant, "passages", pid, OWN_VECTOR_FIELD) for pid in passage_ids]

    def stage_turn_alone(self, pipe, tenant: str, passage_id: str, own_vector, terms: str, forget: list[str]) -> None:
        fields = {**turn_embedding_fields(TurnEmbedding()), "vec": vector_bytes(own_vector), **lexical_fields(terms)}

        def write() -> None:
            self._hset(tenant, "passages", passage_id, fields)
            self._tenant(tenant).lexical = None
            for key in forget:
                self._cache.pop(key, None)

        self._stage(pipe, write)

    async def session_neighbours(self, tenant: str, session_id: str, turn: int, radius: int) -> list[tuple[int, str]]:
        turns = self._tenant(tenant).session_turns.get(session_id, {})
        return sorted((t, pid) for pid, t in turns.items() if t != turn and abs(t - turn) <= radius)
