"""Canonical ids for entities, relations, facts and schemas (pure functions).

Ids are content-derived so that a replayed message writes the same keys (idempotence) and the
same entity or schema recurs across passages."""

import hashlib
import re
import unicodedata

_ARTICLES = re.compile(r"^(the|a|an)\s+", re.I)
_NON_WORD = re.compile(r"[^\w]+", re.U)
_TRAILING = {"the", "a", "an"}
_AUXILIARIES = {"is", "are", "was", "were", "be", "been", "being", "has", "have", "had", "does", "did", "do"}


def entity_id(name: str) -> str:
    """'The  Eiffel-Tower.' → 'eiffel_tower'."""
    text = unicodedata.normalize("NFKC", name).strip().lower()
    text = _ARTICLES.sub("", text)
    return _NON_WORD.sub(" ", text).strip().replace(" ", "_") or "_"


def relation_name(relation: str) -> str:
    """Lower case, single spaces, no punctuation, leading auxiliaries and trailing articles
    stripped ('was born in' → 'born in', 'worked at the' → 'worked at'); verb lemmas come with
    the LLM normaliser (issue 3)."""
    words = _NON_WORD.sub(" ", unicodedata.normalize("NFKC", relation).lower()).split()
    while len(words) > 1 and words[0] in _AUXILIARIES:
        words.pop(0)
    while len(words) > 1 and words[-1] in _TRAILING:
        words.pop()
    return " ".join(words) or "related to"


def short_hash(*parts: str, size: int = 16) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:size]


def fact_id(head_id: str, relation: str, tail_id: str) -> str:
    return short_hash(head_id, relation, tail_id)


def schema_id(head_type: str, relation: str, tail_type: str) -> str:
    return short_hash(head_type, relation, tail_type)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
