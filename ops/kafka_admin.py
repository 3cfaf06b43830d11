"""Topic creation before workers start (kafka-python admin client)."""

from __future__ import annotations

import time

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from workers.settings import Settings


def ensure_topics(
    settings: Settings, partitions: int | None = None, timeout_s: float = 30, connect_timeout_s: float = 30
) -> list[str]:
    """Create the missing topics of the namespace; returns the names created. Raises (kafka's
    KafkaTimeoutError) when no broker answered within `connect_timeout_s`."""
    partitions = partitions or settings.partitions
    admin = KafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap,
        client_id="memstream-admin",
        bootstrap_timeout_ms=int(max(1.0, connect_timeout_s) * 1000),
    )
    try:
        wanted = settings.topics.all()
        missing = [t for t in wanted if t not in set(admin.list_topics())]
        if missing:
            try:
                admin.create_topics(
                    [
                        NewTopic(
                            t,
                            num_partitions=partitions,
                            replication_factor=1,
                            topic_configs={"max.message.bytes": str(settings.max_message_bytes)},
                        )
                        for t in missing
                    ]
                )
            except TopicAlreadyExistsError:
                pass  # another process created them meanwhile
        deadline = time.monotonic() + timeout_s
        while set(wanted) - set(admin.list_topics()):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"topics not visible after {timeout_s}s: {sorted(set(wanted) - set(admin.list_topics()))}"
                )
            time.sleep(0.2)
        return missing
    finally:
        admin.close()


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
