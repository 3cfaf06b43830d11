"""Canonical ids for entities, relations, facts and schemas (pure functions).

Ids are content-derived so that a replayed message writes the same keys (idempotence) and the
same entity or schema recurs across passages."""

import functools
import hashlib
import re
import unicodedata
from dataclasses import replace as _replace

from lemminflect import getInflection, getLemma

from topics import BadInput

_ARTICLES = re.compile(r"^(the|a|an)\s+", re.I)
_NON_WORD = re.compile(r"[^\w]+", re.U)
# Symbols that tell names apart ('C' / 'C++' / 'C#', 'NET' / '.NET'), spelled as words before the
# rest of the punctuation goes: '+' and '#' written right after a word, and a '.' that starts a
# word of letters ('.763' stays '763'). Only names holding one of them get another id than before
# (3 of MuSiQue's 19,277 OpenIE names, e.g. 'Springer Science+Business Media').
_SPELLED_SYMBOLS = re.compile(r"(?<=\w)(?:\++|#)|(?<![\w.])\.(?=[^\W\d_])")
_SYMBOL_WORDS = {"+": " plus ", "#": " sharp ", ".": " dot "}
_TRAILING = {"the", "a", "an"}
_BE = {"is", "are", "was", "were", "be", "been", "being"}
_AUXILIARIES = _BE | {"has", "have", "had", "does", "did", "do"}
# participles that usually state a property rather than an action ('born in', 'located in')
_STATIVE_PARTICIPLES = {
    "born",
    "located",
    "based",
    "situated",
    "named",
    "called",
    "known",
    "married",
    "buried",
    "educated",
    "headquartered",
    "listed",
    "set",
    "composed",
    "made",
    "raised",
    "released",
    "published",
    "owned",
    "used",
}


class UnnamedEntity(BadInput):
    """A name with nothing to identify it: only punctuation, symbols or whitespace."""


def entity_id(name: str) -> str:
    """'The  Eiffel-Tower.' → 'eiffel_tower'; 'C++' → 'c_plus_plus', 'C#' → 'c_sharp', '.NET' →
    'dot_net'. UnnamedEntity for a name of only punctuation (it would merge every such name
    into one entity)."""
    text = unicodedata.normalize("NFKC", name).strip().lower()
    text = _ARTICLES.sub("", text)
    text = _SPELLED_SYMBOLS.sub(lambda m: "".join(_SYMBOL_WORDS[c] for c in m.group()), text)
    eid = _NON_WORD.sub(" ", text).strip().replace(" ", "_")
    if not eid.strip("_"):
        raise UnnamedEntity(f"entity name {name[:80]!r} has no letters or digits")
    return eid


def mention_words(text: str, *, name: bool = False) -> list[str]:
    """The words a text is matched by (workers.algorithms.grounding): NFKC, lower case, '+',
    '#' and '.' spelled as entity_id spells them, every other run of punctuation, underscores
    and whitespace a word break; with `name`, without a leading article (as entity_id)."""
    text = unicodedata.normalize("NFKC", text).strip().lower()
    if name:
        text = _ARTICLES.sub("", text)
    text = _SPELLED_SYMBOLS.sub(lambda m: "".join(_SYMBOL_WORDS[c] for c in m.group()), text)
    return _NON_WORD.sub(" ", text).replace("_", " ").split()


def has_entity_id(name: str) -> bool:
    try:
        entity_id(name)
    except UnnamedEntity:
        return False
    return True


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
        kept = words[0] in _participles(lemma) and (
            passive or following == "by" or (words[0] in _STATIVE_PARTICIPLES and following)
        )
        if not kept:
            words[0] = lemma
    return " ".join(words)


# Verbs of making: what is made has one maker, so the passive relation is single-valued per
# head ("designed by" of a building) and its conflicts can be detected; the active form ("Ada
# designed the lighthouse") is turned into it: both voices are one relation (canonical_fact).
# Not "found": its lemma is also the past of "find" ("I found my keys").
MAKING_VERBS = frozenset(
    """design build construct write author compose paint sculpt draw direct produce
establish invent create discover develop publish photograph""".split()
)


def passive_of(relation: str) -> str | None:
    """The passive relation a normalised active one of MAKING_VERBS is ("design" → "designed
    by"), None for any other."""
    if relation in MAKING_VERBS:
        participles = _participles(relation)
        return f"{participles[0]} by" if participles else None
    return None


def canonical_fact(triple):
    """A Triple with its relation normalised (relation_name) and in the voice memory keeps it in:
    "Y designed X" becomes (X, designed by, Y), as "X was designed by Y" reads, so the two
    conflict when Y differs. Every extractor's facts pass through it (the extractor stage)."""
    relation = relation_name(triple.relation)
    passive = passive_of(relation)
    if passive is None:
        return triple if relation == triple.relation else _replace(triple, relation=relation)
    return _replace(
        triple,
        head=triple.tail,
        tail=triple.head,
        head_type=triple.tail_type,
        tail_type=triple.head_type,
        relation=passive,
    )


@functools.lru_cache(maxsize=50_000)
def _verb_lemma(word: str) -> str | None:
    """The verb's lemma; a word that is a lemma itself stays (so relation_name is idempotent: the
    lemma 'found' of 'founded' read again was 'find', the stages normalising a relation twice).
    The price: a past form that is also a verb ('found', 'saw') stays as it is."""
    lemmas = getLemma(word, upos="VERB", lemmatize_oov=False)
    if word in lemmas:
        return word
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
