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
