"""Erasure (store.base.Erasing): what a document's passages extracted, the sources and mentions
an erasure decides on (fenced), and the removal itself: a passage down to what fences a chunk
of it in flight (_ERASE_PASSAGE), an entity's graph node off every neighbour's adjacency
(_ERASE_NODE: the graph's keys, but only an erasure removes a node)."""

from __future__ import annotations

from redisvl.query.filter import Tag

from store.nodes import entity_node, passage_node
from store.records import ENTITY_MENTIONS, FACT_EXTRACTIONS, TENANT_FIELD, Erasure
from store.redis.base import RedisBase, _eval, _expected, _shared_deletes, _text
from store.redis.lexical_index import stage_lexical_mirror

# A passage erased: nothing of it but what fences a chunk of it still in flight (retired, and
# its incarnation), still its tenant's (in process: store/in_memory/erasing.py's stage_erase).
# KEYS[1]: the passage hash; ARGV: TENANT_FIELD, the tenant.
_ERASE_PASSAGE = """
local incarnation = redis.call('HGET', KEYS[1], 'incarnation')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'retired', '1', 'purged', '1', ARGV[1], ARGV[2])
if incarnation then redis.call('HSET', KEYS[1], 'incarnation', incarnation) end
return 1
"""

# A graph node erased: each of its edges off the other end's adjacency hash, then its own hash.
# KEYS[1]: its adjacency hash; ARGV: the node, the adjacency key prefix (the other ends' keys
# are built here, under the same tenant hash tag, as they are only known at commit).
_ERASE_NODE = """
local fields = redis.call('HKEYS', KEYS[1])
for _, name in ipairs(fields) do
  local sep = string.find(name, '|', 1, true)
  if sep then redis.call('HDEL', ARGV[2] .. string.sub(name, sep + 1), string.sub(name, 1, sep) .. ARGV[1]) end
end
redis.call('DEL', KEYS[1])
return #fields
"""


class ErasingOps(RedisBase):
    """store.base.Erasing on Redis."""

    # ---- erasure: a document's passages and what only they said, gone (workers.stages.erasure) --
    async def document_passages(self, tenant: str, doc_id: str) -> list[str]:
        return sorted(_text(m) for m in await self.shard(tenant).smembers(self.keys(tenant).document_passages(doc_id)))

    async def passage_extracted(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        keys = self.keys(tenant)
        return await self._set_members(tenant, [keys.passage_extracted(pid) for pid in passage_ids])

    async def fact_sources(self, tenant: str, fact_ids: list[str]) -> list[tuple[set[str], str | None]]:
        """Each fact's source passages and its extraction count (what expect_field fences on)."""
        keys = self.keys(tenant)
        return await self._set_and_counter(
            tenant, [(keys.fact_sources(fid), keys.fact(fid)) for fid in fact_ids], FACT_EXTRACTIONS
        )

    async def entity_mentions(self, tenant: str, entity_ids: list[str]) -> list[tuple[set[str], str | None]]:
        """Each entity's current passages and its mention count (what expect_entity fences on)."""
        keys = self.keys(tenant)
        return await self._set_and_counter(
            tenant, [(keys.entity_passages(eid), keys.entity(eid)) for eid in entity_ids], ENTITY_MENTIONS
        )

    async def _set_and_counter(
        self, tenant: str, keys: list[tuple[str, str]], counter: str
    ) -> list[tuple[set[str], str | None]]:
        """For each (set key, hash key): the set's members and the hash's `counter`, in one round trip."""
        pipe = self.shard(tenant).pipeline(transaction=False)
        for set_key, hash_key in keys:
            pipe.smembers(set_key)
            pipe.hget(hash_key, counter)
        replies = await pipe.execute() if keys else []
        return [
            ({m.decode() for m in members}, None if count is None else count.decode())
            for members, count in zip(replies[0::2], replies[1::2])
        ]

    async def facts_naming(self, tenant: str, entity_id: str) -> list[str]:
        """Ids of every fact with the entity as head or tail (any status), from the facts index."""
        searchable = await self.searchable(tenant, "facts")
        if searchable is None:
            return []
        result = await searchable.search(
            str((Tag("head_id") == entity_id) | (Tag("tail_id") == entity_id)),
            lambda q: q.no_content().paging(0, 10_000),
        )
        return sorted(searchable.record_id(doc.id) for doc in result.docs)

    def expect_entity(self, pipe, tenant: str, entity_id: str, mentions: str | None) -> None:
        """The decision read the entity after this many mentions: its commit fails if a passage
        mentioned it meanwhile."""
        _expected(pipe).setdefault((self.keys(tenant).entity(entity_id), ENTITY_MENTIONS), mentions)

    def stage_erase(self, pipe, tenant: str, erasure: Erasure) -> None:
        keys = self.keys(tenant)
        for pid in erasure.passage_ids:
            _eval(pipe, _ERASE_PASSAGE, [keys.passage(pid)], [TENANT_FIELD, tenant])
            stage_lexical_mirror(pipe, keys, pid)
            pipe.delete(keys.passage_extracted(pid), keys.passage_documents(pid))
            pipe.srem(keys.document_passages(erasure.doc_id), pid)
            pipe.srem(keys.graph_nodes, passage_node(pid))
        for fact in erasure.facts:
            pipe.delete(
                keys.fact(fact.id),
                keys.fact_passages(fact.id),
                keys.fact_sources(fact.id),
                keys.fact_said(fact.id),
                keys.fact_set_aside(fact.id),
            )
            pipe.srem(keys.group(fact.head_id, fact.relation), fact.id)
            pipe.srem(keys.facts_with_tail(fact.tail_id), fact.id)
            pipe.srem(keys.schema_pending(fact.schema_id), fact.id)
            pipe.zrem(keys.expiry, fact.id)
        for eid in erasure.entity_ids:
            node = entity_node(eid)
            pipe.delete(keys.entity(eid), keys.entity_passages(eid))
            _eval(pipe, _ERASE_NODE, [keys.adjacency(node)], [node, keys.adjacency("")])
            pipe.srem(keys.graph_nodes, node)
            pipe.srem(keys.similarity_bridged, eid)
        for relation, head in erasure.relation_heads:
            pipe.srem(keys.relation_heads(relation), head)
            pipe.srem(keys.relation_multi_heads(relation), head)
        if erasure.aliases:
            pipe.hdel(keys.aliases, *erasure.aliases)
        if erasure.entity_ids:
            # the change stream names the erased nodes: gone, so every reader loads the graph again
            # (graph_log.changes_since: its cursor is no longer in the stream)
            pipe.delete(keys.graph_changes)
        # the model caches' entries of its texts: keys of other slots than the tenant's (on a
        # cluster, maybe another shard), deleted by commit_once before the transaction — early
        # is safe (an entry deleted costs a model call at most), and a redelivery deletes again
        _shared_deletes(pipe).extend(erasure.cache_keys)
