"""Erasure in process (store.base.Erasing), as store/redis/erasing.py: what a document's
passages extracted, each fact's sources and each entity's mentions with the write counter a
decision is fenced on, and the removal itself (_ERASE_PASSAGE, _ERASE_NODE there)."""

from __future__ import annotations

from store.graph_log import adjacency_field
from store.in_memory.base import InMemoryBase
from store.nodes import entity_node, passage_node
from store.records import ENTITY_MENTIONS, FACT_EXTRACTIONS, Erasure


class ErasingOps(InMemoryBase):
    """store.base.Erasing in process (store.redis.erasing.ErasingOps on Redis)."""

    async def document_passages(self, tenant: str, doc_id: str) -> list[str]:
        return sorted(self._tenant(tenant).sets.get(("document_passages", doc_id), ()))

    async def passage_extracted(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        return [set(self._tenant(tenant).sets.get(("passage_extracted", pid), ())) for pid in passage_ids]

    def _counted(self, tenant: str, layer: str, what: str, record_id: str, counter: str) -> tuple[set[str], str | None]:
        t = self._tenant(tenant)
        count = t.records[layer].get(record_id, {}).get(counter)
        return set(t.sets.get((what, record_id), ())), None if count is None else str(count)

    async def fact_sources(self, tenant: str, fact_ids: list[str]) -> list[tuple[set[str], str | None]]:
        return [self._counted(tenant, "facts", "fact_sources", fid, FACT_EXTRACTIONS) for fid in fact_ids]

    async def entity_mentions(self, tenant: str, entity_ids: list[str]) -> list[tuple[set[str], str | None]]:
        return [self._counted(tenant, "entities", "entity_passages", eid, ENTITY_MENTIONS) for eid in entity_ids]

    async def facts_naming(self, tenant: str, entity_id: str) -> list[str]:
        rows = self._tenant(tenant).records["facts"]
        return sorted(fid for fid, row in rows.items() if entity_id in (row.get("head_id"), row.get("tail_id")))

    def expect_entity(self, pipe, tenant: str, entity_id: str, mentions: str | None) -> None:
        pipe.expected.setdefault((tenant, "entities", entity_id, ENTITY_MENTIONS), mentions)

    def stage_erase(self, pipe, tenant: str, erasure: Erasure) -> None:
        """As store/redis/erasing.py's stage_erase (_ERASE_PASSAGE, _ERASE_NODE)."""

        def write() -> None:
            t = self._tenant(tenant)
            for pid in erasure.passage_ids:
                row = t.records["passages"].pop(pid, {})
                t.records["passages"][pid] = {
                    "retired": "1",
                    "purged": "1",
                    **({"incarnation": row["incarnation"]} if row.get("incarnation") else {}),
                }
                for what in ("passage_extracted", "passage_documents"):
                    t.sets.pop((what, pid), None)
                self._set(tenant, "document_passages", erasure.doc_id).discard(pid)
                self._set(tenant, "graph_nodes").discard(passage_node(pid))
                t.lexical = None
            for fact in erasure.facts:
                t.records["facts"].pop(fact.id, None)
                for what in ("fact_passages", "fact_sources", "fact_set_aside"):
                    t.sets.pop((what, fact.id), None)
                t.said.pop(fact.id, None)
                self._set(tenant, "group", f"{fact.head_id}|{fact.relation}").discard(fact.id)
                self._set(tenant, "facts_with_tail", fact.tail_id).discard(fact.id)
                self._set(tenant, "schema_pending", fact.schema_id).discard(fact.id)
                t.expiry.pop(fact.id, None)
            for eid in erasure.entity_ids:
                node = entity_node(eid)
                t.records["entities"].pop(eid, None)
                t.sets.pop(("entity_passages", eid), None)
                for name in t.adjacency.pop(node, {}):
                    kind, other = name.split("|", 1)
                    t.adjacency.get(other, {}).pop(adjacency_field(kind, node), None)
                self._set(tenant, "graph_nodes").discard(node)
                self._set(tenant, "similarity_bridged").discard(eid)
            for relation, head in erasure.relation_heads:
                self._set(tenant, "relation_heads", relation).discard(head)
                self._set(tenant, "relation_multi_heads", relation).discard(head)
            for alias in erasure.aliases:
                t.aliases.pop(alias, None)
            if erasure.entity_ids:  # Memory deletes the change stream: every reader loads again
                t.changes.clear()
            for key in erasure.cache_keys:
                self._cache.pop(key, None)
            for sets in [k for k, v in t.sets.items() if not v]:  # Redis keeps no empty set
                del t.sets[sets]

        self._stage(pipe, write)
