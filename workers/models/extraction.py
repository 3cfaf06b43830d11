"""A_ext: extractors turn a chunk's text into typed entities and facts.

- `rules`: deterministic and offline. Entities are capitalised spans, typed by suffix and title
  cues; values (amounts, dates, times, numbers) are read whole and are never entities, except
  as the tail of the constraint that names them (both read by workers.models.mentions); a fact links two neighbouring entities of a
  sentence by the words between them. Entity-centric: its value is the entity–passage graph, not its relations.
  Categories by wording (workers.algorithms.categories): every fact of a sentence that states
  a hard constraint, rejects an option or reports a tool failure gets that category, and such
  a sentence also states its "trigger fact" (speaker, relation of the cue, the thing
  constrained / rejected / failed on) — in a conversation turn always, in a plain document
  only when the neighbour rule found no fact in it.
- `replay`: recorded extractions, keyed by the sha256 of the chunk text (JSONL, see docs/configuration.md), or
  HippoRAG's OpenIE output keyed by passage text.
- `llm`: one structured call per chunk to a `ChatModel` (workers/models/llm.py), prompt in
  workers/models/prompts.py.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

from lemminflect import getAllLemmas

from topics import ContractError
from topics.records import TAG_TYPE, Triple
from workers.algorithms import categories
from workers.algorithms.categories import Finding
from workers.algorithms.normalize import content_hash, has_entity_id, relation_name
from workers.algorithms.turns import parse_context
from workers.models.mentions import (
    DATE,
    ERROR,
    MONEY,
    PERCENT,
    TIME,
    VALUE_WITH_PREPOSITION,
    capitalised_spans,
    naming_mentions,
    turn_tags,
    type_of,
    values,
)
from workers.models.prompts import EXTRACTION_SCHEMA, extraction_messages
from workers.models.protocols import Entity, Extraction, Extractor  # noqa: F401  (Entity re-exported)

log = logging.getLogger(__name__)


def drop_unnamed(extraction: Extraction, where: str) -> Extraction:
    """Without the entities, and the facts with a head or tail, whose name is only punctuation
    ('+', '...'): such a name has no entity id (workers.algorithms.normalize.UnnamedEntity), and the chunk's
    other entities and facts are still worth keeping. Each drop is logged."""
    kept = Extraction()
    for e in extraction.entities:
        if has_entity_id(e.name):
            kept.entities.append(e)
        else:
            log.warning("%s: entity %r dropped: its name has no letters or digits", where, e.name)
    for f in extraction.facts:
        if has_entity_id(f.head) and has_entity_id(f.tail):
            kept.facts.append(f)
        else:
            log.warning(
                "%s: fact (%r, %r, %r) dropped: a name has no letters or digits", where, f.head, f.relation, f.tail
            )
    return kept


# ---- rules ------------------------------------------------------------------------------

# A speaker's first person: "I adopted a dog" said by Caroline is (Caroline, adopt, dog). The
# subject, the words that may stand between it and its verb, the words before the object that
# are no part of it, and the words that end the object.
_FIRST_PERSON_SUBJECTS = frozenset(
    {"i", "we", "i've", "we've", "i'd", "we'd", "i'll", "we'll", "i’ve", "we’ve", "i’d", "we’d", "i’ll", "we’ll"}
)
_BEFORE_VERB = frozenset(
    """just also recently finally really actually already even still ever never always often
have has had did do does will would could can might should must got gotten been""".split()
)
_BEFORE_OBJECT = frozenset(
    """a an the my our some this that these those her his their its your new few couple of
two three four five several many lots lot bunch""".split()
)
_OBJECT_ENDS = frozenset(
    """to for with at in on into onto from by about after before during since until and or but so because
when while if that which who whom whose where last next this yesterday today tonight tomorrow week weekend month year ago
it them you him her me us myself ourselves one something anything everything nothing some all out up down off over
again too very really so back there here now then just""".split()
)
MAX_OBJECT_WORDS = 3
# verbs whose bare adjective or adverb says how, not what ("I feel great", "doing great", "we
# work well", "I went home"); after others it may be a thing ("I love chocolate", "I play piano")
_HOW_VERBS = frozenset(
    """feel feeling felt do doing did done go going went gone work working worked look looking looked
seem seemed get getting got stay staying stayed keep keeping kept sound sounds sounded become became
turn turned grow grew run running ran live living lived""".split()
)


def _first_person_facts(sentence: str, speaker: str) -> list[Triple]:
    """(speaker, verb, object) for each first-person clause of a turn: the subject "I" / "we", an
    optional run of auxiliaries and adverbs, a verb (the lexicon's), then up to MAX_OBJECT_WORDS
    words of its object, articles and possessives left out, ending at a preposition, a
    conjunction, a pronoun or a time word; the object's last word must be a noun or a name, and
    a lone lowercase word without an article after a verb of how (_HOW_VERBS) that can be an
    adjective or an adverb is none ("I feel great")."""
    words = re.findall(r"[A-Za-z][\w'’\-]*", sentence)
    facts = []
    for i, word in enumerate(words):
        if word.lower() not in _FIRST_PERSON_SUBJECTS:
            continue
        j = i + 1
        while j < len(words) and words[j].lower() in _BEFORE_VERB:
            j += 1
        if (
            j >= len(words)
            or "VERB" not in getAllLemmas(words[j].lower())
            or words[j].lower() in _BEFORE_OBJECT | _OBJECT_ENDS
        ):
            continue
        k = j + 1
        while k < len(words) and words[k].lower() in _BEFORE_OBJECT:
            k += 1
        bare = k == j + 1  # no article or possessive before the object
        obj: list[str] = []
        while (
            k < len(words)
            and len(obj) < MAX_OBJECT_WORDS
            and words[k].lower() not in _OBJECT_ENDS | _FIRST_PERSON_SUBJECTS
        ):
            obj.append(words[k])
            k += 1
        while obj and not (obj[-1][0].isupper() or "NOUN" in getAllLemmas(obj[-1].lower())):
            obj.pop()
        if bare and len(obj) == 1 and not obj[0][0].isupper() and words[j].lower() in _HOW_VERBS:
            if {"ADJ", "ADV"} & set(getAllLemmas(obj[0].lower())):
                continue  # how, not what: "I feel great", "we work well", "I went home"
        tail = " ".join(obj)
        if tail and has_entity_id(tail) and tail.lower() != speaker.lower():
            facts.append(Triple(head=speaker, relation=words[j], tail=tail, head_type=SPEAKER, tail_type=type_of(tail)))
    return facts


SPEAKER = "SPEAKER"  # the type of a turn's speaker as a fact's head: a person, an agent or a tool


class RulesExtractor:
    name = "rules"
    # its names are spans of a sentence (or the turn's speaker), its categories the sentence's cues
    grounded = True
    max_relation_words = 6

    async def extract(self, text: str, context: str = "") -> Extraction:
        return self.extract_sync(text, context)

    def extract_sync(self, text: str, context: str = "") -> Extraction:
        # every mention starts with a letter or digit, so every name has an entity id
        speaker, _ = parse_context(context)
        entities: dict[str, Entity] = {}
        facts: list[Triple] = []
        for sentence in categories.sentences(text):
            mentions = naming_mentions(sentence, capitalised_spans(sentence))
            finding = categories.classify(sentence)
            if finding is not None and finding.category == categories.TOOL_FAILURE:
                mentions = _tool_named_whole(sentence, mentions, finding)
            for _, _, surface in mentions:
                entities.setdefault(surface, Entity(surface, type_of(surface)))
            found = []
            for (_, end_a, a), (start_b, _, b) in zip(mentions, mentions[1:]):
                between = VALUE_WITH_PREPOSITION.sub(
                    " ", sentence[end_a:start_b]
                )  # "restored in 2010 by" → "restored by"
                words = re.findall(r"[A-Za-z][\w'’\-]*", between)
                if not words or len(words) > self.max_relation_words or a == b:
                    continue
                relation = relation_name(" ".join(words))
                if relation in {"and", "or", "the", "a", "an"}:
                    continue
                found.append(Triple(head=a, relation=relation, tail=b, head_type=type_of(a), tail_type=type_of(b)))
            if finding is not None:
                found = [replace(f, category=finding.category) for f in found]
                # A turn's speaker is no mention: the trigger fact is what ties the constraint,
                # rejection or failure to who stated it. In a plain document it only fills a
                # sentence the neighbour rule left without a fact (Wikipedia prose keeps its facts).
                if speaker or not found:
                    trigger = _trigger_fact(sentence, mentions, finding, speaker)
                    if trigger is not None:  # it replaces the neighbour fact between the same two: the
                        # cue's relation, stated ("the Iberia fares API raised …": failed with, not raise)
                        found = [f for f in found if (f.head, f.tail) != (trigger.head, trigger.tail)]
                        found.append(trigger)
                        entities.setdefault(trigger.head, Entity(trigger.head, trigger.head_type))
                        entities[trigger.tail] = Entity(trigger.tail, trigger.tail_type)
            if speaker:  # a speaker's first person is the speaker: what they did, said as a plain fact (the
                # trigger fact above carries a constraint's, rejection's or failure's category)
                for fact in _first_person_facts(sentence, speaker):
                    if all((fact.head, fact.tail) != (f.head, f.tail) for f in found):
                        found.append(fact)
                        entities.setdefault(fact.head, Entity(fact.head, fact.head_type))
                        entities.setdefault(fact.tail, Entity(fact.tail, fact.tail_type))
            facts.extend(found)
        if speaker:  # a turn's topics as tags: the nodes that join turns about the same thing
            taken = {name.lower() for name in entities} | {speaker.lower()}
            for tag in turn_tags(text, taken):
                entities[tag] = Entity(tag, TAG_TYPE)
        return Extraction(list(entities.values()), facts)


def _trigger_fact(sentence: str, mentions: list[tuple[int, int, str]], finding: Finding, speaker: str) -> Triple | None:
    """(speaker, the cue's relation, the thing constrained / rejected / failed on) of a
    categorised sentence; without a speaker the head is the sentence's first other mention.
    The tail, by preference: what the cue names itself (an error code, "no <X> please"); for a
    failure, its code, exception or HTTP status; for a constraint, an amount with its currency;
    the nearest mention on the cue's side; the words after the cue; a mention on the other side."""
    names = [m for m in mentions if m[2] != speaker]
    after = [m[2] for m in names if m[0] >= finding.end]
    before = [m[2] for m in reversed(names) if m[1] <= finding.start]
    tail, tail_type = "", ""
    if finding.category == categories.TOOL_FAILURE:
        tail = finding.object or categories.failure_item(sentence)
        tail_type = ERROR if tail else ""
    elif finding.object:
        tail = finding.object
    if not tail and finding.category == categories.HARD_CONSTRAINT:
        # an amount, else a date or time (a deadline: "no later than 8 September"), nearest the cue
        stated = values(sentence)
        for kinds in ((MONEY, PERCENT), (DATE, TIME)):
            # a date with its day or month, or a time: a year alone is no deadline ("only the 1966 …");
            # an amount or a percentage as written ("$500", "10%")
            of_kind = [v for v in stated if v[3] in kinds and (kinds[0] == MONEY or re.search(r"[^\W\d_]|:", v[2]))]
            nearest = [v for v in of_kind if v[0] >= finding.end] or [
                v for v in reversed(of_kind) if v[1] <= finding.start
            ]
            if nearest:
                tail, tail_type = nearest[0][2], nearest[0][3]
                break
    if not tail:
        side, other = (before, after) if finding.side == categories.BEFORE else (after, before)
        tail = (side[0] if side else "") or (
            categories.words_after(sentence, finding.end) if finding.side != categories.BEFORE else ""
        )
        tail = tail or (other[0] if other else "")
    # a tool named as what failed heads the failure, not who reported it: "the car-rental API
    # timed out in Braga", said by Karl, is the car-rental API's failure
    failed = _failed_tool(sentence, names, finding) if finding.category == categories.TOOL_FAILURE else ""
    head = (failed if failed != tail else "") or speaker or next((m[2] for m in mentions if m[2] != tail), "")
    if not tail or not head or not has_entity_id(head) or not has_entity_id(tail):
        return None
    return Triple(
        head=head,
        relation=finding.relation,
        tail=tail,
        head_type=SPEAKER if head == speaker else type_of(head),
        tail_type=tail_type or type_of(tail),
        category=finding.category,
        stated=True,
    )


# The last word of a mention that names a tool, and the words before it that are no part of its name
_TOOL_WORDS = frozenset("api apis sdk endpoint service server backend database db gateway webhook plugin bot".split())
_NOT_IN_A_TOOL_NAME = frozenset(
    "the a an to of for with my our your their his her its this that call calls in on at by from and or".split()
)


def _failed_tool(sentence: str, names: list[tuple[int, int, str]], finding: Finding) -> str:
    """The tool a failure's sentence names just before its cue ("the car-rental API timed out",
    "the call to the Iberia fares API raised …"), with the words that name it in front of it, or ''."""
    span = _failed_tool_span(sentence, names, finding)
    return " ".join(sentence[span[0] : span[1]].split()) if span else ""


def _failed_tool_span(sentence: str, names: list[tuple[int, int, str]], finding: Finding) -> tuple[int, int] | None:
    """Where `_failed_tool` is written in the sentence, or None."""
    before = [m for m in names if m[1] <= finding.start]
    if not before or before[-1][2].split()[-1].lower() not in _TOOL_WORDS:
        return None
    start, end, _ = before[-1]
    if re.search(r"[^\w\s\-]", sentence[end : finding.start]):
        return None  # a clause between: not the cue's subject
    for word in reversed(list(re.finditer(r"[\w\-]+", sentence[:start]))[-3:]):
        if word.group().lower() in _NOT_IN_A_TOOL_NAME or re.search(r"[^\w\s\-]", sentence[word.end() : start]):
            break
        start = word.start()
    return start, end


def _tool_named_whole(
    sentence: str, mentions: list[tuple[int, int, str]], finding: Finding
) -> list[tuple[int, int, str]]:
    """A failure's mentions with the failed tool's named whole ("API" → "car-rental API"), so
    the sentence's facts are the tool's, not a twin of them headed by its last word."""
    span = _failed_tool_span(sentence, mentions, finding)
    if span is None:
        return mentions
    whole = " ".join(sentence[span[0] : span[1]].split())
    outside = [m for m in mentions if m[1] <= span[0] or m[0] >= span[1]]  # "Iberia" is in "Iberia fares API"
    return sorted([*outside, (span[0], span[1], whole)])


# ---- replay -----------------------------------------------------------------------------
class ReplayExtractor:
    """Scripted extraction: exactly the recorded entities and facts for each chunk text."""

    name = "replay"
    grounded = (
        False  # recorded from a model: 3.5% of HippoRAG's OpenIE facts of MuSiQue-100 name what their passage does not
    )

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"MEMSTREAM_REPLAY_FILE {self.path} does not exist")
        self.by_sha: dict[str, Extraction] = {}
        raw = self.path.read_text(encoding="utf-8")
        stripped = raw.lstrip()
        if stripped.startswith("{") and '"docs"' in stripped[:200] and self._load_openie(raw):
            return
        for number, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                self._load_line(line, number)

    def _load_line(self, line: str, number: int) -> None:
        where = f"{self.path}:{number}"
        try:
            row = json.loads(line)
            sha = row["text_sha256"]
            entities = [Entity(e["name"], e.get("type") or type_of(e["name"])) for e in row.get("entities", [])]
            facts = [Triple.from_dict(f, where=f"{where} facts[{i}]") for i, f in enumerate(row.get("facts", []))]
        except (json.JSONDecodeError, KeyError, TypeError, ContractError) as exc:
            raise ValueError(f"{where}: bad replay line: {exc}") from None
        self.by_sha[sha] = drop_unnamed(Extraction(entities, facts), where)

    def _load_openie(self, raw: str) -> bool:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("docs"), list):
            return False
        for doc in data["docs"]:
            passage = doc.get("passage")
            if not passage:
                continue
            entities = {
                name: Entity(name, type_of(name))
                for name in doc.get("extracted_entities", [])
                if isinstance(name, str) and name.strip()
            }
            facts = []
            for triple in doc.get("extracted_triples", []):
                # OpenIE output has some malformed triples (not 3 strings): skip them
                if len(triple) != 3 or not all(isinstance(x, str) and x.strip() for x in triple):
                    continue
                head, relation, tail = (x.strip() for x in triple)
                facts.append(
                    Triple(head=head, relation=relation, tail=tail, head_type=type_of(head), tail_type=type_of(tail))
                )
                for name in (head, tail):
                    entities.setdefault(name, Entity(name, type_of(name)))
            self.by_sha[content_hash(passage)] = drop_unnamed(
                Extraction(list(entities.values()), facts), f"{self.path} passage {passage[:40]!r}"
            )
        return True

    async def extract(self, text: str, context: str = "") -> Extraction:
        # keyed by the passage text alone: a recorded extraction stays valid whatever context line a chunk carries
        found = self.by_sha.get(content_hash(text))
        if found is None:
            log.info("replay: no recorded extraction for chunk sha256=%s; it yields no facts", content_hash(text)[:12])
            return Extraction()
        return found


# ---- llm ----------------------------------------------------------------------------------
def parse_extraction(data) -> Extraction:
    """Validate a model's answer against EXTRACTION_SCHEMA (ValueError names the problem)."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("entities"), list)
        or not isinstance(data.get("facts"), list)
    ):
        raise ValueError("expected an object with arrays 'entities' and 'facts'")
    entities = []
    for i, e in enumerate(data["entities"]):
        if (
            not isinstance(e, dict)
            or not isinstance(e.get("name"), str)
            or not e["name"].strip()
            or not isinstance(e.get("type"), str)
        ):
            raise ValueError(f"entities[{i}] needs a non-empty string 'name' and a string 'type'")
        entities.append(Entity(e["name"].strip(), e["type"].strip().upper() or "ENTITY"))
    facts = [Triple.from_dict(f, where=f"facts[{i}]") for i, f in enumerate(data["facts"])]
    # the model categorised each fact itself: a categorised fact is the statement of its category
    facts = [replace(f, stated=f.category != "DECLARATIVE") for f in facts]
    return drop_unnamed(Extraction(entities, facts), "llm extraction")


class LLMExtractor:
    """A_ext with an LLM: one structured call per chunk (cached by prompt)."""

    name = "llm"
    grounded = False

    def __init__(self, client):
        self.client = client

    async def extract(self, text: str, context: str = "") -> Extraction:
        return await self.client.structured(
            "extract", extraction_messages(text, context), "extraction", EXTRACTION_SCHEMA, parse_extraction
        )


def make_extractor(kind: str, replay_file: str = "", llm=None) -> Extractor:
    if kind == "rules":
        return RulesExtractor()
    if kind == "replay":
        if not replay_file:
            raise ValueError("MEMSTREAM_EXTRACTOR=replay needs MEMSTREAM_REPLAY_FILE")
        return ReplayExtractor(replay_file)
    if kind == "llm":
        if llm is None:
            raise ValueError(
                "MEMSTREAM_EXTRACTOR=llm needs an LLM client (MEMSTREAM_LLM_BASE_URL, MEMSTREAM_LLM_MODEL)"
            )
        return LLMExtractor(llm)
    raise ValueError(f"unknown extractor {kind!r}")
