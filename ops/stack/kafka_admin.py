"""Topic creation before workers start (kafka-python admin client): every topic of the namespace,
replicated as the cluster says, up to three brokers (min.insync.replicas 2 at three, so acks=all
survives one broker lost), `documents` compacted — memory is a function of that log, so it keeps each
document's last message for good (workers.recovery, ops/rebuild.py) where the other topics
keep 7 days."""

from __future__ import annotations

import time
from contextlib import suppress

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import (
    InvalidReplicationFactorError,
    RetriableError,
    TopicAlreadyExistsError,
    UnknownBrokerIdError,
)

from workers.settings import Settings


def ensure_topics(
    settings: Settings, partitions: int | None = None, timeout_s: float = 30, connect_timeout_s: float = 30
) -> list[str]:
    """Create the missing topics of the namespace; returns the names created. Raises (kafka's
    KafkaTimeoutError) when no broker answered within `connect_timeout_s`."""
    partitions = partitions or settings.partitions

    def client() -> KafkaAdminClient:
        return KafkaAdminClient(
            bootstrap_servers=settings.kafka_bootstrap,
            client_id="memstream-admin",
            bootstrap_timeout_ms=int(max(1.0, connect_timeout_s) * 1000),
        )

    admin = client()
    try:
        wanted = settings.topics.all()
        deadline = time.monotonic() + timeout_s
        created: list[str] = []
        replicas, brokers = MAX_REPLICAS, 0
        refused: Exception | None = None  # the last answer to a creation, for the timeout's message
        while missing := _missing(admin, wanted, deadline):
            with suppress(*BROKERS_CHANGING):  # the broker the client asked has just gone: another, again
                replicas, brokers = topic_replicas(admin)
            if brokers >= replicas:  # else a broker is away (restarting, fenced): wait for it
                try:
                    admin.create_topics(
                        [
                            NewTopic(
                                t,
                                num_partitions=partitions,
                                replication_factor=replicas,
                                topic_configs=topic_configs(settings, t, replicas),
                            )
                            for t in missing
                        ]
                    )
                    created += missing
                    break
                except TopicAlreadyExistsError:
                    pass  # another process created some meanwhile: those left, again
                except BROKERS_CHANGING as exc:  # a broker gone, back, or fenced, and the client or the
                    # controller not yet told. A new client: kafka-python keeps the controller id it
                    # read first, and asks that node again after a connection error (CI: 60 s of it)
                    refused = exc
                    admin.close()
                    admin = client()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"topics not created within {timeout_s:g}s: the cluster wants {replicas} replicas (its "
                    f"default.replication.factor, up to {MAX_REPLICAS}) and had {brokers} brokers listed"
                    + (f"; the last refusal: {refused!r}" if refused is not None else "")
                )
            time.sleep(0.5)
        while unseen := _missing(admin, wanted, deadline):  # created, until the broker asked lists them
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics not visible after {timeout_s}s: {sorted(unseen)}")
            time.sleep(0.2)
        while not _asking(compact_documents, admin, settings.topics.documents, deadline=deadline):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{settings.topics.documents}: cleanup.policy not made compact within {timeout_s}s")
            time.sleep(0.2)
        return created
    finally:
        admin.close()


MAX_REPLICAS = 3

# What kafka-python raises while the cluster changes under it, rather than asking another broker:
# a connection to a broker just gone (KafkaConnectionError, NodeNotReadyError — retriable), a
# controller id its metadata does not list yet (UnknownBrokerIdError: CI, right after a restarted
# broker became controller), a replica count the controller refuses because it has fenced a broker
# the one asked still lists (InvalidReplicationFactorError). The next try asks again.
BROKERS_CHANGING: tuple[type[Exception], ...] = (RetriableError, UnknownBrokerIdError, InvalidReplicationFactorError)


def _missing(admin: KafkaAdminClient, wanted: list[str], deadline: float | None = None) -> list[str]:
    """The wanted topics the cluster lacks."""
    existing = set(_asking(admin.list_topics, deadline=deadline))
    return [t for t in wanted if t not in existing]


def _asking(call, *args, tries: int = 10, deadline: float | None = None):
    """`call(*args)`, again (half a second apart) while the brokers are changing under it, at most
    `tries` times and not past `deadline` (time.monotonic())."""
    for attempt in range(tries):
        try:
            return call(*args)
        except BROKERS_CHANGING:
            if attempt == tries - 1 or deadline is not None and time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def topic_replicas(admin: KafkaAdminClient) -> tuple[int, int]:
    """(the replicas a new topic gets, the brokers registered now). The replicas are the cluster's
    own — its `default.replication.factor`, raised to the brokers it has, up to three — never just
    the brokers answering this moment: CI's chaos run once created its topics while one of three
    brokers was fenced (three JVMs and the workers on two cores), and they kept two replicas."""
    brokers = admin.describe_cluster()["brokers"]
    if not brokers:
        return 1, 0
    node = str(brokers[0]["broker_id"])
    described = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, node)], config_filter="all")
    entry = described.get("broker", {}).get(node, {}).get("default.replication.factor") or {}
    default = int(entry.get("value") or 1)
    return min(MAX_REPLICAS, max(len(brokers), default)), len(brokers)


def topic_configs(settings: Settings, topic: str, replicas: int) -> dict[str, str]:
    """A new topic's configuration: its message size; `documents` compacted; min.insync.replicas
    one below the replicas from three up."""
    configs = {"max.message.bytes": str(settings.max_message_bytes)}
    if topic == settings.topics.documents:
        configs["cleanup.policy"] = "compact"
    if replicas >= MAX_REPLICAS:
        configs["min.insync.replicas"] = str(replicas - 1)
    return configs


def compact_documents(admin: KafkaAdminClient, topic: str) -> bool:
    """Make an existing documents topic compacted (one created before it was, with the broker's
    default `delete` policy, would drop every document after 7 days); True once it is (False:
    the broker refused for now, e.g. a topic created a moment ago not known everywhere yet)."""
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    entry = described.get("topic", {}).get(topic, {}).get("cleanup.policy") or {}
    if entry.get("value") == "compact":
        return True
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs={"cleanup.policy": "compact"})
    try:
        return admin.alter_configs([resource]).get("topic", {}).get(topic) == "OK"
    except ValueError:  # kafka-python's "Unrecognized configs": the broker asked has no such topic yet
        return False


def delete_namespace_topics(settings: Settings, namespaces: list[str]) -> list[str]:
    """Delete the topics of these namespaces — theirs (`ns.documents`, …) and those of faust apps
    named after them (`ns-…`) — so a benchmark leaves the broker as it found it; returns them."""
    if not namespaces:
        return []
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, client_id="memstream-admin")
    try:
        ours = [t for t in admin.list_topics() if any(t.startswith((f"{ns}.", f"{ns}-")) for ns in namespaces)]
        if ours:
            admin.delete_topics(ours)
        return ours
    finally:
        admin.close()
