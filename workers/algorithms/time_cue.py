"""Time as a cue (pure): what a question says about time, and which conversation turns answer
to it. Two cues, both read off the question's words (no model):

- **A when-question** ("When did Caroline go to the support group?", "How long ago…", "What
  year…") is answered by a turn that says when — "yesterday", "last Friday", "in 2022", "two
  weeks ago" — more often than by a turn that only shares its words.
- **A named period** ("in May 2023", "in June", "during 2022") points at turns said in it (their
  `ts`, which a session date sets) or naming it.

`matches` says which turns meet the question's cues; the engine raises their scores in the
graph modes (RetrievalParams.time_weight). Passages that are not turns (no `ts`) are never
raised: a document's dates are facts about its subject, not about when it was said."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from topics.times import MONTH_PATTERN, MONTHS

_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_YEAR = r"(?:1[89]\d\d|20\d\d)"
_NUMBER = r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a few|few|several|couple of|a couple of)"
_UNIT = r"(?:day|week|weekend|month|year|night|morning|evening|summer|winter|spring|fall|autumn)s?"

# The question asks for a time: its first clause opens with one of these.
_WHEN_QUESTION = re.compile(
    r"^\W*(?:when\b|since when\b|how long ago\b|how long has\b|how long have\b|how long did\b|"
    r"what (?:date|day|year|month|time|week|weekend)\b|which (?:date|day|year|month|week|weekend)\b|"
    r"in (?:what|which) (?:year|month)\b)",
    re.I,
)

# A turn that says when something happened or will.
_SAYS_WHEN = re.compile(
    rf"\b(?:yesterday|today|tonight|tomorrow|recently|ago|"
    rf"(?:last|next|this|past|coming|previous) (?:{_UNIT}|{_WEEKDAY}|{MONTH_PATTERN})|"
    rf"{_NUMBER} {_UNIT} (?:ago|back|later|before|from now)|"
    rf"the other (?:day|week|night)|(?:on|in|since|until|by|during) (?:{_WEEKDAY}|{MONTH_PATTERN}|{_YEAR})|"
    rf"{MONTH_PATTERN} \d{{1,2}}(?:st|nd|rd|th)?\b|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{MONTH_PATTERN}|{_YEAR})\b",
    re.I,
)

# A period a question names: "in May 2023", "May 2023", "in June", "in 2022".
_MONTH_YEAR = re.compile(rf"\b({MONTH_PATTERN})\.?,? ({_YEAR})\b", re.I)
_IN_MONTH = re.compile(rf"\b(?:in|during|of|last|this) ({MONTH_PATTERN})\b", re.I)
_IN_YEAR = re.compile(rf"\b(?:in|during|of) ({_YEAR})\b", re.I)


def _month_number(word: str) -> int:
    word = word.lower()[:3]
    return next(i for i, name in enumerate(MONTHS, 1) if name.startswith(word))


@dataclass(frozen=True)
class Period:
    """A month of a year, a month of any year (year None) or a whole year (month None)."""

    year: int | None
    month: int | None

    def holds(self, moment: datetime) -> bool:
        return (self.year is None or moment.year == self.year) and (self.month is None or moment.month == self.month)

    def named_in(self, text: str) -> bool:
        """Whether the text names this period: its month's name (and year, when both are given)."""
        lowered = text.lower()
        if self.month is not None and not re.search(rf"\b{MONTHS[self.month - 1][:3]}", lowered):
            return False
        return self.year is None or str(self.year) in lowered


@dataclass(frozen=True)
class TimeCue:
    asks_when: bool
    periods: tuple[Period, ...]

    def __bool__(self) -> bool:
        return self.asks_when or bool(self.periods)


def time_cue(question: str) -> TimeCue:
    """The cues a question gives (falsy when none)."""
    periods: list[Period] = []
    spans: list[tuple[int, int]] = []
    for match in _MONTH_YEAR.finditer(question):
        periods.append(Period(int(match.group(2)), _month_number(match.group(1))))
        spans.append(match.span())
    for pattern, make in (
        (_IN_MONTH, lambda m: Period(None, _month_number(m.group(1)))),
        (_IN_YEAR, lambda m: Period(int(m.group(1)), None)),
    ):
        for match in pattern.finditer(question):
            if not any(start <= match.start(1) < end for start, end in spans):
                if (
                    match.group(1).lower() == "may"
                    and pattern is _IN_MONTH
                    and not match.group(0).lower().startswith(("in", "during"))
                ):
                    continue  # "of may" / "this may" as a verb is too rare to read as a month
                periods.append(make(match))
    return TimeCue(bool(_WHEN_QUESTION.match(question)), tuple(dict.fromkeys(periods)))


def says_when(text: str) -> bool:
    """Whether a turn's text says when something happened (a date, a weekday, "last week")."""
    return bool(_SAYS_WHEN.search(text or ""))


def matches(cue: TimeCue, text: str, ts: float | None) -> bool:
    """Whether a turn (its text and `ts`, seconds since the epoch) meets the question's cue: it
    was said in, or names, a period the question names; or, for a when-question that names no
    period, it says when. Never a passage without `ts` (not a turn)."""
    if not cue or ts is None:
        return False
    if cue.periods:
        moment = datetime.fromtimestamp(ts, tz=timezone.utc)
        return any(p.holds(moment) or p.named_in(text or "") for p in cue.periods)
    return says_when(text)


def time_boost(scores: list[tuple[str, float]], matched: set[str], weight: float) -> list[tuple[str, float]]:
    """Each matched passage's score × (1 + weight), re-sorted best first (ties keep their order)."""
    if weight <= 0 or not matched:
        return scores
    return sorted(
        ((pid, score * (1.0 + weight) if pid in matched else score) for pid, score in scores), key=lambda x: -x[1]
    )
