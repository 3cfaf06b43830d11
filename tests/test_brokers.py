"""Three Kafka brokers (`stack up --brokers 3`): topics replicated three times with
min.insync.replicas 2, idempotent acks=all producers (the workers' outbox through faust, the CLI
publisher); the broker leading most of the pipeline's partitions SIGKILLed mid-ingestion — the
memory loses and duplicates nothing, and equals an undisturbed build of the same corpus. Kafka is the test's own (three brokers beside the shared
test stack's one); Redis is the shared one."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter, defaultdict

import pytest
from kafka import KafkaAdminClient

from ops.stack import Stack, free_port
from tests.chaos import comparable_export, export_differences
from tests.conftest import write_docs
from tests.test_crash import chunks_done, corpus, expected_fact_ids
from tests.test_end_to_end import tenant_name
from workers.settings import Settings

pytestmark = pytest.mark.stack


def _export(cli, tenant: str) -> dict:
    return comparable_export(json.loads(cli.run("export", "--tenant", tenant).stdout))


def _free_ports(count: int) -> int:
    """A free port followed by count - 1 free ports (each broker and its controller)."""
    for _ in range(100):
        port = free_port()
        try:
            for other in range(port + 1, port + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", other))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports found")


@pytest.fixture
def three_brokers(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMSTREAM_KAFKA_HEAP", "-Xmx384m")
    stack = Stack(Settings(home=tmp_path / "kafka3", kafka_port=_free_ports(6), kafka_brokers=3))
    stack.service_up("kafka", lambda m: None)
    yield stack
    stack.service_down("kafka")


def test_the_leading_broker_killed_mid_ingestion_loses_and_duplicates_nothing(make_workers, three_brokers, tmp_path):
    stack = three_brokers
    workers = make_workers(kafka_bootstrap=stack.bootstrap, extractor="rules", partitions=4, tau=1, conflicts="off")
    workers.start(role="all")
    cli, tenant, docs = workers.cli, tenant_name("brokers"), corpus(60)
    paths = write_docs(tmp_path / "docs", docs)
    cli.run("publish", *paths, "--tenant", tenant)
    deadline = time.monotonic() + 120
    while chunks_done(workers.env, tenant) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)

    admin = KafkaAdminClient(bootstrap_servers=stack.bootstrap)
    try:
        namespace = workers.env["MEMSTREAM_TOPIC_NAMESPACE"]
        described = admin.describe_topics([t for t in admin.list_topics() if t.startswith(f"{namespace}.")])
    finally:
        admin.close()
    partitions = [p for topic in described for p in topic["partitions"]]
    assert partitions and all(len(p["replica_nodes"]) == 3 for p in partitions), "a topic is not replicated 3 times"
    leader = Counter(p["leader_id"] for p in partitions).most_common(1)[0][0]
    victim = stack.brokers[leader - 1]
    os.killpg(victim.pid(), signal.SIGKILL)  # the leader of most partitions, mid-ingestion, no clean stop
    assert chunks_done(workers.env, tenant) < len(docs), "the corpus finished before the kill; enlarge it"

    cli.run("publish", *paths, "--tenant", tenant, "--wait", "--timeout", "300")
    activated = defaultdict(set)
    for event in cli.tail(tenant):
        if event["event"] == "activated":
            activated[event["fact_id"]].add(event["event_id"])
    assert set(activated) == expected_fact_ids(docs), "a fact was lost"
    assert all(len(ids) == 1 for ids in activated.values()), "a fact was activated twice"
    # and the memory is the one an undisturbed build of the corpus makes (on the surviving brokers)
    fresh = tenant_name("brokers-fresh")
    cli.run("publish", *paths, "--tenant", fresh, "--wait", "--timeout", "300")
    disturbed, undisturbed = _export(cli, tenant), _export(cli, fresh)
    assert disturbed == undisturbed, export_differences(undisturbed, disturbed)
