"""Conflict groups and relation cardinality (store.base.ConflictGroups): a fact joins its (head,
relation) group and the relation's verdict is decided in the same step (_JOIN_GROUP)."""

from __future__ import annotations

from store.base import broader_by_containment
from store.records import GroupJoin
from store.redis.base import DONE_MARK_TTL_S, RedisBase, _text

# A fact joins its (head, relation) group; relation cardinality is counted over heads, and the
# relation's verdict (workers.algorithms.policy.is_multi_valued: at least ARGV[4] heads, and a share ARGV[5]
# of the heads seen, with two or more tails) is decided and written in the same step, so two
# detectors on two partitions cannot both see the old verdict. The message that flipped it is
# remembered (KEYS[6]), so its redelivery spawns the same re-adjudications.
# KEYS: group, relation heads, relation multi-heads, facts with tail, cardinality hash, flip mark.
# ARGV: fact id, head id, relation, min multi heads, multi head share, ttl.
# In process: store/in_memory/groups.py's join_group.
_JOIN_GROUP = """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
local size = redis.call('SCARD', KEYS[1])
if size >= 2 then redis.call('SADD', KEYS[3], ARGV[2]) end
local heads, multi = redis.call('SCARD', KEYS[2]), redis.call('SCARD', KEYS[3])
local verdict = 'single'
if multi >= tonumber(ARGV[4]) and multi >= tonumber(ARGV[5]) * heads then verdict = 'multi' end
local flipped = 0
if redis.call('HGET', KEYS[5], ARGV[3]) ~= verdict then
  redis.call('HSET', KEYS[5], ARGV[3], verdict)
  redis.call('SET', KEYS[6], verdict, 'EX', ARGV[6])
  flipped = 1
elseif redis.call('GET', KEYS[6]) == verdict then
  flipped = 1
end
return {heads, multi, size, verdict, flipped}
"""


class GroupsOps(RedisBase):
    """store.base.ConflictGroups on Redis."""

    # ---- conflict groups and relation cardinality -----------------------------------------------
    async def join_group(
        self,
        tenant: str,
        head_id: str,
        relation: str,
        tail_id: str,
        fact_id: str,
        mark: str,
        multi_rule: tuple[int, float],
    ) -> GroupJoin:
        """Add a fact to its (head, relation) group and decide the relation's cardinality in
        the same atomic step; multi_rule = (min heads, share of heads) with several tails that
        make a relation multi-valued (workers.algorithms.policy). Idempotent; a redelivery of the message
        `mark` that flipped the verdict is told it flipped it."""
        keys = self.keys(tenant)
        heads, multi, size, verdict, flipped = await self.shard(tenant).eval(
            _JOIN_GROUP,
            6,
            keys.group(head_id, relation),
            keys.relation_heads(relation),
            keys.relation_multi_heads(relation),
            keys.facts_with_tail(tail_id),
            keys.relation_cardinality,
            keys.cardinality_flip(mark),
            fact_id,
            head_id,
            relation,
            multi_rule[0],
            multi_rule[1],
            DONE_MARK_TTL_S,
        )
        return GroupJoin(int(heads), int(multi), int(size), verdict.decode(), bool(flipped))

    async def facts_with_tail(self, tenant: str, tail_id: str) -> list[str]:
        return sorted(_text(m) for m in await self.shard(tenant).smembers(self.keys(tenant).facts_with_tail(tail_id)))

    async def group(self, tenant: str, head_id: str, relation: str) -> list[str]:
        return sorted(_text(m) for m in await self.shard(tenant).smembers(self.keys(tenant).group(head_id, relation)))

    async def group_size(self, tenant: str, head_id: str, relation: str) -> int:
        return await self.shard(tenant).scard(self.keys(tenant).group(head_id, relation))

    async def relation_multi_heads(self, tenant: str, relation: str) -> list[str]:
        return sorted(
            _text(m) for m in await self.shard(tenant).smembers(self.keys(tenant).relation_multi_heads(relation))
        )

    async def relation_counts(self, tenant: str, relation: str) -> tuple[int, int]:
        """(heads seen with the relation, heads with two or more tails)."""
        keys = self.keys(tenant)
        return await self.shard(tenant).scard(keys.relation_heads(relation)), await self.shard(tenant).scard(
            keys.relation_multi_heads(relation)
        )

    broader = broader_by_containment  # store.base: the walk over active containment facts, through group() and fact()
