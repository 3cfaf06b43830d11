"""`memstream bench conversation FILE`: evidence recall on a conversation in the LoCoMo layout.

Every turn of the file becomes one document (topics.conversations: `Turn.document`, doc_id
"<sample_id>:<dia_id>") and goes through the real indexing pipeline (`ingest`: chunker,
rules extractor, detector, resolver, the local all-MiniLM-L6-v2 embedder) — in this process
over store.in_memory.InMemoryStore by default (deterministic, offline), or over Redis with
`--redis-url` (fresh tenants). Each sample (conversation) is a tenant of its own: its questions
are asked of its memory only, as in LoCoMo.

Then every question with readable evidence is asked of the query worker's engine in each mode,
and R@2 / R@5 / R@10 is the share of its evidence turns among the top 2 / 5 / 10 passages (a passage
counts for the turn whose doc_id it carries, so a turn chunked into several passages is still
one turn), overall and per the file's own category numbers. Questions without readable evidence
are skipped and counted, as are unreadable evidence parts and ids naming no turn of the sample.
Latency is the engine's answer per question with the question's embedding already computed
(all questions are embedded once beforehand), so modes are compared on the retrieval they do.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ops.bench.datasets import recall_at
from ops.bench.shape import shape_line, shape_of, tenant_joins
from ops.stack.services import stderr
from ops.testing import LocalIndexer
from topics import BadInput, ContractError
from topics.conversations import Question, Turn, is_locomo, locomo_questions, locomo_turns
from workers.algorithms.graph_shape import joins_of
from workers.algorithms.retrieval import NO_LINKS, RetrievalParams
from workers.models.extraction import RulesExtractor
from workers.query.engine import QueryEngine, QueryRequest
from workers.query.modes import QueryMode, mode_names, query_mode, table_order
from workers.settings import Settings

if TYPE_CHECKING:
    from store.base import MemoryStore

SAMPLE_CONVERSATION = Path(__file__).parents[1] / "sample_conversation" / "maya-jonas.json"
# The category numbers as in the public LoCoMo file; papers disagree on this map, so the
# benchmark prints it with every table.
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open domain", 4: "single hop", 5: "adversarial"}
# R@2 beside R@5 / R@10: a graph mode that wins at 5 can lose at 2, where a re-ranker moves the
# first stage's top (HotpotQA's and MuSiQue's pairs are read at 2 and 5, bench recall)
KS = (2, 5, 10)
EMBEDDER = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Probe:
    """A question as the benchmark asks it: its sample's tenant and its evidence as doc ids."""

    question: Question
    tenant: str
    gold: frozenset[str]  # doc ids of the evidence turns


@dataclass
class Plan:
    """What a file gives the benchmark: the turns to ingest, the tenant of each sample, the
    questions it can ask, and the counts of what it cannot."""

    turns: list[Turn]
    tenants: dict[str, str]  # sample id → tenant
    probes: list[Probe]
    questions: int
    no_evidence: int  # questions skipped: no evidence id could be read, or none names a turn
    unreadable_evidence: int  # evidence parts no id could be read from
    unknown_evidence: int  # readable evidence ids naming no turn of their sample


def load_conversations(path: Path) -> tuple[list[Turn], list[Question]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ContractError(f"{path}: not JSON ({exc})") from None
    if not is_locomo(data):
        raise ContractError(
            f"{path}: expected the LoCoMo layout (a sample, or a list of samples, with a 'conversation' object)"
        )
    return locomo_turns(data, str(path)), locomo_questions(data)


def plan(turns: list[Turn], questions: list[Question], tenant_prefix: str) -> Plan:
    samples = list(dict.fromkeys(turn.metadata["sample_id"] for turn in turns))
    tenants = {sample: f"{tenant_prefix}-{i}" for i, sample in enumerate(samples)}
    doc_of = {(turn.metadata["sample_id"], turn.turn_id): turn.doc_id for turn in turns}
    probes, no_evidence, unknown = [], 0, 0
    for question in questions:
        gold = frozenset(
            doc_of[(question.sample_id, dia)] for dia in question.evidence if (question.sample_id, dia) in doc_of
        )
        unknown += len(question.evidence) - len(gold)
        if not gold:
            no_evidence += 1
            continue
        probes.append(Probe(question, tenants[question.sample_id], gold))
    return Plan(
        turns, tenants, probes, len(questions), no_evidence, sum(len(q.unreadable_evidence) for q in questions), unknown
    )


def every(total: int, what: str, started: float) -> Callable[[int], None]:
    """A progress callback printing to stderr about twenty times over `total` steps."""
    step = max(1, total // 20)

    def progress(done: int) -> None:
        if done % step == 0 or done == total:
            stderr(f"conversation: {what} {done}/{total} ({time.perf_counter() - started:.0f} s)")

    return progress


async def ingest(
    memory,
    settings: Settings,
    embedder,
    turns: list[Turn],
    tenants: dict[str, str],
    progress: Callable[[int], None] | None = None,
) -> LocalIndexer:
    """Every turn through the indexing pipeline in this process, into its sample's tenant (the
    one ingestion path, over InMemoryStore or Redis's Memory): one turn at a time, each indexed
    to the end before the next is published, as a live conversation arrives; `progress(turns
    done)` after each."""
    indexer = LocalIndexer(settings, memory, embedder, RulesExtractor())
    for done, turn in enumerate(turns, 1):
        await indexer.index([turn.document(tenants[turn.metadata["sample_id"]])])
        if progress:
            progress(done)
    if indexer.dead_letters:
        raise RuntimeError(f"{len(indexer.dead_letters)} messages were dead-lettered while indexing the conversation")
    return indexer


@dataclass(frozen=True)
class Answer:
    probe: Probe
    mode: str
    ranked: list[str]  # doc ids of the passages, best first
    ms: float
    fallback: bool


NO_WALK = "ppr, no walk"
# What each mechanism of the graph modes contributes, asked of the same memory (`--ablations`):
# row → (mode, retrieval parameters that differ from the defaults).
ABLATIONS: dict[str, tuple[QueryMode, dict[str, float | bool]]] = {
    "hybrid, rrf_k 60": ("hybrid", {"rrf_k": 60.0}),
    "ppr, no episodes": ("ppr", {"episode_weight": 0.0}),
    # the first stage alone (with episodes and the time cue): no walk, no links (a turn has none)
    NO_WALK: ("ppr", {"turn_walk_weight": 0.0, "walk_weight": 0.0, **NO_LINKS}),
    "ppr, walk weight 1": ("ppr", {"turn_walk_weight": 1.0}),
    "ppr, walk weight 8": ("ppr", {"turn_walk_weight": 8.0}),
    "ppr, no entity links": ("ppr", {"turn_link_weight": 0.0}),
    "ppr, no time cue": ("ppr", {"time_weight": 0.0}),
    "ppr, first_kept 0": ("ppr", {"first_kept": 0, "turn_first_kept": 0}),
    "reconstruct, no episodes": ("reconstruct", {"episode_weight": 0.0}),
    "reconstruct, no time cue": ("reconstruct", {"time_weight": 0.0}),
    "reconstruct, no walk": ("reconstruct", {"read_weight": 0.0, **NO_LINKS}),
    "reconstruct, first_kept 0": ("reconstruct", {"first_kept": 0, "turn_first_kept": 0}),
}


async def ask(
    engine: QueryEngine,
    probes: list[Probe],
    modes: list[QueryMode],
    progress: Callable[[int], None] | None = None,
    ablations: dict[str, tuple[QueryMode, dict]] | None = None,
) -> list[Answer]:
    """Every probe in every mode, top max(KS) passages each; then in each ablation's mode with its
    parameters (its Answer.mode is the ablation's name)."""
    runs: list[tuple[str, QueryMode, RetrievalParams]] = [(mode, mode, RetrievalParams()) for mode in modes]
    runs += [
        (name, mode, RetrievalParams.from_json(overrides)) for name, (mode, overrides) in (ablations or {}).items()
    ]
    await engine.embedder.embed(
        list(dict.fromkeys(p.question.question for p in probes))
    )  # latency: retrieval, not the model
    for tenant in dict.fromkeys(p.tenant for p in probes):  # the first query of a tenant loads its graph: not timed
        for mode in dict.fromkeys(mode for _, mode, _ in runs):
            await engine.answer(QueryRequest("warm-up", tenant, max(KS), mode))
    answers, done = [], 0
    for name, mode, params in runs:
        for probe in probes:
            started = time.perf_counter()
            result = await engine.answer(QueryRequest(probe.question.question, probe.tenant, max(KS), mode, params))
            ms = 1000 * (time.perf_counter() - started)
            answers.append(Answer(probe, name, [p.doc_id for p in result.passages], ms, bool(result.fallback)))
            done += 1
            if progress:
                progress(done)
    return answers


def _recall(answers: list[Answer]) -> dict:
    row: dict[str, float | None] = {"n": len(answers)}  # the count, then R@k (None: no answers)
    for k in KS:
        row[f"R@{k}"] = (
            round(100 * sum(recall_at(a.ranked, a.probe.gold, k) for a in answers) / len(answers), 1)
            if answers
            else None
        )
    return row


def summarize(answers: list[Answer], modes: Sequence[str]) -> dict:
    """Per mode: recall overall and per category (the file's numbers; "none" without one),
    latency p50/p99 in ms, and how many PPR answers fell back to the first stage."""
    out = {}
    for mode in modes:
        mine = [a for a in answers if a.mode == mode]
        by_category: dict[str, list[Answer]] = defaultdict(list)
        for answer in mine:
            category = answer.probe.question.category
            by_category["none" if category is None else str(category)].append(answer)
        ms = [a.ms for a in mine]
        out[mode] = {
            "overall": _recall(mine),
            "by_category": {
                c: _recall(by_category[c]) for c in sorted(by_category, key=lambda c: (c == "none", c.zfill(3)))
            },
            "p50_ms": round(float(np.percentile(ms, 50)), 1) if ms else None,
            "p99_ms": round(float(np.percentile(ms, 99)), 1) if ms else None,
            "fallbacks": sum(a.fallback for a in mine),
        }
    return out


def category_name(category: str) -> str:
    return CATEGORIES.get(int(category), "") if category.isdigit() else ""


def format_table(result: dict) -> str:
    modes = list(result["modes"])
    lines = [
        f"{Path(result['file']).name}: {result['samples']} conversation(s), {result['turns']} turns, {result['questions']} questions "
        f"({result['evaluated']} asked; skipped without evidence: {result['skipped_no_evidence']}; "
        f"unreadable evidence parts: {result['unreadable_evidence']}; evidence ids naming no turn: {result['unknown_evidence']})",
        f"indexed in {result['index_seconds']} s ({result['store']}, {result['extractor']} extractor, {result['embedder']})",
        "categories as in the public LoCoMo file: " + ", ".join(f"{n} {name}" for n, name in CATEGORIES.items()),
        f"{'':<18} {'':>4}" + "".join(f" {mode:>{_WIDTH}}" for mode in modes),
        f"{'category':<18} {'n':>4}" + "".join(_recall_heads() for _ in modes),
    ]
    first = result["modes"][modes[0]]
    rows = [("all", first["overall"]["n"], "overall", None)]
    rows += [(f"{c} {category_name(c)}".strip(), row["n"], "by_category", c) for c, row in first["by_category"].items()]
    for label, n, where, key in rows:
        cells = []
        for mode in modes:
            row = result["modes"][mode][where] if key is None else result["modes"][mode][where][key]
            cells.append(_recall_cells(row))
        lines.append(f"{label:<18} {n:>4}" + "".join(cells))
    for name in ("p50_ms", "p99_ms"):
        lines.append(
            f"{name.replace('_', ' '):<18} {'':>4}"
            + "".join(f" {_cell(result['modes'][m][name]):>{_WIDTH}}" for m in modes)
        )
    fallbacks = {m: r["fallbacks"] for m, r in result["modes"].items() if r["fallbacks"]}
    if fallbacks:
        lines.append(
            "fell back to the first stage: " + ", ".join(f"{m} {n}/{result['evaluated']}" for m, n in fallbacks.items())
        )
    lines.append(shape_line(result["graph_shape"]))
    return "\n".join(lines)


_WIDTH = 7 * len(KS) - 1  # a mode's column: one cell of 6 and a space per k


def _recall_heads() -> str:
    return "".join(f" {f'R@{k}':>6}" for k in KS)


def _recall_cells(row: dict) -> str:
    return "".join(f" {_cell(row[f'R@{k}'])}" for k in KS)


def _cell(value) -> str:
    return f"{'-' if value is None else value:>6}"


async def run(
    settings: Settings,
    path: Path,
    modes: list[QueryMode],
    redis_url: str | None,
    embedder=None,
    ablations: dict[str, tuple[QueryMode, dict]] | None = None,
) -> dict:
    turns, questions = load_conversations(path)
    prefix = f"convbench-{uuid.uuid4().hex[:8]}"
    work = plan(turns, questions, prefix)
    if embedder is None:
        from workers.models.embedding import BatchingEmbedder, LocalEmbedder

        embedder = BatchingEmbedder(LocalEmbedder())
    memory: MemoryStore
    if redis_url:
        from store import Memory

        memory = Memory.from_url(redis_url, tau=settings.effective_tau, vector_index=settings.vector_index)
    else:
        from store.in_memory import InMemoryStore

        memory = InMemoryStore(embedder.dims, tau=settings.effective_tau)
    try:
        started = time.perf_counter()
        stderr(
            f"conversation: ingesting {len(turns)} turns of {len(work.tenants)} conversation(s) "
            f"({'Redis at ' + redis_url if redis_url else 'in-memory store'}, tenants {prefix}-*)"
        )
        await ingest(memory, settings, embedder, turns, work.tenants, every(len(turns), "turns indexed", started))
        index_seconds = time.perf_counter() - started
        joins = [await tenant_joins(memory, tenant) for tenant in work.tenants.values()]
        shape = shape_of(joins).to_json()
        reachable = {j["tenant"]: await reachable_by_turn(memory, j) for j in joins} if ablations else {}
        started = time.perf_counter()
        runs = len(modes) + len(ablations or {})
        answers = await ask(
            QueryEngine(memory, embedder),
            work.probes,
            modes,
            every(len(work.probes) * runs, "questions asked", started),
            ablations,
        )
    finally:
        await memory.close()
    return {
        "file": str(path),
        "samples": len(work.tenants),
        "turns": len(turns),
        "tenants": list(work.tenants.values()),
        "store": "redis" if redis_url else "in-memory",
        "extractor": "rules",
        "embedder": EMBEDDER,
        "index_seconds": round(index_seconds, 1),
        "graph_shape": shape,
        "questions": work.questions,
        "evaluated": len(work.probes),
        "skipped_no_evidence": work.no_evidence,
        "unreadable_evidence": work.unreadable_evidence,
        "unknown_evidence": work.unknown_evidence,
        "categories": {str(n): name for n, name in CATEGORIES.items()},
        "categories_source": "as in the public LoCoMo file",
        "modes": summarize(answers, modes),
        **(
            {
                "ablations": {
                    name: {"mode": mode, "params": params, **summarize(answers, [name])[name]}
                    for name, (mode, params) in ablations.items()
                }
            }
            if ablations
            else {}
        ),
        **({"walk_reach": walk_reach([a for a in answers if a.mode == NO_WALK], reachable)} if ablations else {}),
        "per_question": per_question([a for a in answers if a.mode in modes]),
    }


async def reachable_by_turn(memory, joins: dict) -> dict[str, set[str]]:
    """Each turn's (doc id's) entities that are not hubs (workers.algorithms.graph_shape): those
    a walk leaves a passage through. `joins`: one tenant's (ops.bench.shape.tenant_joins)."""
    holds, _, hubs = joins_of(joins["passages"], joins["edges"])
    rows = await memory.passages(joins["tenant"], list(holds))
    out: dict[str, set[str]] = defaultdict(set)
    for held, row in zip(holds.values(), rows):
        if row:
            out[row["doc_id"]] |= held - hubs
    return out


def walk_reach(answers: list[Answer], reachable: dict[str, dict[str, set[str]]]) -> dict:
    """What a walk from the first stage's top 5 could bring up (`--ablations`), per category:
    of the evidence turns the first stage with episodes and the time cue ranks below 5 (the
    NO_WALK answers), how many share an entity that is not a hub with one of its top 5 turns —
    one hop of a walk seeded there — and how many turns a question do (the walk's haystack).
    `reachable`: tenant → doc id → its non-hub entities (reachable_by_turn)."""
    by_category: dict[str, list[Answer]] = defaultdict(list)
    for answer in answers:
        by_category["all"].append(answer)
        number = answer.probe.question.category
        by_category["none" if number is None else str(number)].append(answer)
    out = {}
    for category, mine in by_category.items():
        below = within = nearby = 0
        for answer in mine:
            turns = reachable.get(answer.probe.tenant, {})
            top = answer.ranked[:5]
            exits = set().union(*(turns.get(doc, set()) for doc in top))
            near = {doc for doc, held in turns.items() if doc not in top and held & exits}
            missed = answer.probe.gold - set(top)
            below += len(missed)
            within += len(missed & near)
            nearby += len(near)
        out[category] = {"below_5": below, "within_one_hop": within, "one_hop_turns": round(nearby / len(mine), 1)}
    return out


def per_question(answers: list[Answer]) -> list[dict]:
    """Each question asked, its evidence and, per mode, the top passages' doc ids and recall:
    what to read when a mode misses."""
    rows: dict[int, dict] = {}  # by id(): a probe is asked once per mode
    for answer in answers:
        question = answer.probe.question
        row = rows.setdefault(
            id(answer.probe),
            {
                "question": question.question,
                "category": question.category,
                "evidence": sorted(answer.probe.gold),
                "modes": {},
            },
        )
        row["modes"][answer.mode] = {
            "top": answer.ranked[: max(KS)],
            "fallback": answer.fallback,
            **{f"R@{k}": round(100 * recall_at(answer.ranked, answer.probe.gold, k), 1) for k in KS},
        }
    return list(rows.values())


def parse_modes(text: str | None) -> list[QueryMode]:
    """ "dense,ppr" → the modes, each one the query engine has; None → all of them."""
    names: list[str]
    if text is None:
        names = list(table_order())
    else:
        names = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    modes = [query_mode(name) for name in names]
    unknown = [name for name, mode in zip(names, modes) if mode is None]
    if not names or unknown:
        raise BadInput(f"--modes: {', '.join(unknown) or 'none given'}; the query engine has {', '.join(mode_names())}")
    return [mode for mode in modes if mode is not None]


def run_conversation_bench(
    settings: Settings,
    path: Path | None,
    modes: str | None,
    redis_url: str | None,
    as_json: bool,
    ablations: bool = False,
) -> int:
    result = asyncio.run(
        run(
            settings,
            path or SAMPLE_CONVERSATION,
            parse_modes(modes),
            redis_url,
            ablations=ABLATIONS if ablations else None,
        )
    )
    print(json.dumps(result, indent=1) if as_json else format_table(result) + format_ablations(result))
    return 0


def format_ablations(result: dict) -> str:
    """The ablation rows (when asked for): overall and per category, R@2 / R@5 / R@10; then the walk's
    reach (walk_reach)."""
    if not result.get("ablations"):
        return ""
    categories = list(next(iter(result["ablations"].values()))["by_category"])
    lines = [
        "",
        f"{'ablation':<28} {'all':>{_WIDTH}}" + "".join(f" {c:>{_WIDTH}}" for c in categories),
        f"{'':<28}" + _recall_heads() * (1 + len(categories)),
    ]
    for name, row in result["ablations"].items():
        cells = [row["overall"]] + [row["by_category"][c] for c in categories]
        lines.append(f"{name:<28}" + "".join(_recall_cells(x) for x in cells))
    reach = result.get("walk_reach")
    if reach:  # the same columns: what a walk from the first stage's top 5 could reach
        cells = [reach["all"]] + [reach.get(c, {}) for c in categories]
        lines.append(f"walk reach, from {NO_WALK}'s top 5:")
        for label, key in (
            ("evidence turns below it", "below_5"),
            ("  one non-hub hop from it", "within_one_hop"),
            ("turns that hop, a question", "one_hop_turns"),
        ):
            lines.append(f"{label:<28}" + "".join(f" {_cell(x.get(key)):>{_WIDTH}}" for x in cells))
    return "\n".join(lines)
