"""Documents change (workers.stages.chunker: versions): memory follows each document's current
version. An edit retires the passages the new text no longer holds (out of retrieval and of every
count, kept for audit) and retracts what only they said; a revert brings the earlier text and its
facts back; an older version arriving late changes nothing; a text also held by another document
stays. Each test runs the indexing stages in process (tests.inprocess) over both stores (the
`redis_url` fixture: InMemoryStore and the stack's Redis), with the rules extractor.

"Memory after the edits" is compared with a fresh tenant given only the current texts: the facts
that are in memory (any status but retracted) with their status and supporting passages, and the
schemas with their frequency — `current_memory`."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.inprocess import Delivery, HashEmbedder, InProcess, redis_keys_holding
from workers.models.extraction import RulesExtractor
from workers.query import drilldown

ILSE = "Ilse Marr lives in Kallmar. Nora Velt works for Orsk Mills."
ILSE_EDITED = "Ilse Marr lives in Brest."
GRETA = "Greta Holm founded the Salt Cellar Bakery. Greta Holm lives in Nimmo."
NORA_ELSEWHERE = "Nora Velt works for Orsk Mills since spring."
GRETA_SPACED = "Greta Holm founded the Salt Cellar Bakery.  Greta Holm lives in Nimmo.\n"


def run(coro):
    return asyncio.run(coro)


async def current_memory(stages: InProcess) -> dict:
    """What a fresh tenant of the same current texts must equal: facts in memory (status,
    supporting passages), schemas (frequency, status), by id, and the graph's fact and passage
    edges with their weights (type edges are not compared: an entity joins its types when a fact
    of it is first admitted, and keeps them)."""
    facts = {
        fid: (f.status, tuple(f.passage_ids)) for fid, f in (await stages.facts()).items() if f.status != "retracted"
    }
    schemas = {
        sid: (row.get("frequency"), row.get("status"))
        for sid, row in await stages.memory.records(stages.tenant, "schemas")
    }
    edges = {}
    async for batch in stages.memory.adjacency(stages.tenant, await stages.memory.adjacency_nodes(stages.tenant)):
        edges.update({(e.a, e.b, e.kind): e.weight for e in batch if e.kind in ("fact", "passage") and e.weight})
    return {"facts": facts, "schemas": {sid: v for sid, v in schemas.items() if v[0] not in ("0", 0)}, "edges": edges}


async def fresh(redis_url, documents: dict[str, str], titles: dict | None = None, **settings) -> dict:
    """current_memory of a new tenant given only `documents` (doc id → text; `titles`: doc id →
    its title), in one order."""
    stages = InProcess(redis_url, RulesExtractor(), **settings)
    try:
        for doc_id, text in documents.items():
            await stages.publish(doc_id, text, title=(titles or {}).get(doc_id))
        return await current_memory(stages)
    finally:
        await stages.close()


def _by_head(facts: dict, head: str) -> list:
    return [f for f in facts.values() if f.head == head]


def test_an_edit_retires_the_old_text_and_retracts_what_only_it_said(redis_url):
    """Before: the old passage still ranked first and "Nora Velt works for Orsk Mills", said
    only by the old text, stayed active."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            [old_passage] = {p for f in (await stages.facts()).values() for p in f.passage_ids}
            await stages.publish("ilse", ILSE_EDITED, version=2)
            facts = await stages.facts()
            answers = [
                await stages.query("Where does Ilse Marr live? Kallmar or Brest?", mode=mode)
                for mode in ("lexical", "hybrid", "ppr")
            ]
            retired = (await stages.memory.passages(stages.tenant, [old_passage]))[0]
            return stages, facts, answers, retired, await current_memory(stages), stages.events()
        finally:
            await stages.close()

    stages, facts, answers, retired, memory, events = run(scenario())
    for answer in answers:
        assert [p["text"] for p in answer["passages"]] == [ILSE_EDITED], answer["mode"]
    assert retired["retired"] is True and retired["text"] == ILSE  # kept for audit and drill-down
    [nora] = _by_head(facts, "Nora Velt")
    assert nora.status == "retracted" and nora.passage_ids == []
    assert {f.tail: f.status for f in _by_head(facts, "Ilse Marr")} == {"Kallmar": "retracted", "Brest": "active"}
    assert [e["event"] for e in events if e["fact_id"] == nora.id] == ["activated", "retracted"]
    assert memory == run(fresh(redis_url, {"ilse": ILSE_EDITED}, tau=1))


def test_a_whitespace_edit_counts_its_text_once(redis_url):
    """Before: the edit's passage and the original both supported each fact, which turned the
    pending facts active with two passages and their schemas stable (τ = 2)."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor())
        try:
            await stages.publish("greta", GRETA, version=1)
            await stages.publish("greta", GRETA_SPACED, version=2)
            return await stages.facts(), await current_memory(stages)
        finally:
            await stages.close()

    facts, memory = run(scenario())
    held = [f for f in facts.values() if f.status != "retracted"]
    assert held and all(f.status == "pending" and len(f.passage_ids) == 1 for f in held)
    assert all(status == "candidate" and frequency == "1" for frequency, status in memory["schemas"].values())
    assert memory == run(fresh(redis_url, {"greta": GRETA_SPACED}))


def test_a_revert_brings_the_earlier_text_and_its_facts_back(redis_url):
    """Before: the earlier text was extracted once and never looked at again, so publishing it
    again left the edit's fact active and the original's out."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            for version, text in enumerate((ILSE, ILSE_EDITED, ILSE), 1):
                await stages.publish("ilse", text, version=version)
            answer = await stages.query("Where does Ilse Marr live?", mode="hybrid")
            return await stages.facts(), answer, await current_memory(stages), stages.events()
        finally:
            await stages.close()

    facts, answer, memory, events = run(scenario())
    assert {f.tail: f.status for f in _by_head(facts, "Ilse Marr")} == {"Kallmar": "active", "Brest": "retracted"}
    assert [p["text"] for p in answer["passages"]] == [ILSE]
    [nora] = _by_head(facts, "Nora Velt")
    assert [e["event"] for e in events if e["fact_id"] == nora.id] == ["activated", "retracted", "activated"]
    assert memory == run(fresh(redis_url, {"ilse": ILSE}, tau=1))


def test_an_older_version_arriving_late_changes_nothing(redis_url):
    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE_EDITED, version=2)
            await stages.publish("ilse", ILSE, version=1)
            status = await stages.memory.document_status(stages.tenant, "ilse")
            return status, await current_memory(stages)
        finally:
            await stages.close()

    status, memory = run(scenario())
    assert status.version == 2
    assert memory == run(fresh(redis_url, {"ilse": ILSE_EDITED}, tau=1))


def test_a_fact_also_said_elsewhere_keeps_that_evidence_and_a_shared_text_stays(redis_url):
    """Another document says "Nora Velt works for Orsk Mills" in other words, and a third holds
    the same text as the first: editing the first removes only its own support."""
    other = NORA_ELSEWHERE

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            await stages.publish("nora", other, version=1)
            await stages.publish("copy", "Ilse Marr lives in Kallmar.", version=1)
            await stages.publish("copy-2", "Ilse Marr lives in Kallmar.", version=1)
            await stages.publish("copy", "Something else entirely.", version=2)
            shared = await drilldown.passage_record(
                stages.memory,
                stages.tenant,
                (await stages.query("Ilse Marr Kallmar", mode="lexical"))["passages"][0]["id"],
            )
            return (
                await stages.facts(),
                await current_memory(stages),
                await stages.query("Ilse Marr Kallmar", mode="lexical"),
                shared,
            )
        finally:
            await stages.close()

    facts, memory, answer, shared = run(scenario())
    assert shared.text == "Ilse Marr lives in Kallmar." and shared.doc_ids == ["copy-2"]  # "copy" holds it no more
    [nora] = _by_head(facts, "Nora Velt")
    assert nora.status == "active" and len(nora.passage_ids) == 2  # ilse's and nora's
    assert "Ilse Marr lives in Kallmar." in [p["text"] for p in answer["passages"]]  # copy-2 still holds it
    assert memory == run(
        fresh(
            redis_url,
            {"ilse": ILSE, "nora": other, "copy-2": "Ilse Marr lives in Kallmar.", "copy": "Something else entirely."},
            tau=1,
        )
    )


def test_edits_and_reverts_hold_under_redelivery_and_several_consumers():
    """Every message delivered twice, four consumers on four partitions: the same memory."""

    async def scenario():
        stages = InProcess(
            None, RulesExtractor(), tau=1, delivery=Delivery(partitions=4, consumers=4, seed=7, redeliver=1.0)
        )
        try:
            for version, text in enumerate((ILSE, ILSE_EDITED, ILSE, ILSE_EDITED), 1):
                await stages.publish("ilse", text, version=version)
            await stages.publish("greta", GRETA, version=1)
            return await current_memory(stages), stages.dead_letters()
        finally:
            await stages.close()

    memory, dead = run(scenario())
    assert dead == []
    assert memory == run(fresh(None, {"ilse": ILSE_EDITED, "greta": GRETA}, tau=1))


def test_a_deleted_document_leaves_memory_and_can_come_back(redis_url):
    """A tombstone (no value, key tenant/doc id) on `documents`. Before: nothing could be deleted."""
    other = NORA_ELSEWHERE

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            await stages.publish("nora", other, version=1)
            await stages.delete("ilse")
            await stages.delete("ilse")  # again: nothing more to do
            deleted = (
                await current_memory(stages),
                await stages.query("Ilse Marr Kallmar", mode="lexical"),
                await stages.facts(),
            )
            await stages.publish("ilse", ILSE, version=2)
            return deleted, await current_memory(stages), stages.dead_letters()
        finally:
            await stages.close()

    (memory, answer, facts), back, dead = run(scenario())
    assert dead == []
    assert "Ilse Marr lives in Kallmar" not in " ".join(p["text"] for p in answer["passages"])
    assert {f.tail: f.status for f in _by_head(facts, "Ilse Marr")} == {"Kallmar": "retracted"}
    [nora] = _by_head(facts, "Nora Velt")
    assert nora.status == "active" and len(nora.passage_ids) == 1  # the other document's evidence stays
    assert memory == run(fresh(redis_url, {"nora": other}, tau=1))
    assert back == run(fresh(redis_url, {"ilse": ILSE, "nora": other}, tau=1))


def test_a_tombstone_whose_key_names_no_document_is_dead_lettered():
    async def scenario():
        stages = InProcess(None, RulesExtractor())
        try:
            await stages.deliver("documents", b"no-slash-here", None)
            return stages.dead_letters()
        finally:
            await stages.close()

    [letter] = run(scenario())
    assert "key must be 'tenant/doc id'" in letter["error"]


def test_a_version_under_a_key_other_than_its_body_names_is_dead_lettered_and_indexes_nothing():
    """Deletions and compaction go by the key: a version published under another document's key
    could never be deleted (its tombstone names the body's key) nor compacted away. It is
    refused with the reason; the same body with no key, or under its own key, is indexed."""
    from topics import encode
    from topics.records import Document

    async def scenario():
        stages = InProcess(None, RulesExtractor())
        try:
            body = encode(Document(stages.tenant, "mismatch", "Ilse Marr lives in Kallmar."))
            await stages.deliver("documents", b"other/zzz", body)
            refused, indexed = stages.dead_letters(), await stages.memory.scan_ids(stages.tenant, "passages")
            await stages.deliver("documents", None, body)
            await stages.deliver("documents", f"{stages.tenant}/mismatch".encode(), body)
            return refused, indexed, stages.dead_letters(), await stages.memory.scan_ids(stages.tenant, "passages")
        finally:
            await stages.close()

    refused, indexed, letters, passages = run(scenario())
    [letter] = refused
    assert "the message key 'other/zzz' is not the one its body names" in letter["error"]
    assert letter["key"] == "other/zzz" and indexed == []
    assert letters == refused and len(passages) == 1  # no key, or its own: indexed (once)


# ---- the property: memory is a function of the current documents -----------------------------
# Sentences with shared entities (Orsk Mills, Kallmar) and no two of one head and single-valued
# relation, so no conflict group's decision depends on the order facts arrived in.
SENTENCES = (
    "Ilse Marr lives in Kallmar.",
    "Nora Velt works for Orsk Mills.",
    "Orsk Mills is located in Brest.",
    "Greta Holm founded the Salt Cellar Bakery.",
    "Ilse Marr works for Orsk Mills.",
    "Greta Holm lives in Nimmo.",
    "Nora Velt founded the Kallmar Choir.",
)
DOCS = ("a", "b", "c", "d", "e")


def _text(picks: tuple[int, ...]) -> str:
    return " ".join(SENTENCES[i] for i in picks)


operation = st.one_of(
    st.tuples(
        st.just("publish"),
        st.sampled_from(DOCS),
        st.lists(st.integers(0, len(SENTENCES) - 1), min_size=1, max_size=3, unique=True).map(tuple),
    ),
    st.tuples(st.just("whitespace"), st.sampled_from(DOCS), st.just(())),
    st.tuples(st.just("revert"), st.sampled_from(DOCS), st.just(())),
    st.tuples(st.just("delete"), st.sampled_from(DOCS), st.just(())),
)
# titles naming entities the sentences name (a subject shared with another document's mention),
# one with a qualifier, and none
TITLES = ("Kallmar", "Orsk Mills (company)", "Ilse Marr", None)
# a retitle publishes a document's current text under the next title
titled_operation = st.one_of(operation, st.tuples(st.just("retitle"), st.sampled_from(DOCS), st.just(())))


async def _apply(
    redis_url, operations, redeliver: float, lose_from: int | None = None, **settings
) -> tuple[dict, dict[str, str]]:
    """The operations in order (each drained), then current_memory and the current texts. With
    `lose_from` (the in-memory store), the store loses every write made from that operation on
    (restored from a snapshot taken before it: what a Redis restored from a backup does), and
    the stages recover from the topics (InProcess.recover) before memory is read."""
    stages = InProcess(
        redis_url,
        RulesExtractor(),
        delivery=Delivery(partitions=3, consumers=3, seed=1, redeliver=redeliver),
        keep_log=lose_from is not None,
        **settings,
    )
    history: dict[str, list[str]] = {}
    current: dict[str, str] = {}
    titles: dict[str, str | None] = {}
    snapshot = None
    try:
        for version, (kind, doc, picks) in enumerate(operations, 1):
            if version - 1 == lose_from:
                snapshot = stages.memory.snapshot()  # type: ignore[attr-defined]  # InMemoryStore's
            if kind == "delete":
                await stages.delete(doc)
                current.pop(doc, None)
                continue
            if kind == "publish":
                text = _text(picks)
            elif kind == "whitespace" and doc in current:
                text = (
                    current[doc].replace(" ", "  ", 1) if "  " not in current[doc] else current[doc].replace("  ", " ")
                )
            elif kind == "revert" and len(history.get(doc, [])) >= 2:
                text = history[doc][-2]
            elif kind == "retitle" and doc in current:
                text = current[doc]
                titles[doc] = TITLES[(TITLES.index(titles.get(doc)) + 1) % len(TITLES)]
            else:
                continue
            await stages.publish(doc, text, version=version, title=titles.get(doc))
            history.setdefault(doc, []).append(text)
            current[doc] = text
        if lose_from is not None:
            stages.memory.restore(stages.memory.snapshot() if snapshot is None else snapshot)  # type: ignore[attr-defined]
            await stages.recover()
        return await current_memory(stages), current, {doc: titles.get(doc) for doc in current}
    finally:
        await stages.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    operations=st.lists(titled_operation, min_size=1, max_size=8),
    redeliver=st.sampled_from([0.0, 0.5]),
    tau=st.sampled_from([1, 2]),
)
def test_memory_is_a_function_of_the_current_documents(operations, redeliver, tau):
    """300 random sequences of publish / edit / whitespace edit / revert / delete over five
    documents that share entities, half of them with messages delivered twice on three
    partitions, at τ 1 (a schema stable at its first passage) and 2 (a version can take a
    schema back below τ): the facts (status, support) and schemas (frequency, status) equal
    those of a fresh tenant given only the current texts. (Without parking the facts of a
    schema taken below τ, this finds a counterexample within 600 sequences.) Retitles among
    them: a subject's passage edges (workers.algorithms.subjects), and the links they make to
    the documents naming it, are those of the fresh tenant given the current titles too.
    (With a passage id of the text alone, a retitle left the old subject's edges behind.)"""
    memory, current, titles = run(_apply(None, operations, redeliver, tau=tau))
    assert memory == run(fresh(None, current, titles, tau=tau))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    operations=st.lists(operation, min_size=1, max_size=8),
    lost=st.integers(0, 8),
    redeliver=st.sampled_from([0.0, 0.5]),
    tau=st.sampled_from([1, 2]),
)
def test_memory_is_a_function_of_the_log_after_the_store_loses_its_last_writes(operations, lost, redeliver, tau):
    """The same sequences, then the store loses the writes of the last `lost` operations (all of
    them at most: an emptied store) and the stages read their topics again from the first
    offset whose effects it lacks (workers.recovery): memory equals a fresh tenant's of the
    current texts, across edits, reverts and deletions in the lost part."""
    lose_from = max(0, len(operations) - lost)
    memory, current, _ = run(_apply(None, operations, redeliver, lose_from, tau=tau))
    assert memory == run(fresh(None, current, tau=tau))


@pytest.mark.stack
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(operations=st.lists(operation, min_size=1, max_size=6), tau=st.sampled_from([1, 2]))
def test_memory_is_a_function_of_the_current_documents_in_redis(stack_env, operations, tau):
    """The same property over Redis (Memory: Lua scripts, WATCH fences, RediSearch), 200
    sequences of up to six operations, each delivered twice on three partitions."""
    url = stack_env["MEMSTREAM_REDIS_URL"]
    memory, current, _ = run(_apply(url, operations, 1.0, tau=tau))
    assert memory == run(fresh(url, current, tau=tau))


def test_a_schema_taken_below_tau_is_a_candidate_again_and_its_facts_wait(redis_url):
    """Two documents make "lives in" stable (τ = 2); deleting one leaves the other's fact
    pending, as if only it had been published. Before: it stayed active."""

    async def scenario():
        memory, current, _ = await _apply(
            redis_url, [("publish", "a", (0,)), ("publish", "b", (5,)), ("delete", "b", ())], 0.0
        )
        return memory, current

    memory, current = run(scenario())
    assert set(memory["facts"].values()) == {("pending", memory["facts"][next(iter(memory["facts"]))][1])}
    assert list(memory["schemas"].values()) == [("1", "candidate")]
    assert memory == run(fresh(redis_url, current))


class CountingExtractor(RulesExtractor):
    """Test double: the rules extractor, counting the texts it is asked to extract (what an LLM
    extractor would spend a call on each)."""

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []

    async def extract(self, text: str, context: str = ""):
        self.texts.append(text)
        return await super().extract(text, context)


def test_an_edit_of_one_chunk_of_twenty_extracts_that_chunk_alone():
    """A 20-window document (200 tokens, 40 overlapping: a stride of 160); one word changed in
    the part of window 8 no other window holds: one extraction, not twenty."""
    words = [f"w{i}" for i in range(160 * 19 + 200 - 4)]  # the sentence below is five tokens
    words[160 * 7 + 100] = "Ilse Marr lives in Kallmar."
    edited = list(words)
    edited[160 * 7 + 100] = "Ilse Marr lives in Brest."

    async def scenario():
        extractor = CountingExtractor()
        stages = InProcess(None, extractor, tau=1)
        try:
            await stages.publish("long", " ".join(words), version=1)
            first = len(extractor.texts)
            await stages.publish("long", " ".join(edited), version=2)
            return first, extractor.texts[first:], await stages.facts()
        finally:
            await stages.close()

    first, again, facts = run(scenario())
    assert first == 20
    assert len(again) == 1 and "Brest" in again[0]
    assert {f.tail: f.status for f in _by_head(facts, "Ilse Marr")} == {"Kallmar": "retracted", "Brest": "active"}


def test_a_fact_retracted_on_request_leaves_memory_until_said_again(redis_url):
    """`memstream retract` (a `retract` conflict set): the fact is retracted with an event, left
    out of answers, and no decision of its group brings it back; a passage that says it again
    does. Before: nothing called Lifecycle.retract."""
    from topics import encode
    from workers.publisher import retraction

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            [nora] = _by_head(await stages.facts(), "Nora Velt")
            work = retraction(stages.tenant, nora, "she left the mill", "r1")
            await stages.deliver(work.topic, work.key.encode(), encode(work.record))
            await stages.deliver(work.topic, work.key.encode(), encode(work.record))  # delivered twice: one retraction
            retracted = (await stages.facts())[nora.id]
            # `memstream fact F --evidence` (GET /v1/facts/F/evidence, MCP fact_evidence): where it came from
            evidence = await drilldown.fact_evidence(stages.memory, stages.tenant, nora.id)
            answer = await stages.query("Who works for Orsk Mills?", mode="ppr")
            await stages.publish("mill", "Nora Velt works for Orsk Mills again.", version=1)
            return retracted, evidence, nora, answer, (await stages.facts())[nora.id], stages.events()
        finally:
            await stages.close()

    retracted, evidence, nora, answer, back, events = run(scenario())
    assert retracted.status == "retracted" and retracted.reason == "retracted on request: she left the mill"
    # its support is set aside (no decision brings it back), its evidence kept in sight
    assert retracted.passage_ids == [] and nora.passage_ids
    assert evidence.fact.status == "retracted" and evidence.fact.passage_ids == nora.passage_ids
    assert [p.id for p in evidence.passages] == nora.passage_ids and "Nora Velt" in evidence.passages[0].text
    assert retracted.id not in {f["id"] for f in answer["facts"]}
    kinds = [e["event"] for e in events if e["fact_id"] == retracted.id]
    assert kinds[:2] == ["activated", "retracted"] and kinds.count("retracted") == 1
    assert back.status == "active"


def test_a_fact_said_again_by_a_later_version_drops_the_reason_it_had_left(redis_url):
    """A version stops saying a fact (retracted: "no current passage says it"), a later one says
    it again: it is active, and the reason it had left no longer stands beside it."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("oren", "Oren Vale is a cartographer. Oren Vale lives in Tessaly.", version=1)
            await stages.publish("oren", "Oren Vale is a cartographer.", version=2)
            [left] = [f for f in (await stages.facts()).values() if f.relation == "live in"]
            await stages.publish("oren", "Oren Vale is a sailmaker. Oren Vale lives in Tessaly.", version=3)
            return left, (await stages.facts())[left.id]
        finally:
            await stages.close()

    left, back = run(scenario())
    assert left.status == "retracted" and left.reason.startswith("no current passage says it")
    assert back.status == "active" and "no current passage says it" not in back.reason


def test_tenants_are_listed_with_their_records(redis_url):
    """`memstream tenants` (Memory.tenant_counts): every tenant with records, per layer."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            return stages.tenant, await stages.memory.tenant_counts()
        finally:
            await stages.close()

    tenant, counts = run(scenario())
    assert counts[tenant] == {"passages": 1, "facts": 2, "entities": 4, "schemas": 2}
    assert not any(name.startswith("_") for name in counts)  # the model caches are no tenant


def test_the_same_text_under_two_doc_ids_is_one_passage_of_both(redis_url):
    """Before: the second id appeared nowhere (the passage named only the first)."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("first", "Ilse Marr lives in Kallmar.", version=1)
            await stages.publish("second", "Ilse Marr lives in Kallmar.", version=1)
            [hit] = (await stages.query("Ilse Marr Kallmar", mode="lexical"))["passages"]
            statuses = await stages.memory.document_statuses(stages.tenant, ["first", "second"])
            return await drilldown.passage_record(stages.memory, stages.tenant, hit["id"]), statuses
        finally:
            await stages.close()

    record, statuses = run(scenario())
    assert record.doc_ids == ["first", "second"]
    assert all(s.chunks == s.chunks_done == 1 for s in statuses)  # `publish --wait` sees both indexed


def test_a_query_of_a_tenant_that_holds_nothing_says_so(redis_url):
    """Before: an unknown (say, misspelt) tenant answered like an empty memory."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            known = await stages.query("Where does Ilse Marr live?", mode="lexical")
            stages.tenant = stages.tenant + "-typo"
            return known, await stages.query("Where does Ilse Marr live?", mode="lexical"), stages.tenant
        finally:
            await stages.close()

    known, unknown, name = run(scenario())
    assert "warning" not in known
    assert unknown["passages"] == [] and unknown["warning"].startswith(f"tenant {name!r} holds no memory")


@pytest.mark.stack
def test_a_purged_tenant_leaves_nothing_of_its_texts_in_redis(stack_env):
    """`memstream tenant delete T --purge`: after it, a scan of every key of Redis (names and
    values of every type) finds none of the tenant's words, and no key under its hash tag;
    another tenant is untouched. The embedder caches its vectors in Redis as a worker's does."""
    from ops.erase import purge_tenant
    from store import Memory
    from workers.models.embedding import BatchingEmbedder, embedder_id
    from workers.settings import Settings

    url, word = stack_env["MEMSTREAM_REDIS_URL"], f"Zorvex{uuid.uuid4().hex[:8]}"
    text = f"{word} Quill lives in Brannoc. {word} Quill works for Orsk Mills."

    async def scenario():
        memory = Memory.from_url(url, tau=1)
        model = HashEmbedder()
        embedder = BatchingEmbedder(model, cache=memory.embedding_cache(embedder_id(model).cache_name))
        doomed, kept = (
            InProcess(None, RulesExtractor(), embedder, memory=memory, tau=1),
            InProcess(None, RulesExtractor(), embedder, memory=memory, tau=1),
        )
        try:
            await doomed.publish("note", text, version=1)
            await kept.publish("note", ILSE, version=1)
            before = await memory.tenant_counts()
            vectors = memory.embedding_cache(embedder_id(model).cache_name)
            cached = [len(await vectors.get_many([text, f"{word} Quill"]))]
            gone = await purge_tenant(Settings(redis_url=url), memory, doomed.tenant)
            cached.append(len(await vectors.get_many([text, f"{word} Quill"])))
            answer = await kept.query("Where does Ilse Marr live?", mode="lexical")
            return doomed.tenant, kept.tenant, before, gone, await memory.tenant_counts(), answer, cached
        finally:
            await memory.close()

    doomed, kept, before, gone, after, answer, cached = run(scenario())
    assert before[doomed]["passages"] == 1 and gone["cache entries"] > 0 and gone["keys"] > 0
    assert cached == [2, 0]  # the passage's vector and an entity name's, cached by the extractor, then gone
    assert doomed not in after and after[kept] == before[kept]
    assert [p["text"] for p in answer["passages"]] == [ILSE]
    found = redis_keys_holding(url, [word.encode(), word.lower().encode(), f"{{{doomed}}}".encode()])
    assert found == [], found[:10]


def test_deleting_a_tenant_needs_purge_said_out_loud(capsys):
    from ops import cli

    assert cli.main(["tenant", "delete", "acme"]) == 2
    assert "--purge" in capsys.readouterr().err
    assert cli.main(["tenant", "delete", "", "--purge"]) == 2  # no tenant is no tenant


def test_a_deletion_holds_against_redelivered_versions_and_repeats(redis_url):
    """Review finding: a deletion kept the deleted version, and marks were made of (text,
    version, previous record) alone — so a redelivered old version brought a deleted document
    back, and a second deletion of the same text repeated the first one's mark and was skipped."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            held = []
            await stages.publish("ilse", ILSE, version=5)
            await stages.delete("ilse")
            await stages.publish("ilse", ILSE, version=5)  # the same message again, after the deletion
            held.append(await current_memory(stages))
            await stages.publish("ilse", ILSE, version=6)  # a newer version brings it back
            held.append(await current_memory(stages))
            await stages.delete("ilse")  # and a second deletion of the same text takes it out again
            held.append(await current_memory(stages))
            return held
        finally:
            await stages.close()

    after_redelivery, back, deleted_again = run(scenario())
    nothing = {"facts": {}, "schemas": {}, "edges": {}}
    assert after_redelivery == nothing and deleted_again == nothing
    assert back == run(fresh(redis_url, {"ilse": ILSE}, tau=1))


def _race(stages: InProcess, method: str, concurrent) -> None:
    """Make the next call of the store's `method` commit `concurrent(pipe)` right after its read,
    as another worker's commit would land between a decision's reads and its EXEC."""
    original, fired = getattr(stages.memory, method), []

    async def raced(*args, **kwargs):
        found = await original(*args, **kwargs)
        if not fired:
            fired.append(True)
            pipe = stages.memory.pipeline(stages.tenant)
            concurrent(pipe)
            await pipe.execute()
        return found

    setattr(stages.memory, method, raced)


def test_support_that_lands_while_a_version_retires_the_passage_is_taken_back(redis_url):
    """Review finding: the chunker read a passage's facts unfenced, so support a detector
    committed between that read and the retirement's commit stayed counted on a retired
    passage. Now such a write bumps the passage's revision and the retirement decides again."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            await stages.publish("greta", GRETA, version=1)
            facts = await stages.facts()
            [passage] = {p for f in _by_head(facts, "Ilse Marr") for p in f.passage_ids}
            greta = _by_head(facts, "Greta Holm")[0]
            _race(
                stages,
                "passage_support",
                lambda pipe: stages.memory.stage_fact_passage(pipe, stages.tenant, greta.id, passage),
            )
            await stages.publish("ilse", ILSE_EDITED, version=2)
            return greta, (await stages.facts())[greta.id]
        finally:
            await stages.close()

    before, after = run(scenario())
    assert after.passage_ids == before.passage_ids  # the retired passage's late support is gone again


def test_a_document_taking_the_same_text_while_another_drops_it_keeps_it(redis_url):
    """Review finding: a passage's documents were read unfenced; another document joining the
    same text between the read and the commit left it retired though held."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            [passage] = {p for f in _by_head(await stages.facts(), "Ilse Marr") for p in f.passage_ids}
            _race(
                stages,
                "passage_documents",
                lambda pipe: stages.memory.stage_passage_documents(pipe, stages.tenant, passage, ["copy"], []),
            )
            await stages.publish("ilse", ILSE_EDITED, version=2)
            return (await stages.memory.passage_states(stages.tenant, [passage]))[0]
        finally:
            await stages.close()

    assert run(scenario()).retired is False


def test_a_schema_counted_again_while_a_version_demotes_it_stays_stable(redis_url):
    """Review finding: _demote read a schema's support unfenced; an extractor counting another
    passage for it between that read and the commit left it a candidate with its facts parked
    though it held τ again. Now the schema's status and frequency fence the decision."""
    import numpy as np

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor())  # τ = 2
        try:
            await stages.publish("a", SENTENCES[0], version=1)  # Ilse Marr lives in Kallmar.
            await stages.publish("b", SENTENCES[5], version=1)  # Greta Holm lives in Nimmo: "live in" stable
            [ilse] = _by_head(await stages.facts(), "Ilse Marr")

            def another(pipe):
                return stages.memory.stage_schema(
                    pipe,
                    stages.tenant,
                    ilse.schema_id,
                    ilse.head_type,
                    ilse.relation,
                    ilse.tail_type,
                    np.ones(384, dtype=np.float32),
                    "passage-of-a-third-document",
                )

            _race(stages, "schema_support", another)
            await stages.publish("b", SENTENCES[3], version=2)  # b no longer says "lives in"
            status = (await stages.memory.schema_support(stages.tenant, ilse.schema_id))[0]
            return status, (await stages.facts())[ilse.id]
        finally:
            await stages.close()

    status, ilse = run(scenario())
    assert status == "stable" and ilse.status == "active"


def test_a_fact_held_behind_the_gate_is_told_pending_and_told_where_it_merged(redis_url):
    """Before: a fact held behind the τ gate published nothing, and when its promotion found its
    active twin and merged into it, nothing told subscribers where it went. Now: `pending` once
    (its first passage), and `merged` naming it with `merged_into`."""
    from tests.inprocess import ScriptedExtractor
    from topics.records import Triple
    from workers.algorithms.normalize import canonical_fact, entity_id, fact_id

    relation = canonical_fact(Triple("a", "married to", "b")).relation
    a, b = "Ana Lind", "Bo Ek"
    if fact_id(entity_id(a), relation, entity_id(b)) > fact_id(entity_id(b), relation, entity_id(a)):
        a, b = b, a  # the active fact is the canonical one (smaller id): the promoted twin merges into it
    script = {
        "one": [(a, "married to", b, "PERSON", "ROBOT")],
        "two": [("Cy Moss", "married to", "Di Fern", "PERSON", "ROBOT")],
        "swapped": [(b, "married to", a, "ROBOT", "PERSON")],
        "four": [("Eve Sand", "married to", "Fay Holt", "ROBOT", "PERSON")],
    }

    async def scenario():
        stages = InProcess(redis_url, ScriptedExtractor(script), tau=2)
        try:
            for doc_id in ("one", "two", "swapped"):
                await stages.publish(doc_id, doc_id)
            told_before = stages.events()
            await stages.publish("four", "four")  # its schema stable: promoted, it meets its active twin
            return told_before, stages.events(), await stages.facts()
        finally:
            await stages.close()

    told_before, told, facts = run(scenario())
    active, swapped = fact_id(entity_id(a), relation, entity_id(b)), fact_id(entity_id(b), relation, entity_id(a))
    assert [e["event"] for e in told_before if e["fact_id"] == swapped] == ["pending"]
    assert [e["event"] for e in told if e["fact_id"] == swapped] == ["pending", "merged"]
    [merged] = [e for e in told if e["fact_id"] == swapped and e["event"] == "merged"]
    assert (
        merged["fact"]["merged_into"] == active
        and facts[swapped].status == "merged"
        and facts[active].status == "active"
    )


def test_a_version_that_retires_passages_says_so(redis_url):
    """Before: a retired passage left memory without a word. Now a `retired` event (keyed by the
    document, no fact) names the passages an edit or a deletion took out, and a redelivery or a
    version that retires nothing says nothing more."""

    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("ilse", ILSE, version=1)
            [first] = {p for f in (await stages.facts()).values() for p in f.passage_ids}
            await stages.publish("ilse", ILSE_EDITED, version=2)
            await stages.publish("ilse", ILSE_EDITED, version=2)  # the same version again
            [second] = {p for f in (await stages.facts()).values() if f.status == "active" for p in f.passage_ids}
            await stages.delete("ilse")
            return first, second, [o for o in stages.sent if o.topic == "indexed-facts"], stages.events()
        finally:
            await stages.close()

    first, second, sent, events = run(scenario())
    retired = [e for e in events if e["event"] == "retired"]
    assert [(e["doc_id"], e["passage_ids"], e["fact_id"], e["fact"]) for e in retired] == [
        ("ilse", [first], "", {}),
        ("ilse", [second], "", {}),
    ]
    assert [o.key for o in sent if b'"retired"' in o.value] == [f"{retired[0]['tenant']}/ilse"] * 2


def test_similarity_bridges_do_not_depend_on_the_order_documents_arrive_in(redis_url):
    """Memory = f(log) for the similarity edges too (CI: a Redis rebuilt from the log lacked one
    similar edge of the original, tests/test_rebuild_from_log.py). An entity was bridged to its 10
    nearest known entities at cosine ≥ sim_edge, so which pairs were joined depended on which
    entities existed when each arrived: 12 names of one vector, published in two orders, were
    joined by different sets of edges. Now every pair at cosine ≥ sim_edge is joined, whichever
    arrives first (up to SIMILAR_NEIGHBOURS_MAX neighbours an entity)."""
    from tests.test_round_trips import NamesOnly

    names = [f"Cora Person{i}" for i in range(10, 22)]

    async def similar_edges(order: list[str]) -> set:
        stages = InProcess(redis_url, NamesOnly(), sim_bridging=True)
        try:
            for n, name in enumerate(order):
                await stages.publish(f"d{n}", f"{name}, Unrelated{'x' * n}")
            memory = await stages.export()
            return {frozenset((e["source"], e["target"])) for e in memory["edges"] if e["kind"] == "similar"}
        finally:
            await stages.close()

    forward, backward = run(similar_edges(names)), run(similar_edges(names[::-1]))
    assert forward == backward
    assert len(forward) == len(names) * (len(names) - 1) // 2  # the digit-blind embedder: one vector, every pair
