"""Time in memory (store.base.Expiry): a fact's `expires_at` and its place in the tenant's expiry
index, which the lapse scripts here keep together (_RAISE_LAPSE) — raised as passages support
the fact (_RECORD_LAPSE, staged by store.redis.layers' stage_new_fact), carried over a merge
(_MERGE_LAPSE), indexed again with the fact (_INDEX_LAPSE), cleared by the sweep (_EXPIRY_DONE)."""

from __future__ import annotations

from typing import cast

from store.redis.base import RedisBase, _eval

# A passage's support for a fact lapses at ARGV[2] ('' never); the fact holds until the latest
# lapse of its passages, for ever once one never lapses. Only a fact some TTL applies to is
# written: `expires_at` absent on an existing fact = for ever (a passage without TTL supported
# it; none is ever taken back); the latest lapse is a running maximum, so no per-passage record.
# Staged before the fact's creation, to tell its first passage from later ones. In process:
# store/in_memory/expiry.py's _record_lapse; the scripts below, its methods of the same role.
_RAISE_LAPSE = """
local function raise_lapse(fact, index, id, at, first)  -- at: false = never
  local current = redis.call('HGET', fact, 'expires_at')
  if current == '' then current = false end  -- written by older versions: never
  if not at then
    if current then
      redis.call('HDEL', fact, 'expires_at')
      redis.call('ZREM', index, id)
    end
  elseif first or (current and tonumber(at) > tonumber(current)) then
    redis.call('HSET', fact, 'expires_at', at)
    redis.call('ZADD', index, at, id)
  end
end
"""
# KEYS: the fact, the expiry index. ARGV: fact id, lapse.
_RECORD_LAPSE = (
    _RAISE_LAPSE
    + """
raise_lapse(KEYS[1], KEYS[2], ARGV[1], ARGV[2] ~= '' and ARGV[2], redis.call('EXISTS', KEYS[1]) == 0)
return 1
"""
)

# The sweep saw a lapse through: out of the expiry index, if the fact still lapses then.
# KEYS: the expiry index. ARGV: fact id, the lapse the sweep read.
_EXPIRY_DONE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 1
"""

# A fact merged into another: its passages' support goes with them, so the target's lapse is
# raised to the source's as a passage's would be (the source's absent = for ever); the source,
# out of memory, leaves the expiry index (a passage that says it later puts it back: the sweep
# drops it, the resolver merges that support on).
# KEYS: the source fact, the target fact, the expiry index. ARGV: source id, target id.
_MERGE_LAPSE = (
    _RAISE_LAPSE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local at = redis.call('HGET', KEYS[1], 'expires_at')
raise_lapse(KEYS[2], KEYS[3], ARGV[2], at ~= '' and at, false)
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
)

# A fact (back) in memory is in the expiry index at its lapse, if it has one: a sweep that passed
# that lapse while the fact was out of memory dropped its entry.
# KEYS: the fact, the expiry index. ARGV: fact id.
_INDEX_LAPSE = """
local at = redis.call('HGET', KEYS[1], 'expires_at')
if at and at ~= '' then redis.call('ZADD', KEYS[2], at, ARGV[1]) end
return 1
"""


class ExpiryOps(RedisBase):
    """store.base.Expiry on Redis."""

    # ---- time in memory: the expiry index (stage_new_fact fills it, workers.stages.expiry sweeps it) --
    async def lapsed_facts(self, tenant: str, now: float, limit: int = 500) -> list[tuple[str, float]]:
        """(fact id, expires_at) of the tenant's facts whose TTL lapsed by `now`, earliest first."""
        rows = cast(  # WITHSCORES: (member, score) pairs
            list[tuple[bytes, float]],
            await self.shard(tenant).zrangebyscore(
                self.keys(tenant).expiry, "-inf", now, start=0, num=limit, withscores=True
            ),
        )
        return [(fid.decode(), float(at)) for fid, at in rows]

    def stage_expiry_done(self, pipe, tenant: str, fact_id: str, expires_at: float) -> None:
        """The sweep saw the fact's lapse at `expires_at` through: out of the expiry index, unless
        it lapses at another time now (a passage that supports it later puts it back)."""
        _eval(pipe, _EXPIRY_DONE, [self.keys(tenant).expiry], [fact_id, repr(float(expires_at))])

    def stage_merged_lapse(self, pipe, tenant: str, source_id: str, target_id: str) -> None:
        """`source_id` is merged into `target_id`: the target lapses no earlier than the source
        (never, if the source never does); the source leaves the expiry index (_MERGE_LAPSE)."""
        keys = self.keys(tenant)
        _eval(pipe, _MERGE_LAPSE, [keys.fact(source_id), keys.fact(target_id), keys.expiry], [source_id, target_id])

    def stage_lapse_indexed(self, pipe, tenant: str, fact_id: str) -> None:
        """The fact is in the expiry index at its `expires_at`, if it has one (_INDEX_LAPSE)."""
        keys = self.keys(tenant)
        _eval(pipe, _INDEX_LAPSE, [keys.fact(fact_id), keys.expiry], [fact_id])
