"""Conflict groups and relation cardinality in process (store.base.ConflictGroups), as
store/redis/groups.py: a fact joining its group (join_group: _JOIN_GROUP there), the groups and
counts read."""

from __future__ import annotations

from store.base import broader_by_containment
from store.in_memory.base import InMemoryBase
from store.records import GroupJoin


class GroupsOps(InMemoryBase):
    """store.base.ConflictGroups in process (store.redis.groups.GroupsOps on Redis)."""

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
        """As store/redis/groups.py's _JOIN_GROUP (the first join of a relation sets its verdict: a flip)."""
        t, group = self._tenant(tenant), self._set(tenant, "group", f"{head_id}|{relation}")
        group.add(fact_id)
        self._set(tenant, "facts_with_tail", tail_id).add(fact_id)
        self._set(tenant, "relation_heads", relation).add(head_id)
        if len(group) >= 2:
            self._set(tenant, "relation_multi_heads", relation).add(head_id)
        heads, multi = (
            len(self._set(tenant, "relation_heads", relation)),
            len(self._set(tenant, "relation_multi_heads", relation)),
        )
        verdict = "multi" if multi >= multi_rule[0] and multi >= multi_rule[1] * heads else "single"
        flipped = False
        if t.cardinality.get(relation) != verdict:
            t.cardinality[relation] = t.flips[mark] = verdict
            flipped = True
        elif t.flips.get(mark) == verdict:
            flipped = True
        return GroupJoin(heads, multi, len(group), verdict, flipped)

    async def facts_with_tail(self, tenant: str, tail_id: str) -> list[str]:
        return sorted(self._set(tenant, "facts_with_tail", tail_id))

    async def group(self, tenant: str, head_id: str, relation: str) -> list[str]:
        return sorted(self._set(tenant, "group", f"{head_id}|{relation}"))

    async def group_size(self, tenant: str, head_id: str, relation: str) -> int:
        return len(self._set(tenant, "group", f"{head_id}|{relation}"))

    async def relation_multi_heads(self, tenant: str, relation: str) -> list[str]:
        return sorted(self._set(tenant, "relation_multi_heads", relation))

    async def relation_counts(self, tenant: str, relation: str) -> tuple[int, int]:
        return len(self._set(tenant, "relation_heads", relation)), len(
            self._set(tenant, "relation_multi_heads", relation)
        )

    broader = broader_by_containment  # store.base: Memory's walk over active containment facts, through this store's group() and fact()
