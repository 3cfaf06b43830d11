"""A fact of M_fac and its lifecycle: the one typed record the pipeline, the query worker and
export share, and the transitions that change it.

    new ──τ gate──> pending ──promotion──> active <──> invalid
                      ^                      │  (park: its schema fell below τ)
                      └──────────────────────┘
                                  │          │  ╲
                                  │          │   merged (into a fact that says the same)
                                  └──────────┴──> expired · retracted

Each transition stages, on the message's transaction, the fact's status and timestamps and its
graph edge (an active fact is an edge between its entities; any other status is not), and
returns the event that tells subscribers. Event ids are given when the message's outbox is
known (workers.envelope.stamp_event_ids): one per transition.

Times: `created_at` / `activated_at` / `expired_at` are system time (seconds since the epoch;
`expired_at` set ⇔ the fact no longer holds in memory), as is `expires_at` (when its TTL lapses);
`valid_at` / `invalid_at` are world time from the evidence ("1998", "1998-05") as the resolver
qualifies it — an invalidated fact ends where the fact that excluded it begins, when that is later
(`invalidate(..., ends_at=)`). workers.algorithms.expiry reads the two timelines (`as_of`).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal, get_args

import numpy as np

from store.nodes import entity_node
from store.records import Hit
from topics import FactEvent
from topics.contract import FactCategory, fact_category
from topics.records import CATEGORY_PRECEDENCE, VALUE_TYPES, Triple

# A fact's lifecycle (docs/architecture.md, "How it works"); mypy checks every status named in code
# against it (strict_equality: comparing with a name not in it is an error).
FactStatus = Literal["new", "pending", "active", "invalid", "merged", "expired", "retracted"]
STATUSES: tuple[FactStatus, ...] = get_args(FactStatus)

# What extraction says of a fact; of the descriptions seen, the one of the most specific category
# (CATEGORY_PRECEDENCE), then the smallest, wins (order-independent): Fact.description_rank.
DESCRIPTION_FIELDS = (
    "head",
    "relation",
    "tail",
    "head_type",
    "tail_type",
    "head_id",
    "tail_id",
    "schema_id",
    "category",
    "valid_from",
    "valid_to",
    "text",
)
# What an event tells subscribers about the fact.
PUBLIC_FIELDS = (
    "head",
    "relation",
    "tail",
    "head_type",
    "tail_type",
    "head_id",
    "tail_id",
    "schema_id",
    "category",
    "status",
    "qualifiers",
    "valid_from",
    "valid_to",
    "merged_into",
)
_TIMES = ("created_at", "activated_at", "expired_at", "expires_at")


@dataclass
class Fact:
    id: str
    head: str
    relation: str
    tail: str
    head_type: str
    tail_type: str
    head_id: str
    tail_id: str
    schema_id: str
    category: FactCategory = "DECLARATIVE"
    valid_from: str | None = None
    valid_to: str | None = None
    text: str = ""
    status: FactStatus = "new"
    passage_ids: list[str] = field(default_factory=list)
    qualifiers: dict = field(default_factory=dict)
    reason: str = ""
    merged_into: str = ""
    valid_at: str = ""
    invalid_at: str = ""
    created_at: float | None = None
    activated_at: float | None = None
    expired_at: float | None = None
    # system time at which its TTL lapses: the latest lapse of its supporting passages (None:
    # never). Written by the store with each passage's lapse (Memory.stage_new_fact) and with
    # the passages a merge brings (Memory.stage_merged_lapse) at commit, not on this record.
    expires_at: float | None = None

    @classmethod
    def extracted(cls, fact_id: str, triple: Triple, head_id: str, tail_id: str, schema_id: str) -> "Fact":
        return cls(
            fact_id,
            triple.head,
            triple.relation,
            triple.tail,
            triple.head_type,
            triple.tail_type,
            head_id,
            tail_id,
            schema_id,
            fact_category(triple.category),
            triple.valid_from,
            triple.valid_to,
            f"{triple.head} {triple.relation} {triple.tail}",
        )

    @classmethod
    def from_hash(cls, fact_id: str, row: dict[str, str], passage_ids: list[str]) -> "Fact":
        """From the fact's Redis hash (decoded, without the vector). A reconstruct query reads
        ~115 facts (50,000 passages): one dict copied from the defaults, no merge of three, no
        json.loads of an empty "{}" — a fact read (layers.fact_of_values) 9.0 → 6.6 µs."""
        # field → value for cls(**): str, str | None (valid_from/valid_to), float | None (the times).
        # mypy checks a ** mapping's value type against every field it may fill: only Any fits all
        values: dict[str, Any] = _hash_defaults().copy()
        for name in _hash_fields():
            if name in row:
                values[name] = row[name]
        values["valid_from"] = values["valid_from"] or None
        values["valid_to"] = values["valid_to"] or None
        for name in _TIMES:
            if row.get(name):
                values[name] = float(row[name])
        qualifiers = row.get("qualifiers")
        values["qualifiers"] = json.loads(qualifiers) if qualifiers and qualifiers != "{}" else {}
        return cls(fact_id, passage_ids=sorted(passage_ids), **values)

    def description(self) -> dict[str, str]:
        return {name: "" if getattr(self, name) is None else str(getattr(self, name)) for name in DESCRIPTION_FIELDS}

    def description_rank(self) -> str:
        """What the stores compare descriptions by (the smaller wins): the category's place in
        CATEGORY_PRECEDENCE first, so a plain re-mention (DECLARATIVE) of a refusal, constraint or
        failure does not take its category away whatever the order they arrive in, then the
        fields, so ties go to the smallest."""
        described = self.description()
        place = (
            CATEGORY_PRECEDENCE.index(self.category)
            if self.category in CATEGORY_PRECEDENCE
            else len(CATEGORY_PRECEDENCE)
        )
        return "\x1f".join([str(place), *(described[k] for k in sorted(described))])

    def triple(self) -> Triple:
        return Triple(
            self.head,
            self.relation,
            self.tail,
            self.head_type,
            self.tail_type,
            self.category,
            self.valid_from,
            self.valid_to,
        )

    def public(self) -> dict:
        return {name: getattr(self, name) for name in PUBLIC_FIELDS}

    def to_json(self) -> dict:
        """Every field, for HTTP answers and export."""
        return asdict(self)

    def holds(self, now: float | None = None) -> bool:
        """Active and its TTL not lapsed: what a query may use (before the sweep expires it too)."""
        return self.status == "active" and not self.lapsed(now)

    def lapsed(self, now: float | None = None) -> bool:
        """Its TTL is over (the sweep expires it, if it has not yet)."""
        return self.expires_at is not None and self.expires_at <= (time.time() if now is None else now)

    @property
    def event_start(self) -> str:
        """When it began to hold in the world, as far as known: the resolver's span, else the
        evidence's ('' unknown)."""
        return self.valid_at or self.valid_from or ""

    @property
    def event_end(self) -> str:
        return self.invalid_at or self.valid_to or ""


def event(tenant: str, kind: str, fact: Fact, graph_version: int, reason: str = "", evidence=()) -> FactEvent:
    return FactEvent(
        tenant=tenant,
        event=kind,
        event_id="",
        fact_id=fact.id,
        fact=fact.public(),
        passage_ids=list(fact.passage_ids),
        graph_version=graph_version,
        reason=reason,
        ts=time.time(),
        evidence_passage_ids=list(evidence),
    )


def document_event(
    tenant: str, kind: str, doc_id: str, passage_ids, graph_version: int, reason: str, fact_ids=()
) -> FactEvent:
    """A document's event (FactEvent.DOCUMENT_EVENTS): `retired` or `purged`; ids, never text."""
    return FactEvent(
        tenant=tenant,
        event=kind,
        event_id="",
        fact_id="",
        fact={},
        passage_ids=sorted(passage_ids),
        graph_version=graph_version,
        reason=reason,
        ts=time.time(),
        doc_id=doc_id,
        fact_ids=list(fact_ids),
    )


class Lifecycle:
    """The transitions of a fact, staged on the message's transaction (`pipe`) through the
    memory's primitives. Each updates the Fact in place and returns its event; `reason` is
    stored with the fact, `told` (default: the reason) is what the event says."""

    def __init__(self, memory):
        self.memory = memory

    def _stage(self, pipe, tenant: str, fact: Fact, **changes) -> None:
        # the decision saw the fact in this status: its commit fails if another stage changed it
        self.memory.expect_status(pipe, tenant, fact.id, fact.status)
        for name, value in changes.items():
            setattr(fact, name, value)
        stored = {
            name: (json.dumps(value, sort_keys=True) if name == "qualifiers" else value)
            for name, value in changes.items()
        }
        self.memory.stage_fact_update(pipe, tenant, fact.id, stored)

    def _link(self, pipe, tenant: str, fact: Fact, version: int) -> None:
        if fact.head_type in VALUE_TYPES or fact.tail_type in VALUE_TYPES:
            return  # a value is no node a walk passes through (`_unlink` stays: an edge made before this rule goes)
        self.memory.stage_fact_edge(
            pipe, tenant, version, entity_node(fact.head_id), entity_node(fact.tail_id), fact.id
        )

    def _unlink(self, pipe, tenant: str, fact: Fact, version: int) -> None:
        self.memory.stage_fact_unlink(
            pipe, tenant, version, entity_node(fact.head_id), entity_node(fact.tail_id), fact.id
        )

    def activate(
        self,
        pipe,
        tenant: str,
        fact: Fact,
        version: int,
        qualifiers: dict | None = None,
        reason: str = "",
        evidence=(),
        told: str = "",
    ) -> FactEvent:
        """Into memory (again): an edge between its entities, `expired_at` cleared — a fact that
        regains support and wins its group is used by queries again."""
        if fact.status != "active":
            self._link(pipe, tenant, fact, version)
        # a sweep that passed its lapse while it was out of memory dropped its expiry index entry
        self.memory.stage_lapse_indexed(pipe, tenant, fact.id)
        changes = {"status": "active", "activated_at": time.time(), "expired_at": None}
        if qualifiers is not None:
            changes.update(qualifiers=qualifiers, reason=reason, **_world_times(qualifiers))
        elif fact.status != "active":  # back in memory: why it left ("no current passage says it") no longer holds
            changes["reason"] = reason
        self._stage(pipe, tenant, fact, **changes)
        return event(tenant, "activated", fact, version, told or reason, evidence)

    def invalidate(
        self,
        pipe,
        tenant: str,
        fact: Fact,
        version: int,
        qualifiers: dict,
        reason: str,
        evidence=(),
        told: str = "",
        ends_at: str = "",
    ) -> FactEvent:
        """Excluded by better-supported evidence: kept (non-destructive), no longer an edge.
        `ends_at`: the event time the fact that excluded it begins at, its `invalid_at` when
        its qualifiers give none (as Graphiti ends a superseded edge)."""
        if fact.status == "active":
            self._unlink(pipe, tenant, fact, version)
        times = _world_times(qualifiers)
        times["invalid_at"] = times["invalid_at"] or ends_at
        self._stage(
            pipe, tenant, fact, status="invalid", expired_at=time.time(), qualifiers=qualifiers, reason=reason, **times
        )
        return event(tenant, "invalidated", fact, version, told or reason, evidence)

    def qualify(
        self, pipe, tenant: str, fact: Fact, version: int, qualifiers: dict, reason: str, evidence=(), told: str = ""
    ) -> FactEvent:
        """An active fact's time span or scope, as its group's evidence sets it."""
        self._stage(pipe, tenant, fact, qualifiers=qualifiers, reason=reason, **_world_times(qualifiers))
        return event(tenant, "qualified", fact, version, told or reason, evidence)

    def requalify_silently(self, pipe, tenant: str, fact: Fact, qualifiers: dict, reason: str) -> None:
        """Qualifiers of a fact that is not active change: recorded, nothing to tell."""
        self._stage(pipe, tenant, fact, qualifiers=qualifiers, reason=reason, **_world_times(qualifiers))

    def merge(
        self,
        pipe,
        tenant: str,
        target: Fact,
        new_passages: set[str],
        version: int,
        reason: str,
        source: Fact | None = None,
    ) -> FactEvent | None:
        """`source` says the same as `target` (or is it, gaining support): the target takes the
        new supporting passages; the source, if another fact, is merged into it (no edge, kept
        with `merged_into`). The event names the source when subscribers knew it as active (it
        left memory; `merged_into` says where to), else the target; None when nothing changed
        that subscribers can see. Subscribers know a pending fact too (its `pending` event)."""
        source_left = source is not None and source.id != target.id and source.status in ("active", "pending")
        if source is not None and source.id != target.id:
            if source.status == "active":
                self._unlink(pipe, tenant, source, version)
            self._stage(pipe, tenant, source, status="merged", merged_into=target.id, expired_at=time.time())
            # its passages' support comes with its lapse: the target lapses no earlier (never if it never does)
            self.memory.stage_merged_lapse(pipe, tenant, source.id, target.id)
        new = set(new_passages) - set(target.passage_ids)
        for passage_id in sorted(new):
            self.memory.stage_fact_passage(pipe, tenant, target.id, passage_id)
        target.passage_ids = sorted(set(target.passage_ids) | new)
        if source_left:  # subscribers knew the source: tell them it is now the target
            assert source is not None  # source_left says it is given
            return event(tenant, "merged", source, version, reason)
        return event(tenant, "merged", target, version, reason) if new else None

    def expire(self, pipe, tenant: str, fact: Fact, version: int, reason: str) -> FactEvent:
        """Its time in memory is over (a TTL): no edge, no longer used by queries. Not final: a
        passage extracted later that says it again brings it back (the detector admits it like a
        new fact, and it holds until that passage's support lapses)."""
        if fact.status == "active":
            self._unlink(pipe, tenant, fact, version)
        self._stage(pipe, tenant, fact, status="expired", expired_at=time.time(), reason=reason)
        return event(tenant, "expired", fact, version, reason)

    def park(self, pipe, tenant: str, fact: Fact, version: int, reason: str) -> FactEvent:
        """Back behind the τ gate: its schema's support fell below τ (a document version took a
        passage away), so it waits, pending, as a fact of a candidate schema does."""
        if fact.status == "active":
            self._unlink(pipe, tenant, fact, version)
        self.memory.stage_pend(pipe, tenant, fact.schema_id, [fact.id])
        self._stage(pipe, tenant, fact, status="pending", expired_at=time.time(), reason=reason)
        return event(tenant, "pending", fact, version, reason)

    def retract(self, pipe, tenant: str, fact: Fact, version: int, reason: str) -> FactEvent:
        """Withdrawn by its source (a document version that no longer says it)."""
        if fact.status == "active":
            self._unlink(pipe, tenant, fact, version)
        self._stage(pipe, tenant, fact, status="retracted", expired_at=time.time(), reason=reason)
        return event(tenant, "retracted", fact, version, reason)


def _world_times(qualifiers: dict) -> dict:
    span = qualifiers.get("time") or {}
    return {"valid_at": span.get("from") or "", "invalid_at": span.get("to") or ""}


@functools.cache
def _hash_fields() -> tuple[str, ...]:
    """The fields Fact.from_hash reads as they are stored: dataclasses.fields per fact was ~15% of
    the CPU of a reconstruct query reading ~100 facts (py-spy, 50,000 passages)."""
    return tuple(f.name for f in fields(Fact) if f.name not in ("id", "passage_ids", "qualifiers", *_TIMES))


@functools.cache
def _hash_defaults() -> dict[str, Any]:
    """What Fact.from_hash gives a field the hash lacks: "" for the fields without a default,
    the dataclass's default for the rest, None for the times (no qualifiers: {})."""
    defaults: dict[str, Any] = {name: None for name in _TIMES}
    for f in fields(Fact):
        if f.name in _hash_fields():
            defaults[f.name] = "" if f.default is MISSING else f.default
    return defaults


@functools.cache
def stored_fields() -> tuple[str, ...]:
    """Every field of a fact's hash that Fact.from_hash reads (an HMGET of them reads a fact
    without its vector)."""
    return (*_hash_fields(), "qualifiers", *_TIMES)


@dataclass(frozen=True)
class FactRecordHit(Hit):
    """A fact search's hit with what the same command read of it: the fact (None: not read, or
    gone since) and its stored vector (None: not asked for)."""

    fact: Fact | None = None
    vector: np.ndarray | None = None
