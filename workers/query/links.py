"""The pages a subject joins to a query, for ppr and reconstruct (workers.algorithms.subjects):
in a tenant of titled documents every passage holds its document's subject, so a name the
question holds that is a page's subject names that page (`named_pages`), and a name the first
stage's top passage holds is a hyperlink to that page (`linked_pages`) — the second hop of a
question the top passage answers half of. Those pages among a mode's first candidates rank right
below the top passage. Nothing is read for a top passage without a subject (an untitled
document, a conversation turn)."""

from __future__ import annotations

import asyncio

from store.base import MemoryStore
from workers.algorithms.normalize import entity_id, has_entity_id
from workers.algorithms.subjects import linked_pages, named_pages
from workers.query.first_stage import FirstStageSearch, ready
from workers.query.request import QueryRequest


async def pages_linked(
    memory: MemoryStore,
    first_stage: FirstStageSearch,
    request: QueryRequest,
    top_row: dict | None,
    ranked: list[str],
    rows: dict[str, dict],
    top_entities: list[str] | None = None,
) -> tuple[list[str], dict[str, dict]]:
    """The pages the question names, then those `top_row` (the first stage's top passage's row)
    links to, among `ranked`'s first `first_stage_k` (a mode's ranking, best first; at most
    `named_pages` and `linked_pages` of each: the request's params), and `rows` with those
    candidates' rows read (one round trip for the missing; the top passage's entities in the
    same one unless given: `top_entities`, entity ids)."""
    params = request.params
    if params.named_pages <= 0 and params.linked_pages <= 0 or not top_row or not top_row.get("subject"):
        return [], rows
    top, candidates = top_row["id"], ranked[: params.first_stage_k]
    entities, rows = await asyncio.gather(
        ready(top_entities or [])
        if top_entities is not None or params.linked_pages <= 0
        else _entities_of(memory, request.tenant, top),
        first_stage.read_rows(request.tenant, candidates, rows),
    )
    subject_of = {pid: sid for pid in candidates if (sid := _subject_id(rows.get(pid)))}
    links = set(entities) - {_subject_id(top_row)}
    named = named_pages(request.query, top, candidates, subject_of, params.named_pages)
    linked = linked_pages(links, top, candidates, subject_of, params.linked_pages)
    return list(dict.fromkeys(named + linked)), rows


async def _entities_of(memory: MemoryStore, tenant: str, passage_id: str) -> list[str]:
    return (await memory.passages_entities(tenant, [passage_id]))[0]


def _subject_id(row: dict | None) -> str | None:
    """The entity id of a passage row's subject; None for none (or a stored name that names
    nothing: the chunker never stores one, a hand-made chunk message might)."""
    name = (row or {}).get("subject")
    return entity_id(name) if name and has_entity_id(name) else None
