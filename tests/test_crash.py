"""Kill -9 a worker in the middle of indexing: after its partitions move to the survivor,
no fact is lost and none is activated twice (a redelivered event carries the same event_id)."""

import asyncio
import itertools
import os
import signal
import time
from collections import defaultdict

import pytest

from store import Memory
from tests.conftest import write_docs
from tests.test_end_to_end import tenant_name
from workers.algorithms.normalize import entity_id, fact_id, relation_name
from workers.models.extraction import RulesExtractor

FIRST = ["Alder", "Briony", "Cassian", "Delphine", "Ewan", "Farrah", "Gideon", "Hester", "Ivo", "Juno"]
LAST = ["Quill", "Rowan", "Sallow", "Thorne", "Umber", "Vane"]
PLACES = ["Brightwater", "Port Selka", "Calder Valley", "Lake Merrow", "Ostra"]


def corpus(n: int) -> dict[str, str]:
    docs = {}
    for i, (first, last) in enumerate(itertools.islice(itertools.product(FIRST, LAST), n)):
        person, company, place = f"{first} {last}", f"{last} {first} Works", PLACES[i % len(PLACES)]
        docs[f"doc{i:03d}"] = (
            f"{person} founded {company}. {company} builds boats in {place}. {person} married {FIRST[(i + 3) % 10]} {LAST[(i + 1) % 6]}."
        )
    return docs


def expected_fact_ids(docs: dict[str, str]) -> set[str]:
    ids = set()
    for text in docs.values():
        for f in RulesExtractor().extract_sync(text).facts:
            ids.add(fact_id(entity_id(f.head), relation_name(f.relation), entity_id(f.tail)))
    return ids


def chunks_done(env: dict, tenant: str) -> int:
    async def count():
        memory = Memory.from_url(env["MEMSTREAM_REDIS_URL"])
        try:
            return await memory.chunks_done_count(tenant)
        finally:
            await memory.close()

    return asyncio.run(count())


@pytest.mark.parametrize("window", [1, 8])
def test_killed_worker_loses_and_duplicates_nothing(make_workers, tmp_path, window):
    # delivery guarantees only: no τ gate, no conflict handling (templated sentences are near-duplicates);
    # window 8: the extractors read ahead (MEMSTREAM_LLM_CONCURRENCY), the victim dies holding up to 8 chunks
    workers = make_workers(extractor="rules", partitions=4, tau=1, conflicts="off", llm_concurrency=window)
    victim = workers.start(role="chunker,extractor,detector,resolver")
    workers.start(role="all")
    time.sleep(4)  # let the group settle with both members
    tenant, docs = tenant_name("crash"), corpus(60)
    paths = write_docs(tmp_path / "docs", docs)
    publisher = workers.cli
    publisher.run("publish", *paths, "--tenant", tenant)
    deadline = time.monotonic() + 120
    while chunks_done(workers.env, tenant) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(victim.pid, signal.SIGKILL)  # mid-stream, no clean shutdown
    victim.wait()
    assert chunks_done(workers.env, tenant) < len(docs), "the corpus finished before the kill; enlarge it"

    publisher.run("publish", *paths, "--tenant", tenant, "--wait", "--timeout", "240")
    events = publisher.tail(tenant)
    activated = defaultdict(set)
    for e in events:
        if e["event"] == "activated":
            activated[e["fact_id"]].add(e["event_id"])
    assert set(activated) == expected_fact_ids(docs), "a fact was lost"
    assert all(len(ids) == 1 for ids in activated.values()), "a fact was activated twice"
    answer = publisher.query("Who founded Rowan Alder Works?", tenant)
    assert answer["passages"][0]["text"].startswith("Alder Rowan founded Rowan Alder Works.")


def test_a_worker_stopped_while_its_broker_is_silent_exits_at_its_deadline_and_loses_nothing(make_workers, tmp_path):
    """SIGTERM to a worker mid-ingestion while its one broker is SIGSTOPped (a host gone, a
    network partition): faust's stop flushes the producer and commits offsets with no timeout, and
    the worker was still running 150 s later (a second signal does nothing). Now it exits with 1
    MEMSTREAM_STOP_SECONDS after the signal (8 s here); with the broker back, a new worker
    finishes the corpus: no fact lost, none activated twice."""
    from ops.stack.services import Stack
    from tests.chaos import free_kafka_port
    from workers.settings import Settings

    port = free_kafka_port(1)
    stack = Stack(Settings(home=tmp_path / "kafka", kafka_port=port))
    stack.service_up("kafka", lambda m: None)
    try:
        workers = make_workers(
            kafka_bootstrap=f"127.0.0.1:{port}", extractor="rules", tau=1, conflicts="off", stop_seconds=8
        )
        worker = workers.start(role="all")
        tenant, docs = tenant_name("silent"), corpus(40)
        paths = write_docs(tmp_path / "docs", docs)
        workers.cli.run("publish", *paths, "--tenant", tenant)
        deadline = time.monotonic() + 120
        while chunks_done(workers.env, tenant) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        broker = stack.kafka.pid()
        assert broker is not None
        os.killpg(broker, signal.SIGSTOP)
        try:
            time.sleep(0.5)
            signalled = time.monotonic()
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                rc = worker.wait(60)
            except Exception:
                pytest.fail("the worker was still running 60 s after SIGTERM, its broker silent")
            assert rc == 1 and time.monotonic() - signalled < 40, (rc, time.monotonic() - signalled)
        finally:
            os.killpg(broker, signal.SIGCONT)
        assert "not stopped 8 s after the signal" in workers.logs()

        workers.start(role="all")
        workers.cli.run("publish", *paths, "--tenant", tenant, "--wait", "--timeout", "240")
        activated = defaultdict(set)
        for e in workers.cli.tail(tenant):
            if e["event"] == "activated":
                activated[e["fact_id"]].add(e["event_id"])
        assert set(activated) == expected_fact_ids(docs), "a fact was lost"
        assert all(len(ids) == 1 for ids in activated.values()), "a fact was activated twice"
    finally:
        stack.service_down("kafka")
