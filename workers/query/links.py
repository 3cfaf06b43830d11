"""The pages a subject joins to a query, for ppr and reconstruct (workers.algorithms.subjects):
in a tenant of titled documents every passage holds its document's subject, so a name the
question holds that is a page's subject names that page (`named_pages`), and a name the first
stage's top passage holds is a hyperlink to that page (`linked_pages`) — the second hop of a
question the top passage answers half of. Those pages among a mode's first candidates rank right
below the top passage. Nothing is read for a top passage without a subject (an untitled
document, a conversation turn)."""

from __future__ import annotations

import asyncio
from typing import Callable

from store.base import MemoryStore
from workers.algorithms.normalize import entity_id, has_entity_id
from workers.algorithms.retrieval import keep_first
from workers.algorithms.subjects import linked_pages, named_pages
from workers.query.first_stage import ready
from workers.query.request import QueryRequest


async def with_subject_pages(
    memory: MemoryStore,
    request: QueryRequest,
    first: list[str],
    ranked: list[tuple[str, float]],
    rows: dict[str, dict],
    entities_in: Callable[[str], list[str] | None] | None = None,
) -> list[tuple[str, float]]:
    """`ranked` (ppr's or reconstruct's ranking, or the first stage's where ppr's walk had no
    seed) with the pages subject_pages finds right below the first stage's kept top passage
    (keep_first); the top passage's row is `rows`' (`first`: the first stage's ranking)."""
    top_row = rows.get(first[0]) if first else None
    pages = await subject_pages(memory, request, top_row, [pid for pid, _ in ranked], rows, entities_in)
    return keep_first(ranked, first, request.params.first_kept, pages) if pages else ranked


async def subject_pages(
    memory: MemoryStore,
    request: QueryRequest,
    top_row: dict | None,
    ranked: list[str],
    rows: dict[str, dict],
    entities_in: Callable[[str], list[str] | None] | None = None,
) -> list[str]:
    """The pages the question names, then those `top_row` (the first stage's top passage's row)
    links to, among `ranked`'s first `first_stage_k` (a mode's ranking, best first; at most
    `named_pages` and `linked_pages` of each: the request's params). A question that names the
    top passage's own page names that page's other passages (MuSiQue-100 has pages of several:
    left out, ppr's R@2 fell 57.2 → 56.0); the top passage links to none of them. The subjects
    of candidates whose row is not in `rows` are read in one round trip (the field alone),
    beside the top passage's entities unless `entities_in` (passage id → its entity ids, None
    where unknown: ppr's cached graph) has them — asked only of a titled top passage. A subject
    is matched by its name's entity id: an alias the resolver merged into another entity names
    that one in the passages' entities, not in the subject, and is neither named nor linked."""
    params = request.params
    if params.first_kept <= 0 or params.named_pages <= 0 and params.linked_pages <= 0:
        return []  # (the pages are the kept top passage's: with none kept, none)
    if not top_row or not top_row.get("subject"):
        return []
    top, candidates = top_row["id"], ranked[: params.first_stage_k]
    unread = [pid for pid in candidates if pid not in rows]
    known = entities_in(top) if entities_in is not None and params.linked_pages > 0 else None
    entities, subjects = await asyncio.gather(
        ready(known or [])
        if known is not None or params.linked_pages <= 0
        else _entities_of(memory, request.tenant, top),
        memory.passage_subjects(request.tenant, unread) if unread else ready([]),
    )
    names = {
        **{pid: rows[pid].get("subject") for pid in candidates if pid in rows},
        **dict(zip(unread, subjects)),
    }
    subject_of = {pid: sid for pid, name in names.items() if (sid := _subject_id(name))}
    own = _subject_id(top_row["subject"])
    named = named_pages(request.query, top, candidates, subject_of, params.named_pages)
    # a passage links to other pages: its own document's other passages are none
    linked = linked_pages(set(entities) - {own}, top, candidates, subject_of, params.linked_pages)
    return list(dict.fromkeys(named + linked))


async def _entities_of(memory: MemoryStore, tenant: str, passage_id: str) -> list[str]:
    return (await memory.passages_entities(tenant, [passage_id]))[0]


def _subject_id(name: str | None) -> str | None:
    """The entity id a stored subject names; None for none (or a name that names nothing: the
    chunker never stores one, a hand-made chunk message might)."""
    return entity_id(name) if name and has_entity_id(name) else None
