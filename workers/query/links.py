"""The pages the first stage's top passage links to, for ppr and reconstruct
(workers.algorithms.retrieval.linked_pages): in a tenant of titled documents every passage holds
its document's subject (workers.algorithms.subjects), so a name the top passage holds that is
another page's subject is a hyperlink — the second hop of a question the top passage answers
half of. Those pages among a mode's first candidates rank right below the top passage. Nothing
is read for a top passage without a subject (an untitled document, a conversation turn)."""

from __future__ import annotations

import asyncio

from store.base import MemoryStore
from workers.algorithms.normalize import entity_id
from workers.algorithms.retrieval import RetrievalParams, linked_pages
from workers.query.first_stage import FirstStageSearch, ready


async def pages_linked(
    memory: MemoryStore,
    first_stage: FirstStageSearch,
    tenant: str,
    params: RetrievalParams,
    top_row: dict | None,
    ranked: list[str],
    rows: dict[str, dict],
    top_entities: list[str] | None = None,
) -> tuple[list[str], dict[str, dict]]:
    """The pages `top_row` (the first stage's top passage's row) links to among `ranked`'s first
    `params.first_stage_k` (a mode's ranking, best first), at most `params.linked_pages`, and
    `rows` with those candidates' rows read (one round trip for the missing; the top passage's
    entities in the same one unless given: `top_entities`, entity ids)."""
    if params.linked_pages <= 0 or not top_row or not top_row.get("subject"):
        return [], rows
    top, candidates = top_row["id"], ranked[: params.first_stage_k]
    entities, rows = await asyncio.gather(
        ready(top_entities) if top_entities is not None else _entities_of(memory, tenant, top),
        first_stage.read_rows(tenant, candidates, rows),
    )
    subject_of = {pid: entity_id(rows[pid]["subject"]) for pid in candidates if (rows.get(pid) or {}).get("subject")}
    links = set(entities) - {entity_id(top_row["subject"])}
    return linked_pages(links, top, candidates, subject_of, params.linked_pages), rows


async def _entities_of(memory: MemoryStore, tenant: str, passage_id: str) -> list[str]:
    return (await memory.passages_entities(tenant, [passage_id]))[0]
