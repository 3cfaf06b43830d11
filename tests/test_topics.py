"""`ensure_topics` (ops/stack/kafka_admin.py) on the local broker: `documents` is compacted — memory is
a function of that log, so it must keep each document's last message past the 7 days the other
topics keep — and a documents topic made before, with the broker's `delete` policy, is made so."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

from ops.stack import kafka_admin
from ops.stack.kafka_admin import delete_namespace_topics, ensure_topics
from workers.settings import Settings

pytestmark = pytest.mark.stack


def _policy(admin: KafkaAdminClient, topic: str, wanted: str | None = None) -> str:
    """The topic's cleanup.policy; with `wanted`, read until it is that (a change reaches the
    broker's metadata a moment after the controller took it), at most 10 s."""
    deadline = time.monotonic() + 10
    while True:
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        policy = (described["topic"][topic].get("cleanup.policy") or {}).get("value", "delete")
        if wanted is None or policy == wanted or time.monotonic() > deadline:
            return policy
        time.sleep(0.2)


@pytest.mark.parametrize("before", [False, True], ids=["new", "made before with delete"])
def test_the_documents_topic_is_compacted(stack_env, before):
    namespace = f"t{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env({**stack_env, "MEMSTREAM_TOPIC_NAMESPACE": namespace, "MEMSTREAM_APP_ID": namespace})
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        if before:
            admin.create_topics([NewTopic(settings.topics.documents, num_partitions=2, replication_factor=1)])
            assert _policy(admin, settings.topics.documents) == "delete"
        ensure_topics(settings)
        assert _policy(admin, settings.topics.documents, "compact") == "compact"
        assert _policy(admin, settings.topics.chunks) == "delete"
        if not before:  # made here: its size limit too
            configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, settings.topics.documents)])
            held = configs["topic"][settings.topics.documents]["max.message.bytes"]["value"]
            assert held == str(settings.max_message_bytes)
    finally:
        admin.close()
        delete_namespace_topics(settings, [namespace])


@pytest.mark.parametrize(
    "raised",
    [
        kafka_errors.UnknownBrokerIdError(3),
        kafka_errors.NodeNotReadyError(3),
        kafka_errors.NotControllerError(),
        kafka_errors.KafkaConnectionError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_client_behind_the_brokers_changing_asks_again(stack_env, monkeypatch, raised):
    """What kafka-python raises while a broker goes or comes back, rather than asking another — in
    CI, UnknownBrokerIdError: a restarted broker had become controller before the admin client's
    metadata listed it — is asked again, at every step. The double here is the real client on the
    real broker, made to raise that once before each of its calls."""
    namespace = f"t{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env({**stack_env, "MEMSTREAM_TOPIC_NAMESPACE": namespace, "MEMSTREAM_APP_ID": namespace})
    raised_in: list[str] = []

    def raising_once(name: str):
        def call(self, *args, **kwargs):
            if name not in raised_in:
                raised_in.append(name)
                raise raised
            return getattr(KafkaAdminClient, name)(self, *args, **kwargs)

        return call

    calls = ("list_topics", "describe_cluster", "create_topics", "describe_configs")
    ClientBehindTheBrokers = type("ClientBehindTheBrokers", (KafkaAdminClient,), {c: raising_once(c) for c in calls})
    monkeypatch.setattr(kafka_admin, "KafkaAdminClient", ClientBehindTheBrokers)
    try:
        assert sorted(ensure_topics(settings, timeout_s=30)) == sorted(settings.topics.all())
        assert sorted(raised_in) == sorted(calls)
        admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
        try:
            assert _policy(admin, settings.topics.documents, "compact") == "compact"
        finally:
            admin.close()
    finally:
        delete_namespace_topics(settings, [namespace])


def test_a_client_stuck_on_a_controller_that_no_longer_answers_is_made_anew(stack_env, monkeypatch):
    """kafka-python's admin client keeps the controller id it read first and, after a connection
    error, asks that node again: in CI a creation was refused that way for 60 s, while a new
    client would have asked the controller the cluster has now. The double: the real client, whose
    first instance can never create."""
    namespace = f"t{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env({**stack_env, "MEMSTREAM_TOPIC_NAMESPACE": namespace, "MEMSTREAM_APP_ID": namespace})
    made: list[KafkaAdminClient] = []

    class StuckFirst(KafkaAdminClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def create_topics(self, *args, **kwargs):
            if self is made[0]:
                raise kafka_errors.KafkaConnectionError("the controller it knows is gone")
            return super().create_topics(*args, **kwargs)

    monkeypatch.setattr(kafka_admin, "KafkaAdminClient", StuckFirst)
    try:
        assert sorted(ensure_topics(settings, timeout_s=20)) == sorted(settings.topics.all())
        assert len(made) == 2
    finally:
        delete_namespace_topics(settings, [namespace])


def test_topics_create_refuses_a_partition_count_below_1(monkeypatch, capsys):
    """Before: `topics create --partitions 0` created the topics with the default 4 (0 read as
    unset) and `--partitions -3` ended in a long Kafka error. Now argparse refuses them, exit 2."""
    from ops.cli import main
    from ops.stack.services import free_port

    monkeypatch.setenv("MEMSTREAM_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")  # (the old code's connect fails)
    for bad in ("0", "-3", "two"):
        with pytest.raises(SystemExit) as exit:
            main(["topics", "create", "--partitions", bad])
        assert exit.value.code == 2
        assert f"argument --partitions: must be a whole number >= 1, not '{bad}'" in capsys.readouterr().err
