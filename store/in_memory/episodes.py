"""What reconstruct walks, in process (store.base.Episodes), as store/redis/episodes.py: an
entity's passages, passage vectors (_ENTITY_PASSAGE_VECTORS there) and a session's turns in
order."""

from __future__ import annotations

import numpy as np

from store.in_memory.base import InMemoryBase


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
            self._tenant(tenant).session_turns.setdefault(session_id, {})[passage_id] = turn  # Memory's ZADD

        self._stage(pipe, write)

    async def session_neighbours(self, tenant: str, session_id: str, turn: int, radius: int) -> list[tuple[int, str]]:
        turns = self._tenant(tenant).session_turns.get(session_id, {})
        return sorted((t, pid) for pid, t in turns.items() if t != turn and abs(t - turn) <= radius)
