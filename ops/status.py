"""`memstream status [--tenant T] [--json]`: where the pipeline stands, from Kafka and Redis
alone (no worker is asked). Per indexing stage: the consumer group's lag per partition (the end
of the log minus the committed offset) and its throughput over a short sample (committed
offsets moved per second); the dead letters on the DLQ; with a tenant, its documents recorded
vs through the pipeline (deleted ones apart) and its facts by status (pending ones waiting
behind the τ gate). A partition a worker holds but that makes no progress shows as lag that
does not fall; the worker itself acts on it (workers.liveness, memstream_consumer_stalls_total).
Per partition also the last offset whose effects Redis holds (the store's applied offsets):
behind Kafka's committed one, Redis lost writes, and the report says memory is behind its log
until the workers have read those messages again (workers.recovery)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from workers.roles import ROLE_TOPICS
from workers.settings import Settings

KAFKA_READ_TIMEOUT_MS = 15_000  # each read of Kafka's: a request, and a committed offset's fetch with its retries


def kafka_status(settings: Settings, sample_s: float = 2.0) -> dict:
    """Per stage (role): its topic, per-partition end offset, committed offset and lag, the lag
    in all, and messages committed per second over `sample_s`; and the DLQ's letters."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=KAFKA_READ_TIMEOUT_MS,
    )
    # the group's committed offsets, read as a member that never joins (it subscribes to nothing)
    group = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.app_id,
        enable_auto_commit=False,
        request_timeout_ms=KAFKA_READ_TIMEOUT_MS,
    )
    try:
        topics = {role: getattr(settings.topics, suffix.replace("-", "_")) for role, suffix in ROLE_TOPICS.items()}
        partitions = {
            role: [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
            for role, topic in topics.items()
        }
        every = [tp for tps in partitions.values() for tp in tps]

        def committed() -> dict:  # (with no timeout, a broker gone silent after the start held it for good)
            return {
                tp: offset
                for tp in every
                if (offset := group.committed(tp, timeout_ms=KAFKA_READ_TIMEOUT_MS)) is not None
            }

        before, started = committed(), time.monotonic()
        time.sleep(sample_s)
        after, elapsed = committed(), time.monotonic() - started
        ends = consumer.end_offsets(every) if every else {}
        stages = {}
        for role, tps in partitions.items():
            rows = [
                {
                    "partition": tp.partition,
                    "end": ends[tp],
                    "committed": after.get(tp),
                    "lag": max(0, ends[tp] - after.get(tp, 0)),
                }
                for tp in tps
            ]
            moved = sum(after.get(tp, 0) - before.get(tp, 0) for tp in tps)
            stages[role] = {
                "topic": topics[role],
                "lag": sum(r["lag"] for r in rows),
                "per_second": round(moved / elapsed, 2),
                "partitions": rows,
                **({} if tps else {"missing": "topic does not exist yet (start a worker)"}),
            }
        dlq = [
            TopicPartition(settings.topics.dlq, p)
            for p in sorted(consumer.partitions_for_topic(settings.topics.dlq) or [])
        ]
        letters = sum(consumer.end_offsets(dlq).values()) - sum(consumer.beginning_offsets(dlq).values()) if dlq else 0
        return {"group": settings.app_id, "stages": stages, "dead_letters": letters}
    finally:
        consumer.close()
        group.close(autocommit=False)


async def tenant_status(memory, tenant: str) -> dict:
    """The tenant's documents (recorded, through the pipeline, deleted) and facts by status."""
    doc_ids = await memory.document_ids(tenant)
    statuses = [s for s in await memory.document_statuses(tenant, doc_ids) if s is not None]
    deleted = sum(1 for s in statuses if s.chunks == 0)
    indexed = sum(1 for s in statuses if s.chunks and s.chunks_done == s.chunks)
    facts = Counter(row.get("status", "") for _, row in await memory.records(tenant, "facts", skip=("vec", "_rank")))
    known = (
        {}
        if doc_ids or await memory.tenant_known(tenant)
        else {"warning": f"tenant {tenant!r} holds no memory (nothing was ever indexed for it)"}
    )
    return {
        "tenant": tenant,
        "documents": len(statuses) - deleted,
        "documents_indexed": indexed,
        "documents_deleted": deleted,
        "facts": dict(sorted(facts.items())),
        "pending_facts": facts.get("pending", 0),
        **known,
    }


async def memory_behind_log(memory, kafka: dict) -> list[dict]:
    """Adds to each partition row of `kafka` (kafka_status) the last offset Redis holds the
    effects of ("applied"); returns the partitions where that is behind Kafka's committed one."""
    from workers.recovery import behind

    lagging = []
    for role, stage in kafka["stages"].items():
        rows = stage["partitions"]
        applied = await memory.applied_offsets(kafka["group"], stage["topic"], [r["partition"] for r in rows])
        for row in rows:
            row["applied"] = applied.get(row["partition"])
            if behind(row["applied"], row["committed"]) is not None:
                lagging.append({"stage": role, "topic": stage["topic"], **row})
    return lagging


def status(settings: Settings, tenant: str | None, sample_s: float = 2.0) -> dict:
    out: dict = {"kafka": kafka_status(settings, sample_s)}
    from store import Memory

    async def read() -> None:
        memory = Memory.from_url(settings.redis_url)
        try:
            out["memory_behind_log"] = await memory_behind_log(memory, out["kafka"])
            if tenant is not None:
                out["tenant"] = await tenant_status(memory, tenant)
        finally:
            await memory.close()

    asyncio.run(read())
    return out


def render(report: dict) -> str:
    """The report as a few aligned lines."""
    kafka = report["kafka"]
    lines = [
        f"consumer group {kafka['group']}",
        f"{'stage':<10} {'topic':<40} {'lag':>8} {'msg/s':>8}  partitions (lag)",
    ]
    for role, stage in kafka["stages"].items():
        parts = " ".join(f"{r['partition']}:{r['lag']}" for r in stage["partitions"]) or stage.get("missing", "")
        lines.append(f"{role:<10} {stage['topic']:<40} {stage['lag']:>8} {stage['per_second']:>8}  {parts}")
    lines.append(f"dead letters: {kafka['dead_letters']}")
    behind = report.get("memory_behind_log") or []
    if behind:
        parts = ", ".join(
            f"{b['topic']}[{b['partition']}] holds up to {'none' if b['applied'] is None else b['applied']}"
            f" of {b['committed']}"
            for b in behind
        )
        lines.append(
            f"warning: memory is behind its log — Redis lost writes ({parts}); the workers read those "
            "messages again (at their next assignment, or within seconds while running)"
        )
    if "tenant" in report:
        t = report["tenant"]
        facts = ", ".join(f"{n} {s}" for s, n in t["facts"].items()) or "none"
        lines.append(
            f"tenant {t['tenant']}: {t['documents_indexed']} of {t['documents']} documents indexed, {t['documents_deleted']} deleted; "
            f"facts: {facts}" + (" (pending: behind the τ gate)" if t["pending_facts"] else "")
        )
        if "warning" in t:
            lines.append(f"warning: {t['warning']}")
    return "\n".join(lines)
