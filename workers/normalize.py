"""Canonical ids for entities, relations, facts and schemas (pure functions).

Ids are content-derived so that a replayed message writes the same keys (idempotence) and the
same entity or schema recurs across passages."""

import functools
import hashlib
import re
import unicodedata

from lemminflect import getInflection, getLemma

_ARTICLES = re.compile(r"^(the|a|an)\s+", re.I)
_NON_WORD = re.compile(r"[^\w]+", re.U)
_TRAILING = {"the", "a", "an"}
_BE = {"is", "are", "was", "were", "be", "been", "being"}
_AUXILIARIES = _BE | {"has", "have", "had", "does", "did", "do"}
# participles that usually state a property rather than an action ('born in', 'located in')
_STATIVE_PARTICIPLES = {"born", "located", "based", "situated", "named", "called", "known", "married", "buried", "educated",
                        "headquartered", "listed", "set", "composed", "made", "raised", "released", "published", "owned", "used"}


def entity_id(name: str) -> str:
    """'The  Eiffel-Tower.' → 'eiffel_tower'."""
    text = unicodedata.normalize("NFKC", name).strip().lower()
    text = _ARTICLES.sub("", text)
    return _NON_WORD.sub(" ", text).strip().replace(" ", "_") or "_"


def relation_name(relation: str) -> str:
    """Lower case, single spaces, no punctuation, auxiliaries and trailing articles stripped,
    and the verb in its lemma: 'founded' / 'founds' / 'has founded' → 'found', 'worked at the'
    → 'work at'. A participle read as passive or as a property is kept — after a form of 'be',
    before 'by', or a stative one before a preposition: 'was born in' / 'born in' → 'born in',
    'is located in' → 'located in', 'built by' → 'built by'."""
    words = _NON_WORD.sub(" ", unicodedata.normalize("NFKC", relation).lower()).split()
    passive = False
    while len(words) > 1 and words[0] in _AUXILIARIES:
        passive = passive or words[0] in _BE
        words.pop(0)
    while len(words) > 1 and words[-1] in _TRAILING:
        words.pop()
    if not words:
        return "related to"
    lemma = _verb_lemma(words[0])
    if lemma and lemma != words[0]:
        following = words[1] if len(words) > 1 else ""
        kept = words[0] in _participles(lemma) and (passive or following == "by" or (words[0] in _STATIVE_PARTICIPLES and following))
        if not kept:
            words[0] = lemma
    return " ".join(words)


@functools.lru_cache(maxsize=50_000)
def _verb_lemma(word: str) -> str | None:
    lemmas = getLemma(word, upos="VERB", lemmatize_oov=False)
    return lemmas[0] if lemmas else None


@functools.lru_cache(maxsize=50_000)
def _participles(lemma: str) -> tuple[str, ...]:
    return getInflection(lemma, tag="VBN")


def short_hash(*parts: str, size: int = 16) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:size]


def fact_id(head_id: str, relation: str, tail_id: str) -> str:
    return short_hash(head_id, relation, tail_id)


def schema_id(head_type: str, relation: str, tail_type: str) -> str:
    return short_hash(head_type, relation, tail_type)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
