"""What a reconstruct walk answers (workers.query.reconstruct): its `QueryResult` — the first
stage's ranking fused with the walk's passages, the facts it took, its path, why it stopped,
the budget spent and the router — and a cue as answers show it (`cue_view`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from store.records import is_current
from workers.algorithms.expiry import said_by
from workers.algorithms.reconstruction import Cue, Stop
from workers.algorithms.retrieval import fuse_walk, kept_first
from workers.query.answers import (
    BudgetView,
    CueView,
    FactView,
    QueryCues,
    QueryResult,
    RankedPassage,
    RouterView,
    SpentView,
    Stopped,
)
from workers.query.links import with_links

if TYPE_CHECKING:  # the walk calls walk_result: for the type checker only
    from workers.query.reconstruct_walk import Walk


async def walk_result(
    walk: Walk, query_cues: list[Cue], times: list[str], attributes: list[str], stop: Stop, version: int
) -> QueryResult:
    """The first stage's ranking fused with the walk's (the passages read, in reading order):
    a passage both found ranks above either alone, and top_k is always filled."""
    walked = list(walk.read)
    params = walk.request.params
    first = [pid for pid, _ in walk.first.fused]
    kept = kept_first(params, walk.first.turn_share)
    ranked = fuse_walk(first, walked, params, params.read_weight, kept)
    known = {**walk.first.rows, **walk.read}
    # the pages the question names and the top passage links to, and its bridge passage, right below it
    ranked = await with_links(walk.memory, walk.request, first, ranked, known, kept)
    ranked = ranked[: walk.request.top_k + len(walked)]
    missing = [pid for pid, _ in ranked if pid not in known]
    rows = {
        **known,
        **{pid: row for pid, row in zip(missing, await walk.memory.passages(walk.tenant, missing)) if is_current(row)},
    }
    passages: list[RankedPassage] = []
    for pid, score in ranked:
        row = walk.read.get(pid)
        if row is not None and not said_by(row, walk.request.as_of):  # a turn said after as_of, read through an entity
            continue
        if row is not None:
            passages.append(RankedPassage.of(row, round(score, 8), step=row["step"], via="walk"))
        elif rows.get(pid) is not None:
            passages.append(RankedPassage.of(rows[pid], round(score, 8), via="first_stage"))
    passages = passages[: walk.request.top_k]
    facts: list[FactView] = []
    for step, branch in enumerate(walk.taken, 1):
        if branch.kind != "fact":
            continue
        fact = walk.records[branch.tag_id]
        fields = {
            "head": fact.head,
            "relation": fact.relation,
            "tail": fact.tail,
            "head_id": fact.head_id,
            "tail_id": fact.tail_id,
            "status": fact.status,
            "category": fact.category,
        }
        facts.append(FactView.of_fields(fact.id, fields, round(branch.score, 6), step=step))
    steps, passages_budget, tokens = walk.budget.limits()
    router = RouterView(name=walk.router.name)
    if walk.fallback:
        router.fallback_from = walk.fallback["from"]
        router.error = walk.fallback["error"]
        router.fallback_at_step = walk.fallback["at_step"]
    return QueryResult(
        query=walk.request.query,
        tenant=walk.tenant,
        mode=walk.request.mode,
        passages=passages,
        entities=[cue_view(cue) for cue in walk.cues.values() if cue.kind not in ("query", "episode")],
        facts=facts,
        cues=QueryCues(
            entities=[cue_view(c) for c in query_cues if c.kind == "entity"],
            times=times,
            attributes=attributes,
        ),
        path=walk.path,
        stopped=Stopped(reason=stop.reason, detail=stop.detail),
        budget=BudgetView(
            steps=steps,
            passages=passages_budget,
            tokens=tokens,
            spent=SpentView(steps=walk.spent.steps, passages=walk.spent.passages, tokens=walk.spent.tokens),
        ),
        router=router,
        graph_version=version,
    )


def cue_view(cue: Cue) -> CueView:
    """A cue as answers show it (an empty id or name: none, as for the query's own cue)."""
    return CueView(
        kind=cue.kind,
        id=cue.id or None,
        name=cue.name or None,
        score=round(cue.score, 6),
        hop=cue.hop,
        origin=cue.origin or None,
    )
