"""A document's subject: the entity its title names (topics.Document.title). Every passage of a
titled document holds its subject entity, so a passage of another document that names the same
entity (its extractor's mention, normalised to the same entity id: workers.algorithms.normalize)
shares a node with it — the hyperlink a Wikipedia page or a note's link would make, found
without an LLM and in any order of arrival, since both sides derive the node from the name."""

from __future__ import annotations

import re

from workers.algorithms.chunking import TextChunk
from workers.algorithms.normalize import content_hash, has_entity_id

# a trailing qualifier in parentheses ("The Prestige (film)", "Mercury (planet)"): Wikipedia's
# way, and a notes corpus's, of keeping two pages of one name apart; a passage names the thing
# without it ("The Prestige")
_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")


def subject_name(title: str | None) -> str:
    """The name of the entity a title makes a document's subject: the title without a trailing
    parenthesised qualifier and surrounding whitespace; '' when it names nothing (no title, a
    title of only punctuation)."""
    if not title:
        return ""
    name = " ".join(title.split())
    bare = _QUALIFIER.sub("", name)
    name = bare if has_entity_id(bare) else name
    return name if has_entity_id(name) else ""


def titled_chunk_id(subject: str, text: str) -> str:
    """A titled document's passage id: of its subject and text, so the same words under two
    titles are two passages, each holding its own subject (an untitled document's passage id
    is its text's hash alone: workers.algorithms.chunking.chunk_id_of)."""
    return content_hash("\x1f".join(("subject", subject, text)))[:32]


def titled_pieces(subject: str, pieces: list[TextChunk]) -> list[TextChunk]:
    """A document's pieces with the ids of its subject's passages (unchanged without one)."""
    if not subject:
        return pieces
    return [TextChunk(titled_chunk_id(subject, p.text), p.seq, p.text) for p in pieces]
