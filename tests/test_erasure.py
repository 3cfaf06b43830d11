"""Erasure (`memstream delete --purge`, workers.stages.erasure): a document's text — every
version of it — leaves the store with the facts and entities only it gave and their model-cache
entries; what other documents say stays. Each test runs the indexing stages in process
(tests.inprocess) over both stores (the `redis_url` fixture), with the rules extractor and an
embedder that caches its vectors in the store as a worker's does.

"Nothing of it" is looked for everywhere: for Redis, every key's name and value of every type
(a SCAN over the whole server); for the in-memory store, everything the tenant's memory and the
model caches hold. The document's people are made-up words, so any trace is found."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from store.in_memory import InMemoryStore
from tests.inprocess import DIMS, HashEmbedder, InProcess, redis_keys_holding
from workers.models.embedding import BatchingEmbedder, embedder_id
from workers.models.extraction import RulesExtractor
from workers.models.prompts import EXTRACTION_SCHEMA, extraction_messages

LLM_MODEL = "erasure-test-model"  # nothing calls it: the test plants the extraction answers it would have cached


def run(coro):
    return asyncio.run(coro)


def _stages(redis_url, **settings) -> InProcess:
    """An in-process pipeline whose embedder caches vectors in the store."""
    from store import Memory

    memory = Memory.from_url(redis_url, tau=1) if redis_url else InMemoryStore(DIMS, tau=1)
    model = HashEmbedder()
    embedder = BatchingEmbedder(model, cache=memory.embedding_cache(embedder_id(model).cache_name))
    return InProcess(None, RulesExtractor(), embedder, memory=memory, tau=1, llm_model=LLM_MODEL, **settings)


def traces(stages: InProcess, redis_url, words: list[str]) -> list[str]:
    """Where any of `words` (any case) is still held: Redis keys, or parts of the in-memory store."""
    needles = [w.lower().encode() for w in words] + [w.encode() for w in words]
    if redis_url is not None:
        return redis_keys_holding(redis_url, needles)
    store = stages.memory
    memory = {**vars(store._tenants[stages.tenant])}
    memory["sets"] = {k: v for k, v in memory["sets"].items() if v}  # (reads make empty sets here; Redis keeps none)
    parts = {"tenant": repr(memory).encode(), "caches": repr(store._cache).encode()}
    return [name for name, blob in parts.items() if any(n in blob for n in needles)]


async def plant_llm_answers(stages: InProcess, texts: list[str]) -> list[str]:
    """What an LLM extractor would have cached for these passages (the answer names them)."""
    cache = stages.memory.llm_cache(LLM_MODEL)
    for text in texts:
        await cache.put(
            extraction_messages(text, ""), EXTRACTION_SCHEMA, json.dumps({"entities": [text[:40]], "facts": []})
        )
    return [cache.key(extraction_messages(text, ""), EXTRACTION_SCHEMA) for text in texts]


def test_an_erased_document_leaves_nothing_of_any_version(redis_url):
    """Before: `delete` only retired a document's passages (kept for audit, with their text and
    vectors), and nothing could take its text out of Redis short of erasing the whole tenant."""
    word = f"Zorvex{uuid.uuid4().hex[:8]}"
    first = f"{word} Quill lives in Brannoc. {word} Quill works for Orsk Mills."
    edited = f"{word} Quill lives in Tallowmere."
    other = "Nora Velt works for Orsk Mills."

    async def scenario():
        stages = _stages(redis_url)
        try:
            await stages.publish("quill", first, version=1)
            await stages.publish("quill", edited, version=2)  # version 1's passage is retired, kept for audit
            await stages.publish("nora", other, version=1)
            llm_keys = await plant_llm_answers(stages, [first, edited])
            before = traces(stages, redis_url, [word])
            walked = await stages.query("Who works for Orsk Mills?", mode="ppr")  # the query side holds the graph now
            await stages.delete("quill", purge=True)
            after = traces(stages, redis_url, [word])
            walked_after = await stages.query(
                "Who works for Orsk Mills?", mode="ppr"
            )  # its change stream gone: loaded again
            planted = [
                await stages.memory.llm_cache(LLM_MODEL).get(extraction_messages(t, ""), EXTRACTION_SCHEMA)
                for t in (first, edited)
            ]
            answer = await stages.query("Who works for Orsk Mills?", mode="lexical")
            facts = {(f.head, f.relation, f.tail): f.status for f in (await stages.facts()).values()}
            await stages.publish("quill", edited, version=3)  # published again: indexed anew
            again = {(f.head, f.relation, f.tail): f.status for f in (await stages.facts()).values()}
            return stages.events(), before, after, planted, llm_keys, answer, facts, again, walked, walked_after
        finally:
            await stages.close()

    events, before, after, planted, llm_keys, answer, facts, again, walked, walked_after = run(scenario())
    assert {p["text"] for p in walked["passages"]} == {edited, other}
    assert [p["text"] for p in walked_after["passages"]] == [other]
    assert before, "the document's words were in the store before its erasure"
    assert after == [], after[:10]
    assert planted == [None, None] and len(llm_keys) == 2
    [purged] = [e for e in events if e["event"] == "purged"]
    assert purged["doc_id"] == "quill" and len(purged["passage_ids"]) == 2 and len(purged["fact_ids"]) == 3
    assert word.lower() not in json.dumps(purged).lower()  # the event names what went, never its text
    assert [p["text"] for p in answer["passages"]] == [other]  # the other document and the entity it shares stay
    assert facts == {("Nora Velt", "work for", "Orsk Mills"): "active"}
    assert again == {**facts, (f"{word} Quill", "live in", "Tallowmere"): "active"}


def test_an_erasure_keeps_a_text_another_document_holds_and_facts_said_elsewhere(redis_url):
    """A passage another document's current version holds is that document's text too: it
    stays, as does a fact another passage extracted (retired or not)."""
    word = f"Zorvex{uuid.uuid4().hex[:8]}"
    shared = f"{word} Quill lives in Brannoc."
    own = f"{word} Quill works for Orsk Mills. {word} Quill founded Tallow Works."

    async def scenario():
        stages = _stages(redis_url)
        try:
            await stages.publish("quill", f"{shared}\n\n{own}".replace(". ", ".\n\n"), version=1)
            await stages.publish("copy", shared, version=1)
            await stages.publish("later", f"{word} Quill founded Tallow Works.", version=1)
            await stages.delete("later")  # retired, kept for audit: its fact was extracted there too
            await stages.delete("quill", purge=True)
            facts = {(f.head, f.relation, f.tail): f.status for f in (await stages.facts()).values()}
            passages = [row for _, row in await stages.memory.records(stages.tenant, "passages") if row.get("text")]
            return facts, passages, stages.events()
        finally:
            await stages.close()

    facts, passages, events = run(scenario())
    assert {(p["text"], p.get("retired") == "1") for p in passages} == {
        (shared, False),
        (f"{word} Quill founded Tallow Works.", True),
    }
    assert facts == {
        (f"{word} Quill", "live in", "Brannoc"): "active",
        (f"{word} Quill", "found", "Tallow Works"): "retracted",
    }
    [purged] = [e for e in events if e["event"] == "purged"]
    assert len(purged["fact_ids"]) == 1  # works for Orsk Mills: only the erased text said it


def test_an_erasure_redelivered_or_repeated_changes_nothing_more(redis_url):
    """The erasure and its tombstone delivered twice, and `delete --purge` asked again: one
    `purged` event (a redelivery repeats its id), and the memory as after the first."""

    async def scenario():
        stages = _stages(redis_url)
        try:
            await stages.publish("quill", "Odo Quill lives in Brannoc.", version=1)
            await stages.publish("nora", "Nora Velt works for Orsk Mills.", version=1)
            await stages.delete("quill", purge=True, wait=False)
            await stages.delete("quill", purge=True, wait=False)
            await stages.drain()
            once = await stages.export()
            await stages.delete("quill", purge=True)
            return once, await stages.export(), stages.events()
        finally:
            await stages.close()

    once, twice, events = run(scenario())
    assert once == twice
    assert len({e["event_id"] for e in events if e["event"] == "purged"}) == 1


def test_an_extraction_landing_while_the_erasure_decides_keeps_its_fact(redis_url):
    """Another passage extracting the same fact between the erasure's reads and its commit (its
    extraction count moves) makes the erasure decide again: the fact stays, with its source."""
    from store.facts import Fact
    from tests.test_versions import _race
    from topics.records import Triple
    from workers.algorithms.normalize import entity_id, fact_id, schema_id

    async def scenario():
        stages = _stages(redis_url)
        try:
            await stages.publish("quill", "Odo Quill lives in Brannoc.", version=1)
            [fact] = (await stages.facts()).values()
            triple = Triple("Odo Quill", "lives in", "Brannoc")
            again = Fact.extracted(
                fact.id, triple, entity_id("Odo Quill"), entity_id("Brannoc"), schema_id("ENTITY", "lives in", "ENTITY")
            )
            _race(
                stages,
                "fact_sources",
                lambda pipe: stages.memory.stage_new_fact(pipe, stages.tenant, again, [1.0] * DIMS, None, "elsewhere"),
            )
            await stages.delete("quill", purge=True)
            return fact, await stages.facts(), stages.events()
        finally:
            await stages.close()

    fact, facts, events = run(scenario())
    assert fact.id == fact_id(fact.head_id, fact.relation, fact.tail_id) and fact.id in facts
    [purged] = [e for e in events if e["event"] == "purged"]
    assert purged["fact_ids"] == []


@pytest.mark.parametrize(
    "value, error",
    [
        (b'{"v":1,"tenant":"t","doc_id":"d","erase":false}', "erase=False"),
        (b'{"v":1,"tenant":"t","doc_id":"d","erase":true,"text":"x"}', "'text'"),
        (b'{"v":1,"tenant":"","doc_id":"d","erase":true}', "tenant"),
        (b'{"v":1,"tenant":"t","doc_id":" ","erase":true}', "doc id"),
    ],
)
def test_a_malformed_erasure_is_refused_with_its_reason(value, error):
    from topics import ContractError, Document, decode

    with pytest.raises(ContractError, match=error):
        decode(Document, value)


def test_an_erasure_value_reads_back_as_the_deletion_it_encodes():
    from topics import Document, DocumentDeletion, decode

    deletion = DocumentDeletion("acme", "notes/a.md", purge=True)
    assert decode(Document, deletion.erasure_value()) == deletion


def one_document_tenant(redis_url: str, doc_id: str, text: str) -> str:
    """A fresh tenant holding one document, indexed in this process into the Redis at `redis_url`."""

    async def index() -> str:
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish(doc_id, text, version=1)
            return stages.tenant
        finally:
            await stages.close()

    return run(index())


@pytest.mark.stack
def test_memstream_tenant_delete_purge_announces_what_went(stack_env, capsys):
    """`memstream tenant delete T --purge`: a `purged` event for the tenant (no document, no
    ids, what went counted) on memstream.indexed-facts, after the erasure."""
    from ops import cli
    from tests.chaos import read_topic
    from workers.settings import Settings

    tenant = one_document_tenant(stack_env["MEMSTREAM_REDIS_URL"], "note", "Odo Quill lives in Brannoc.")
    assert cli.main(["tenant", "delete", tenant, "--purge"]) == 0
    assert f"tenant {tenant} erased:" in capsys.readouterr().out
    settings = Settings.from_env(stack_env)
    events = [json.loads(r.value) for r in read_topic(settings.kafka_bootstrap, settings.topics.indexed_facts)]
    [purged] = [e for e in events if e["tenant"] == tenant]
    assert (purged["event"], purged["doc_id"], purged["fact_id"], purged["passage_ids"]) == ("purged", "", "", [])
    assert purged["reason"].startswith("tenant erased: ") and "1 passages" in purged["reason"]


@pytest.mark.stack
def test_a_tenant_erased_for_good_does_not_come_back_from_the_log(stack_env, tmp_path, capsys):
    """`tenant delete T --purge` erased Redis alone: the tenant's documents stayed current on
    memstream.documents, so `memstream rebuild` (or a recovery from the log) indexed them again
    and the log kept their texts (an audit). Now each gets an erasure and a tombstone: the log's
    current documents of the tenant — what a rebuild reads (ops.rebuild.current_documents) — are
    none."""
    from ops import cli
    from ops.rebuild import current_documents
    from tests.chaos import read_topic
    from workers.settings import Settings

    settings = Settings.from_env(stack_env)
    tenant = f"gone-{uuid.uuid4().hex[:8]}"
    for name in ("quill", "marr"):
        (tmp_path / f"{name}.txt").write_text(f"{name.title()} lives in Brannoc.", encoding="utf-8")
    assert cli.main(["publish", str(tmp_path), "--tenant", tenant]) == 0  # on the log; no worker needed
    assert sorted(d.doc_id for d in current_documents(settings, tenant)[0][tenant]) == ["marr", "quill"]
    capsys.readouterr()
    assert cli.main(["tenant", "delete", tenant, "--purge"]) == 0
    assert "2 documents erased on memstream.documents" in capsys.readouterr().out
    assert current_documents(settings, tenant) == ({}, 0)
    by_key: dict[bytes, list] = {}
    for record in read_topic(settings.kafka_bootstrap, settings.topics.documents):
        if record.key.startswith(f"{tenant}/".encode()):
            by_key.setdefault(record.key, []).append(record.value)
    for key, values in by_key.items():  # each: its publication, its erasure, its tombstone
        assert len(values) == 3 and json.loads(values[1])["erase"] is True and values[2] is None, key


@pytest.mark.stack
def test_deleting_an_id_the_tenant_never_held_is_refused_with_the_id_it_may_mean(stack_env, capsys):
    """`memstream delete notes/ilse` after `publish notes/` (README's own example: the folder's
    file is `ilse`) said "1/1 deleted" and changed nothing. An id the tenant holds no record of
    is refused now, nothing published, naming the recorded id it may mean."""
    from ops import cli
    from tests.chaos import read_topic
    from topics import document_key
    from workers.settings import Settings

    tenant = one_document_tenant(stack_env["MEMSTREAM_REDIS_URL"], "ilse", "Ilse Marr lives in Brannoc.")
    assert cli.main(["delete", "notes/ilse", "nosuch", "--tenant", tenant]) == 2
    err = capsys.readouterr().err
    assert "'notes/ilse' (did you mean 'ilse'?)" in err and "'nosuch'" in err and "nothing was deleted" in err
    settings = Settings.from_env(stack_env)
    keys = {r.key for r in read_topic(settings.kafka_bootstrap, settings.topics.documents)}
    assert not {document_key(tenant, "notes/ilse").encode(), document_key(tenant, "nosuch").encode()} & keys
    assert cli.main(["delete", "ilse", "--tenant", tenant]) == 0
    # --force: published whatever Redis holds (a document not through the chunker yet, or dead-lettered)
    assert cli.main(["delete", "nosuch", "--tenant", tenant, "--force"]) == 0
    keys = {r.key for r in read_topic(settings.kafka_bootstrap, settings.topics.documents)}
    assert {document_key(tenant, "ilse").encode(), document_key(tenant, "nosuch").encode()} <= keys


def test_a_fact_merged_into_an_erased_one_is_retracted_and_comes_back_when_said_again(redis_url):
    """ "X married Y" (kept) and "Y married X" (merged into it) from two documents; the second is
    deleted, the first erased. Before: the merged fact pointed at an erased one, and publishing
    the second again sent its merge to the dead-letter topic. Now it is retracted by the
    erasure, and the second document brings it back active."""
    from tests.inprocess import ScriptedExtractor
    from topics.records import Triple
    from workers.algorithms.normalize import canonical_fact, entity_id, fact_id

    relation = canonical_fact(Triple("a", "married to", "b")).relation
    a, b = "Ana Lind", "Bo Ek"
    if fact_id(entity_id(a), relation, entity_id(b)) > fact_id(entity_id(b), relation, entity_id(a)):
        a, b = b, a  # the first document's fact is the canonical one: the second merges into it
    script = {"first": [(a, "married to", b, "PERSON", "PERSON")], "second": [(b, "married to", a, "PERSON", "PERSON")]}
    kept, twin = fact_id(entity_id(a), relation, entity_id(b)), fact_id(entity_id(b), relation, entity_id(a))

    async def scenario():
        stages = InProcess(redis_url, ScriptedExtractor(script), tau=1)
        try:
            await stages.publish("one", "first")
            await stages.publish("two", "second")
            merged = (await stages.facts())[twin].merged_into
            await stages.delete("two")
            await stages.delete("one", purge=True)
            after_erasure = await stages.facts()
            await stages.publish("two", "second", version=2)
            return merged, after_erasure, await stages.facts(), stages.dead_letters(), stages.events()
        finally:
            await stages.close()

    merged, after_erasure, again, letters, events = run(scenario())
    assert merged == kept
    assert kept not in after_erasure and (after_erasure[twin].status, after_erasure[twin].merged_into) == (
        "retracted",
        "",
    )
    assert again[twin].status == "active" and letters == []
    assert [e["event"] for e in events if e["fact_id"] == twin][-2:] == ["retracted", "activated"]
