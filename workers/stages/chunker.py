"""The chunker: a document → its chunks on `chunks` (keyed by the document, so they stay in order)."""

from __future__ import annotations

from topics import Chunk, Document
from workers.algorithms.chunking import chunk_text
from workers.algorithms.normalize import content_hash
from workers.algorithms.expiry import document_ttls
from workers.envelope import Emit, PermanentError
from workers.stages.context import Stage


def chunking_mark(doc: Document, doc_hash: str) -> str:
    """Done mark: one per document text and version."""
    return f"doc:{doc.doc_id}:{doc_hash[:32]}:{doc.version}"


def passage_metadata(doc: Document) -> dict:
    """What each passage of `doc` keeps of it: its metadata and the turn fields that are set."""
    turn = {name: getattr(doc, name) for name in ("session_id", "turn", "speaker", "ts") if getattr(doc, name) is not None}
    return {**doc.metadata, **turn}


class ChunkerStage(Stage):
    async def handle(self, doc: Document) -> None:
        try:  # refused here, before any chunk: the dead letter names the document and the field
            document_ttls(doc.metadata)
        except ValueError as exc:
            raise PermanentError(f"document {doc.doc_id}: {exc}") from None
        doc_hash = content_hash(doc.text)
        pieces = chunk_text(doc.text, self.settings.chunk_tokens, self.settings.chunk_overlap)
        # Outside the once-mark: publishing an earlier text again makes it current again.
        pipe = self.memory.pipeline()
        self.memory.stage_document(pipe, doc.tenant, doc.doc_id, doc_hash, doc.version, [p.chunk_id for p in pieces])
        await pipe.execute()

        async def decide(pipe) -> list[Emit]:
            return [
                Emit("chunks", doc.doc_id, Chunk(
                    tenant=doc.tenant, chunk_id=p.chunk_id, doc_id=doc.doc_id, seq=p.seq, n_chunks=len(pieces),
                    text=p.text, doc_version=doc.version, doc_hash=doc_hash, metadata=passage_metadata(doc),
                ))
                for p in pieces
            ]

        await self.once(doc.tenant, chunking_mark(doc, doc_hash), decide)
