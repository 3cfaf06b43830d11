"""Fact categories from wording (pure): the one place that says which sentences state a hard
constraint, reject an option or report a tool failure, and what they constrain, reject or
report. The `rules` extractor (workers.models.extraction) gives every fact of such a sentence
its category; the LLM extractor is asked for the same categories by its prompt.

A sentence's category is that of the first cue, in this precedence, whose pattern it matches:

1. TOOL_FAILURE — an HTTP error status ("HTTP 409", "409 Conflict", "status 503"), an error
   code in SCREAMING_SNAKE_CASE ("ROOM_UNAVAILABLE"), an exception name ("TimeoutError",
   "ConnectionRefusedError", "ReadTimeout"), or the words failed / failing / timed out /
   errored / crashed / error(s) (not a person who failed or is failing something: "I failed the
   test", "she's failing her classes").
2. REJECTED_OPTION — "we won't", "I won't", "will not" (not a promise or an exclamation: "won't
   believe", "won't forget", "won't regret", "won't give up" / "won't quit" with nothing given up,
   "won't let you down"), "refuse(d)", "rejected", "declined"
   (to do something, or an object: "the population declined" is no refusal), "ruled out",
   "don't want", "would rather not", "not an option", "out of the question", "no <X> please".
3. HARD_CONSTRAINT — "cannot / must not / may not exceed", "at most", "no more than", "maximum
   of", "no less than", "minimum of", "no later than", "no earlier than", "budget of / is",
   must (not) <verb> (not an inference: "must have been", "must be so …"), "never <verb>" (not
   an experience or a cheer: "have never been", "never forget", "never give up"), "required",
   "mandatory", "not allowed", "forbidden", and "only" at a clause start or after a modal ("Only
   direct flights", "we can only …").
4. DECLARATIVE — everything else.

The most specific evidence wins: a failure report often quotes a constraint ("cannot be
booked"), and a refusal often gives one as its reason ("not an option because we must …").

Each cue also names the relation of the fact the sentence states about its speaker (the
`rules` extractor's "trigger fact": head = the turn's speaker, relation, tail = the thing
constrained, rejected or failed on): "failed with" (an error code, exception or HTTP status),
"failed", "timed out", "rejected", "must not exceed", "at most", "at least", "no later than",
"no earlier than", "budget of", "required", "only", or the cue's own words ("must arrive",
"never fly"); and where that thing is written: after the cue ("we won't transit through
Miami"), before it ("Miami is not an option"), or the cue itself (an error code).

Measured on the 994 HotpotQA-100 passages (Wikipedia prose, as ops.bench.datasets builds them): 40
of the rules extractor's 6,088 facts (0.7%) get a category (33 HARD_CONSTRAINT, mostly "only"
and "never"; 4 REJECTED_OPTION; 3 TOOL_FAILURE), 10 sentences without a fact gain their trigger
fact (and 4 entities); every other entity and fact is exactly what the extractor gave without
categories (since values are literals and inferences no cue: 35 of 4,101 — 26
HARD_CONSTRAINT, 6 REJECTED_OPTION, 3 TOOL_FAILURE). A cue word capitalised inside a sentence
is part of a title ("The Devil's Rejects") and no cue; "at least" is none either (17 false
constraints there: "at least 56 fatalities").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HARD_CONSTRAINT, REJECTED_OPTION, TOOL_FAILURE, DECLARATIVE = (
    "HARD_CONSTRAINT",
    "REJECTED_OPTION",
    "TOOL_FAILURE",
    "DECLARATIVE",
)

# What the cue's fact is about, relative to the cue
AFTER, BEFORE, ITSELF = "after", "before", "itself"

_HTTP_REASONS = (
    "Bad Request|Unauthorized|Payment Required|Forbidden|Not Found|Method Not Allowed|Not Acceptable|Request Timeout|"
    "Conflict|Gone|Precondition Failed|Payload Too Large|Unprocessable (?:Entity|Content)|Locked|Too Many Requests|"
    "Internal Server Error|Not Implemented|Bad Gateway|Service Unavailable|Gateway Timeout"
)
# The things a failure is reported with, most specific first (the tail of a failure's fact)
FAILURE_ITEMS = (
    ("error code", re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")),
    ("exception", re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception|Timeout)\b")),
    (
        "HTTP status",
        re.compile(
            rf"\bHTTP(?:/\d(?:\.\d)?)?\s*[45]\d\d\b|\b[45]\d\d\s+(?:{_HTTP_REASONS})\b|\bstatus(?:\s+code)?\s*:?\s*[45]\d\d\b"
        ),
    ),
)
_SUBJECTS = r"(?:we|i|they|he|she|you)"
_NEGATED = r"(?:won't|won’t|will not|wouldn't|wouldn’t|would not|shan't|shall not)"
_AMOUNT = (
    r"(?:[€$£]\s?\d[\d,.]*(?:\s?(?:k|K|m|million|bn))?"
    r"|\d[\d,.]*(?:\s?(?:k|K|million|bn))?\s?(?:EUR|USD|GBP|CHF|euros?|dollars?|pounds?|€|\$|£))"
)
AMOUNT = re.compile(_AMOUNT)


# "must" that infers rather than obliges — "that must have been awesome", "you must be so
# excited", "it must feel great" — and "never" that tells an experience or cheers someone on —
# "I've never been to Paris", "I'll never forget that day", "never give up" — state no rule. In the
# LoCoMo dev conversations 45 of the 45 hard constraints the rules extractor made were such
# sentences ("Gina — must be — Jon", from "Wow, Jon, you must be so excited!"); a hard
# constraint is boosted in the walk and shown to an agent as one. A perfect after "must" is an
# inference ("must have been", "must've loved"; not "must have heated floors", "must have
# completed the course"); "must be" before a word of feeling or judgement is one too ("must be
# so excited"), while "must be direct", "must be very short", "must be under 200 EUR" stay rules.
_FEELING = (  # words of feeling or judgement; not those a rule may ask of a thing ("hard", "fun", "quiet")
    "awesome|amazing|great|exciting|excited|proud|tough|scary|wonderful|fulfilling|rewarding|relieved|"
    "thrilled|lovely|incredible|fantastic|beautiful|crazy|stressful|overwhelming|exhausting|frustrating|"
    "heartbreaking|tiring|hectic|interesting|inspiring|satisfying|challenging|surreal|devastating|"
    "terrifying|painful|sad|happy|glad|nerve-wracking|nerve-racking|exhilarating|magical|breathtaking|"
    "emotional|liberating|empowering"
)
_EPISTEMIC_MUST = (
    r"(?:\s+have|'ve|’ve)\s+(?:been|had|felt|seen|heard|known|thought|loved|enjoyed|meant|gone|done|made|taken|got|gotten)\b"
    rf"|\s+be\s+(?:(?:so|such|really|very|quite|pretty|super|totally|incredibly)\s+)?(?:an?\s+)?(?:{_FEELING})\b"
    r"|\s+(?:feel|mean)\b"
)
# "never" right after a perfect's auxiliary ("I've never", "she has never"), case-blind as the
# cues are ("I'd never fly Ryanair", "Let's never book it" are rules: 'd and 's are more often
# "would", "us" and "is")
_A_PERFECT_BEFORE = re.compile(r"(?:have|has|had|'ve|’ve) $", re.IGNORECASE)
_NEVER_NOT_A_RULE = (
    r"(?:been|had|seen|heard|tried|saw|forget|forgot|forgotten|know|knew|thought|imagined|expected|realized|"
    r"realised|believe|believed|dreamed|dreamt|guessed|give\s+up|gave\s+up|lose\s+hope|stop\s+believing|"
    r"say\s+never|fails?\s+to|ceases?\s+to)\b"
)

# "won't" that promises or exclaims: "you won't believe it", "I won't (ever) forget that", "I
# won't give up / quit" with nothing given up ("I won't quit, no matter what", "I won't quit on
# my dreams"; "won't give up my seat", "won't quit my job", "won't give up sugar" refuse one), "I
# won't let you down" — 12 of the 13 REJECTED_OPTION facts the rules extractor made of the
# LoCoMo dev turns; an agent is shown a rejected option as one not to offer again
_PROMISE = (
    r"(?:(?:ever|even|really|just)\s+)?"
    r"(?:(?:believe|forget|regret)\b"
    r"|(?:give\s+up|quit)(?=\s*(?:[.!?,;:)—–-]|$)|\s+(?:on|now|yet|ever|no\s+matter|even|until|so)\b)"
    r"|let\s+(?:[\w’']+\s+){1,4}down\b)"
)

# A person who failed something reports no tool's failure: "I failed the military aptitude
# test" (the LoCoMo dev turns' one TOOL_FAILURE), "she's failing her classes", "I've just failed
# the exam" — a person's pronoun (not "they": a service may be one), an auxiliary or an adverb,
# then "failed" / "failing" with an object. "I failed to book the hotel", "Sadly I failed",
# "the payment failed the check" still report a failure.
_AN_OBJECT = r"(?:the|an?|my|his|her|our|their|your|this|that|these|those|its|some|any|all)\b"
_A_PERSON_BEFORE = re.compile(
    r"\b(?:i|we|he|she|you)(?:['’](?:ve|d|m|s|re)|\s+(?:have|has|had|am|is|are|was|were|will|would|did))?"
    r"(?:\s+(?:just|also|already|never|once|recently|nearly|almost|totally|completely|really|still))?\s+$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Cue:
    category: str
    pattern: re.Pattern
    relation: str  # the trigger fact's relation; "" = the cue's own words ("must arrive", "never fly")
    side: str  # where the constrained / rejected / failed thing is written: AFTER, BEFORE or ITSELF
    unless_after: re.Pattern | None = None  # no cue where the text before the match ends so


def _cue(category: str, pattern: str, relation: str, side: str = AFTER, unless_after: re.Pattern | None = None) -> Cue:
    return Cue(category, re.compile(pattern, re.IGNORECASE if side != ITSELF else 0), relation, side, unless_after)


# In precedence order (topics.records.CATEGORY_PRECEDENCE; first match decides). Within a category, the more specific cue first.
CUES: tuple[Cue, ...] = (
    *(Cue(TOOL_FAILURE, pattern, "failed with", ITSELF) for _, pattern in FAILURE_ITEMS),
    _cue(TOOL_FAILURE, r"\btimed out\b|\btimes out\b", "timed out"),
    # "error" naming a measure ("the error rate must stay under 10%", "a margin of error") is no failure
    _cue(
        TOOL_FAILURE,
        rf"\b(?:failed|failing)\b(?!\s+{_AN_OBJECT})|\b(?:errored|crashed)\b"
        r"|(?<!margin of )\berrors?\b(?!\s+(?:rates?|margins?|bars?|bounds?|budgets?|terms?)\b)",
        "failed",
    ),
    _cue(TOOL_FAILURE, rf"\b(?:failed|failing)\b(?=\s+{_AN_OBJECT})", "failed", unless_after=_A_PERSON_BEFORE),
    _cue(REJECTED_OPTION, r"\bno\s+(?P<object>[\w’'\- ]{1,40}?),?\s+please\b", "rejected"),
    _cue(
        REJECTED_OPTION,
        r"\b(?:is|are|was|were|been|be)\s+(?:rejected|refused|ruled out|declined)\b",
        "rejected",
        BEFORE,
    ),
    _cue(REJECTED_OPTION, r"\bnot an option\b|\bout of the question\b", "rejected", BEFORE),
    _cue(REJECTED_OPTION, rf"\b{_SUBJECTS}\s+{_NEGATED}(?!\s+{_PROMISE})", "rejected"),
    _cue(
        REJECTED_OPTION,
        r"\b(?:rejected|rejects?|refused|refuses?|ruled out|rules? out|(?:would|'d|’d) rather not)\b",
        "rejected",
    ),
    _cue(
        REJECTED_OPTION, r"\b(?:don't|don’t|do not|doesn't|doesn’t|does not|didn't|didn’t|did not)\s+want\b", "rejected"
    ),
    _cue(
        REJECTED_OPTION,
        r"\bdeclin(?:ed|es|e)\s+(?:to\s+(?=[a-z])|(?:the|an?|our|my|your|their|his|her|it|this|that)\b)",
        "rejected",
    ),
    _cue(
        HARD_CONSTRAINT,
        r"\b(?:cannot|can't|can’t|can not|must not|mustn't|mustn’t|may not|should not|shall not|not to)\s+exceed\b",
        "must not exceed",
    ),
    _cue(
        HARD_CONSTRAINT,
        r"\b(?:at most|no more than|not more than|a maximum of|maximum of|up to a maximum of)\b",
        "at most",
    ),
    _cue(HARD_CONSTRAINT, r"\b(?:no less than|not less than|a minimum of|minimum of)\b", "at least"),
    _cue(HARD_CONSTRAINT, r"\b(?:no later than|not later than)\b", "no later than"),
    _cue(HARD_CONSTRAINT, r"\b(?:no earlier than|not earlier than)\b", "no earlier than"),
    _cue(HARD_CONSTRAINT, r"\bbudget\s*(?:of|is|was|will be|=|:)", "budget of"),
    _cue(HARD_CONSTRAINT, rf"\bmust(?!{_EPISTEMIC_MUST})(?:\s+not|n't|n’t)?\s+[a-z]+", ""),
    _cue(HARD_CONSTRAINT, rf"\bnever\s+(?!{_NEVER_NOT_A_RULE})[a-z]+", "", unless_after=_A_PERFECT_BEFORE),
    _cue(HARD_CONSTRAINT, r"\b(?:required|mandatory|not allowed|forbidden|prohibited)\b", "required", BEFORE),
    _cue(HARD_CONSTRAINT, r"\b(?:can|could|will|would|should|may|must)\s+only\b|(?:^|[,:;(]\s*)only\b", "only"),
)


@dataclass(frozen=True)
class Finding:
    """A categorised sentence: its category, the trigger fact's relation, and the cue's span."""

    category: str
    relation: str
    start: int
    end: int
    side: str
    object: str = ""  # the thing the cue itself names ("no <red-eye flights> please"), else ''


def classify(sentence: str) -> Finding | None:
    """The category of `sentence` by the first cue that matches (CUES' order); None: DECLARATIVE."""
    for cue in CUES:
        for match in cue.pattern.finditer(sentence):
            if _skipped(cue, sentence, match):
                continue
            if cue.side == ITSELF:
                return Finding(
                    cue.category, cue.relation, match.start(), match.end(), cue.side, " ".join(match.group(0).split())
                )
            words = " ".join(match.group(0).split()).strip(",:;( ").lower()
            named = match.groupdict().get("object")
            return Finding(
                cue.category,
                cue.relation or words,
                match.start(),
                match.end(),
                cue.side,
                " ".join(named.split()) if named else "",
            )
    return None


def cues_in(sentence: str) -> frozenset[str]:
    """Every category some cue of `sentence` carries (not only the first by precedence): what
    the sentence can be said to state (workers.algorithms.grounding)."""
    return frozenset(
        cue.category for cue in CUES if any(not _skipped(cue, sentence, m) for m in cue.pattern.finditer(sentence))
    )


# Where a passage's sentences end: after . ! ? ; and at line breaks (the rules extractor's sentences)
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
# A period that ends an initial or a title's abbreviation ends no sentence: "J. R. R. Tolkien",
# "St. Louis", "Dr. Rao" were cut into "J.", "R.", … and their names lost ("Tolkien", "St", "Louis").
_ABBREVIATED = re.compile(r"(?:\b[A-Z]|\b(?:St|Dr|Mr|Mrs|Ms|Mt|Ft|Jr|Sr|Prof|Gen|Col|Lt|Capt|Sgt|Rev|Gov|Sen|Rep))\.$")


def sentences(text: str) -> list[str]:
    """A text's sentences: cut after . ! ? ; and at line breaks, not after an initial or an
    abbreviated title ("J. R. R. Tolkien", "St. Louis")."""
    out, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        if "\n" not in end.group() and _ABBREVIATED.search(text, start, end.start()):
            continue
        out.append(text[start : end.start()])
        start = end.end()
    return out + [text[start:]]


def _skipped(cue: Cue, sentence: str, match: re.Match) -> bool:
    """Whether a cue's match is none: a cue word in a title, or after what the cue excludes."""
    if cue.unless_after is not None and cue.unless_after.search(sentence, 0, match.start()):
        return True
    return cue.side != ITSELF and _in_title(sentence, match)


def _in_title(sentence: str, match: re.Match) -> bool:
    """A cue word capitalised inside a sentence belongs to a name, not to the speaker's wording:
    "The Devil's Rejects", "When Flanders Failed", "I Won't Be Home No More"."""
    at_start = not sentence[: match.start()].strip(" \"'“‘(")
    words = re.findall(r"[\w’']+", match.group(0))
    return any(w[0].isupper() and w != "I" for w in words[1 if at_start else 0 :])


def failure_item(sentence: str) -> str:
    """The most specific thing a failure is reported with (error code, exception, HTTP status), or ''."""
    for _, pattern in FAILURE_ITEMS:
        match = pattern.search(sentence)
        if match:
            return " ".join(match.group(0).split())
    return ""


_CLAUSE_END = re.compile(
    r"[,:;()\[\]{}\"]|\b(?:because|since|as|but|and|so|unless|if|when|while|which|that)\b", re.IGNORECASE
)
_LEADING = {
    "the",
    "a",
    "an",
    "any",
    "our",
    "my",
    "your",
    "their",
    "his",
    "her",
    "its",
    "this",
    "that",
    "to",
    "be",
    "with",
    "of",
    "for",
}


def words_after(sentence: str, end: int, limit: int = 4) -> str:
    """Up to `limit` words after a cue, to the clause's end, without leading articles: the
    constrained or rejected thing when no name or amount is written ("must be direct")."""
    rest = sentence[end:]
    stop = _CLAUSE_END.search(rest)
    words = re.findall(r"[\w’'\-]+", rest[: stop.start()] if stop else rest)
    while words and words[0].lower() in _LEADING:
        words.pop(0)
    return " ".join(words[:limit])
