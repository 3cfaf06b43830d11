"""The chunker: a document → its chunks on `chunks` (keyed by the document, so they stay in order)."""

from __future__ import annotations

from topics import Chunk, Document
from workers.algorithms.chunking import chunk_text
from workers.algorithms.normalize import content_hash
from workers.algorithms.turns import turn_context, when_of
from workers.envelope import Emit
from workers.stages.context import Stage


def chunking_mark(doc: Document, doc_hash: str) -> str:
    """Done mark: one per document text and version."""
    return f"doc:{doc.doc_id}:{doc_hash[:32]}:{doc.version}"


def passage_metadata(doc: Document) -> dict:
    """What each passage of `doc` keeps of it: its metadata and the turn fields that are set."""
    turn = {name: getattr(doc, name) for name in ("session_id", "turn", "speaker", "ts") if getattr(doc, name) is not None}
    return {**doc.metadata, **turn}


def context_of(doc: Document) -> str:
    """A turn's context line: its speaker, and its session date as the source wrote it (LoCoMo
    metadata 'date') or else its timestamp; '' for other documents. (The same as branch
    i11-conv's chunker, which supersedes this on merge.)"""
    if doc.session_id is None and doc.turn is None:
        return ""
    date = doc.metadata.get("date")
    return turn_context(doc.speaker, when_of(date if isinstance(date, str) else "", doc.ts))


class ChunkerStage(Stage):
    async def handle(self, doc: Document) -> None:
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
                    text=p.text, doc_version=doc.version, doc_hash=doc_hash, context=context_of(doc), metadata=passage_metadata(doc),
                ))
                for p in pieces
            ]

        await self.once(doc.tenant, chunking_mark(doc, doc_hash), decide)
