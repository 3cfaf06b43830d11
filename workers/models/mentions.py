"""What the `rules` extractor (workers.models.extraction) reads in a sentence before it makes
facts: values — amounts, dates, times, numbers — read whole, never entities (`values`); the
capitalised spans that may name something (`capitalised_spans`) and those that do
(`naming_mentions`: no first person, no common word a turn opens with); and an entity's type
from its name alone (`type_of`, which also types OpenIE and replayed entities)."""

from __future__ import annotations

import re

from lemminflect import getAllLemmas

from topics.records import VALUE_TYPES
from topics.times import MONTHS
from workers.algorithms import categories

# '+' and '#' right after a word are part of it ('C++', 'C#', 'Google+'): entity ids keep them
_WORD = re.compile(r"[\w][\w'’\-\.&]*[\w][+#]*|[\w][+#]*", re.U)
_CONNECTORS = {"of", "de", "du", "la", "le", "von", "van", "der", "del", "the", "and", "for", "on", "upon"}
_SENTENCE_STARTERS = {
    "the",
    "a",
    "an",
    "in",
    "on",
    "at",
    "it",
    "its",
    "he",
    "she",
    "his",
    "her",
    "they",
    "their",
    "this",
    "these",
    "that",
    "those",
    "there",
    "after",
    "before",
    "during",
    "when",
    "while",
    "as",
    "since",
    "from",
    "by",
    "with",
    "for",
    "of",
    "to",
    "but",
    "and",
    "or",
    "however",
    "also",
    "although",
    "i",
    "we",
    "you",
    "my",
    "our",
    "your",
    "if",
    "then",
    "today",
    "yesterday",
    "tomorrow",
    "following",
    "later",
    "some",
}
_ORG_WORDS = {
    "university",
    "college",
    "school",
    "company",
    "corporation",
    "corp",
    "inc",
    "ltd",
    "llc",
    "institute",
    "party",
    "club",
    "records",
    "band",
    "group",
    "association",
    "council",
    "society",
    "agency",
    "bank",
    "church",
    "army",
    "navy",
    "ministry",
    "department",
    "foundation",
    "academy",
    "museum",
    "press",
    "journal",
    "league",
    "team",
    "fc",
    "union",
    "committee",
    "organization",
    "organisation",
    "network",
}
_LOC_WORDS = {
    "city",
    "river",
    "mountain",
    "mountains",
    "lake",
    "county",
    "island",
    "islands",
    "state",
    "kingdom",
    "republic",
    "ocean",
    "sea",
    "park",
    "street",
    "bridge",
    "province",
    "district",
    "valley",
    "bay",
    "coast",
    "region",
    "town",
    "village",
    "airport",
    "station",
    "road",
    "square",
    "castle",
    "forest",
    "desert",
}
_PERSON_TITLES = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "sir",
    "lord",
    "lady",
    "king",
    "queen",
    "prince",
    "princess",
    "president",
    "saint",
    "st",
    "pope",
    "general",
    "captain",
    "professor",
    "prof",
}


# ---- values: literals, never entities --------------------------------------------------------
# Amounts, percentages, clock times, dates, years, ordinals and numbers are read whole ("3,000
# EUR", "8 September 2024", "10:30 pm", "$45.50") and are no mention: a value qualifies a fact
# (a constraint's amount, a deadline), it is never a node a walk passes through. Read as words
# they were junk entities — "3", "000" and "EUR" from "3,000 EUR", "10" and "30" from "10:30",
# "8" as the tail of "no later than 8 September" — and numbers and years joined every passage
# that happened to share one ("Varn Lighthouse — in — 2010").
MONEY, ERROR = "MONEY", "ERROR"  # types of a trigger fact's tail: an amount, a failure's code / status / exception
DATE, TIME, NUMBER, PERCENT = "DATE", "TIME", "NUMBER", "PERCENT"
assert VALUE_TYPES == {MONEY, DATE, TIME, NUMBER, PERCENT}

_MONTH_NAME = "(?:" + "|".join(m.capitalize() for m in MONTHS) + ")"
_MONTH = rf"(?:{_MONTH_NAME}|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.?)"
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
_NUMERAL = r"\d+(?:[.,]\d+)*"
_VALUES: tuple[tuple[str, str], ...] = (
    (MONEY, categories.AMOUNT.pattern),
    (PERCENT, rf"{_NUMERAL}\s?(?:%|per ?cent\b)"),
    (TIME, r"\d{1,2}:\d{2}(?::\d{2})?(?:\s?[aApP]\.?[mM]\b\.?)?|\d{1,2}\s?[aApP]\.?[mM]\b\.?"),
    (DATE, rf"{_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?\b"),  # 8 September [2024]
    (DATE, rf"{_MONTH}\s+{_DAY}(?:,?\s+\d{{4}})?\b"),  # September 8[th][, 2024]
    (DATE, rf"(?:{_MONTH}\s+)?\d{{4}}s?\b"),  # [May] 2023, the 1990s
    (DATE, _MONTH_NAME + r"\b"),  # a month alone (see `values`: not one next to a name, "Theresa May")
    (NUMBER, rf"{_NUMERAL}(?:st|nd|rd|th)?\b"),
)
_MONTH_ALONE = len(_VALUES) - 2
# a value is no part of a word: not after a letter and a hyphen nor before one ("COVID-19",
# "7-Eleven", "Catch-22"), nor a number's digits before a unit ("1.5m")
_VALUE = re.compile(
    "|".join(
        rf"(?P<v{n}>(?<![\w.,])(?<![^\W\d_]-)(?:{pattern})(?![.,]?\w)(?!-[^\W\d_]))"
        for n, (_, pattern) in enumerate(_VALUES)
    )
)
_WORD_BEFORE, _CAPITAL_AFTER = re.compile(r"([A-Z][\w'’\-]*)\s+$"), re.compile(r"\s+[A-Z]")


def _in_a_name(sentence: str, start: int, end: int) -> bool:
    """Whether the words at start:end stand next to a name's capitalised word (no punctuation
    between): after one that opens no sentence, or before any."""
    before = _WORD_BEFORE.search(sentence[:start])
    return bool(
        before
        and before.group(1).lower() not in _SENTENCE_STARTERS | _CONNECTORS
        or _CAPITAL_AFTER.match(sentence, end)
    )


# a value with the preposition that ties it to a relation: out of the words a relation is named by
VALUE_WITH_PREPOSITION = re.compile(
    r"(?:\b(?:in|on|at|since|until|by|from|of|for|before|after|during|around|than|about)\s+)?(?:" + _VALUE.pattern + ")"
)


def values(sentence: str) -> list[tuple[int, int, str, str]]:
    """The values a sentence states, whole: (start, end, surface, type)."""
    out = []
    for match in _VALUE.finditer(sentence):
        which = int(match.lastgroup[1:])  # type: ignore[index]
        if which == _MONTH_ALONE and _in_a_name(sentence, match.start(), match.end()):
            continue  # "Theresa May", "June Carter": a name ("In June, …": a month)
        kind = _VALUES[which][0]
        surface = " ".join(match.group(0).split()).rstrip(".")
        out.append((match.start(), match.start() + len(match.group(0).rstrip(".")), surface, kind))
    return out


def type_of(name: str) -> str:
    """Entity type from the name alone (the `rules` typer; also types OpenIE entities)."""
    words = name.replace(".", " ").lower().split()
    if not words:
        return "ENTITY"
    whole = _VALUE.fullmatch(name.strip())
    if whole:
        return _VALUES[int(whole.lastgroup[1:])][0]  # type: ignore[index]
    if any(w in _ORG_WORDS for w in words):
        return "ORGANIZATION"
    if any(w in _LOC_WORDS for w in words):
        return "LOCATION"
    if words[0] in _PERSON_TITLES:
        return "PERSON"
    return "ENTITY"


def _is_capital(word: str) -> bool:
    """A word that may open a name: capitalised, or a digit with letters ("3M", "7-Eleven"); a
    number alone is a value ("xxvii,19", ".500" read as names were junk entities)."""
    return word[0].isupper() or word[0].isdigit() and any(c.isalpha() for c in word)


# Punctuation between two capitalised words ends a name: a list ("Helen Hunt, Dan Aykroyd"), a
# place and its region ("Dallas, Texas"), a parenthesis, a quotation, a spaced dash. Not a period
# ("J. R. R. Tolkien", "St. Louis"), an apostrophe, an ampersand ("Procter & Gamble"), a colon
# ("Star Wars: The Force Awakens") or a dash between words ("Austria–Hungary"); nor a comma before
# a name's suffix ("Martin Luther King, Jr.", "Apple, Inc.").
_NAME_BREAK = re.compile(r"[,;()\[\]{}\"“”!?]|\s[–—]|[–—]\s")
_NAME_SUFFIXES = frozenset("jr sr inc ltd llc plc corp co ii iii iv".split())


def capitalised_spans(sentence: str) -> list[tuple[int, int, str]]:
    """Capitalised spans (with inner connectors), values left out: (start, end, surface). A span
    ends at punctuation (_NAME_BREAK), and two names joined by "and" are two spans (_split_and)."""
    taken = [(start, end) for start, end, _, _ in values(sentence)]
    words = [
        (m.start(), m.end(), m.group().rstrip("."))
        if not any(start < m.end() and m.start() < end for start, end in taken)
        else (m.start(), m.end(), "")  # a value's word: no name, and it ends one
        for m in _WORD.finditer(sentence)
    ]

    def joined(a: int, b: int) -> bool:  # no punctuation that ends a name between words a and b
        gap = sentence[words[a][1] : words[b][0]]
        return not _NAME_BREAK.search(gap) or gap.strip() == "," and words[b][2].lower() in _NAME_SUFFIXES

    spans, i = [], 0
    while i < len(words):
        if not words[i][2] or not _is_capital(words[i][2]):
            i += 1
            continue
        j = i + 1
        # a name runs over capitalised words and inner connectors, never over punctuation
        while j < len(words) and words[j][2] and joined(j - 1, j):
            if words[j][2][0].isupper():
                j += 1
            elif (
                words[j][2].lower() in _CONNECTORS
                and j + 1 < len(words)
                and words[j + 1][2][:1].isupper()
                and joined(j, j + 1)
            ):
                j += 2
            else:
                break
        for part in _split_and(words[i:j]):
            while part and part[0][2].lower() in _SENTENCE_STARTERS:
                part = part[1:]
            while part and part[-1][2].lower() in _CONNECTORS:
                part = part[:-1]
            if part:
                start, end = part[0][0], part[-1][1]
                surface = sentence[start:end].rstrip(".")
                if len(surface) > 1 or surface.isdigit():
                    spans.append((start, start + len(surface), surface))
        i = j
    return spans


def _split_and(span: list[tuple[int, int, str]]) -> list[list[tuple[int, int, str]]]:
    """A span's names, split where "and" joins two names of two capitalised words or more and the
    one before has no connector ("Meg Whitman and Rudy Giuliani", "DePatie-Freleng Enterprises
    and United Productions of America"). One name keeps its "and" ("Bosnia and Herzegovina",
    "Only Fools and Horses", "Department of Health and Human Services"), and so do two of one
    word each ("Hiroshima, Kyoto and Nagasaki" leaves "Kyoto and Nagasaki": a list's last two
    are not told from a country's name). In HotpotQA-100's and MuSiQue-100's passages 1,007 of
    28,523 mentions joined two names by "and"."""
    parts: list[list[tuple[int, int, str]]] = []
    current: list[tuple[int, int, str]] = []
    for at, word in enumerate(span):
        if word[2].lower() == "and" and current:
            rest = [w for w in span[at + 1 :] if w[2][:1].isupper()]
            before = [w for w in current if w[2][:1].isupper()]
            if len(before) >= 2 and len(rest) >= 2 and not any(w[2].lower() in _CONNECTORS for w in current):
                parts.append(current)
                current = []
                continue
        current.append(word)
    return parts + [current]


# Words a turn starts with that are no names, capitalised only by their place: interjections
# the verb lexicon lacks. Every other sentence-initial word the lexicon knows (lemminflect: "Wow",
# "Thanks", "Glad", "What", "It's") is dropped from the front of a mention as well. Measured on
# the first LoCoMo dev conversation (419 turns): 18 of its 20 entities of most passages were
# such words ("It's" in 70 turns, "I'm" 66, "What" 46, "Wow Caroline" 34) — hubs joining turns
# by how they begin, which PPR spread along.
_INTERJECTIONS = frozenset(
    "yeah yep yup hey hi hello oh ooh aw aww wow congrats haha hahaha hmm lol omg ok yay ugh btw".split()
)
# ... and those that are no name alone or before punctuation ("Bye!", "Bye, Caroline", "Nope,"),
# but may open one ("Bye Bye Birdie", "Goodbye Yellow Brick Road"): not openers
_FAREWELLS = frozenset("bye goodbye nope nah".split())
_FIRST_PERSON = frozenset({"i", "i'm", "i've", "i'll", "i'd", "i’m", "i’ve", "i’ll", "i’d"})


def _base(word: str) -> str:
    """A word lowercased, without what follows an apostrophe ("It's" → "it")."""
    return re.split(r"['’]", word.lower(), maxsplit=1)[0]


def _common_word(word: str) -> bool:
    """A word of the language, not a name: an interjection, a contraction of a common word
    ("It's", "That's", "I'm"), or a word the lexicon knows in any part of speech."""
    base = _base(word)
    return base in _INTERJECTIONS or base in _FAREWELLS or base in _SENTENCE_STARTERS or bool(getAllLemmas(base))


# Greetings and reactions a turn opens with before a name ("Thanks, Caroline", "Wow Mel"):
# dropped from the front of a longer mention; any other common first word stays in one ("New
# York", "Grace Hopper", "United States" open Wikipedia sentences).
_OPENERS = _INTERJECTIONS | frozenset(
    "thanks thank congratulations glad sorry yes no well so great awesome nice good love "
    "what how why where who when cool sure right okay".split()
)


def _opening_word(sentence: str, words: list[tuple[int, int]]) -> bool:
    """Whether the first of a sentence-opening mention's words is no part of a name: the
    mention's only word and a common one ("It's", "What", "Glad"), an opener ("Thanks"), or a
    common word set off by punctuation ("Wow, Caroline")."""
    word = sentence[words[0][0] : words[0][1]]
    if not _common_word(word):
        return False
    if len(words) == 1:
        return True
    return _base(word) in _OPENERS or bool(re.search(r"[^\w\s]", sentence[words[0][1] : words[1][0]]))


def naming_mentions(sentence: str, mentions: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The mentions that name something: a first-person word is never a name, and a mention that
    opens its sentence loses its leading common words ("Wow Caroline" → "Caroline", "It's" →
    nothing); inside a sentence a capitalised common word is kept ("my dog Biscuit")."""
    out = []
    opening = re.search(r"\w", sentence)
    first = opening.start() if opening else 0
    for start, end, surface in mentions:
        words = [(start + m.start(), start + m.end()) for m in _WORD.finditer(surface)]
        at_start = start == first
        while words and (
            sentence[words[0][0] : words[0][1]].lower() in _FIRST_PERSON or at_start and _opening_word(sentence, words)
        ):
            words = words[1:]
        if words:
            new_start = words[0][0]
            text = sentence[new_start:end].rstrip(".")
            if len(text) > 1 or text.isdigit():
                out.append((new_start, new_start + len(text), text))
    return out


# ---- a turn's tags (MRAgent's cue → tag → content) ---------------------------------------------

TAG_MIN_LETTERS = 3  # "dog", "art", "job"; shorter ones are function words the lexicon lists as nouns
_TAG_WORD = re.compile(r"[A-Za-z](?:[a-z\-]*[a-z])?")  # one letter too: "a" before a noun counts
_NOT_TAGS = (
    _INTERJECTIONS
    | _OPENERS
    | frozenset(
        """thing things something anything everything nothing someone anyone everyone lot lots bit kind
        sort way time times day days today tonight tomorrow yesterday week weeks weekend month months
        year years while moment bunch couple one ones""".split()
    )
    | frozenset(
        """i me my mine myself you your yours yourself yourselves he him his himself she her hers herself
        it its itself we us our ours ourselves they them their theirs themselves this that these those
        all some any other others such each both many much few several another either neither none
        which what who whom whose whatever""".split()
    )
)
# a word the lexicon reads as a noun and a verb is a noun after these ("my dog", "for support");
# not after "that", a pronoun as often as a determiner in a turn ("that sounds great")
_NOUN_AFTER = frozenset(
    """a an the my your his her its our their this these those some any no every each another
    of for with about in on at from by into""".split()
)
# the verbs whose -ing form says nothing of a topic ("doing", "going", "feeling")
_LIGHT_VERBS = frozenset(
    """be do have go get make take come feel find help work look say think try keep give see know want
    need put let mean tell talk use start stay happen seem call ask wait hope plan""".split()
)


def _is_tag(word: str, previous: str) -> bool:
    """Whether `word` (lowercase, in a sentence after `previous`) names a topic: a noun, a noun
    that is also a verb only after a determiner or a preposition, a gerund of a verb that is not
    a light one ("hiking", "painting"); never a word that can be an adjective, an adverb or an
    auxiliary ("tough", "home", "can")."""
    lemmas = getAllLemmas(word)
    if not lemmas or {"ADJ", "ADV", "AUX"} & set(lemmas):
        return False
    nouns, verbs = lemmas.get("NOUN"), lemmas.get("VERB")
    if word.endswith("ing") and verbs and verbs[0] not in _LIGHT_VERBS:
        return True
    return bool(nouns) and (not verbs or previous in _NOUN_AFTER)


def turn_tags(text: str, taken: set[str]) -> list[str]:
    """A turn's tags (MRAgent's cue → tag → content): its lowercase words that name a topic
    (_is_tag), as written — a name the passage holds, as a grounded extractor's must be; the
    similarity bridges join "painting" and "paintings" — so turns about the same thing share a
    node across sessions where a turn names no one ("I took up pottery"). Never a name (a
    capitalised word: mentions read those), an interjection, a pronoun or a word of time
    ("week", "yesterday": the time cue reads those); none in `taken` (lowercased names the
    turn already holds)."""
    tags: dict[str, None] = {}
    previous = ""
    for match in _TAG_WORD.finditer(text):
        word = match.group()
        if (
            word.islower()
            and len(word) >= TAG_MIN_LETTERS
            and word not in _NOT_TAGS
            and word not in taken
            and _is_tag(word, previous)
        ):
            tags[word] = None
        previous = word.lower()
    return list(tags)
