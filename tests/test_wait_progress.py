"""`memstream publish --wait` reads the progress of many documents at once: the batched status
call on both stores (store.MemoryStore.document_statuses), and the wait loop asking it once per
poll, only for the documents still pending."""

import asyncio
import json
import uuid

import redis.asyncio as aioredis

from ops.publish import _wait_indexed, poll_interval
from store import DocumentStatus, Memory
from store.in_memory import InMemoryStore
from store.memory import DOCUMENT_STATUS_BATCH
from topics import Document
from workers.algorithms.normalize import content_hash
from workers.settings import Settings


def run(coro):
    return asyncio.run(coro)


def _store(redis_url: str | None):
    return Memory.from_url(redis_url) if redis_url else InMemoryStore()


async def _record(
    store, tenant: str, doc_id: str, text: str, chunk_ids: list[str], done: list[str], version: int = 1
) -> None:
    """What the chunker and the stages after it write about a document's progress."""
    pipe = store.pipeline(tenant)
    store.stage_document(pipe, tenant, doc_id, content_hash(text), version, chunk_ids)
    for chunk_id in done:
        store.stage_chunk_done(pipe, tenant, chunk_id)
    await pipe.execute()


def test_document_statuses_absent_partial_done_and_many_in_order(redis_url):
    async def scenario():
        store, tenant = _store(redis_url), f"ws-{uuid.uuid4().hex[:8]}"
        try:
            await _record(store, tenant, "partial", "one two", ["p0", "p1", "p2"], ["p1"])
            await _record(store, tenant, "done", "three", ["d0", "d1"], ["d0", "d1"])
            await _record(store, tenant, "empty", "", [], [])
            many_chunks = [f"m{i}" for i in range(2500)]  # past the script's slices of SMISMEMBER
            await _record(store, tenant, "long", "long", many_chunks, many_chunks[::2])
            many = [f"doc-{i}" for i in range(2 * DOCUMENT_STATUS_BATCH + 7)]  # several script calls
            for i, doc_id in enumerate(many):
                if i % 3:
                    await _record(store, tenant, doc_id, doc_id, [f"{doc_id}-c"], [f"{doc_id}-c"] if i % 3 == 2 else [])
            asked = ["absent", "partial", "done", "empty", "long", "é/ü:{x}", *many]
            return (
                await store.document_statuses(tenant, asked),
                await store.document_statuses(tenant, []),
                await store.document_status(tenant, "partial"),
                await store.document_status(tenant, "absent"),
                many,
            )
        finally:
            await store.close()

    statuses, none, single, absent, many = run(scenario())
    assert statuses[:6] == [
        None,
        DocumentStatus(content_hash("one two"), 1, 3, 1),
        DocumentStatus(content_hash("three"), 1, 2, 2),
        DocumentStatus(content_hash(""), 1, 0, 0),
        DocumentStatus(content_hash("long"), 1, 2500, 1250),
        None,
    ]
    assert statuses[6:] == [
        None if i % 3 == 0 else DocumentStatus(content_hash(doc_id), 1, 1, 1 if i % 3 == 2 else 0)
        for i, doc_id in enumerate(many)
    ]
    assert none == [] and single == statuses[1] and absent is None
    assert [s.indexed(content_hash(t)) for s, t in zip(statuses[1:5], ["one two", "three", "", "long"])] == [
        False,
        True,
        True,
        False,
    ]
    assert not statuses[2].indexed(content_hash("an older text"))  # done, but another version than the one waited for


def test_document_statuses_is_one_round_trip_to_redis(stack_env, monkeypatch):
    sent = []
    real_execute, real_command = aioredis.client.Pipeline.execute, aioredis.Redis.execute_command

    async def execute(self, *args, **kwargs):
        sent.append(("pipeline", len(self.command_stack)))
        return await real_execute(self, *args, **kwargs)

    async def command(self, *args, **kwargs):
        sent.append(("command", args[0]))
        return await real_command(self, *args, **kwargs)

    async def scenario():
        memory, tenant = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"]), f"ws-{uuid.uuid4().hex[:8]}"
        try:
            await _record(memory, tenant, "doc-1", "text", ["c1"], ["c1"])
            monkeypatch.setattr(aioredis.client.Pipeline, "execute", execute)
            monkeypatch.setattr(aioredis.Redis, "execute_command", command)
            statuses = await memory.document_statuses(tenant, [f"doc-{i}" for i in range(3 * DOCUMENT_STATUS_BATCH)])
            monkeypatch.undo()
            return statuses
        finally:
            await memory.close()

    statuses = run(scenario())
    assert (
        statuses[1] == DocumentStatus(content_hash("text"), 1, 1, 1)
        and statuses.count(None) == 3 * DOCUMENT_STATUS_BATCH - 1
    )
    assert sent == [("pipeline", 3)]  # three script calls, sent together


class CountingStore:
    """Test double: an InMemoryStore that records each status read of the wait loop and, after
    each, lets the pipeline get on (`progress` is called with the number of reads so far)."""

    def __init__(self, store: InMemoryStore, progress):
        self.store, self.progress, self.reads = store, progress, []

    async def document_statuses(self, tenant: str, doc_ids: list[str]):
        self.reads.append((tenant, sorted(doc_ids)))
        statuses = await self.store.document_statuses(tenant, doc_ids)
        await self.progress(len(self.reads))
        return statuses

    async def document_status(self, tenant: str, doc_id: str):
        raise AssertionError("the wait loop reads documents one by one")


def _docs(tenant: str, n: int) -> list[Document]:
    return [Document(tenant=tenant, doc_id=f"d{i}", text=f"text {i}") for i in range(n)]


def test_wait_reads_all_pending_documents_once_per_poll_and_only_those_still_pending():
    store, docs = InMemoryStore(), _docs("acme", 30)

    async def index(some: list[Document]) -> None:
        for doc in some:
            await _record(store, doc.tenant, doc.doc_id, doc.text, [f"{doc.doc_id}-c"], [f"{doc.doc_id}-c"])

    async def progress(reads: int) -> None:  # between polls, as the workers would
        await index(docs[10:25] if reads == 1 else docs[25:] if reads == 2 else [])

    async def scenario():
        await index(docs[:10])  # indexed before the wait starts
        await _record(
            store, "acme", "d29", "an older text", ["old-c"], ["old-c"]
        )  # another version, done: still pending
        counting = CountingStore(store, progress)
        pending = await _wait_indexed(Settings(), docs, timeout_s=60, quiet=True, memory=counting)
        return pending, counting.reads

    pending, reads = run(scenario())
    assert pending == []
    assert [len(ids) for _, ids in reads] == [30, 20, 5]
    assert reads[2] == ("acme", sorted(d.doc_id for d in docs[25:]))


def test_wait_reads_each_tenant_once_per_poll_and_returns_what_is_pending_at_the_deadline():
    store = InMemoryStore()
    docs = _docs("acme", 3) + _docs("globex", 2)

    async def nothing(reads: int) -> None:
        pass

    async def scenario():
        counting = CountingStore(store, nothing)
        pending = await _wait_indexed(Settings(), docs, timeout_s=0, quiet=True, memory=counting)
        return pending, counting.reads

    pending, reads = run(scenario())
    assert sorted(pending) == ["d0", "d0", "d1", "d1", "d2"]
    assert reads == [
        ("acme", ["d0", "d1", "d2"]),
        ("globex", ["d0", "d1"]),
    ]  # one read at the deadline, one call per tenant


def test_the_poll_interval_grows_with_the_pending_documents_within_bounds():
    assert [poll_interval(n) for n in (0, 1, 50, 1000, 5000, 100_000)] == [0.05, 0.05, 0.05, 1.0, 5.0, 5.0]


def test_bench_wait_measures_the_cli_of_each_tree_on_a_redis_of_its_own(stack_env):
    """`memstream bench wait` end to end, small: this tree and a baseline (this tree again)."""
    from kafka import KafkaAdminClient

    from tests.conftest import ROOT, Cli

    rows = json.loads(
        Cli(stack_env)
        .run(
            "bench",
            "wait",
            "--pending",
            "30",
            "--window",
            "1",
            "--seen",
            "--baseline-tree",
            str(ROOT),
            "--json",
            timeout=300,
        )
        .stdout
    )
    assert [(r["tree"], r["directory"], r["pending"], r["seen"]) for r in rows] == [
        ("this", str(ROOT), 30, True),
        ("baseline", str(ROOT), 30, True),
    ]
    assert all(
        r["client_core_share"] > 0 and r["redis_commands_per_s"] > 0 for r in rows
    )  # it polled Redis in the window
    admin = KafkaAdminClient(bootstrap_servers=stack_env["MEMSTREAM_KAFKA_BOOTSTRAP"])
    try:
        assert not [
            t for t in admin.list_topics() for r in rows if t.startswith(f"{r['namespace']}.")
        ]  # its topics deleted
    finally:
        admin.close()
