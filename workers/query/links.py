"""What a titled document's links join to a query, for ppr and reconstruct
(workers.algorithms.subjects): in a tenant of titled documents every passage holds its
document's subject, so a name the question holds that is a page's subject names that page
(`named_pages`), and a name the first stage's top passage holds is a hyperlink to that page
(`linked_pages`) — the second hop of a question the top passage answers half of; a passage the
first stage ranks that shares such a name with the top passage is a second hop too, where the
name has no page (`bridge_passages`). Those pages and passages rank right below the top passage.
Nothing is read for a top passage without a subject (an untitled document, a conversation
turn)."""

from __future__ import annotations

import asyncio
from typing import Callable, Sequence

from store.base import MemoryStore
from workers.algorithms.normalize import entity_id, has_entity_id
from workers.algorithms.retrieval import keep_first
from workers.algorithms.subjects import bridge_passages, linked_pages, named_pages
from workers.query.first_stage import ready
from workers.query.request import QueryRequest


async def with_links(
    memory: MemoryStore,
    request: QueryRequest,
    first: list[str],
    ranked: list[tuple[str, float]],
    rows: dict[str, dict],
    kept: int,
    entities_in: Callable[[str], list[str] | None] | None = None,
) -> list[tuple[str, float]]:
    """`ranked` (ppr's or reconstruct's ranking, or the first stage's where ppr's walk had no
    seed) with what links_of_top finds right below the first stage's `kept` top passages, kept
    in place (keep_first; retrieval.kept_first: as many as the walk's fusion keeps); the top
    passage's row is `rows`' (`first`: the first stage's ranking)."""
    top_row = rows.get(first[0]) if first else None
    ranked_ids = [pid for pid, _ in ranked]
    links = await links_of_top(memory, request, top_row, ranked_ids, rows, first, entities_in, kept=kept)
    return keep_first(ranked, first, kept, links) if links else ranked


async def links_of_top(
    memory: MemoryStore,
    request: QueryRequest,
    top_row: dict | None,
    ranked: list[str],
    rows: dict[str, dict],
    first: Sequence[str] = (),
    entities_in: Callable[[str], list[str] | None] | None = None,
    *,
    kept: int,
) -> list[str]:
    """The pages the question names, then those `top_row` (the first stage's top passage's row)
    links to, among `ranked`'s first `first_stage_k` (a mode's ranking, best first; at most
    `named_pages` and `linked_pages` of each: the request's params); then at most
    `bridge_passages` of `first`'s first `first_stage_k` (the first stage's ranking) that share
    a bridge entity with the top passage (subjects.bridge_passages): current passages (their
    row in `rows`) of other pages than the top passage's, none kept in place already. A question that names the
    top passage's own page names that page's other passages (MuSiQue-100 has pages of several:
    left out, ppr's R@2 fell 57.2 → 56.0); the top passage links to none of them. The subjects
    of candidates whose row is not in `rows` are read in one round trip (the field alone),
    beside the entities of the top passage and of `first`'s candidates that `entities_in`
    (passage id → its entity ids, None where unknown: ppr's cached graph) does not have — asked
    only of a titled top passage. A subject is matched by its name's entity id: an alias the
    resolver merged into another entity names that one in the passages' entities, not in the
    subject, and is neither named nor linked. `kept`: how many of `first` are kept in place above
    them (retrieval.kept_first: two over turns, one over documents; none kept, no links)."""
    params = request.params
    if kept <= 0 or max(params.named_pages, params.linked_pages, params.bridge_passages) <= 0:
        return []  # (they are the kept top passage's links: with none kept, none)
    if not top_row or not top_row.get("subject"):
        return []
    top, candidates = top_row["id"], ranked[: params.first_stage_k]
    unread = [pid for pid in candidates if pid not in rows]
    own, held = _subject_id(top_row["subject"]), set(first[:kept])
    # a bridge is a current passage (its row read) of another page, not one kept in place
    bridged = [
        pid
        for pid in (first[: params.first_stage_k] if params.bridge_passages > 0 else ())
        if pid in rows and pid not in held and _subject_id(rows[pid].get("subject")) != own
    ]
    asked = ([top] if params.linked_pages > 0 or bridged else []) + bridged
    known = {pid: found for pid in asked if entities_in is not None and (found := entities_in(pid)) is not None}
    unknown = [pid for pid in asked if pid not in known]
    entities, subjects = await asyncio.gather(
        memory.passages_entities(request.tenant, unknown) if unknown else ready([]),
        memory.passage_subjects(request.tenant, unread) if unread else ready([]),
    )
    entities_of = {pid: set(ids) for pid, ids in [*known.items(), *zip(unknown, entities)]}
    names = {
        **{pid: rows[pid].get("subject") for pid in candidates if pid in rows},
        **dict(zip(unread, subjects)),
    }
    subject_of = {pid: sid for pid, name in names.items() if (sid := _subject_id(name))}
    # a passage links to other pages: its own document's other passages are none
    links = entities_of.get(top, set()) - {own}
    named = named_pages(request.query, top, candidates, subject_of, params.named_pages)
    pages = list(dict.fromkeys(named + linked_pages(links, top, candidates, subject_of, params.linked_pages)))
    return pages + bridge_passages(request.query, links, bridged, entities_of, set(pages), params.bridge_passages)


def _subject_id(name: str | None) -> str | None:
    """The entity id a stored subject names; None for none (or a name that names nothing: the
    chunker never stores one, a hand-made chunk message might)."""
    return entity_id(name) if name and has_entity_id(name) else None
