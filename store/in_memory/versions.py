"""Document versions in process (store.base.Versions), as store/redis/versions.py: a
document's record read and fenced, each passage's documents, its retirement and restoration
(_RETIRE_PASSAGE, _RESTORE_PASSAGE there) and its support out of every count (_RECOUNT_SCHEMA
there)."""

from __future__ import annotations

from store.in_memory.base import InMemoryBase, _stored
from store.records import RETIRED_FIELDS, DocumentRecord, PassageState


class VersionsOps(InMemoryBase):
    """store.base.Versions in process (store.redis.versions.VersionsOps on Redis)."""

    async def document_record(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        doc = self._tenant(tenant).documents.get(doc_id)
        return (
            None
            if doc is None
            else DocumentRecord(
                doc["doc_hash"],
                int(doc["version"]),
                tuple(doc["chunk_ids"]),
                doc.get("mark", ""),
                doc.get("seq", 0),
                doc.get("position"),
            )
        )

    def expect_document(self, pipe, tenant: str, doc_id: str, record: DocumentRecord | None) -> None:
        pipe.expected.setdefault(
            (tenant, "documents", doc_id, "version"), None if record is None else str(record.version)
        )
        pipe.expected.setdefault(
            (tenant, "documents", doc_id, "doc_hash"), None if record is None else record.doc_hash or None
        )

    def expect_passage(self, pipe, tenant: str, passage_id: str, state: PassageState, counts: bool = False) -> None:
        pipe.expected.setdefault((tenant, "passages", passage_id, "retired"), "1" if state.retired else None)
        pipe.expected.setdefault(
            (tenant, "passages", passage_id, "incarnation"), str(state.incarnation) if state.incarnation else None
        )
        if counts:
            pipe.expected.setdefault(
                (tenant, "passage_revisions", passage_id, "n"), str(state.revision) if state.revision else None
            )

    def stage_passage_documents(self, pipe, tenant: str, passage_id: str, joined: list[str], left: list[str]) -> None:
        def write() -> None:
            owners = self._set(tenant, "passage_documents", passage_id)
            owners.update(joined)
            for doc_id in joined + left:
                self._set(tenant, "document_passages", doc_id).add(passage_id)
            owners.difference_update(left)
            self._revise(tenant, passage_id)

        self._stage(pipe, write)

    async def passage_documents(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        return [set(self._tenant(tenant).sets.get(("passage_documents", pid), ())) for pid in passage_ids]

    async def passage_states(self, tenant: str, passage_ids: list[str]) -> list[PassageState]:
        t = self._tenant(tenant)
        return [
            PassageState(
                t.records["passages"].get(pid, {}).get("retired") == "1",
                int(t.records["passages"].get(pid, {}).get("incarnation") or 0),
                t.revisions.get(pid, 0),
            )
            for pid in passage_ids
        ]

    def stage_retire_passage(self, pipe, tenant: str, passage_id: str) -> None:
        """As store/redis/versions.py's _RETIRE_PASSAGE."""

        def write() -> None:
            t = self._tenant(tenant)
            row = t.records["passages"].setdefault(passage_id, {})
            if row.get("retired") == "1":
                return
            for name, aside in RETIRED_FIELDS.items():
                if name in row:
                    row[aside] = row.pop(name)
            row["retired"] = "1"
            t.lexical = None  # the BM25 index is rebuilt without it

        self._stage(pipe, write)

    def stage_restore_passage(self, pipe, tenant: str, passage_id: str, incarnation: int) -> None:
        """As store/redis/versions.py's _RESTORE_PASSAGE."""

        def write() -> None:
            t = self._tenant(tenant)
            row = t.records["passages"].setdefault(passage_id, {})
            for name, aside in RETIRED_FIELDS.items():
                if aside in row:
                    row[name] = row.pop(aside)
            row.update(retired="", incarnation=_stored(incarnation))
            row.pop("purged", None)
            t.lexical = None

        self._stage(pipe, write)

    async def passage_support(self, tenant: str, passage_id: str) -> tuple[list[str], list[str]]:
        sets = self._tenant(tenant).sets
        return sorted(sets.get(("passage_facts", passage_id), ())), sorted(
            sets.get(("passage_schemas", passage_id), ())
        )

    def stage_drop_support(
        self, pipe, tenant: str, passage_id: str, fact_ids: list[str], schema_ids: list[str], entity_ids: list[str]
    ) -> None:
        """As store/redis/versions.py's stage_drop_support (the schema's count: _RECOUNT_SCHEMA)."""

        def write() -> None:
            t = self._tenant(tenant)
            for fid in fact_ids:
                self._set(tenant, "fact_passages", fid).discard(passage_id)
            for sid in schema_ids:
                supporting = self._set(tenant, "schema_passages", sid)
                supporting.discard(passage_id)
                if sid in t.records["schemas"]:
                    self._hset(tenant, "schemas", sid, {"frequency": len(supporting)})
            for eid in entity_ids:
                self._set(tenant, "entity_passages", eid).discard(passage_id)
            for what in ("passage_facts", "passage_schemas", "chunk_facts_done", "chunk_outstanding"):
                t.sets.pop((what, passage_id), None)
            self._set(tenant, "chunks_done").discard(passage_id)

        self._stage(pipe, write)
