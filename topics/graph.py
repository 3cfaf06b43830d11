"""The stage graph: for each topic, its record, how its partition key follows from a record, and
the stages that produce and consume it — one table (STAGE_GRAPH) that the rest reads instead of
repeating it: the topic names (topics.names), the worker roles (workers.roles), the indexing
pipeline's routes (workers.pipeline) and the messages stages send (workers.envelope.Emit.of).

A topic's suffix is its record's TOPIC; its key is a function of the record. The key decides
what is ordered: one key, one partition, delivered in order — one document's versions, one
head's facts and conflict groups. A key the record cannot give (a duplicate on conflict-sets)
is None here, and its producer names it.

Stages are named by their module in workers/stages (a consumer is also the worker role that
runs it, `memstream worker --role`); outside them, ENVELOPE (the dead letters of any stage) and
CLIENTS: `memstream publish`/`delete`/`retract`/`erase`, the query API and MCP tools, and any
producer that follows docs/usage.md. Topics no stage consumes (indexed-facts, dlq) are read
outside the pipeline (`memstream tail`, subscribers, `memstream status`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from topics.generated import spliced
from topics.records import CandidateFact, Chunk, ConflictSet, DeadLetter, Document, FactEvent, Record

R = TypeVar("R", bound=Record)

CLIENTS = "clients"  # producers outside the indexing pipeline (see the module docstring)
ENVELOPE = "envelope"  # workers.envelope: what any stage could not decode or kept failing on


@dataclass(frozen=True)
class TopicSpec(Generic[R]):
    """One topic: its record class (whose TOPIC is the suffix), its partition key as a
    function of a record (None: the record cannot give it), who produces it, who consumes it."""

    record: type[R]
    key: Callable[[R], str | None]
    producers: tuple[str, ...]
    consumers: tuple[str, ...] = ()

    @property
    def topic(self) -> str:
        return self.record.TOPIC


def conflict_key(conflict: ConflictSet) -> str | None:
    """The head whose group the resolver decides: the candidate's (an adjudication's probe
    carries the group's head, a retraction's is the fact itself) — but None for a duplicate,
    keyed by its target's head, which the record does not hold (a symmetric twin's head is the
    candidate's tail); its producer names it (workers.stages.handoffs.duplicate)."""
    return None if conflict.kind == "duplicate" else conflict.candidate.head_id


STAGE_GRAPH: tuple[TopicSpec[Any], ...] = (
    TopicSpec(Document, lambda doc: doc.key, producers=(CLIENTS,), consumers=("chunker",)),
    TopicSpec(Chunk, lambda chunk: chunk.key, producers=("chunker",), consumers=("extractor",)),
    TopicSpec(CandidateFact, lambda cand: cand.key, producers=("extractor", "detector"), consumers=("detector",)),
    TopicSpec(
        ConflictSet,
        conflict_key,
        producers=("chunker", "detector", "resolver", "expiry", CLIENTS),
        consumers=("resolver",),
    ),
    TopicSpec(
        FactEvent, lambda event: event.key, producers=("chunker", "erasure", "detector", "resolver", "expiry", CLIENTS)
    ),
    TopicSpec(DeadLetter, lambda letter: letter.key or "", producers=(ENVELOPE,)),  # the original message's key
)

TOPIC_SUFFIXES = tuple(spec.topic for spec in STAGE_GRAPH)
BY_TOPIC: dict[str, TopicSpec[Any]] = {spec.topic: spec for spec in STAGE_GRAPH}
_BY_RECORD: dict[type[Record], TopicSpec[Any]] = {spec.record: spec for spec in STAGE_GRAPH}
# stage → the one topic it consumes (the worker roles of the indexing pipeline, in topic order)
CONSUMES: dict[str, str] = {stage: spec.topic for spec in STAGE_GRAPH for stage in spec.consumers}


def spec_of(record: Record) -> TopicSpec[Any]:
    """The topic `record` is sent on (by its exact class: a record is of one topic)."""
    try:
        return _BY_RECORD[type(record)]
    except KeyError:
        raise ValueError(f"{type(record).__name__} is the record of no topic") from None


def partition_key(record: Record) -> str | None:
    """The partition key of `record` on its topic; None where the record cannot give it."""
    return spec_of(record).key(record)


# The stages' own words for the rows of stage_table that are not a module of workers/stages
_NOT_A_STAGE_MODULE = {
    CLIENTS: "`memstream publish`/`delete`/`retract`/`erase`, the query API, MCP tools, your producers",
    ENVELOPE: "`workers/envelope.py`: what a stage could not decode or kept failing on",
}
STAGE_TABLE_BEGIN = (
    "<!-- stage table: generated from STAGE_GRAPH in topics/graph.py by "
    "`memstream stage-table --write docs/architecture.md`; change the graph there, not here -->"
)
STAGE_TABLE_END = "<!-- end of the generated stage table -->"


def stage_table() -> str:
    """Markdown: each stage of STAGE_GRAPH (and the clients, and the envelope's dead letters) with
    its module, the topic it consumes and the topics it produces. docs/architecture.md holds it
    (checked by tests/test_gates.py); `memstream stage-table --write docs/architecture.md`
    rewrites it."""
    stages: dict[str, tuple[list[str], list[str]]] = {}
    for spec in STAGE_GRAPH:
        for stage in spec.consumers:
            stages.setdefault(stage, ([], []))[0].append(spec.topic)
        for stage in spec.producers:
            stages.setdefault(stage, ([], []))[1].append(spec.topic)
    lines = ["| stage | module | consumes | produces |", "|---|---|---|---|"]
    for stage, (consumes, produces) in stages.items():
        module = _NOT_A_STAGE_MODULE.get(stage, f"`workers/stages/{stage}.py`")
        lines.append(
            f"| {stage} | {module} | {', '.join(f'`{t}`' for t in consumes) or '—'} | "
            f"{', '.join(f'`{t}`' for t in produces) or '—'} |"
        )
    return "\n".join(lines) + "\n"


def with_stage_table(document: str) -> str:
    """`document` (docs/architecture.md) with stage_table() between its markers."""
    return spliced(document, STAGE_TABLE_BEGIN, STAGE_TABLE_END, stage_table(), "stage table")
