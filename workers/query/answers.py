"""What the query side answers, typed once: `POST /v1/query` (QueryResult), the drill-downs
(FactRecord, Evidence, PassageRecord, StandingFacts) and the answer generation (Answer). The
engine and reconstruct build these; HTTP serialises them (`to_json`), the MCP tools return them
(the SDK publishes their JSON schemas as the tools' output schemas) and `memstream query` reads
an HTTP answer back into a QueryResult to print it (ops.answer_format).

On the wire a field that is None is left out (`to_json`): a mode's own sections (`seeds`, `ppr`,
`graph` of ppr; `path`, `cues`, `budget`, `stopped`, `router` of reconstruct) appear only in its
answers, and an optional field of a record only when it has a value."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from store.facts import Fact, FactStatus
from store.records import Hit
from topics.contract import FactCategory
from workers.query.modes import QueryMode


class _Whole(BaseModel):
    """A record on the wire with every field, null included."""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class _Wire(BaseModel):
    """A record on the wire: None fields left out."""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True, by_alias=True)


class Answer(_Whole):
    """An answer generated over a query's passages (`"answer": true`): `citations` are ids of
    those passages; any other id the model cited is in `dropped_citations`, not trusted."""

    model_config = ConfigDict(frozen=True)
    text: str
    citations: list[str]
    dropped_citations: list[str] = []


class Passage(_Wire):
    """A passage: the exact text of a published turn or document piece, its document, metadata
    (turn_id, dia_id, session_id, speaker, ts, ...) and context line; a titled document's passage
    also its subject (the name of the entity its title names)."""

    id: str
    doc_id: str
    text: str
    metadata: dict[str, Any] = {}
    context: str = ""
    subject: str | None = None


class RankedPassage(Passage):
    """A passage in a query answer, with its score; in reconstruct answers also the step that read
    it and how it was found ("walk": read by the walk, "first_stage": from the first stage)."""

    score: float
    step: int | None = None
    via: Literal["walk", "first_stage"] | None = None

    @classmethod
    def of(cls, row: dict[str, Any], score: float, **extra: Any) -> RankedPassage:
        """From a stored passage (store.records.passage_json)."""
        return cls(
            id=row["id"],
            doc_id=row["doc_id"],
            text=row["text"],
            metadata=row["metadata"],
            context=row["context"],
            subject=row.get("subject"),
            score=score,
            **extra,
        )


class StoredPassage(Passage):
    """A passage as the store holds it (store.records.passage_json): also its place in its
    document and whether a later version retired it (out of retrieval, kept for audit)."""

    seq: int
    doc_version: int
    retired: bool


class PassageRecord(StoredPassage):
    """GET /v1/passages/{id}: the stored passage and every document whose current version holds
    the same text (one passage of all; `doc_id` is the first that was extracted)."""

    doc_ids: list[str]


class Evidence(_Whole):
    """GET /v1/facts/{id}/evidence: the fact (every field, null included) and the passages it
    was extracted from, as published."""

    fact: Fact
    passages: list[StoredPassage]


@dataclass
class StandingFact(Fact):
    """A standing fact: every field of the fact, and the documents (for a turn:
    '{session_id}:{turn}') of the passages that state it."""

    doc_ids: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, fact: Fact, doc_ids: list[str]) -> StandingFact:
        return cls(**{f.name: getattr(fact, f.name) for f in fields(Fact)}, doc_ids=doc_ids)


class StandingFacts(_Whole):
    """GET /v1/facts: a tenant's facts of some categories that hold now, most specific first."""

    tenant: str
    categories: list[str]
    total: int = Field(description="active facts of these categories; more than listed when over `limit`")
    facts: list[StandingFact]
    warning: str | None = Field(default=None, description="set when the tenant holds no memory (a misspelt tenant?)")


class Overview(_Whole):
    """GET /v1/overview: a tenant's memory at a glance: its records per layer (store.keys.LAYERS),
    its facts per status and the version of its graph."""

    tenant: str
    layers: dict[str, int]
    facts_by_status: dict[str, int]
    graph_version: int


class RecentFacts(_Whole):
    """GET /v1/recent-facts: a tenant's newest facts of some statuses (none: any), newest first."""

    tenant: str
    statuses: list[str]
    facts: list[Fact]


class EntityName(_Wire):
    """An entity as stored: its id, name and type."""

    id: str
    name: str
    type: str = ""


class Neighbourhood(_Whole):
    """GET /v1/entities/{id}/facts: an entity and the facts that name it (as head or tail), every
    field; `total` counts them all, more than listed when over `limit`."""

    tenant: str
    entity: EntityName
    total: int
    facts: list[Fact]


class FactView(_Wire):
    """A fact in a query answer: (head, relation, tail) with its entity ids, status, `category`
    (a plain statement, a HARD_CONSTRAINT, a REJECTED_OPTION or a TOOL_FAILURE), when its TTL
    lapses (`expires_at`, epoch seconds) and its score; in reconstruct answers the step that read it."""

    id: str
    head: str | None = None
    relation: str | None = None
    tail: str | None = None
    head_id: str | None = None
    tail_id: str | None = None
    status: FactStatus | None = None
    category: FactCategory | None = None
    expires_at: float | None = None
    score: float | None = None
    step: int | None = None

    @classmethod
    def of_fields(cls, fact_id: str, fields: dict[str, Any], score: float, **extra: Any) -> FactView:
        """From a search hit's fields: an empty field is no field."""
        return cls(id=fact_id, **{k: v for k, v in fields.items() if v not in (None, "")}, score=score, **extra)

    @classmethod
    def of_hit(cls, hit: Hit) -> FactView:
        """From a fact search's hit (its `expired_at`, a store field, is no part of the view)."""
        return cls.of_fields(hit.id, {k: v for k, v in hit.fields.items() if k != "expired_at"}, round(hit.score, 6))


class EntityView(_Wire):
    """An entity in a query answer: its id, name, type and score."""

    id: str
    name: str | None = None
    type: str | None = None
    score: float

    @classmethod
    def of_hit(cls, hit: Hit) -> EntityView:
        """From an entities search's hit (its fields name and type)."""
        return cls(id=hit.id, name=hit.fields["name"], type=hit.fields["type"], score=round(hit.score, 6))


class CueView(_Wire):
    """A cue of the reconstruct walk: an entity, a time or an episode the walk recalls from,
    where it came from (`from`: the query, a KNN, a fact or passage read) and at which hop."""

    model_config = ConfigDict(populate_by_name=True)
    kind: str
    id: str | None = None
    name: str | None = None
    score: float
    hop: int
    origin: str | None = Field(default=None, alias="from")


class Scored(_Wire):
    id: str
    score: float


class TypeSeed(_Wire):
    type: str
    score: float


class WalkSeeds(_Wire):
    """What seeded a ppr walk: the facts, entities, types and passages, with their weights."""

    facts: list[Scored]
    entities: list[EntityView]
    types: list[TypeSeed]
    passages: list[Scored]


class WalkStats(_Wire):
    """The PPR solve: passes, whether it converged (false only at the pass cap), its error bound."""

    passes: int
    converged: bool
    error_bound: float


class GraphStats(_Wire):
    """How the cached matrix got here: one load, then stream changes folded in as deltas."""

    nodes: int
    edges: int
    loads: int
    rebuilds: int
    changes_applied: int
    deltas_applied: int


class Tag(_Wire):
    """What a reconstruct step recalled a cue by: a fact or a passage (its id and score, by the
    kind), its text and the chain of facts that led there."""

    fact_id: str | None = None
    passage_id: str | None = None
    text: str
    fact_score: float | None = None
    passage_score: float | None = None
    chain: str
    chain_score: float


class Content(_Wire):
    """What a reconstruct step read: the passages (their ids, tokens), those the budget left unread."""

    fact_id: str | None = None
    passages: list[str]
    tokens: int
    not_read: list[str] | None = None


class Step(_Wire):
    """One step of the reconstruct walk: cue → tag → content → new cues."""

    step: int
    cue: CueView
    tag: Tag
    score: float
    router: str
    why: str | None = None
    content: Content
    new_cues: list[CueView]


class QueryCues(_Wire):
    entities: list[CueView]
    times: list[str]
    attributes: list[str]


class Stopped(_Wire):
    reason: str
    detail: str


class SpentView(_Wire):
    steps: int
    passages: int
    tokens: int


class BudgetView(_Wire):
    steps: int
    passages: int
    tokens: int
    spent: SpentView


class RouterView(_Wire):
    """The router that chose each step; with a fallback, the one it fell back from and why."""

    name: str
    fallback_from: str | None = None
    error: str | None = None
    fallback_at_step: int | None = None


def empty_tenant_warning(tenant: str) -> str:
    """What an answer says of a tenant nothing was ever indexed for: a misspelt tenant, or none
    given (the default), would otherwise look like an empty memory."""
    return f"tenant {tenant!r} holds no memory: nothing was ever indexed for it (`memstream tenants` lists those that hold some)"


class QueryResult(_Wire):
    """`POST /v1/query`'s answer in every mode: the ranked passages, the facts and entities near
    the query, the graph version it read; `fallback` when a graph mode answered with its first
    stage; `warning` when the tenant holds no memory; `answer` when one was asked for."""

    query: str
    tenant: str
    mode: QueryMode
    passages: list[RankedPassage]
    entities: list[EntityView | CueView] = []
    facts: list[FactView] = []
    graph_version: int | None = None
    fallback: str | None = None
    warning: str | None = None
    answer: Answer | None = None
    timings_ms: dict[str, float] | None = None
    # ppr
    seeds: WalkSeeds | None = None
    ppr: WalkStats | None = None
    graph: GraphStats | None = None
    # reconstruct
    cues: QueryCues | None = None
    path: list[Step] | None = None
    stopped: Stopped | None = None
    budget: BudgetView | None = None
    router: RouterView | None = None


# ---- receipts of the writes: what was queued, and where -------------------------------------


class Remembered(_Whole):
    """A document or turn queued for indexing (the MCP tool remember)."""

    doc_id: str
    tenant: str
    topic: str
    queued: bool = Field(
        description="true: on the topic; indexed by the workers within seconds, then found by search_memory"
    )


class Retracted(_Whole):
    """A fact's retraction queued for the resolver (POST /v1/facts/{id}/retract, the MCP tool retract_fact)."""

    fact_id: str
    tenant: str
    request: str = Field(description="the retraction's work id")
    queued: bool = Field(description="true: on memstream.conflict-sets; the resolver retracts it within seconds")


class Forgotten(_Whole):
    """A document's deletion queued (the MCP tool forget)."""

    doc_id: str
    tenant: str
    topic: str
    queued: bool = Field(
        description="true: its tombstone is on the topic; the workers take the document out within seconds"
    )


class Health(_Wire):
    """GET /healthz: ok, or unhealthy with the part that does not answer."""

    status: Literal["ok", "unhealthy"]
    redis: Literal["unavailable"] | None = None
