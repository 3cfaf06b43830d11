"""Token-window chunking with overlap (pure).

Tokens are whitespace-separated words. A chunk's text is the exact slice of the document from
its first token to its last, so a document that fits in one window comes back unchanged and
chunk ids (content hashes) are stable across runs."""

import re
from dataclasses import dataclass

from workers.normalize import content_hash

_TOKEN = re.compile(r"\S+")


@dataclass(frozen=True)
class TextChunk:
    chunk_id: str
    seq: int
    text: str


def chunk_id_of(text: str) -> str:
    return content_hash(text)[:32]


def chunk_text(text: str, window: int = 200, overlap: int = 40) -> list[TextChunk]:
    if window <= 0 or not 0 <= overlap < window:
        raise ValueError("need window > 0 and 0 <= overlap < window")
    spans = [m.span() for m in _TOKEN.finditer(text)]
    if len(spans) <= window:
        return [TextChunk(chunk_id_of(text), 0, text)] if spans else []
    chunks, start, step = [], 0, window - overlap
    while True:
        end = min(start + window, len(spans))
        piece = text[spans[start][0] : spans[end - 1][1]]
        chunks.append(TextChunk(chunk_id_of(piece), len(chunks), piece))
        if end == len(spans):
            return chunks
        start += step
