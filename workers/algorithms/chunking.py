"""Token-window chunking with overlap (pure).

A token is a whitespace-separated word of at most MAX_TOKEN_CHARS characters (a longer run of
non-space characters — a URL, a blob — is cut into pieces of that many), except in scripts
written without spaces between words: there every character is a token of its own, as in most
tokenizers (Han ideographs, Japanese kana, CJK punctuation and fullwidth forms; see _UNSPACED).
So a window of `window` tokens is `window` words of English, or `window` characters of Chinese or
Japanese (200 characters of Chinese are roughly as many model tokens as 200 English words).

Every chunk holds at most `window` tokens and at most `window * MAX_TOKEN_CHARS` characters,
whatever the text. A chunk's text is the exact slice of the document from its first token to its
last, so a document that fits in one window comes back unchanged and chunk ids (content hashes)
are stable across runs."""

import re
from dataclasses import dataclass

from workers.algorithms.normalize import content_hash

MAX_TOKEN_CHARS = 64
# Scripts written without spaces between words (U+3000, the ideographic space, is whitespace).
_UNSPACED = (
    "\u2e80-\u2fdf"  # CJK and Kangxi radicals
    "\u3001-\u303f"  # CJK symbols and punctuation
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f\u3190-\u31ff"  # Bopomofo, Kanbun, CJK strokes, Katakana extensions
    "\u3200-\u9fff"  # enclosed CJK, CJK compatibility, CJK unified ideographs (and extension A)
    "\uf900-\ufaff\ufe30-\ufe4f"  # CJK compatibility ideographs and forms
    "\uff01-\uffef"  # halfwidth and fullwidth forms
    "\U00020000-\U0003ffff"  # CJK unified ideographs, extensions B and later
)
_TOKEN = re.compile(f"[{_UNSPACED}]|[^\\s{_UNSPACED}]{{1,{MAX_TOKEN_CHARS}}}")


@dataclass(frozen=True)
class TextChunk:
    chunk_id: str
    seq: int
    text: str


def token_count(text: str) -> int:
    """Tokens as the chunker counts them (what a chunk window of N holds). findall's list, not
    a count over finditer's matches: a reconstruct walk counts ~100 passages a query, and the
    match objects were ~2% of its CPU (py-spy, 50,000 passages)."""
    return len(_TOKEN.findall(text))


def chunk_id_of(text: str) -> str:
    return content_hash(text)[:32]


def turn_chunk_id(doc_id: str, context: str, text: str) -> str:
    """A conversation turn's passage id: of its document, context line and text, so two turns
    with the same words ("Thanks!") stay two passages, and a turn published again keeps its id."""
    return content_hash("\x1f".join((doc_id, context, text)))[:32]


def chunk_text(text: str, window: int = 200, overlap: int = 40) -> list[TextChunk]:
    """Windows of `window` tokens, each starting `overlap` tokens before the previous one ended.
    A window whose slice would pass window * MAX_TOKEN_CHARS characters (long runs of whitespace
    between its tokens) ends early, and the next one overlaps it in proportion to its tokens."""
    if window <= 0 or not 0 <= overlap < window:
        raise ValueError("need window > 0 and 0 <= overlap < window")
    spans = [m.span() for m in _TOKEN.finditer(text)]
    if not spans:
        return []
    max_chars = window * MAX_TOKEN_CHARS
    if len(spans) <= window and len(text) <= max_chars:
        return [TextChunk(chunk_id_of(text), 0, text)]
    chunks: list[TextChunk] = []
    start = 0
    while True:
        end = min(start + window, len(spans))
        while end - start > 1 and spans[end - 1][1] - spans[start][0] > max_chars:
            end -= 1  # one token alone is at most MAX_TOKEN_CHARS
        piece = text[spans[start][0] : spans[end - 1][1]]
        chunks.append(TextChunk(chunk_id_of(piece), len(chunks), piece))
        if end == len(spans):
            return chunks
        taken = end - start
        # a full window steps by window - overlap; a cut one overlaps in proportion, and moves on
        start = end - overlap if taken == window else max(start + 1, end - overlap * taken // window)
