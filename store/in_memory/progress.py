"""Document progress in process (store.base.Progress), as store/redis/progress.py: the
document's record (its latest version only: _RECORD_DOCUMENT there), each chunk's facts
detected and work outstanding (_progress: _CHUNK_PROGRESS there), and the statuses
`publish --wait` polls."""

from __future__ import annotations

import time

from store.in_memory.base import InMemoryBase
from store.records import DocumentStatus


class ProgressOps(InMemoryBase):
    """store.base.Progress in process (store.redis.progress.ProgressOps on Redis)."""

    def stage_document(
        self,
        pipe,
        tenant: str,
        doc_id: str,
        doc_hash: str,
        version: int,
        chunk_ids: list[str],
        mark: str = "",
        position: tuple[int, int] | None = None,
    ) -> None:
        t = self._tenant(tenant)
        record = {
            "doc_hash": doc_hash,
            "version": version,
            "chunk_ids": list(chunk_ids),
            "ts": time.time(),
            "mark": mark,
            "position": position,
        }

        def write() -> None:  # store/redis/progress.py's _RECORD_DOCUMENT: the latest publication's
            current = t.documents.get(doc_id)
            if current is None or current["version"] <= version:
                t.documents[doc_id] = {**record, "seq": (current or {}).get("seq", 0) + 1}

        self._stage(pipe, write)

    def stage_chunk_done(self, pipe, tenant: str, chunk_id: str) -> None:
        self._stage(pipe, lambda: self._set(tenant, "chunks_done").add(chunk_id))

    def _progress(
        self, tenant: str, chunk_id: str, chunk_fact_count: int, fact_index: str = "", work_id: str = ""
    ) -> None:
        """store/redis/progress.py's _CHUNK_PROGRESS: through when every fact is detected and no spawned
        work is outstanding."""
        facts_done, outstanding = (
            self._set(tenant, "chunk_facts_done", chunk_id),
            self._set(tenant, "chunk_outstanding", chunk_id),
        )
        if fact_index:
            facts_done.add(fact_index)
        if work_id:
            outstanding.discard(work_id)
        if len(facts_done) >= chunk_fact_count and not outstanding:
            self._set(tenant, "chunks_done").add(chunk_id)

    def stage_fact_done(self, pipe, tenant: str, chunk_id: str, fact_index: int, chunk_fact_count: int) -> None:
        self._stage(pipe, lambda: self._progress(tenant, chunk_id, chunk_fact_count, fact_index=str(fact_index)))

    def stage_spawn(self, pipe, tenant: str, chunk_id: str, work_ids: list[str]) -> None:
        if work_ids:
            spawned = list(work_ids)
            self._stage(pipe, lambda: self._set(tenant, "chunk_outstanding", chunk_id).update(spawned))

    def stage_work_done(self, pipe, tenant: str, chunk_id: str, work_id: str, chunk_fact_count: int) -> None:
        self._stage(pipe, lambda: self._progress(tenant, chunk_id, chunk_fact_count, work_id=work_id))

    async def chunk_done(self, tenant: str, chunk_id: str) -> bool:
        return chunk_id in self._set(tenant, "chunks_done")

    async def chunks_done_count(self, tenant: str) -> int:
        return len(self._set(tenant, "chunks_done"))

    async def outstanding_work(self, tenant: str, chunk_id: str) -> list[str]:
        return sorted(self._set(tenant, "chunk_outstanding", chunk_id))

    async def document_status(self, tenant: str, doc_id: str) -> DocumentStatus | None:
        return (await self.document_statuses(tenant, [doc_id]))[0]

    async def document_statuses(self, tenant: str, doc_ids: list[str]) -> list[DocumentStatus | None]:
        documents, done = self._tenant(tenant).documents, self._set(tenant, "chunks_done")

        def status(doc: dict | None) -> DocumentStatus | None:
            if doc is None:
                return None
            return DocumentStatus(
                doc["doc_hash"], doc["version"], len(doc["chunk_ids"]), sum(1 for c in doc["chunk_ids"] if c in done)
            )

        return [status(documents.get(doc_id)) for doc_id in doc_ids]

    async def document_ids(self, tenant: str) -> list[str]:
        return sorted(self._tenant(tenant).documents)
