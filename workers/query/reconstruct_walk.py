"""One reconstruct query's walk (the mode: workers.query.reconstruct): the query's cues, the
branches their tags open, a router's steps — each reads its branch's content and makes new cues
of what it read — until nothing adds, the router stops or the budget is spent; then its answer
(workers.query.reconstruct_result)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter
from itertools import islice
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, TypeVar

import numpy as np

from store.facts import Fact, FactRecordHit
from store.records import Hit, is_current
from topics.records import NO_CUE_TYPES
from workers.algorithms.chunking import token_count
from workers.algorithms.reconstruction import (
    Branch,
    Budget,
    Cue,
    Spent,
    Stop,
    adds_something,
    admit,
    attribute_words,
    branch_score,
    chain_cosines,
    chain_part,
    chain_plus,
    chain_text,
    choose_mentions,
    episode_score,
    exhausted,
    mention_candidates,
    names_something,
    time_expressions,
    time_keys,
    unit_vector,
)
from workers.algorithms.retrieval import FirstStage, cosines
from workers.algorithms.turns import session_turn
from workers.models.llm import LLMError, MalformedOutput
from workers.query.answers import Content, QueryResult, Step, Tag
from workers.query.reconstruct_result import cue_view, walk_result
from workers.query.routing import Route, SimilarityRouter

if TYPE_CHECKING:  # the mode makes the walk: for the type checker only
    from workers.query.reconstruct import Reconstructor

log = logging.getLogger(__name__)
A = TypeVar("A")
B = TypeVar("B")

# The facts the engine counts as live: (tenant, query vector, k, extra tag filters each, whether
# their vectors are wanted) → the hits of each filter, searched at once, each with its fact and
# vector where the store read them with the search (FactRecordHit; else the walk reads them); the
# engine's own search (active, not expired), so both modes agree on what a query may use.
FactSearch = Callable[
    [str, np.ndarray, int, list[Mapping[str, str] | None], bool], Awaitable[list[list[FactRecordHit]]]
]

ENTITY_CUES_BY_KNN = 3  # when the query names no entity of the memory: the entities nearest it …
ENTITY_CUE_MIN = 0.5  # … at this cosine or more, of a type that may be a cue (not a value, not a tag) …
# … found among this many nearest: a conversation's tags are entities too, and the words of a
# question are near its topic words, so the nearest three were often tags, left out after the search
ENTITY_CUE_CANDIDATES = 4 * ENTITY_CUES_BY_KNN
MAX_NEW_CUES = 4  # new cues per step (the fact's other entity first, then the passages' entities)
QUERY_PASSAGES = 5  # the query cue tags the first stage's top 5 (measured when it was dense's top: 3 gave R@5 62.7 on the sample conversation, 5 and 10 64.1) …
ENTITY_PASSAGES = 3  # … an entity cue the passages that mention it nearest the query …
# … among at most this many of them (their vectors are read and compared): a speaker or a common
# noun of a long-lived tenant is in thousands. Over the cap the first by id are read — ids are
# content hashes, so a fixed, arbitrary sample; the query cue's dense top holds the nearest
# passages anyway. 256 vectors of 384 floats: ~400 KB a cue. It does not bind on the conversation
# benchmark (its largest entity, rules extractor, is in 4 passages): R@5 69.2 with or without it.
ENTITY_PASSAGES_READ = 256
EPISODE_RADIUS = 1  # a turn read makes an episode cue of its session's turns at most this far from it


class Walk:
    """One query's walk: its cues, open branches, steps taken, passages read and budget spent."""

    def __init__(self, owner: Reconstructor, request, vector: np.ndarray, facts: FactSearch, budget: Budget):
        self.memory, self.router = owner.memory, owner.router
        self.request, self.tenant, self.vector, self.search, self.budget = (
            request,
            request.tenant,
            vector,
            facts,
            budget,
        )
        self.layer_k = request.params.layer_k
        self.cues: dict[str, Cue] = {}  # entity id ("" for the query's attribute cue) → cue
        self.open: dict[str, Branch] = {}  # branch key ("fact:<id>", "passage:<id>") → the best branch to that tag
        self.taken: list[Branch] = []
        self.records: dict[str, Fact] = {}  # fact id → store.facts.Fact of every branch seen
        self.read: dict[str, dict] = {}  # passage id → its row, with the step and score that read it
        self.named_by_read: Counter[str] = Counter()  # entity id → the passages read that name it
        self.rows: dict[str, dict | None] = {}  # passage id → its row, for the tags whose row came with their search
        self.episodes: dict[
            str, dict[str, int]
        ] = {}  # episode cue id → {passage id of a neighbouring turn: its lag (turns after the one read)}
        self.moments: dict[str, tuple[str, int]] = {}  # episode cue id → the (session, turn) it recalls
        # the cues of a step after which the budget is spent: their tags are searched only if the
        # walk's stop depends on them (_walk)
        self.unsearched: list[Cue] = []
        self.path: list[Step] = []
        self.spent = Spent()
        self.fallback: dict | None = None
        self.keys: frozenset[str] = frozenset()
        self.first = FirstStage([], [], [], {})  # the engine's, once _first_in_hand awaits it
        self.first_stage: asyncio.Future[FirstStage] | None = None  # the first stage, running (run)
        self.timings: dict[str, float] = {}  # the query's (run): _first_in_hand says when the first stage came
        self.started = 0.0  # when run began
        # the first stage's ranking with each passage's cosine: the query cue's passages, and the
        # ranking the walk's is fused with
        self.dense: list[Hit] | None = None  # the first stage's ranking with cosines (_first_in_hand)
        self.vectors: dict[
            tuple[str, str], np.ndarray
        ] = {}  # ("fact" | "passage", id) → its unit vector, read once (_tag_vectors)

    async def run(self, timings: dict[str, float], first: Awaitable[FirstStage]) -> QueryResult:
        """The query's cues are looked up, then their branches searched while the first stage
        runs (the query cue's own passages, its top, wait for it). The first stage starts once the
        cues are known: Redis answers a server's commands one at a time, and the lookup waited
        behind its lexical and dense searches (~4 ms at 50,000 passages) while the client had
        nothing to do; now the client reads the cues' branches while Redis searches."""
        self.timings, self.started = timings, time.perf_counter()
        try:
            stop, cues, times, attributes, version = await self._cues_then_walk(first)
            await self._first_in_hand()
        finally:
            if self.first_stage is not None:
                self.first_stage.cancel()  # a lookup that failed leaves no first stage running
            elif inspect.iscoroutine(first):
                first.close()  # never started: the lookup failed
        return await walk_result(self, cues, times, attributes, stop, version)

    async def _first_in_hand(self) -> None:
        """The first stage, awaited once: its ranking with each passage's cosine — the query
        cue's passages, and the ranking the walk's is fused with."""
        if self.dense is None:
            assert self.first_stage is not None, "the walk starts the first stage once the cues are known"
            self.first = await self.first_stage
            self.timings["first_stage"] = _ms(self.started)
            self.dense = [
                Hit(pid, self.first.cosines[pid], {}) for pid, _ in self.first.fused if pid in self.first.cosines
            ]

    async def _cues_then_walk(self, first: Awaitable[FirstStage]) -> tuple[Stop, list[Cue], list[str], list[str], int]:
        candidates, canonical, version, names, near_entities = await self._mentions()
        self.first_stage = asyncio.ensure_future(first)
        chosen = choose_mentions(
            candidates,
            {cid: eid for cid, eid in canonical.items() if eid in names and names[eid]["type"] not in NO_CUE_TYPES},
        )
        times = time_expressions(self.request.query)
        self.keys = time_keys(times)
        time_words = {t.lower() for t in times}
        cues = [
            Cue("time" if m.text.lower() in time_words else "entity", eid, names[eid]["name"], 1.0, 0, "query")
            for m, eid in chosen
        ]
        if not cues:  # the entities nearest the query (a round trip of their own where a lookup came first)
            near_entities = await self._entities_near() if near_entities is None else near_entities
            cues = [
                Cue("entity", h.id, h.fields["name"], h.score, 0, "entity-knn")
                for h in near_entities
                if h.score >= ENTITY_CUE_MIN and h.fields.get("type") not in NO_CUE_TYPES
            ][:ENTITY_CUES_BY_KNN]
        attributes = attribute_words(self.request.query, [m for m, _ in chosen], times)
        query_cue = Cue("query", "", " ".join(attributes) or self.request.query, 1.0, 0, "query")
        await self._expand([query_cue, *cues])  # awaits the first stage for the query cue's passages
        self.timings["cues"] = _ms(self.started)  # the first stage's time included
        t = time.perf_counter()
        stop = await self._walk()
        self.timings["walk"] = _ms(t)
        return stop, cues, times, attributes, version

    async def _mentions(self) -> tuple[list, dict[str, str], int, dict[str, dict], list[Hit] | None]:
        """The query's mention candidates, their canonical ids, the graph's version, the canonical
        ids' names and types, and — where the query has no candidate — the entities nearest it:
        one round trip. The nearest entities are cues only where no mention is one (6 of 100
        questions at 50,000 passages): searched every time, they cost a query ~0.7 ms of Redis
        and its first stage a round trip (reconstruct 0.95x, bench scale questions, 50,000)."""
        candidates = mention_candidates(self.request.query)
        ids = sorted({m.entity_id for m in candidates})
        if ids:
            (canonical, names), version = await _beside(
                self.memory.canonical_names(self.tenant, ids), self.memory.graph_version(self.tenant)
            )
            return candidates, canonical, version, names, None
        near, version = await _beside(self._entities_near(), self.memory.graph_version(self.tenant))
        return candidates, {}, version, {}, near

    async def _entities_near(self) -> list[Hit]:
        return await self.memory.knn(self.tenant, "entities", self.vector, ENTITY_CUE_CANDIDATES, ["name", "type"])

    async def _walk(self) -> Stop:
        while True:
            cue_ids, read = set(self.cues), set(self.read)
            taken = {b.key for b in self.taken}
            self.open = {key: b for key, b in self.open.items() if adds_something(b, taken, read, cue_ids)}
            if not self.open and self.unsearched:  # whether the walk is exhausted or out of budget
                await self._search(self.unsearched)
                self.unsearched = []
                self.open = {key: b for key, b in self.open.items() if adds_something(b, taken, read, cue_ids)}
            if not self.open:
                return Stop("exhausted", "no open branch adds a fact, passage or cue")
            spent = exhausted(self.budget, self.spent)
            if spent:
                return Stop("budget", f"{spent} budget of {getattr(self.budget, spent)} spent")
            route = await self._route()
            if route.branch is None:
                assert route.stop is not None, "a router that takes no branch says why it stops"
                return route.stop
            if not await self._take(route.branch, route.why):
                return Stop("budget", "no room left in the passages or tokens budget for the next evidence passage")

    async def _route(self) -> Route:
        branches = list(self.open.values())  # each router ranks what it reads of them
        best_taken = max((b.score for b in self.taken), default=None)
        facts = [b.text for b in self.taken if b.kind == "fact"]
        passages = [row["text"] for row in self.read.values()]
        try:
            return await self.router.choose(self.request.query, facts, passages, branches, best_taken)
        except (LLMError, MalformedOutput) as exc:
            log.warning(
                "reconstruct: the %s router failed (%s); the similarity router takes over", self.router.name, exc
            )
            self.fallback = {"from": self.router.name, "error": str(exc)[:500], "at_step": self.spent.steps + 1}
            self.router = SimilarityRouter()
            return await self.router.choose(self.request.query, facts, passages, branches, best_taken)

    async def _take(self, branch: Branch, why: str) -> bool:
        """Take the branch: read its new passages (as the budget admits) — a fact's evidence, or
        the passage itself — and make new cues of a fact's other end and of the entities the
        passages read name; fetch their branches. False: the branch has passages to read and the
        budget admits none of them (the step is not taken)."""
        new_ids = [p for p in branch.passage_ids if p not in self.read]
        # the rows, the entities they name with their names, and the chain's vectors (the
        # branch's own; a fact's evidence turn goes on the chain too), in one round trip
        chain = [(branch.kind, branch.tag_id)] + ([("passage", p) for p in new_ids] if branch.kind != "passage" else [])
        found = await self.memory.read_passages(self.tenant, new_ids, [t for t in chain if t not in self.vectors])
        for tag, vec in found.vectors.items():
            self.vectors.setdefault(tag, unit_vector(vec))
        rows = [row for row in found.rows if is_current(row)]
        entities_of = dict(zip(new_ids, found.entities))
        tokens = [token_count(row["text"]) for row in rows]
        admitted = admit(self.budget, self.spent, tokens)
        if rows and not admitted:
            return False
        del self.open[branch.key]
        self.taken.append(branch)
        self.spent.steps += 1
        step = self.spent.steps
        for row, count in zip(rows[:admitted], tokens[:admitted]):
            self.read[row["id"]] = {**row, "step": step, "score": branch.score}
            self.named_by_read.update(set(entities_of[row["id"]]))
            self.spent.passages += 1
            self.spent.tokens += count
        leads: list[tuple[str, str | None, str]] = []  # (entity id, name if known, where it came from)
        if branch.kind == "fact":
            leads = [
                (eid, name, f"fact:{branch.tag_id}") for eid, name in _ends(self.records[branch.tag_id], branch.cue.id)
            ]
        for row in rows[:admitted]:
            leads += [(eid, None, f"passage:{row['id']}") for eid in sorted(entities_of[row["id"]])]
        fresh: dict[str, tuple[str | None, str]] = {}
        for eid, name, origin in leads:
            if not names_something(eid):  # "I'm", "That's": no cue to follow
                continue
            if eid not in self.cues and eid not in fresh:  # capped below, once values are left out
                fresh[eid] = (name, origin)
        names = {eid: found.names[eid] for eid, (name, _) in fresh.items() if name is None and eid in found.names}
        turns = [row for row in rows[:admitted] if session_turn(row.get("metadata") or {}) is not None]
        chain_vector = chain_plus(branch.cue.chain_vector, self.vectors.get((branch.kind, branch.tag_id)))
        # a passage's value (an amount, a date) is no cue, nor does it take a real entity's place
        fresh = dict(
            islice(
                ((e, lead) for e, lead in fresh.items() if names.get(e, {}).get("type") not in NO_CUE_TYPES),
                MAX_NEW_CUES,
            )
        )
        new_cues = [
            Cue(
                "entity",
                eid,
                name or names.get(eid, {}).get("name", eid),
                branch.score,
                branch.cue.hop + 1,
                origin,
                branch.chain,
                chain_vector,
            )
            for eid, (name, origin) in fresh.items()
        ]
        new_cues += self._episode_cues(branch, turns, chain_vector)
        kind = branch.kind
        is_fact, tag_score = kind == "fact", round(branch.tag_score, 6)
        self.path.append(
            Step(
                step=step,
                cue=cue_view(branch.cue),
                tag=Tag(
                    fact_id=branch.tag_id if is_fact else None,
                    passage_id=None if is_fact else branch.tag_id,
                    text=branch.text if is_fact else chain_part(branch.text),
                    fact_score=tag_score if is_fact else None,
                    passage_score=None if is_fact else tag_score,
                    chain=branch.chain,
                    chain_score=round(branch.chain_score, 6),
                ),
                score=round(branch.score, 6),
                router=self.router.name,
                why=why or None,
                content=Content(
                    fact_id=branch.tag_id if is_fact else None,
                    passages=[row["id"] for row in rows[:admitted]],
                    tokens=sum(tokens[:admitted]),
                    not_read=[row["id"] for row in rows[admitted:]] if admitted < len(rows) else None,
                ),
                new_cues=[cue_view(cue) for cue in new_cues],
            )
        )
        fresh_cues = self._record(new_cues)
        if exhausted(self.budget, self.spent):  # no step follows: their tags matter only to why it stops
            self.unsearched += fresh_cues
        else:
            await self._search(fresh_cues)
        return True

    async def _tag_vectors(self, tags: list[tuple[str, str]]) -> None:
        """Read the unit vectors of the tags (("fact" | "passage", id)) not read before: a walk
        reads each vector once and scores every chain through it with no model call."""
        passages = sorted({tid for kind, tid in tags if kind == "passage" and (kind, tid) not in self.vectors})
        facts = sorted({tid for kind, tid in tags if kind == "fact" and (kind, tid) not in self.vectors})
        if not passages and not facts:  # most calls: no task, no loop turn
            return
        if passages and facts:
            passage_vectors, fact_vectors = await _beside(
                self.memory.passage_vectors(self.tenant, passages), self.memory.fact_vectors(self.tenant, facts)
            )
        elif passages:
            passage_vectors, fact_vectors = await self.memory.passage_vectors(self.tenant, passages), []
        else:
            passage_vectors, fact_vectors = [], await self.memory.fact_vectors(self.tenant, facts)
        for key, vec in zip(
            [("passage", p) for p in passages] + [("fact", f) for f in facts], [*passage_vectors, *fact_vectors]
        ):
            if vec is not None:
                self.vectors[key] = unit_vector(vec)

    async def _episode_turns(self, cues: list[Cue]) -> None:
        """Each episode cue's tags: its session's turns at most EPISODE_RADIUS from the turn read,
        {passage id: its lag (turns after the one read)}, all read at once."""
        episodes = [cue.id for cue in cues if cue.kind == "episode"]
        found = await asyncio.gather(
            *(self.memory.session_neighbours(self.tenant, *self.moments[cue_id], EPISODE_RADIUS) for cue_id in episodes)
        )
        for cue_id, near in zip(episodes, found):
            self.episodes[cue_id] = {pid: other - self.moments[cue_id][1] for other, pid in near}

    def _episode_cues(self, branch: Branch, turns: list[dict], chain_vector: np.ndarray | None) -> list[Cue]:
        """Temporal contiguity: each conversation turn read (a passage whose metadata names its
        session and turn) recalls its neighbours — the session's turns at most EPISODE_RADIUS
        from it (read with the cue's other tags: _episode_turns) — as an episode cue whose tags
        are those turns' passages; its chain is the one that read the turn (a fact's, with the
        turn added)."""
        cues = []
        for row in turns:
            session, turn = session_turn(row.get("metadata") or {}) or ("", 0)
            cue_id = f"episode:{session}:{turn}"
            if cue_id in self.cues or cue_id in self.moments:
                continue
            self.moments[cue_id] = (session, turn)
            chain, vector = branch.chain, chain_vector
            if branch.kind != "passage":  # a fact's evidence turn: the chain goes on through it
                chain = chain_text(branch.chain, chain_part(row["text"]))
                vector = chain_plus(vector, self.vectors.get(("passage", row["id"])))
            cues.append(
                Cue(
                    "episode",
                    cue_id,
                    f"{session} turn {turn} ±{EPISODE_RADIUS}",
                    branch.score,
                    branch.cue.hop + 1,
                    f"passage:{row['id']}",
                    chain,
                    vector,
                )
            )
        return cues

    async def _expand(self, cues: list[Cue]) -> None:
        """Record the cues and open a branch to each of their tags not taken yet (_search)."""
        await self._search(self._record(cues))

    def _record(self, cues: list[Cue]) -> list[Cue]:
        """The cues not recorded before, recorded now (in the walk's cues, what a branch's leads
        are compared with, before their tags are searched)."""
        fresh = []
        for cue in cues:
            if cue.id not in self.cues:
                self.cues[cue.id] = cue
                fresh.append(cue)
        return fresh

    async def _search(self, fresh: list[Cue]) -> None:
        """Open a branch to each tag of the recorded cues `fresh` not taken yet: their live facts
        and their passages (a tag reached from two cues keeps the better-scored branch). A first-hop
        branch scores its tag's own cosine (the index's); a later one the cosine of its chain.
        Two round trips: the cues' searches (their facts, their passages with vectors, an episode's
        turns), then the records of what they found (the facts, the passages' rows, the vectors
        chains need)."""
        fact_hits, passages = await _beside(self._fact_hits(fresh), self._passage_tags(fresh))
        for _, hit in fact_hits:  # what the store read with the search
            if hit.fact is not None:
                self.records.setdefault(hit.id, hit.fact)
            if hit.vector is not None:
                self.vectors.setdefault(("fact", hit.id), unit_vector(hit.vector))
        missing = sorted({h.id for _, h in fact_hits} - set(self.records))
        # the vectors a chain is scored with (those the walk read already are not read again)
        chained = [("fact", h.id) for cue, h in fact_hits if cue.chain_vector is not None] + [
            ("passage", pid) for cue, pid, _ in passages if cue.chain_vector is not None
        ]
        unread = sorted({pid for _, pid, _ in passages} - set(self.rows))
        if missing or unread or any(tag not in self.vectors for tag in chained):
            records, found_rows, _ = await asyncio.gather(
                self.memory.facts(self.tenant, missing),
                self.memory.passages(self.tenant, unread),
                self._tag_vectors(chained),
            )
            for fid, fact in zip(missing, records):
                if fact is not None:
                    self.records[fid] = fact
            self.rows.update(zip(unread, found_rows))
        rows = {pid: row for _, pid, _ in passages if is_current(row := self.rows.get(pid))}
        found = [(cue, "fact", h.id, h.score) for cue, h in fact_hits if h.id in self.records] + [
            (cue, "passage", pid, score) for cue, pid, score in passages
        ]
        tags = []  # (cue, kind, id, tag text, the text the time bonus reads, the tag's cosine)
        for cue, kind, tid, score in found:
            if kind == "fact":
                fact = self.records[tid]
                text = fact.text or f"{fact.head} {fact.relation} {fact.tail}"
                tags.append((cue, kind, tid, text, " ".join([text, fact.valid_from or "", fact.valid_to or ""]), score))
            elif tid in rows:
                tags.append((cue, kind, tid, rows[tid]["text"], f"{rows[tid]['context']} {rows[tid]['text']}", score))
        chains = {  # tag → its chain's vector, for the tags past the first hop (all scored at once)
            i: cue.chain_vector + self.vectors[(kind, tid)]
            for i, (cue, kind, tid, *_) in enumerate(tags)
            if cue.chain_vector is not None and (kind, tid) in self.vectors
        }
        chain_scores = dict(zip(chains, chain_cosines(list(chains.values()), self.vector)))
        for i, (cue, kind, tid, text, timed, score) in enumerate(tags):
            chain_score = chain_scores.get(i, score)
            if kind == "fact":
                fact = self.records[tid]
                leads, evidence = tuple(eid for eid, _ in _ends(fact, cue.id)), tuple(sorted(fact.passage_ids))
            else:
                leads, evidence = (), (tid,)
            scored = branch_score(chain_score, timed, self.keys, cue if kind == "passage" else None)
            if cue.kind == "episode":
                scored = episode_score(scored, self.episodes[cue.id][tid])
            branch = Branch(cue, kind, tid, text, leads, evidence, score, chain_score, scored)
            current = self.open.get(branch.key)
            if current is None or (branch.score, -branch.cue.hop, branch.cue.kind != "query") > (
                current.score,
                -current.cue.hop,
                current.cue.kind != "query",
            ):
                self.open[branch.key] = branch

    async def _fact_hits(self, cues: list[Cue]) -> list[tuple[Cue, FactRecordHit]]:
        """(cue, hit with the fact's cosine to the query) for each cue's live facts not taken yet:
        the entity's facts as head or tail; for the query cue the facts nearest the query. All
        searched at once."""
        searches = [
            (cue, where)
            for cue in cues
            if cue.kind != "episode"
            for where in ([None] if cue.kind == "query" else [{"head_id": cue.id}, {"tail_id": cue.id}])
        ]
        if not searches:  # episode cues alone
            return []
        chained = any(cue.chain_vector is not None for cue, _ in searches)
        results = await self.search(self.tenant, self.vector, self.layer_k, [where for _, where in searches], chained)
        taken = {b.key for b in self.taken}
        return [(cue, h) for (cue, _), hits in zip(searches, results) for h in hits if f"fact:{h.id}" not in taken]

    async def _passage_tags(self, cues: list[Cue]) -> list[tuple[Cue, str, float]]:
        """(cue, passage id, the passage's cosine to the query) for each cue's passages not read
        yet: for the query cue the QUERY_PASSAGES nearest the query (the dense ranking's top);
        for an entity the ENTITY_PASSAGES nearest the query among those that mention it (at most
        ENTITY_PASSAGES_READ of them read); for an episode its turns (the neighbours of the turn
        read). Every entity's passages come with their vectors, in one command (~130 sequential
        round trips a walk on a 2,000-passage tenant when read one cue after another)."""
        mentioning = [cue for cue in cues if cue.kind not in ("query", "episode")]
        episodes = [cue for cue in cues if cue.kind == "episode"]

        async def episode_vectors() -> None:
            await self._episode_turns(episodes)
            await self._tag_vectors(
                [("passage", pid) for cue in episodes for pid in self.episodes[cue.id] if pid not in self.read]
            )

        # the entities' passages ranked, beside the episodes' turns and their vectors (a task
        # and a loop turn each where there are episodes only: a step's tasks delay its commands)
        if episodes:
            by_entity, _ = await _beside(self._entity_passages_ranked(mentioning), episode_vectors())
        else:
            by_entity = await self._entity_passages_ranked(mentioning)
        if any(cue.kind == "query" for cue in cues):
            await self._first_in_hand()
        out = []
        for cue in cues:
            if cue.kind == "query":
                top = [h for h in (self.dense or [])[:QUERY_PASSAGES] if h.id not in self.read]
                self.rows.update({h.id: self.first.rows[h.id] for h in top if h.id in self.first.rows})
                out += [(cue, h.id, h.score) for h in top]
                continue
            if cue.kind != "episode":
                best = sorted(by_entity.get(cue.id, []), key=lambda x: (-x[0], x[1]))[:ENTITY_PASSAGES]
                out += [(cue, pid, score) for score, pid in best]
                continue
            found = [  # an episode's turns, all of them
                (pid, self.vectors[("passage", pid)])
                for pid in self.episodes[cue.id]
                if pid not in self.read and ("passage", pid) in self.vectors
            ]
            if found:
                scores = cosines(np.vstack([vec for _, vec in found]), self.vector)
                out += [
                    (cue, pid, score)
                    for score, pid in sorted(zip(scores, (p for p, _ in found)), key=lambda x: (-x[0], x[1]))
                ]
        return out

    async def _entity_passages_ranked(self, cues: list[Cue]) -> dict[str, list[tuple[float, str]]]:
        """Each entity cue's passages not read yet as (cosine to the query, passage id). A store
        whose index tags passages by entity ranks them itself (entity_passages_near: exact over
        all of them, no vector moved; one more each than the passages read that name a cue, so
        ENTITY_PASSAGES unread remain); elsewhere its first ENTITY_PASSAGES_READ are read with
        their vectors and ranked here."""
        ids = [cue.id for cue in cues]
        if not ids:
            return {}
        chained = any(cue.chain_vector is not None for cue in cues)
        # as many more than ENTITY_PASSAGES as there are passages read that name the cue (the
        # index's entity tags are the passage's entities field, the one read_passages reads):
        # the ENTITY_PASSAGES nearest unread are among them. One more for every passage read
        # took 96 passages (a row and a vector each) a query where these take 69, 50,000 passages.
        more = max(self.named_by_read[eid] for eid in ids)
        near = await self.memory.entity_passages_near(self.tenant, self.vector, ids, ENTITY_PASSAGES + more, chained)
        if near is not None:  # each with its row and vector, read with the search
            for hit in (hit for hits in near for hit in hits):
                self.rows.setdefault(hit.id, hit.row)
                if hit.vector is not None:
                    self.vectors.setdefault(("passage", hit.id), unit_vector(hit.vector))
            return {cue.id: [(h.score, h.id) for h in hits if h.id not in self.read] for cue, hits in zip(cues, near)}
        mentioned = await self.memory.entity_passage_vectors(self.tenant, ids, ENTITY_PASSAGES_READ)
        by_entity: dict[str, list[tuple[float, str]]] = {}
        for cue, pairs in zip(cues, mentioned):
            for pid, vec in pairs:
                self.vectors.setdefault(("passage", pid), unit_vector(vec))
            found = [(pid, self.vectors[("passage", pid)]) for pid, _ in pairs if pid not in self.read]
            if found:
                scores = cosines(np.vstack([vec for _, vec in found]), self.vector)
                by_entity[cue.id] = list(zip(scores, (pid for pid, _ in found)))
        return by_entity


def _ends(fact, cue_id: str) -> list[tuple[str, str]]:
    """The entities a fact leads to from a cue: its other end (both ends for the query cue), a
    value (an amount, a date) never."""
    ends = [(fact.head_id, fact.head, fact.head_type), (fact.tail_id, fact.tail, fact.tail_type)]
    return [(eid, name) for eid, name, kind in ends if eid != cue_id and kind not in NO_CUE_TYPES]


async def _beside(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Both awaited at once with one task where asyncio.gather makes two: the second runs in a
    task while this one awaits the first (whose command so leaves first). A walk's step awaited
    two searches at once in two tasks; a task costs a loop turn before its command leaves (the
    store's connections: the same on a command's write took 29.7 -> 27.7 ms off reconstruct)."""
    beside = asyncio.ensure_future(second)
    try:
        done = await first
    except BaseException:
        beside.cancel()
        raise
    return done, await beside


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
