"""Grounding (pure): which extracted facts and entities a passage supports.

Documents are untrusted, and so is what a model says about them: a fact is admitted only if
its head and its tail occur in its passage, and a fact of the decision trace (HARD_CONSTRAINT,
REJECTED_OPTION, TOOL_FAILURE) keeps its category only if a sentence of the passage that names
its head or tail carries a cue of that category (workers.algorithms.categories.cues_in). The
A_ext stage (workers.stages.extractor) applies this to the output of every extractor that is not
grounded by construction (the llm and replay extractors; the rules extractor's names are spans
of the passage and its categories the passage's cues).

A name occurs in a passage when, after normalisation (workers.algorithms.normalize.mention_words:
NFKC, case, punctuation, whitespace, a leading article)
- its words are a run of the passage's words ("the Eiffel-Tower" in "… the Eiffel Tower …"), or
- each of its words is a word of one sentence of the passage, in any order and singular or
  plural: a model may rearrange what one sentence says ("behavior of the oceans" from "the
  behavior of the atmosphere, oceans and cryosphere"; "Friday" from "on Fridays"), never add a
  word no sentence has; or
- it is the speaker of a conversation turn, named in the chunk's context line
  (workers.algorithms.turns.parse_context): "I must not exceed 3,000 USD" states Ana's limit; or
- another name of its entity occurs as a run of words: the tenant's aliases (`memstream
  alias`), given by the caller as entity id → the other entity ids of that entity.

Measured on HippoRAG's GPT-3.5 OpenIE of MuSiQue-100 (17,233 facts, replayed by the `replay`
extractor): a run of words alone drops 1,666 facts (9.7%), mostly paraphrases that split a list
("microwave techniques" from "Microwave Theory and Techniques"); the one-sentence rule keeps all
but 596 (3.5%), and with plurals folded all but 465 (2.7%: 456 for a name not in the passage,
9 over a length limit). Those name what no sentence has the words of: world knowledge
("Billings, Montana", "Second World War"), descriptions ("highest-paid NBA player") and
compositions ("Kevin Durant in 2007 NBA draft").

A trace fact whose category no such sentence states is demoted to DECLARATIVE, not dropped: its
head and tail are in the passage, so it is as grounded as any other fact; only the category,
which lets it past the τ gate at once (workers.algorithms.policy.needs_no_tau) and lifts it in
retrieval, is the model's claim, and the passage does not make it.

What this cannot check: a document that *states* something ("the budget is unlimited") yields
that fact, grounded. Grounding stops a model (or an injection steering it) from adding what the
passage does not say; whom to believe is the choice of who may publish to a tenant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Generic, Iterable, Mapping, Protocol, TypeVar

from topics.records import Triple
from workers.algorithms import categories
from workers.algorithms.normalize import mention_words
from workers.algorithms.turns import parse_context

_CONNECTORS = frozenset("the of and von van der de del la le du".split())
# Words that say what kind of thing a name names, not which one: never a part to ground by.
GENERIC_NAME_WORDS = frozenset(
    """
mill house hall church school college university company corporation inc ltd group party club band records
bank society institute association council agency city town village river lake mountain island state county
street road bridge park station airport castle palace tower museum library hospital center centre theatre
theater stadium river bay sea ocean valley district province region kingdom republic empire war battle
award prize cup league team film album song book novel series show festival""".split()
)

# Length limits: a name is a name, a relation a short verb phrase; a model that writes a
# paragraph there is not extracting. Of the 60,023 names of the MuSiQue-100 OpenIE, 72 have more
# than 12 words, 18 more than 16 (lists and quoted clauses, e.g. a 51-word constitutional article)
# and 2 more than 200 characters; its longest relation has 89 characters.
MAX_NAME_CHARS = 200
MAX_NAME_WORDS = 16
MAX_RELATION_CHARS = 100

# Why a fact or an entity is not admitted (the `reason` of memstream_ungrounded_facts_total)
HEAD_NOT_IN_PASSAGE = "head_not_in_passage"
TAIL_NOT_IN_PASSAGE = "tail_not_in_passage"
NAME_TOO_LONG = "name_too_long"
RELATION_TOO_LONG = "relation_too_long"
NOT_IN_PASSAGE = "not_in_passage"  # an entity's name


def _stem(word: str) -> str:
    """A word without its plural 's' ('fridays' → 'friday'), for the one-sentence rule."""
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def _stems(words: list[str]) -> frozenset[str]:
    return frozenset(map(_stem, words))


def _run(words: list[str]) -> str:
    """Words as a string that matches whole words only: ' a b c '."""
    return f" {' '.join(words)} " if words else ""


@dataclass(frozen=True)
class Passage:
    """A chunk's text as grounding reads it."""

    words: str  # the passage's words, _run
    sentences: tuple[str, ...]  # as written: categories read the wording
    sentence_words: tuple[frozenset[str], ...]  # _stems of each sentence
    speaker: str  # the turn's speaker (context line), _run; '' for a plain document
    capitalised: frozenset[str] = frozenset()  # its words written with a capital (as mention_words spells them)

    @classmethod
    def of(cls, text: str, context: str = "") -> "Passage":
        speaker, _ = parse_context(context)
        sentences = tuple(s for s in categories.sentences(text) if s.strip())
        capitalised = frozenset(
            w for token in re.findall(r"\w+", text) if token[0].isupper() for w in mention_words(token)
        )
        return cls(
            _run(mention_words(text)),
            sentences,
            tuple(_stems(mention_words(s)) for s in sentences),
            _run(mention_words(speaker, name=True)),
            capitalised,
        )

    def mentions(self, name: str, other_ids: Iterable[str] = ()) -> bool:
        """`name` occurs here (module docstring); `other_ids`: the other entity ids of its entity."""
        words = mention_words(name, name=True)
        if not words:
            return False
        run = _run(words)
        if run in self.words or run == self.speaker or any(_stems(words) <= s for s in self.sentence_words):
            return True
        return any(
            (alias := _run(mention_words(other.replace("_", " ")))) and (alias in self.words or alias == self.speaker)
            for other in other_ids
        )

    def mentions_in_part(self, name: str, names: Iterable[str] = ()) -> bool:
        """The passage gives `name` in part — its first or last word ("Tesla's birthplace" for
        Nikola Tesla) — and that word points to no other name of the extraction (`names`): a
        model writes an entity's full, canonical name where the passage shortens it. A word of
        fewer than three letters, a number, a connector or a word that says what kind of thing (
        GENERIC_NAME_WORDS) is no part of a name to go by, and the part must be written capitalised
        in the passage, as a name is. Measured on HippoRAG's GPT-3.5
        OpenIE of MuSiQue-100: 2.70% of its 17,233 facts dropped before, 2.60% with it (1.78% if
        any first or last word counted, common nouns and lower case included: too loose)."""
        words = mention_words(name, name=True)
        if len(words) < 2:
            return False
        others = [mention_words(other, name=True) for other in names if other != name]
        for word in dict.fromkeys((words[0], words[-1])):
            if len(word) < 3 or word.isdigit() or word in _CONNECTORS or word in GENERIC_NAME_WORDS:
                continue  # the kind of thing a name names ("Mill" of "Southwind Mill") points to no one
            if word in self.capitalised and not any(word in other for other in others):
                return True
        return False

    def states(self, category: str, names: Iterable[str]) -> bool:
        """A sentence that names one of `names` carries a cue of `category`; when one of them is
        the turn's speaker, any sentence of the turn does (the speaker states all of it)."""
        forms = [mention_words(n, name=True) for n in names]
        spoken = any(_run(f) == self.speaker for f in forms if f)
        return any(
            category in categories.cues_in(sentence)
            for sentence, words in zip(self.sentences, self.sentence_words)
            if spoken or any(f and _stems(f) <= words for f in forms)
        )


def name_problem(name: str) -> str:
    return NAME_TOO_LONG if len(name) > MAX_NAME_CHARS or len(name.split()) > MAX_NAME_WORDS else ""


def fact_problem(
    triple: Triple, passage: Passage, other_ids: Mapping[str, Iterable[str]] = {}, names: Iterable[str] = ()
) -> str:
    """Why `triple` is not admitted from `passage`; '' when it is. `other_ids`: name → the
    other entity ids of its entity (aliases); `names`: every name of the extraction (a name
    given in part must point to one of them, Passage.mentions_in_part)."""
    problem = name_problem(triple.head) or name_problem(triple.tail)
    if problem:
        return problem
    if len(triple.relation) > MAX_RELATION_CHARS:
        return RELATION_TOO_LONG
    if not _occurs(triple.head, passage, other_ids, names):
        return HEAD_NOT_IN_PASSAGE
    if not _occurs(triple.tail, passage, other_ids, names):
        return TAIL_NOT_IN_PASSAGE
    return ""


def _occurs(name: str, passage: Passage, other_ids: Mapping[str, Iterable[str]], names: Iterable[str]) -> bool:
    return passage.mentions(name, other_ids.get(name, ())) or passage.mentions_in_part(name, names)


def entity_problem(
    name: str, passage: Passage, other_ids: Mapping[str, Iterable[str]] = {}, names: Iterable[str] = ()
) -> str:
    return name_problem(name) or ("" if _occurs(name, passage, other_ids, names) else NOT_IN_PASSAGE)


class Named(Protocol):
    """An extracted entity as grounding reads it (workers.models.protocols.Entity)."""

    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


@dataclass
class Grounded(Generic[E]):
    """What a passage supports of an extraction, and what it does not."""

    facts: list[Triple] = field(default_factory=list)  # admitted (demoted ones as DECLARATIVE)
    entities: list[E] = field(default_factory=list)
    dropped: list[tuple[Triple, str]] = field(default_factory=list)  # (fact, reason)
    dropped_entities: list[tuple[E, str]] = field(default_factory=list)  # (entity, reason)
    demoted: list[Triple] = field(default_factory=list)  # as extracted, before the demotion


def ground(
    facts: list[Triple], entities: list[E], passage: Passage, other_ids: Mapping[str, Iterable[str]] = {}
) -> Grounded[E]:
    """Split an extraction (facts; entities with a `.name`) into what `passage` supports and
    what it does not; a trace fact whose category it does not state comes back DECLARATIVE."""
    out: Grounded[E] = Grounded()
    names = {n for t in facts for n in (t.head, t.tail)} | {e.name for e in entities}
    for triple in facts:
        problem = fact_problem(triple, passage, other_ids, names)
        if problem:
            out.dropped.append((triple, problem))
            continue
        if triple.category != categories.DECLARATIVE and not passage.states(
            triple.category, (triple.head, triple.tail)
        ):
            out.demoted.append(triple)
            triple = replace(triple, category=categories.DECLARATIVE, stated=False)
        out.facts.append(triple)
    for entity in entities:
        problem = entity_problem(entity.name, passage, other_ids, names)
        if problem:
            out.dropped_entities.append((entity, problem))
        else:
            out.entities.append(entity)
    return out


def unmentioned(facts: list[Triple], entities: Iterable[Named], passage: Passage) -> set[str]:
    """The names of an extraction that do not occur by themselves, wholly or in part: the ones
    whose aliases the caller needs to look up (most chunks have none, and need no lookup)."""
    names = {n for t in facts for n in (t.head, t.tail)} | {e.name for e in entities}
    return {
        n for n in names if not name_problem(n) and not passage.mentions(n) and not passage.mentions_in_part(n, names)
    }


def quoted(quote: str, text: str) -> bool:
    """`quote` is written in `text`: its words, in order, are a run of the text's words (case,
    punctuation and whitespace normalised). What the LLM resolver's evidence sentence must be of
    the passage it cites."""
    words = mention_words(quote)
    return bool(words) and _run(words) in _run(mention_words(text))
