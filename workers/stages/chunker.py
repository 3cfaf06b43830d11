"""The chunker: a document → its chunks on `chunks` (keyed by the document, so they stay in order).

A conversation turn (a document with `turn` set: topics.Document.is_turn) is one immutable passage: one chunk
holding its text verbatim whatever its length, with the turn's context line (speaker and time,
workers.algorithms.turns) beside it, never in it."""

from __future__ import annotations

from topics import Chunk, Document
from workers.algorithms.chunking import TextChunk, chunk_text, turn_chunk_id
from workers.algorithms.normalize import content_hash
from workers.algorithms.turns import turn_context, when_of
from workers.envelope import Emit
from workers.stages.context import Stage


def chunking_mark(doc: Document, doc_hash: str, context: str = "") -> str:
    """Done mark: one per document text and version, and per context line of a turn (its
    passage id depends on it: a turn published again with its speaker corrected is chunked again)."""
    mark = f"doc:{doc.doc_id}:{doc_hash[:32]}:{doc.version}"
    return f"{mark}:{content_hash(context)[:16]}" if context else mark


TURN_FIELDS = ("session_id", "turn", "speaker", "ts")


def passage_metadata(doc: Document) -> dict:
    """What each passage of `doc` keeps of it: its metadata and the turn fields that are set.
    The turn fields' names are theirs: a metadata key of the same name is not kept (the
    extractor reads `ts` as the turn's time: only the Document's own, range-checked `ts`)."""
    turn = {name: getattr(doc, name) for name in TURN_FIELDS if getattr(doc, name) is not None}
    return {**{k: v for k, v in doc.metadata.items() if k not in TURN_FIELDS}, **turn}


def context_of(doc: Document) -> str:
    """A turn's context line: its speaker, and its session date as the source wrote it (LoCoMo
    metadata 'date') or else its timestamp; '' for other documents."""
    if not doc.is_turn:
        return ""
    date = doc.metadata.get("date")
    return turn_context(doc.speaker, when_of(date if isinstance(date, str) else "", doc.ts))


def pieces_of(doc: Document, context: str, window: int, overlap: int) -> list[TextChunk]:
    """A turn: one piece, its text verbatim, its id of (doc id, context, text). Other documents:
    token windows (ids: content hashes of their text, as before turns existed)."""
    if doc.is_turn:
        return [TextChunk(turn_chunk_id(doc.doc_id, context, doc.text), 0, doc.text)]
    return chunk_text(doc.text, window, overlap)


class ChunkerStage(Stage):
    async def handle(self, doc: Document) -> None:
        doc_hash = content_hash(doc.text)
        context = context_of(doc)
        pieces = pieces_of(doc, context, self.settings.chunk_tokens, self.settings.chunk_overlap)
        # Outside the once-mark: publishing an earlier text again makes it current again.
        pipe = self.memory.pipeline()
        self.memory.stage_document(pipe, doc.tenant, doc.doc_id, doc_hash, doc.version, [p.chunk_id for p in pieces])
        await pipe.execute()

        async def decide(pipe) -> list[Emit]:
            return [
                Emit("chunks", doc.doc_id, Chunk(
                    tenant=doc.tenant, chunk_id=p.chunk_id, doc_id=doc.doc_id, seq=p.seq, n_chunks=len(pieces),
                    text=p.text, doc_version=doc.version, doc_hash=doc_hash, context=context, metadata=passage_metadata(doc),
                ))
                for p in pieces
            ]

        await self.once(doc.tenant, chunking_mark(doc, doc_hash, context), decide)
