"""Three Kafka brokers (`stack up --brokers 3`): topics replicated three times with
min.insync.replicas 2, idempotent acks=all producers (the workers' outbox through faust, the CLI
publisher); the broker leading most of the pipeline's partitions SIGKILLed mid-ingestion — the
memory loses and duplicates nothing, and equals an undisturbed build of the same corpus. Kafka is the test's own (three brokers beside the shared
test stack's one); Redis is the shared one."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict

import pytest

from ops.stack.services import Stack
from tests.chaos import comparable_export, export_differences, free_kafka_port, leading_broker
from tests.conftest import write_docs
from tests.test_crash import chunks_done, corpus, expected_fact_ids
from tests.test_end_to_end import tenant_name
from workers.settings import Settings

pytestmark = pytest.mark.stack


def _export(cli, tenant: str) -> dict:
    return comparable_export(json.loads(cli.run("export", "--tenant", tenant).stdout))


@pytest.fixture
def three_brokers(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMSTREAM_KAFKA_HEAP", "-Xmx384m")
    stack = Stack(Settings(home=tmp_path / "kafka3", kafka_port=free_kafka_port(3), kafka_brokers=3))
    try:
        stack.service_up("kafka", lambda m: None)
        yield stack
    finally:  # a start that failed (a port taken meanwhile) leaves no broker behind either
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

    leader = leading_broker(stack.bootstrap, workers.env["MEMSTREAM_TOPIC_NAMESPACE"])
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


def test_topics_created_while_a_broker_is_away_wait_for_it_rather_than_keep_two_replicas(three_brokers):
    """A topic's replicas are the cluster's (`default.replication.factor`, up to three), never the
    brokers that happen to answer: CI's chaos run created its topics while one of three brokers was
    fenced (three JVMs and the workers on two cores) and they kept two replicas for good."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaConnectionError

    from ops.stack.kafka_admin import ensure_topics

    stack = three_brokers
    away = stack.brokers[2]
    present = ",".join(f"127.0.0.1:{b.port}" for b in stack.brokers[:2])
    settings = Settings(kafka_bootstrap=present, topic_namespace=f"away{os.getpid()}", partitions=2)
    os.killpg(away.pid(), signal.SIGKILL)
    admin = KafkaAdminClient(bootstrap_servers=present)
    try:
        deadline, seen_fenced = time.monotonic() + 60, 0
        while seen_fenced < 5:  # fenced once its session times out, in the view of both brokers left
            assert time.monotonic() < deadline, "the killed broker was never fenced"
            try:
                seen_fenced = seen_fenced + 1 if len(admin.describe_cluster()["brokers"]) == 2 else 0
            except KafkaConnectionError:  # asked the killed one: another, next time
                seen_fenced = 0
            time.sleep(0.5)

        with pytest.raises(TimeoutError, match="wants 3 replicas"):
            ensure_topics(settings, timeout_s=3)
        ours = [t for t in admin.list_topics() if t.startswith(f"{settings.topic_namespace}.")]
        assert ours == [], f"topics created with fewer replicas than the cluster's: {ours}"

        stack.service_up("kafka", lambda m: None)  # the third broker back: the topics are made, replicated 3 times
        ensure_topics(settings, timeout_s=60)
        deadline, replicas = time.monotonic() + 30, []
        while len(replicas) < 2 * len(settings.topics.all()):  # as the broker asked learns of them
            assert time.monotonic() < deadline, f"the topics' partitions not described: {replicas}"
            described = admin.describe_topics(settings.topics.all())
            replicas = [len(p["replica_nodes"]) for topic in described for p in topic["partitions"]]
            time.sleep(0.2)
        assert set(replicas) == {3}
    finally:
        admin.close()
