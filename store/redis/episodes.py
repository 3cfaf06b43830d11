"""What reconstruct walks (store.base.Episodes): an entity's passages, passage vectors, and a
session's turns in order."""

from __future__ import annotations

from typing import cast

import numpy as np

from store.records import (
    OWN_VECTOR_FIELD,
    TURN_EMBEDDING_FIELDS,
    TurnEmbedding,
    TurnsNear,
    lexical_fields,
    turn_embedding_fields,
    vector_bytes,
    vector_from_bytes,
)
from store.redis.base import RedisBase, _expected, _shared_deletes, _text
from store.redis.lexical_index import stage_lexical_mirror

# Each entity's first ARGV[1] passages by id (SORT_RO ... ALPHA LIMIT) and each one's vector (the
# hash at ARGV[2] .. id): reconstruct's entity cues in one command, where a SORT a cue and then
# the vectors' read cost two dependent round trips and a command a cue. KEYS: the entities'
# passage sets (one tenant's: one slot, the passages' hashes in it too). Read-only.
_ENTITY_PASSAGE_VECTORS = """#!lua flags=no-writes
local out = {}
for i, key in ipairs(KEYS) do
  local ids = redis.call('SORT_RO', key, 'LIMIT', 0, tonumber(ARGV[1]), 'ALPHA')
  local vectors = {}
  for j, id in ipairs(ids) do vectors[j] = redis.call('HGET', ARGV[2] .. id, 'vec') end
  out[i] = {ids, vectors}
end
return out
"""


class EpisodesOps(RedisBase):
    """store.base.Episodes on Redis."""

    # ---- reconstruct: an entity's passages, passage vectors ------------------------------
    async def entity_passages(self, tenant: str, entity_id: str, limit: int | None = None) -> list[str]:
        """The ids of the passages the entity was extracted from, sorted; the first `limit` of
        them (SORT ... ALPHA LIMIT: a partial sort in Redis, only `limit` ids come back)."""
        key = self.keys(tenant).entity_passages(entity_id)
        if limit is None:
            return sorted(_text(p) for p in await self.shard(tenant).smembers(key))
        # without GET or groups: the members alone
        return [
            p.decode() for p in cast(list[bytes], await self.shard(tenant).sort(key, start=0, num=limit, alpha=True))
        ]

    async def entity_passage_vectors(
        self, tenant: str, entity_ids: list[str], limit: int
    ) -> list[list[tuple[str, np.ndarray]]]:
        """For each entity, its first `limit` passages by id (entity_passages) with their vectors
        (a passage with no vector left out), all in one command."""
        if not entity_ids:
            return []
        keys = self.keys(tenant)
        replies = await self._run_script(
            tenant,
            _ENTITY_PASSAGE_VECTORS,
            [keys.entity_passages(eid) for eid in entity_ids],
            [limit, keys.passage("")],
        )
        return [
            [(pid.decode(), vector_from_bytes(raw)) for pid, raw in zip(ids, vectors) if raw]
            for ids, vectors in replies
        ]

    async def passage_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]:
        """Each passage's stored vector (of its indexed text), in one command; None for a missing id."""
        replies = await self._read_each(tenant, [self.keys(tenant).passage(pid) for pid in passage_ids], "HGET", "vec")
        return [None if raw is None else vector_from_bytes(raw) for raw in replies]

    # ---- episodes: a session's turns in order (reconstruct's temporal contiguity) -----------
    def stage_session_turn(self, pipe, tenant: str, session_id: str, turn: int, passage_id: str) -> None:
        """Index a turn's passage under its session, scored by its turn number: ZADD, so a
        redelivered chunk changes nothing (a turn published again with a corrected speaker is a
        new passage beside the first: both are that turn). The turn's change count moves (the
        fence of expect_session_turns)."""
        keys = self.keys(tenant)
        pipe.zadd(keys.session_turns(session_id), {passage_id: turn})
        pipe.hincrby(keys.session_turn_changes(session_id), str(turn), 1)

    async def session_turns_near(self, tenant: str, session_id: str, turn: int) -> TurnsNear:
        """The session's passages at turn − 1, turn and turn + 1, and each turn's change count:
        one round trip, both read at one moment (MULTI: a passage indexed between two reads would
        be missed by the first and counted by the second, and the fence would hold)."""
        keys = self.keys(tenant)
        pipe = self.shard(tenant).pipeline(transaction=True)
        pipe.zrangebyscore(keys.session_turns(session_id), turn - 1, turn + 1, withscores=True)
        pipe.hmget(keys.session_turn_changes(session_id), [str(t) for t in (turn - 1, turn, turn + 1)])
        rows, counts = await pipe.execute()
        return TurnsNear(
            sorted((int(score), pid.decode()) for pid, score in rows),
            {t: int(count or 0) for t, count in zip((turn - 1, turn, turn + 1), counts)},
        )

    def expect_session_turns(self, pipe, tenant: str, session_id: str, changes: dict[int, int]) -> None:
        """The decision read these turns of the session so (session_turns_near): its commit fails
        if a passage was indexed at one of them meanwhile."""
        key, expected = self.keys(tenant).session_turn_changes(session_id), _expected(pipe)
        for turn, count in changes.items():
            expected.setdefault((key, str(turn)), str(count) if count else None)

    async def turn_embeddings(self, tenant: str, passage_ids: list[str]) -> list[TurnEmbedding]:
        """What each passage's vector was embedded with (its hash's turn fields), in one command."""
        replies = await self._read_each(
            tenant, [self.keys(tenant).passage(pid) for pid in passage_ids], "HMGET", *TURN_EMBEDDING_FIELDS
        )
        return [TurnEmbedding(*(_text(v) if v else "" for v in reply)) for reply in replies]

    def stage_turn_embedding(
        self, pipe, tenant: str, passage_id: str, embedding: TurnEmbedding, vector, own_vector, terms: str
    ) -> None:
        """A turn's passage vector embedded again (after the turn before it, indexed since), what
        it followed, its own text's vector, and its lexical terms followed by that turn's; its
        indexes take them in place (a large tenant's own lexical index too). The decision
        expects that passage's state first (expect_passage): an erasure meanwhile leaves no
        fields behind."""
        fields = {
            **turn_embedding_fields(embedding),
            "vec": vector_bytes(vector),
            OWN_VECTOR_FIELD: vector_bytes(own_vector),
            **lexical_fields(terms),
        }
        pipe.hset(self.keys(tenant).passage(passage_id), mapping=fields)
        stage_lexical_mirror(pipe, self.keys(tenant), passage_id)

    async def own_vectors(self, tenant: str, passage_ids: list[str]) -> list[np.ndarray | None]:
        """Each turn's vector of its own text alone, where one is kept (OWN_VECTOR_FIELD)."""
        replies = await self._read_each(
            tenant, [self.keys(tenant).passage(pid) for pid in passage_ids], "HGET", OWN_VECTOR_FIELD
        )
        return [None if raw is None else vector_from_bytes(raw) for raw in replies]

    def stage_turn_alone(self, pipe, tenant: str, passage_id: str, own_vector, terms: str, forget: list[str]) -> None:
        """The turn's own vector and lexical terms back in place of those made after the turn
        before it (that turn left memory), and the cached vectors `forget` (what it had
        embedded) deleted."""
        fields = {
            **turn_embedding_fields(TurnEmbedding()),
            "vec": vector_bytes(own_vector),
            **lexical_fields(terms),
        }
        pipe.hset(self.keys(tenant).passage(passage_id), mapping=fields)
        stage_lexical_mirror(pipe, self.keys(tenant), passage_id)
        _shared_deletes(pipe).extend(forget)

    async def session_neighbours(self, tenant: str, session_id: str, turn: int, radius: int) -> list[tuple[int, str]]:
        """(turn, passage id) of the session's turns at most `radius` from `turn`, the turn
        itself left out; by turn, then passage id."""
        rows = cast(  # WITHSCORES: (member, score) pairs
            list[tuple[bytes, float]],
            await self.shard(tenant).zrangebyscore(
                self.keys(tenant).session_turns(session_id), turn - radius, turn + radius, withscores=True
            ),
        )
        return sorted((int(score), pid.decode()) for pid, score in rows if int(score) != turn)
