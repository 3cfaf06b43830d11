"""The τ gate (store.base.Gate): a fact of a schema not yet stable parked as pending, checked and
parked in one step (_HOLD_PENDING); a schema's status and support, read and fenced; its parked
facts drained, or parked again."""

from __future__ import annotations

import asyncio

from store.redis.base import RedisBase, _expected, _text

# The τ gate: park a fact as pending unless its schema is stable — checked and parked at once.
# In process: store/in_memory/gate.py's hold_pending.
_HOLD_PENDING = """
if redis.call('HGET', KEYS[7], 'retired') == '1' then return -1 end
if redis.call('HGET', KEYS[1], 'status') == 'stable' then return 0 end
redis.call('HINCRBY', KEYS[6], 'n', 1)
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[5], ARGV[1])
local status = redis.call('HGET', KEYS[3], 'status')
if status == 'new' or status == 'retracted' then redis.call('HSET', KEYS[3], 'status', 'pending') end
return 1
"""


class GateOps(RedisBase):
    """store.base.Gate on Redis."""

    # ---- τ gate ------------------------------------------------------------------------
    async def hold_pending(self, tenant: str, schema_id: str, fact_id: str, passage_id: str) -> bool | None:
        """Atomically: if the schema is not stable, park the fact as pending (True); if it is,
        do nothing (False); if a version retired the passage meanwhile, nothing either (None). Checking and parking in one step is what lets the promoting
        detector's drain see every fact parked before the promotion."""
        keys = self.keys(tenant)
        held = await self.shard(tenant).eval(
            _HOLD_PENDING,
            7,
            keys.schema(schema_id),
            keys.schema_pending(schema_id),
            keys.fact(fact_id),
            keys.fact_passages(fact_id),
            keys.passage_facts(passage_id),
            keys.passage_revision(passage_id),
            keys.passage(passage_id),
            fact_id,
            passage_id,
        )
        return None if held == -1 else bool(held)

    async def pending_facts(self, tenant: str, schema_id: str) -> list[str]:
        return sorted(_text(m) for m in await self.shard(tenant).smembers(self.keys(tenant).schema_pending(schema_id)))

    def stage_unpend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        if fact_ids:
            pipe.srem(self.keys(tenant).schema_pending(schema_id), *fact_ids)

    def stage_pend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        """Park facts under their schema again (its support fell below τ: Lifecycle.park)."""
        if fact_ids:
            pipe.sadd(self.keys(tenant).schema_pending(schema_id), *fact_ids)

    async def schema_status(self, tenant: str, schema_id: str) -> str | None:
        """The schema's status alone (None: no such schema): one HGET, not its passage set."""
        status = await self.shard(tenant).hget(self.keys(tenant).schema(schema_id), "status")
        return _text(status) if status else None

    async def schema_support(self, tenant: str, schema_id: str) -> tuple[str | None, list[str], str | None]:
        """(the schema's status, None: no such schema; its supporting passages; its frequency as stored)."""
        keys = self.keys(tenant)
        (status, frequency), passages = await asyncio.gather(
            self.shard(tenant).hmget(keys.schema(schema_id), ["status", "frequency"]),
            self.shard(tenant).smembers(keys.schema_passages(schema_id)),
        )
        return (
            (_text(status) if status else None),
            sorted(_text(m) for m in passages),
            (_text(frequency) if frequency else None),
        )

    def expect_schema(self, pipe, tenant: str, schema_id: str, status: str | None, frequency: str | None) -> None:
        """The decision read the schema so (schema_support): its commit fails if its status or
        frequency changed (an extractor counting another passage for it)."""
        key = self.keys(tenant).schema(schema_id)
        expected = _expected(pipe)
        expected.setdefault((key, "status"), status or None)
        expected.setdefault((key, "frequency"), frequency or None)

    def stage_schema_status(self, pipe, tenant: str, schema_id: str, status: str) -> None:
        pipe.hset(self.keys(tenant).schema(schema_id), "status", status)
