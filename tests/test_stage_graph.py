"""The stage graph (topics.graph.STAGE_GRAPH) against the code: every topic name and record class
is in it, each consumer is the stage the pipeline routes its topic to, the roles are its
consumers, the stages send only what it says they produce — and `Emit.of(record)` gives every
message the topic and partition key the stages gave it by hand before (a changed key would break
an ordering guarantee). No stage names a topic or builds an Emit itself."""

from __future__ import annotations

import ast
import asyncio
import time
from pathlib import Path

import pytest

from store import Outgoing
from store.facts import Fact, document_event, event
from store.in_memory import InMemoryStore
from tests.inprocess import InProcess, ScriptedExtractor
from topics import CandidateFact, Chunk, DeadLetter, Document, Topics, encode, records
from topics.graph import BY_TOPIC, CLIENTS, CONSUMES, ENVELOPE, STAGE_GRAPH, TOPIC_SUFFIXES, partition_key
from topics.names import TOPIC_SUFFIXES as NAMED_SUFFIXES
from topics.records import Record, Triple
from workers.algorithms.policy import SYMMETRIC_RELATIONS
from workers.envelope import Emit, Envelope
from workers.pipeline import Pipeline
from workers.publisher import retraction
from workers.roles import ROLE_TOPICS
from workers.settings import Settings
from workers.stages.handoffs import adjudication, duplicate, fact_probe

ROOT = Path(__file__).resolve().parent.parent
STAGE_MODULES = sorted(p.stem for p in (ROOT / "workers" / "stages").glob("*.py") if p.stem not in ("__init__",))


def _pipeline() -> Pipeline:
    async def send(item: Outgoing) -> None:
        raise AssertionError("nothing is sent")

    return Pipeline(Settings.from_env({}), InMemoryStore(), send)


# ---- the table against the contract ------------------------------------------------------------


def test_every_topic_name_is_a_topic_of_the_graph_in_its_order():
    assert NAMED_SUFFIXES == TOPIC_SUFFIXES == tuple(BY_TOPIC)
    assert len(set(TOPIC_SUFFIXES)) == len(STAGE_GRAPH)
    topics = Topics("ns")
    assert topics.all() == [f"ns.{suffix}" for suffix in TOPIC_SUFFIXES]
    # each topic has its accessor (ops.status reads them by suffix), naming that topic
    for suffix in TOPIC_SUFFIXES:
        assert getattr(topics, suffix.replace("-", "_")) == f"ns.{suffix}"
    named = {name for name, value in vars(Topics).items() if isinstance(value, property)}
    assert named == {suffix.replace("-", "_") for suffix in TOPIC_SUFFIXES}


def test_every_record_class_of_a_topic_is_the_graphs_record_of_that_topic():
    with_topic = {
        cls
        for cls in vars(records).values()
        if isinstance(cls, type) and issubclass(cls, Record) and cls is not Record and cls.TOPIC
    }
    assert with_topic == {spec.record for spec in STAGE_GRAPH}
    for cls in with_topic:
        assert BY_TOPIC[cls.TOPIC].record is cls


def test_stages_named_are_modules_of_the_pipeline_or_outside_it():
    for spec in STAGE_GRAPH:
        assert spec.producers, spec.topic
        for name in spec.producers + spec.consumers:
            assert name in STAGE_MODULES or name in (ENVELOPE, CLIENTS), (spec.topic, name)
        assert ENVELOPE not in spec.consumers and CLIENTS not in spec.consumers  # consumers: stages only
    consumers = [stage for spec in STAGE_GRAPH for stage in spec.consumers]
    assert len(consumers) == len(set(consumers)) == len(CONSUMES)  # a stage consumes one topic


# ---- the table against the pipeline and the roles ----------------------------------------------


def test_each_consumer_is_the_stage_its_topic_is_routed_to():
    pipeline = _pipeline()
    consumed = {spec.topic for spec in STAGE_GRAPH if spec.consumers}
    assert set(pipeline.routes) == consumed == set(Pipeline.RECORDS)
    for spec in STAGE_GRAPH:
        for stage in spec.consumers:
            route = pipeline.routes[spec.topic]
            assert type(route.handle.__self__).__module__ == f"workers.stages.{stage}", (spec.topic, stage)
            assert Pipeline.RECORDS[spec.topic] is spec.record
    for topic, route in pipeline.prefetchers.items():
        assert route.decode is pipeline.routes[topic].decode


def test_each_route_decodes_its_topics_record():
    pipeline = _pipeline()
    for topic, sample in SAMPLES.items():
        if topic in pipeline.routes:
            key = getattr(sample, "key", "k")  # a document under its own key (another is refused)
            decoded = pipeline.envelope.decode(topic, encode(sample), key.encode())
            assert type(decoded) is BY_TOPIC[topic].record and decoded == sample


def test_the_worker_roles_are_the_consuming_stages():
    assert ROLE_TOPICS == CONSUMES
    assert list(ROLE_TOPICS) == ["chunker", "extractor", "detector", "resolver"]


# ---- Emit.of: the topics and keys the stages gave by hand ------------------------------------

T = "acme"
TRIPLE = Triple("Ana", "live in", "Lisbon", "PERSON", "PLACE")
MARRIED = Triple("Bo", "married to", "Ana", "PERSON", "PERSON")
assert MARRIED.relation in SYMMETRIC_RELATIONS


def _candidate(head_id: str, triple: Triple, tail_id: str, **fields) -> CandidateFact:
    return CandidateFact(T, "p1", "d1", triple, 0, 2, head_id, tail_id, "rules", **fields)


def _fact(fid: str, head_id: str, triple: Triple, tail_id: str) -> Fact:
    return Fact.extracted(fid, triple, head_id, tail_id, "s1")


def _old_candidate_key(head_id: str, relation: str, tail_id: str) -> str:
    """workers.stages.handoffs.candidate_key as it was before the stage graph."""
    return min(head_id, tail_id) if relation in SYMMETRIC_RELATIONS else head_id


CANDIDATES = [
    _candidate("ana", TRIPLE, "lisbon"),
    _candidate("bo", MARRIED, "ana"),  # symmetric, head after tail: keyed by the tail
    _candidate("ana", MARRIED, "bo"),  # symmetric, head before tail
    _candidate("zed", TRIPLE, "ana", activation=True, work_id="act:f1"),  # a promotion
]
DOC = Document(T, "d1", "Ana lives in Lisbon.")
CHUNK = Chunk(T, "c1", "d1", 0, 1, "Ana lives in Lisbon.")
ADJUDICATION = adjudication(CANDIDATES[0], "ana", "live in", "group", "group").record
SAMPLES: dict[str, Record] = {
    "documents": DOC,
    "chunks": CHUNK,
    "candidate-facts": CANDIDATES[0],
    "conflict-sets": ADJUDICATION,
    "indexed-facts": document_event(T, "retired", "d1", ["c1"], 3, "gone"),
    "dlq": DeadLetter("memstream.chunks", "{}", "bad", key="d1"),
}


def _same(emit: Emit, topic: str, key: str, record: Record) -> None:
    assert (emit.topic, emit.key, emit.record) == (topic, key, record)


def test_documents_and_chunks_keep_their_keys():
    _same(Emit.of(DOC), "documents", f"{T}/d1", DOC)  # as memstream publish keys them (Document.key)
    _same(Emit.of(CHUNK), "chunks", CHUNK.doc_id, CHUNK)  # the chunker's Emit("chunks", doc.doc_id, ...)


@pytest.mark.parametrize("cand", CANDIDATES, ids=lambda c: f"{c.head_id}-{c.fact.relation}-{c.tail_id}")
def test_candidate_facts_keep_their_keys(cand):
    # the extractor's and the detector's Emit("candidate-facts", candidate_key(head, relation, tail), ...)
    _same(Emit.of(cand), "candidate-facts", _old_candidate_key(cand.head_id, cand.fact.relation, cand.tail_id), cand)
    assert cand.key == _old_candidate_key(cand.head_id, cand.fact.relation, cand.tail_id)


def test_symmetric_candidates_share_a_key():
    assert Emit.of(CANDIDATES[1]).key == Emit.of(CANDIDATES[2]).key == "ana"


@pytest.mark.parametrize("cand", CANDIDATES[:2])
def test_conflict_sets_keep_their_keys(cand):
    # adjudication: Emit("conflict-sets", head_id, record), also for another head than the candidate's
    for head in (cand.head_id, "other-head"):
        emit = adjudication(cand, head, "live in", "why", "cause")
        assert (emit.topic, emit.key) == ("conflict-sets", head)
        assert emit == Emit.of(emit.record)
    # retraction: Emit("conflict-sets", fact.head_id, record)
    fact = _fact("f1", "ana", TRIPLE, "lisbon")
    emit = retraction(T, fact, "asked", "r1")
    assert (emit.topic, emit.key, emit.record.kind) == ("conflict-sets", fact.head_id, "retract")
    assert emit == Emit.of(emit.record)
    assert Emit.of(adjudication(fact_probe(T, fact, "expiry"), "ana", "live in", "w", "c").record).key == "ana"


def test_a_duplicate_keeps_its_explicit_key_its_targets_head():
    cand = CANDIDATES[2]  # ana married to bo; its twin is bo married to ana
    for target in (_fact("f0", "ana", MARRIED, "bo"), _fact("f9", "bo", MARRIED, "ana")):
        emit = duplicate(cand, target, "same fact")
        assert (emit.topic, emit.key) == ("conflict-sets", target.head_id)
    assert partition_key(emit.record) is None  # the record does not hold it
    with pytest.raises(ValueError, match="cannot give its key"):
        Emit.of(emit.record)


def test_a_key_the_record_gives_cannot_be_named_again():
    with pytest.raises(ValueError, match="derived from the record"):
        Emit.of(CHUNK, key="d1")
    with pytest.raises(ValueError, match="record of no topic"):
        Emit.of(TRIPLE)


def test_events_keep_their_keys():
    fact = _fact("f1", "ana", TRIPLE, "lisbon")
    for item in (event(T, "activated", fact, 2), document_event(T, "retired", "d1", ["c1"], 3, "gone")):
        emitted = Emit.of(item)
        _same(emitted, "indexed-facts", item.key, item)
    assert Emit.of(event(T, "activated", fact, 2)).key == "f1"
    assert Emit.of(document_event(T, "purged", "d1", [], 3, "erased")).key == f"{T}/d1"


def test_dead_letters_keep_the_original_key():
    sent: list[Outgoing] = []

    async def send(item: Outgoing) -> None:
        sent.append(item)

    envelope = Envelope(settings=Settings.from_env({}), memory=InMemoryStore(), send=send, routes={})
    asyncio.run(envelope.dead_letter("chunks", b"d1", b"{}", "bad", 0, 7, 1))
    asyncio.run(envelope.dead_letter("documents", None, b"{}", "bad", 0, 8, 1))
    assert [(item.topic, item.key) for item in sent] == [("dlq", "d1"), ("dlq", "")]
    assert Emit.of(DeadLetter("t", "{}", "e")).key == ""


# ---- what the stages send ------------------------------------------------------------------------


SCRIPT = {
    "Ana lives in Lisbon.": [("Ana", "live in", "Lisbon")],
    "Ana lives in Lisbon, still.": [("Ana", "live in", "Lisbon")],
    "Ana lives in Porto.": [("Ana", "live in", "Porto")],
    "Cy lives in Rome.": [("Cy", "live in", "Rome")],
    "Bo married Ana.": [("Bo", "married to", "Ana", "PERSON", "PERSON")],
    "Ana married Bo.": [("Ana", "married to", "Bo", "PERSON", "PERSON")],
}


class Watched:
    """The stages over InProcess, each message a stage sends checked against the graph: on a
    topic the stage produces, under the key the graph derives (a duplicate: its target's head,
    one end of its candidate). `seen`: (stage, topic, conflict kind) of everything sent."""

    def __init__(self, **settings):
        self.stages = InProcess(None, ScriptedExtractor(SCRIPT), **settings)
        self.seen: set[tuple[str, str, str]] = set()
        consumer = {topic: stage for stage, topic in CONSUMES.items()}
        process = self.stages.pipeline.process

        async def watched(topic, key, value, partition=None, offset=None):
            before = len(self.stages.sent)
            await process(topic, key, value, partition, offset)
            self.check(consumer[topic], before)

        self.stages.pipeline.process = watched  # type: ignore[method-assign]

    def check(self, stage: str, before: int) -> None:
        produced = {spec.topic for spec in STAGE_GRAPH if stage in spec.producers}
        for item in self.stages.sent[before:]:
            record = records.decode(BY_TOPIC[item.topic].record, item.value)
            kind = getattr(record, "kind", "")
            self.seen.add((stage, item.topic, kind))
            assert item.topic in produced, (stage, item.topic)
            if kind == "duplicate":
                assert item.key in (record.candidate.head_id, record.candidate.tail_id), item
            else:
                assert item.key == partition_key(record), item

    async def sweep(self) -> None:
        before = len(self.stages.sent)
        await self.stages.pipeline.expire_lapsed(now=time.time() + 10**6)
        self.check("expiry", before)
        await self.stages.drain()


def test_each_stage_sends_only_what_the_graph_says_it_produces_and_keys_it_so():
    """Documents, a duplicate, a single-valued conflict, a symmetric pair, a deletion and an
    expiry; then a schema promoted past τ (its parked fact sent again as an activation)."""
    run = Watched(tau=1)

    async def scenario() -> None:
        stages = run.stages
        for n, text in enumerate(["Ana lives in Lisbon.", "Ana lives in Lisbon, still.", "Ana lives in Porto."]):
            await stages.publish(f"d{n}", text)
        await stages.publish("m1", "Bo married Ana.")
        await stages.publish("m2", "Ana married Bo.")
        await stages.delete("d0")
        await stages.publish("c1", "Cy lives in Rome.", metadata={"ttl_seconds": 60})
        await run.sweep()

    asyncio.run(scenario())
    assert {
        ("chunker", "chunks", ""),
        ("chunker", "indexed-facts", ""),
        ("chunker", "conflict-sets", "adjudicate"),
        ("extractor", "candidate-facts", ""),
        ("detector", "conflict-sets", "duplicate"),
        ("detector", "conflict-sets", "adjudicate"),
        ("detector", "indexed-facts", ""),
        ("resolver", "indexed-facts", ""),
        ("expiry", "indexed-facts", ""),
    } <= run.seen, run.seen
    assert run.stages.dead_letters() == []

    promoted = Watched(tau=2)

    async def promotion() -> None:
        await promoted.stages.publish("a", "Ana lives in Lisbon.")
        await promoted.stages.publish("c", "Cy lives in Rome.")

    asyncio.run(promotion())
    assert ("detector", "candidate-facts", "") in promoted.seen, promoted.seen
    assert promoted.stages.dead_letters() == []


# ---- no stage names a topic ------------------------------------------------------------------------

TOPIC_WORDS = set(TOPIC_SUFFIXES) | {"dead-letters", "dead-letter", "candidate_facts", "conflict_sets"}


@pytest.mark.parametrize("module", STAGE_MODULES)
def test_no_stage_names_a_topic_or_builds_an_emit_by_hand(module):
    tree = ast.parse((ROOT / "workers" / "stages" / f"{module}.py").read_text())
    literals = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TOPIC_WORDS
    ]
    assert literals == []
    by_hand = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Emit"
    ]
    assert by_hand == []  # Emit.of(record): topic and key from the stage graph


def test_the_stage_table_is_the_graphs_every_stage_with_what_it_consumes_and_produces(capsys):
    """`memstream stage-table` prints, per stage of STAGE_GRAPH, the topic it consumes and the
    topics it produces — read from the graph, so the docs' table (a gate) cannot drift from it;
    a document without its markers is refused, not rewritten."""
    from ops.cli import main
    from topics import BadInput
    from topics.graph import stage_table, with_stage_table

    rows = {
        cells[0]: cells
        for line in stage_table().splitlines()[2:]
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    stages = {s for spec in STAGE_GRAPH for s in (*spec.producers, *spec.consumers)}
    assert set(rows) == stages
    for stage, (_, _, consumes, produces) in rows.items():
        assert consumes == (f"`{CONSUMES[stage]}`" if stage in CONSUMES else "—")
        made = [spec.topic for spec in STAGE_GRAPH if stage in spec.producers]
        assert produces == ", ".join(f"`{t}`" for t in made)
    assert rows["chunker"][3] == "`chunks`, `conflict-sets`, `indexed-facts`"
    assert main(["stage-table"]) == 0
    assert capsys.readouterr().out == stage_table()
    with pytest.raises(BadInput, match="no stage table to replace"):
        with_stage_table("# a document without the table's markers\n")
