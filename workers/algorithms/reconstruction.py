"""Active reconstruction, the pure parts (no I/O): recall step by step as a person does — cues
(the entities and times the query names, its attribute words; later the entities of what was
read, and episodes: a conversation turn read recalls its session's neighbouring turns) → tags
(a cue's facts, and its passages: those mentioning its entity, the query's nearest, an
episode's turns) → content (a fact's evidence passages, or the passage) → new cues from that
content (the reverse step) — until the evidence suffices or a budget is spent. The walk with
its reads is workers.query.reconstruct_walk (the mode: workers.query.reconstruct); here are the
cue extraction, the branch scores (with the episode tie-break), the budget accounting and the
stop rule it applies.

A branch is (cue → tag), the tag a fact or a passage. Its score is the cosine between the query
and the branch's chain — the texts that led to the cue and this tag, as one text ("The Silent
Orchard written by Mara Kellen; Mara Kellen born in Tromsø") — plus a bonus when it matches a
time of the query. The chain, not the tag alone, because a second-hop fact shares little with the question: with
all-MiniLM-L6-v2, "Mara Kellen born in Tromsø" is at 0.21 from "Where was the author of The
Silent Orchard born?", the chain above at 0.63, the chains through the book's other facts at
0.54–0.60. A first-hop branch's chain is its fact, whose vector the facts index already holds."""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable

import numpy as np

from topics import BadInput
from topics.contract import quoted_names
from topics.times import MONTH_PATTERN, MONTHS
from workers.algorithms.normalize import UnnamedEntity, entity_id
from workers.algorithms.retrieval import cosines

# ---- the budget ------------------------------------------------------------------------------
# What a request may ask for: each bounds one request's reads (a step is two fact KNNs per new
# cue and the passages of one fact).
BUDGET_RANGES = {"steps": (1, 32), "passages": (1, 100), "tokens": (1, 100_000)}


@dataclass(frozen=True)
class Budget:
    """How much a walk may read: steps (branches taken), passages and their tokens (as the chunker
    counts them). None: the query worker's default (DEFAULT_BUDGET, or its settings)."""

    steps: int | None = None
    passages: int | None = None
    tokens: int | None = None

    @classmethod
    def from_json(cls, body) -> "Budget":
        """A request's "budget" object; ValueError naming the field for anything else."""
        if not isinstance(body, dict):
            raise BadInput("'budget' must be an object with any of steps, passages, tokens")
        unknown = sorted(set(body) - set(BUDGET_RANGES))
        if unknown:
            raise BadInput(f"unknown budget field(s) [{quoted_names(unknown)}]; known: {sorted(BUDGET_RANGES)}")
        for name, value in body.items():
            low, high = BUDGET_RANGES[name]
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise BadInput(f"budget {name!r} must be an integer from {low} to {high}")
        return cls(**body)

    def over(self, defaults: "Budget") -> "Budget":
        """This budget with its unset fields taken from `defaults`."""
        return Budget(
            **{
                f.name: getattr(defaults, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
                for f in fields(self)
            }
        )

    def check(self) -> "Budget":
        """A complete budget inside BUDGET_RANGES (a worker's settings), else ValueError."""
        Budget.from_json(asdict(self))
        return self

    def limits(self) -> tuple[int, int, int]:
        """(steps, passages, tokens) of a complete budget — a walk's, taken over its defaults — else ValueError."""
        steps, passages, tokens = self.steps, self.passages, self.tokens
        if steps is None or passages is None or tokens is None:
            raise ValueError(f"{self} is incomplete: a walk's budget is taken over its defaults (Budget.over)")
        return steps, passages, tokens


# Six steps: with temporal contiguity (episode cues) the walk needs the steps to read a turn and
# then its reply — on the conversation benchmark R@5 / R@10 overall 66.9 / 76.9 and multi-hop
# 64.4 / 83.3 at 4 steps, 69.2 / 77.5 and 67.4 / 81.1 at 5, 69.2 / 81.0 and 67.4 / 83.3 at 6,
# 69.2 / 80.8 and 67.4 / 82.6 at 7 (dense: 64.1 / 75.5, multi-hop 64.4 / 87.9). Without episode
# cues more steps gain nothing (6 steps: 64.1 / 74.8, multi-hop 64.4 / 81.1).
DEFAULT_STEPS, DEFAULT_PASSAGES, DEFAULT_TOKENS = 6, 8, 2000
DEFAULT_BUDGET = Budget(steps=DEFAULT_STEPS, passages=DEFAULT_PASSAGES, tokens=DEFAULT_TOKENS)


@dataclass
class Spent:
    steps: int = 0
    passages: int = 0
    tokens: int = 0


def admit(budget: Budget, spent: Spent, passage_tokens: list[int]) -> int:
    """How many of these passages, in order, the budget still has room for (their count and
    tokens); a passage that does not fit ends the admission (the order is the evidence's)."""
    _, max_passages, max_tokens = budget.limits()
    passages, tokens, n = spent.passages, spent.tokens, 0
    for count in passage_tokens:
        if passages + 1 > max_passages or tokens + count > max_tokens:
            break
        passages, tokens, n = passages + 1, tokens + count, n + 1
    return n


def exhausted(budget: Budget, spent: Spent) -> str | None:
    """The budget a walk has spent ('steps', 'passages', 'tokens'), or None."""
    max_steps, max_passages, max_tokens = budget.limits()
    if spent.steps >= max_steps:
        return "steps"
    if spent.passages >= max_passages:
        return "passages"
    if spent.tokens >= max_tokens:
        return "tokens"
    return None


# ---- cues from the query -----------------------------------------------------------------------
STOPWORDS = frozenset(
    "a about above after again against all am an and any are as at be because been before being below between both but by "
    "can could did do does doing down during each few for from further had has have having he her here hers herself him "
    "himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or other "
    "our ours ourselves out over own same she should so some such than that the their theirs them themselves then there "
    "these they this those through to too under until up very was we were what when where which while who whom why will "
    "with would you your yours yourself yourselves did does tell know said say says ever also".split()
)
# the longest first: "8 May, 2023" before "May 2023" before "2023"
_TIME = re.compile(
    r"\b(?:\d{4}-\d{2}(?:-\d{2})?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?\s+{MONTH_PATTERN}\.?,?\s+\d{{4}}"
    rf"|{MONTH_PATTERN}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}"
    rf"|{MONTH_PATTERN}\.?,?\s+\d{{4}}"
    rf"|{MONTH_PATTERN}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?"
    r"|(?:1[0-9]|20)\d{2}s?"
    rf"|{MONTH_PATTERN})\b",
    re.I,
)
_MONTH_WORDS = frozenset(MONTHS) | {m[:3] for m in MONTHS} | {"sept"}
_WORD = re.compile(r"[^\W_]+(?:['’.\-+#][^\W_]+)*[+#]*", re.U)
MAX_MENTION_WORDS = 6
MAX_MENTIONS = 512  # candidate spans looked up per query (a 4,096-character query has ~700 words)


@dataclass(frozen=True)
class Mention:
    text: str
    start: int  # word index of its first word in the query
    end: int  # one past its last word
    entity_id: str


def mention_candidates(query: str) -> list[Mention]:
    """Every span of up to MAX_MENTION_WORDS words that could name an entity — not only stop
    words — with its entity id (workers.algorithms.normalize.entity_id: the id the extractor
    gives the same name); longest first, then in query order; at most MAX_MENTIONS."""
    words = [m for m in _WORD.finditer(query)]
    out, seen = [], set()
    for n in range(min(MAX_MENTION_WORDS, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            span = words[i : i + n]
            if all(w.group().lower() in STOPWORDS for w in span):
                continue
            text = query[span[0].start() : span[-1].end()]
            try:
                eid = entity_id(text)
            except UnnamedEntity:
                continue
            if (eid, i) not in seen:
                seen.add((eid, i))
                out.append(Mention(text, i, i + n, eid))
            if len(out) >= MAX_MENTIONS:
                return out
    return out


def choose_mentions(candidates: list[Mention], known: dict[str, str]) -> list[tuple[Mention, str]]:
    """The spans that name an entity of the memory (`known`: candidate entity id → the memory's
    entity id, aliases resolved), longest first, none overlapping a longer one: "The Silent
    Orchard" wins over "Orchard". Pairs of (mention, memory entity id), in query order."""
    taken: list[tuple[Mention, str]] = []
    covered: set[int] = set()
    for m in candidates:  # longest first
        if m.entity_id in known and not covered & set(range(m.start, m.end)):
            taken.append((m, known[m.entity_id]))
            covered |= set(range(m.start, m.end))
    return sorted(taken, key=lambda pair: pair[0].start)


CONTRACTION_ENDS = frozenset({"s", "m", "re", "ve", "ll", "d", "t"})  # I'm, That's, You're, I've, We'll, I'd, don't


def names_something(entity_id: str) -> bool:
    """Whether an entity id is a name, not only stop words and contraction endings: a rules
    extractor takes any capitalised word at the start of a sentence ("How's", "I'm", "What"),
    and such an "entity" links every passage that starts that way — no cue to follow."""
    return any(part not in STOPWORDS and part not in CONTRACTION_ENDS for part in entity_id.split("_") if part)


def time_expressions(query: str) -> list[str]:
    """The times a query names ("8 May, 2023", "May 2023", "2023-05", "1998", "May"), as written."""
    found = (m.group() for m in _TIME.finditer(query))
    # a month name alone only capitalised: "may" and "march" are verbs too
    return list(dict.fromkeys(t for t in found if not (t.lower().rstrip(".") in _MONTH_WORDS and t[0].islower())))


def time_keys(times: list[str]) -> frozenset[str]:
    """What a text must contain to mention one of these times: its years and full month names,
    lower case ("8 May, 2023" → {"2023", "may"})."""
    keys = set()
    for text in times:
        lowered = text.lower()
        keys.update(re.findall(r"\b(?:1[0-9]|20)\d{2}\b", lowered))
        keys.update(month for month in MONTHS if re.search(rf"\b{month[:3]}", lowered))
    return frozenset(keys)


def mentions_time(text: str, keys: frozenset[str]) -> bool:
    lowered = text.lower()
    return any(re.search(rf"\b{re.escape(key)}\b", lowered) for key in keys)


def attribute_words(query: str, mentions: list[Mention], times: list[str]) -> list[str]:
    """The query's remaining content words — neither stop words, nor part of an entity mention
    or a time — lower case, in order: what the question asks about the cues ("author", "born")."""
    covered = {i for m in mentions for i in range(m.start, m.end)}
    time_words = {w.lower() for t in times for w in _WORD.findall(t)}
    out = []
    for i, w in enumerate(_WORD.finditer(query)):
        word = w.group().lower()
        if (
            i not in covered
            and word not in STOPWORDS
            and word not in time_words
            and len(word) > 1
            and not word.isdigit()
        ):
            out.append(word)
    return list(dict.fromkeys(out))


# ---- cues, branches, the router's scores and the stop rule ----------------------------------------
@dataclass(frozen=True)
class Cue:
    kind: str  # "entity" | "time" (an entity the query names), "query" (the query's attributes: facts nearest it, whatever their entities),
    #            "episode" (a turn read: its session's neighbouring turns)
    id: str  # the entity id ("" for the query cue; "episode:<session id>:<turn>" for an episode)
    name: str
    score: float  # 1.0 for a name in the query; a similarity for one found by KNN
    hop: int  # 0: from the query; n: from content read at hop n - 1
    origin: str  # "query", "entity-knn", "fact:<id>", "passage:<id>"
    chain: str = ""  # the facts that led here, as one text ("" for a query cue)
    # the chain as a vector: the sum of its links' unit vectors (None for a query cue), so the
    # next link's chain is scored without the model (chain_cosines)
    chain_vector: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Branch:
    """(cue → tag): a fact linked to the cue's entity (head or tail; for the query cue one nearest
    the query), or a passage — one that mentions the cue's entity, for the query cue one of the
    dense ranking's top, for an episode cue one of the neighbouring turns of the turn read."""

    cue: Cue
    kind: str  # "fact" | "passage"
    tag_id: str  # the fact id or the passage id
    text: str  # the fact as "head relation tail"; the passage's text
    leads_to: tuple[
        str, ...
    ]  # entities it leads to: a fact's other end (both from the query cue); a passage's, known once read: ()
    passage_ids: tuple[str, ...]  # what taking it reads: a fact's evidence; the passage itself
    tag_score: float  # cosine of the fact or passage alone to the query (its index's)
    chain_score: float  # cosine of `chain` to the query
    score: float  # what the router ranks by (branch_score)

    @functools.cached_property
    def key(self) -> str:
        """The branch's name among the open ones, and the id the LLM router answers with (read
        ~40 times a branch by a walk's filtering and ranking: made once)."""
        return f"{self.kind}:{self.tag_id}"

    @property
    def chain(self) -> str:
        return chain_text(self.cue.chain, chain_part(self.text) if self.kind == "passage" else self.text)


TIME_BONUS = 0.1  # a branch that mentions a time the query names
STOP_MARGIN = 0.25  # stop when the best open branch scores this much below the best taken


CHAIN_PART_CHARS = 300  # of a passage in a chain: two or three turns fit the embedder's 256 word pieces


def chain_text(chain: str, tag_text: str) -> str:
    return f"{chain}; {tag_text}" if chain else tag_text


def chain_part(passage_text: str) -> str:
    """A passage as a link of a chain: its first CHAIN_PART_CHARS characters, so that a long
    passage does not push the rest of the chain out of what the embedder reads."""
    return (
        passage_text
        if len(passage_text) <= CHAIN_PART_CHARS
        else passage_text[:CHAIN_PART_CHARS].rsplit(" ", 1)[0] + " …"
    )


def branch_score(chain_score: float, text: str, keys: frozenset[str], cue: Cue | None = None) -> float:
    """The chain's cosine, plus TIME_BONUS when the tag mentions a time of the query; past the
    first hop no more than the score of the branch whose content raised the cue. The cap, because
    a chain inherits the relevance of the texts that led to it: on the conversation benchmark a
    junk hop ("How's the robotics club?; That's amazing! How's the training going?") scored 0.59,
    above both its links (0.48, 0.24), and such hops pushed the dense ranking's answers out of the
    top 5 (R@5 61.3 against dense 64.1 without the cap and names_something, 64.1 with both)."""
    score = chain_score + (TIME_BONUS if keys and mentions_time(text, keys) else 0.0)
    return min(score, cue.score) if cue is not None and cue.hop else score


EPISODE_LAG_COST = (
    0.001  # an episode branch, per turn of distance beyond the adjacent one; half of it for a turn before
)


def episode_score(score: float, lag: int) -> float:
    """An episode branch's score: its branch_score (the chain through the turn read, capped by the
    branch that read it), less EPISODE_LAG_COST per turn of `lag` (the neighbour's turn minus the
    turn read) beyond ±1 and half of it more for a turn before — nearer first, and forward before
    backward, as in free recall, where a recalled item brings back its successor more often than
    its predecessor; in a conversation the next turn is the reply. Mostly a tie-break: the chain of
    a relevant turn and any neighbour often reaches the cap, and with equal scores the walk went by
    passage id — on the conversation benchmark backwards through a session (turns 8, 7, 6 from
    9), pushing the answer (turn 11) out of the top 5: R@5 overall 64.1, single hop 65.4 with
    equal scores, 66.9 and 73.1 with this order (4 steps; dense 64.1 and 73.1). A discount that
    is more than a tie-break loses the neighbours to the dense ranking's tail (×0.95: 62.7)."""
    return score - EPISODE_LAG_COST * (abs(lag) - 1 + (0.5 if lag < 0 else 0))


def adds_something(branch: Branch, taken: set[str], read: set[str], cues: set[str]) -> bool:
    """Whether taking the branch would add anything: a branch not taken yet that brings a passage
    not read yet or an entity not yet a cue. One that adds nothing is dropped, never taken.
    (Set comparisons where generators were: every open branch is asked at every step.)"""
    return branch.key not in taken and (not read.issuperset(branch.passage_ids) or not cues.issuperset(branch.leads_to))


def ranked(branches) -> list[Branch]:
    """Best first; equal scores by key (the order must not depend on how they were found)."""
    return sorted(branches, key=_rank)


def best(branches) -> Branch | None:
    """ranked(branches)[0] without sorting them all (None: no branch)."""
    return min(branches, key=_rank, default=None)


def _rank(branch: Branch) -> tuple[float, str]:
    """A branch's place in ranked and best: higher score first; equal scores by key."""
    return (-branch.score, branch.key)


@dataclass(frozen=True)
class Stop:
    reason: str  # "exhausted" | "below_threshold" | "budget" | "router"
    detail: str


def similarity_choice(
    open_branches: Iterable[Branch], best_taken: float | None, margin: float = STOP_MARGIN
) -> Branch | Stop:
    """The similarity router: the best-scored open branch, unless it scores `margin` below the best
    branch taken so far (what is left leads away from the question: the evidence suffices)."""
    top = best(open_branches)
    if top is None:
        return Stop("exhausted", "no open branch adds a fact, passage or cue")
    if best_taken is not None and top.score < best_taken - margin:
        return Stop(
            "below_threshold", f"best open branch {top.score:.3f} < best taken {best_taken:.3f} - margin {margin:g}"
        )
    return top


# ---- chains: a walk's links as one vector ------------------------------------------------------
def chain_plus(chain: np.ndarray | None, link: np.ndarray | None) -> np.ndarray | None:
    """A chain vector with one more link (either may be missing: None)."""
    return link if chain is None else chain if link is None else chain + link


def unit_vector(vector) -> np.ndarray:
    """The vector at length 1, in float32. The norm as np.linalg.norm computes it (the square
    root of the dot product, bit for bit) without its checks: ~150 vectors a query."""
    vector = np.asarray(vector, dtype=np.float32)
    return vector / max(float(np.sqrt(vector.dot(vector))), 1e-12)


def chain_cosines(chain_vectors: list[np.ndarray], query: np.ndarray) -> list[float]:
    """Each chain's cosine to the query: of the sum of its links' unit vectors — the mean of their
    embeddings, as a mean-pooling embedder's vector of the chain's text is near the mean of its
    parts'. Measured against embedding each chain's text (the walk's model call per step: 243 of
    its 264 ms p50 on the LoCoMo dev conversations), one memory, one run each: R@5 / R@10 65.5 /
    75.9 embedded, 66.0 / 75.4 with the sum; p50 264 → 10.8 ms. A step's chains in one product:
    one at a time they were ~11% of a walk's CPU (py-spy, 50,000 passages)."""
    return cosines(np.vstack(chain_vectors), query) if chain_vectors else []
