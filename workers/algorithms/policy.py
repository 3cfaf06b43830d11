"""Conflict policy (pure): relation cardinality, time spans, and the deterministic offline
adjudication of a conflict group.

A conflict group is every fact with one head and one single-valued relation. Adjudication is a
function of the group's content only (support, document version, time spans, granularity
paths), so the end state does not depend on the order facts arrived in."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

# Relations whose head and tail may be swapped without changing the fact: the contract's, since a
# candidate fact's partition key depends on them (topics.records.candidate_key)
from topics.contract import SYMMETRIC_RELATIONS  # noqa: F401  (re-exported)

# Relations that put one place or thing inside another (granularity).
CONTAINMENT_RELATIONS = frozenset(
    {"part of", "located in", "situated in", "lie in", "in", "within", "subdivision of", "district of", "borough of"}
)

MIN_MULTI_HEADS = 2
MULTI_HEAD_SHARE = 0.25
# Fact categories whose facts never compete for a relation's single value, and so never join a
# conflict group: a speaker rejects many options, a tool fails many times. Judged as a group,
# "Ana rejected Miami" lost to "Ana rejected US" (one head, two tails: single-valued) and the
# memory forgot the refusal. Hard constraints do compete: a new budget replaces the old one.
UNCONTESTED_CATEGORIES = frozenset({"REJECTED_OPTION", "TOOL_FAILURE"})
# The decision trace: a budget, a refusal or a failed tool call binds when said once. τ denoises
# the topics of a corpus (a schema seen in one passage may be noise); an agent whose memory parks
# "we must not exceed 3,000 USD" until it is said again repeats the mistake. Only a *stated*
# fact of these categories passes the gate at once (Triple.stated: the rules extractor's trigger
# fact, an LLM-categorised fact): the facts that merely share its sentence ("4 return HTTP",
# "USD of the budget of 3") wait for τ like any other — admitting them too took the memory-tax
# context from 83 to 317 tokens.
TRACE_CATEGORIES = frozenset({"HARD_CONSTRAINT", "REJECTED_OPTION", "TOOL_FAILURE"})


def needs_no_tau(triple) -> bool:
    """A stated fact of the decision trace: admitted without waiting for its schema's τ."""
    return triple.stated and triple.category in TRACE_CATEGORIES


def is_multi_valued(heads_seen: int, heads_with_many_tails: int) -> bool:
    """A relation is multi-valued once at least 2 heads, and at least 25% of the heads seen
    with it, have two or more distinct tails."""
    return heads_with_many_tails >= MIN_MULTI_HEADS and heads_with_many_tails >= MULTI_HEAD_SHARE * heads_seen


_DATE = re.compile(r"^\s*(-?\d{1,4})(?:-(\d{1,2}))?(?:-(\d{1,2}))?")


def parse_time(value: str | None, end: bool = False) -> tuple[int, int, int] | None:
    """'1998' / '1998-05' / '1998-05-17' → a comparable (y, m, d); a missing part is the start
    of its period, or its end when end=True. Anything else → None."""
    if not value:
        return None
    m = _DATE.match(str(value))
    if not m:
        return None
    year = int(m.group(1))
    month = int(m.group(2)) if m.group(2) else (12 if end else 1)
    day = int(m.group(3)) if m.group(3) else (31 if end else 1)
    return (year, month, day)


def has_span(valid_from: str | None, valid_to: str | None) -> bool:
    return parse_time(valid_from) is not None or parse_time(valid_to, end=True) is not None


def spans_overlap(a_from, a_to, b_from, b_to) -> bool:
    """Closed intervals; an open end reaches to the beginning or end of time."""
    lo = (-(10**9), 0, 0)
    hi = (10**9, 0, 0)
    a0, a1 = parse_time(a_from) or lo, parse_time(a_to, end=True) or hi
    b0, b1 = parse_time(b_from) or lo, parse_time(b_to, end=True) or hi
    return a0 <= b1 and b0 <= a1


@dataclass(frozen=True)
class GroupFact:
    id: str
    tail_id: str
    support: int  # distinct supporting passages
    # when a document that still says it first said it (system time: the detector's, as a
    # document's passage first supported it); an edit of the document elsewhere moves nothing
    said_at: float
    valid_from: str | None = None
    valid_to: str | None = None
    passage_ids: tuple[str, ...] = ()

    @property
    def stated_at(self) -> tuple[float, str]:
        """When the fact holds from, and how that is known: the time its text gives (its
        valid_from: "moved to Lindqvist in 2021"), else when it was first said (`said_at`;
        "" names it: a system time, which no reason quotes, so a rebuild tells the same)."""
        given = parse_time(self.valid_from)
        if given is not None:
            try:
                return datetime(*given, tzinfo=timezone.utc).timestamp(), str(self.valid_from)
            except ValueError:  # no such day ("2021-02-31"): as if the text gave none
                pass
        return self.said_at, ""


@dataclass(frozen=True)
class Decision:
    status: str  # active | invalid
    kind: str  # "" (no conflict) | mutual_exclusion | temporal | granularity
    reason: str
    qualifiers: dict = field(default_factory=dict)
    evidence: tuple[str, ...] = ()  # passage ids the decision relies on
    excluded_by: str = ""  # an invalid fact's: the fact that excluded it


def rank_key(f: GroupFact):
    """More support first; tie: the later statement (GroupFact.stated_at: the time its text gives,
    else when a document still saying it first said it), then id. Never when a version was
    published: a typo fixed in an old document made its claim the newer one."""
    return (-f.support, -f.stated_at[0], f.id)


def _why_first(kept: GroupFact, excluded: GroupFact) -> str:
    """Why `kept` ranks above `excluded` (rank_key), for the excluded fact's reason."""
    support = f"{kept.support} vs {excluded.support} supporting passages"
    if kept.support != excluded.support:
        return support
    (kept_at, kept_text), (excluded_at, excluded_text) = kept.stated_at, excluded.stated_at
    if kept_at == excluded_at:
        return f"{support}, stated at the same time: the smaller id"
    if kept_text and excluded_text:
        return f"{support}, the later time its text gives: {kept_text} vs {excluded_text}"
    if not kept_text and not excluded_text:
        return f"{support}, first said later by a document that still says it"
    said = "when it was first said"
    return f"{support}, stated later: {kept_text or said} vs {excluded_text or said}"


def adjudicate(facts: list[GroupFact], broader: Callable[[str, str], bool]) -> dict[str, Decision]:
    """Decide every fact of a conflict group. `broader(a, b)`: memory holds a containment path
    from entity b up to entity a (a is broader than b)."""

    def temporal(f: GroupFact, g: GroupFact) -> bool:
        return (
            has_span(f.valid_from, f.valid_to)
            and has_span(g.valid_from, g.valid_to)
            and not spans_overlap(f.valid_from, f.valid_to, g.valid_from, g.valid_to)
        )

    def granular(f: GroupFact, g: GroupFact) -> bool:
        return broader(f.tail_id, g.tail_id) or broader(g.tail_id, f.tail_id)

    kept: list[GroupFact] = []
    decisions: dict[str, Decision] = {}
    for f in sorted(facts, key=rank_key):
        blocker = next((k for k in kept if not (temporal(f, k) or granular(f, k))), None)
        if blocker is not None:
            decisions[f.id] = Decision(
                "invalid",
                "mutual_exclusion",
                f"excluded by {blocker.id} ({_why_first(blocker, f)})",
                evidence=blocker.passage_ids + f.passage_ids,
                excluded_by=blocker.id,
            )
        else:
            kept.append(f)
    for f in kept:
        others = [k for k in kept if k.id != f.id]
        qualifiers: dict[str, dict[str, Any]] = {}  # "time": its span; "scope": the facts it is narrower/broader than
        kinds, evidence = [], list(f.passage_ids)
        if any(temporal(f, k) for k in others):
            qualifiers["time"] = {"from": f.valid_from, "to": f.valid_to}
            kinds.append("temporal")
        narrower_than = sorted(k.id for k in others if broader(k.tail_id, f.tail_id))
        broader_than = sorted(k.id for k in others if broader(f.tail_id, k.tail_id))
        if narrower_than or broader_than:
            qualifiers["scope"] = {"narrower_than": narrower_than, "broader_than": broader_than}
            kinds.append("granularity")
        for k in others:
            evidence.extend(k.passage_ids)
        kind = "+".join(kinds)
        reason = {
            "": "no conflict",
            "temporal": "non-overlapping time spans",
            "granularity": "one tail contains the other",
        }.get(kind, kind)
        decisions[f.id] = Decision("active", kind, reason, qualifiers, tuple(dict.fromkeys(evidence)) if kinds else ())
    return decisions
