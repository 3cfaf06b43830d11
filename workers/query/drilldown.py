"""Drill-down from a fact to its evidence and to a passage: the records GET /v1/facts/{id},
/v1/facts/{id}/evidence and /v1/passages/{id} answer, and `memstream fact` / `memstream passage`
print (one implementation for the HTTP API, the CLI and other callers). None: no such record in
the tenant. And a tenant's standing facts — its constraints, rejected options and tool failures
that hold — as GET /v1/facts?category=, the MCP tool standing_facts and `memstream facts` list
them (`standing_facts`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from store.base import MemoryStore
from store.facts import STATUSES, Fact
from store.keys import LAYERS
from topics import ContractError
from topics.contract import quoted, quoted_names
from topics.records import CATEGORY_PRECEDENCE, FACT_CATEGORIES
from workers.query.answers import (
    EntityName,
    Evidence,
    Neighbourhood,
    Overview,
    PassageRecord,
    RecentFacts,
    StandingFact,
    StandingFacts,
    StoredPassage,
    empty_tenant_warning,
)

# What an agent checks before a decision: everything but plain statements
STANDING_CATEGORIES = ("HARD_CONSTRAINT", "REJECTED_OPTION", "TOOL_FAILURE")
DEFAULT_FACTS_LIMIT, MAX_FACTS_LIMIT = 50, 500


def missing(what: str, tenant: str) -> str:
    """The message for a record the tenant does not have (`what`: "fact 'f1'", "passage 'p9'"):
    the HTTP 404 body, the CLI's error and the MCP tool error say the same."""
    return f"no {what} in tenant {tenant!r}"


async def fact_record(memory: MemoryStore, tenant: str, fact_id: str) -> Fact | None:
    """The fact, every field (Fact.to_json on the wire); a fact retracted on request shows the
    passages its retraction set aside (its status says it is retracted: they support nothing)."""
    fact = await memory.fact(tenant, fact_id)
    if fact is not None and fact.status == "retracted" and not fact.passage_ids:
        fact = dataclasses.replace(fact, passage_ids=await memory.set_aside_passages(tenant, fact_id))
    return fact


async def fact_evidence(memory: MemoryStore, tenant: str, fact_id: str) -> Evidence | None:
    """The fact (fact_record) and the passages it was extracted from, as published."""
    fact = await fact_record(memory, tenant, fact_id)
    if fact is None:
        return None
    passages = [StoredPassage(**p) for p in await memory.passages(tenant, fact.passage_ids) if p is not None]
    return Evidence(fact=fact, passages=passages)


async def passage_record(memory: MemoryStore, tenant: str, passage_id: str) -> PassageRecord | None:
    """The passage (store.records.passage_json): its text byte for byte as published, its
    document, metadata (turn_id, dia_id, session_id, speaker, ts, ...) and context line, and
    `doc_ids`: every document whose current version holds the same text (one passage of all;
    `doc_id` is the first that was extracted)."""
    found = (await memory.passages(tenant, [passage_id]))[0]
    if found is None:
        return None
    [held_by] = await memory.passage_documents(tenant, [passage_id])
    return PassageRecord(**found, doc_ids=sorted(held_by) or ([] if found["retired"] else [found["doc_id"]]))


def fact_filter(categories: Any = None, limit: Any = None) -> tuple[tuple[str, ...], int]:
    """The categories (a list, or one comma-separated string; None or empty: STANDING_CATEGORIES)
    and the limit (1 to MAX_FACTS_LIMIT; None: DEFAULT_FACTS_LIMIT; a string of ASCII digits is
    read, nothing else: not " 5", "1e3", "-1" nor "²", which str.isdigit accepts and int() refuses)
    of a standing-facts request; ContractError names what is wrong."""
    chosen: tuple[str, ...]
    if categories is None or categories == "" or categories == []:
        chosen = STANDING_CATEGORIES
    else:
        names = categories.split(",") if isinstance(categories, str) else categories
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ContractError("'category' must be a list of category names or one comma-separated string")
        chosen = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
        unknown = [n for n in chosen if n not in FACT_CATEGORIES]
        if unknown or not chosen:
            raise ContractError(
                f"unknown fact category {quoted_names(unknown) or quoted(categories)}: expected {', '.join(FACT_CATEGORIES)}"
            )
    return chosen, parse_limit(limit)


def parse_limit(limit: Any = None) -> int:
    """A limit of a listing: 1 to MAX_FACTS_LIMIT; None or "": DEFAULT_FACTS_LIMIT; a string of
    ASCII digits is read, nothing else; ContractError otherwise."""
    if limit is None or limit == "":
        return DEFAULT_FACTS_LIMIT
    if isinstance(limit, str) and limit.isascii() and limit.isdigit():
        # more digits than the largest limit has is out of range unread: int() refuses a string
        # of over 4,300 digits with a ValueError, which was a 500 (an audit)
        digits = limit.lstrip("0") or "0"
        limit = int(digits) if len(digits) <= len(str(MAX_FACTS_LIMIT)) else MAX_FACTS_LIMIT + 1
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_FACTS_LIMIT:
        raise ContractError(f"'limit' must be an integer from 1 to {MAX_FACTS_LIMIT}")
    return limit


async def standing_facts(
    memory: MemoryStore,
    tenant: str,
    categories: tuple[str, ...] = STANDING_CATEGORIES,
    limit: int = DEFAULT_FACTS_LIMIT,
    now: float | None = None,
) -> StandingFacts:
    """The tenant's facts of `categories` that hold now (active, TTL not lapsed), most specific
    category first (CATEGORY_PRECEDENCE), then oldest first (created_at, then id): {"tenant",
    "categories", "total" (the facts of those categories that hold; more than listed when over
    `limit`), "facts": each fact (store.facts.Fact.to_json) with the doc ids of its passages
    ("doc_ids": a turn's document, so the turn that said it)}. The store fills `limit` one
    category at a time in that order (MemoryStore.active_facts), so a tool failure is never left
    out for a plain constraint; a fact whose TTL lapsed between that read and this is dropped."""
    now = time.time() if now is None else now
    ordered = tuple(sorted(categories, key=CATEGORY_PRECEDENCE.index))
    facts, total = await memory.active_facts(tenant, ordered, limit, now)
    facts = [f for f in facts if f.holds(now)]
    passage_ids = sorted({p for f in facts for p in f.passage_ids})
    doc_of = {p["id"]: p["doc_id"] for p in await memory.passages(tenant, passage_ids) if p is not None}
    return StandingFacts(
        tenant=tenant,
        categories=list(categories),
        total=total,
        facts=[StandingFact.of(f, sorted({doc_of[p] for p in f.passage_ids if p in doc_of})) for f in facts],
        warning=None if facts or await memory.tenant_known(tenant) else empty_tenant_warning(tenant),
    )


async def overview(memory: MemoryStore, tenant: str) -> Overview:
    """The tenant's records per layer and facts per status (the store's census, as the metrics
    read it) and its graph version: what the explorer's memory-at-a-glance panel shows."""
    layers = {layer: sum((await memory.census(layer)).get(tenant, {}).values()) for layer in LAYERS}
    statuses = (await memory.census("facts", by="status")).get(tenant, {})
    return Overview(
        tenant=tenant,
        layers=layers,
        facts_by_status=dict(sorted(statuses.items())),
        graph_version=await memory.graph_version(tenant),
    )


async def neighbourhood(
    memory: MemoryStore, tenant: str, entity_id: str, limit: int = DEFAULT_FACTS_LIMIT
) -> Neighbourhood | None:
    """The entity (None: the tenant has none of that id) and the first `limit` facts naming it as
    head or tail, by id: the explorer expands an entity's node with them."""
    names = await memory.entity_names(tenant, [entity_id])
    if entity_id not in names:
        return None
    fact_ids = await memory.facts_naming(tenant, entity_id)
    facts = [f for f in await memory.facts(tenant, fact_ids[:limit]) if f is not None]
    found = names[entity_id]
    return Neighbourhood(
        tenant=tenant,
        entity=EntityName(id=entity_id, name=found["name"], type=found.get("type") or ""),
        total=len(fact_ids),
        facts=facts,
    )


def status_filter(statuses: str | None) -> tuple[str, ...]:
    """?status=A,B of GET /v1/recent-facts (None or empty: any status); ContractError names an unknown one."""
    chosen = tuple(dict.fromkeys(n.strip() for n in (statuses or "").split(",") if n.strip()))
    unknown = [n for n in chosen if n not in STATUSES]
    if unknown:
        raise ContractError(f"unknown fact status {quoted_names(unknown)}: expected {', '.join(STATUSES)}")
    return chosen


async def recent_facts(
    memory: MemoryStore, tenant: str, statuses: tuple[str, ...] = (), limit: int = DEFAULT_FACTS_LIMIT
) -> RecentFacts:
    """The tenant's newest `limit` facts of `statuses` (empty: any), newest first by created_at:
    the explorer's newest facts, and with ("invalid",) the facts that lost a conflict."""
    return RecentFacts(tenant=tenant, statuses=list(statuses), facts=await memory.recent_facts(tenant, statuses, limit))
